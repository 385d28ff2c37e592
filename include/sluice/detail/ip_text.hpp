// Internal: the exact text forms of IP addresses, parsed and printed without the C library.
//
// inet_pton is not used: it needs a NUL-terminated copy, its strictness differs between C
// libraries (some accept short or octal IPv4 forms), and it knows no zone ids or ports. These
// parsers accept exactly the RFC 4291 / RFC 3986 grammar (IPv4 dotted quad without leading
// zeros; IPv6 with at most one "::" and an optional trailing dotted quad) and run in one pass.
#ifndef SLUICE_DETAIL_IP_TEXT_HPP_
#define SLUICE_DETAIL_IP_TEXT_HPP_

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace sluice::detail {

using Ipv4Bytes = std::array<std::uint8_t, 4>;
using Ipv6Bytes = std::array<std::uint8_t, 16>;

// Parses one decimal number of 1..`max_digits` digits, no sign, no leading zero (except "0"),
// at most `max_value`, from the front of `text`; on success removes it and returns true.
inline bool consume_decimal(std::string_view& text, std::size_t max_digits, unsigned max_value,
                            unsigned& value) noexcept {
  const char* first = text.data();
  const char* last = first + text.size();
  auto [end, ec] = std::from_chars(first, last, value);
  const auto digits = static_cast<std::size_t>(end - first);
  if (ec != std::errc() || digits == 0 || digits > max_digits || value > max_value) return false;
  if (digits > 1 && *first == '0') return false;
  text.remove_prefix(digits);
  return true;
}

// "" or ":port" with a port 0..65535 (decimal, no leading zeros).
inline bool valid_port_suffix(std::string_view suffix) noexcept {
  if (suffix.empty()) return true;
  if (!suffix.starts_with(':')) return false;
  suffix.remove_prefix(1);
  unsigned port = 0;
  return consume_decimal(suffix, 5, 65535, port) && suffix.empty();
}

// A dotted quad: four decimal octets 0..255, no leading zeros, nothing else.
inline bool parse_ipv4(std::string_view text, Ipv4Bytes& out) noexcept {
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (i > 0) {
      if (!text.starts_with('.')) return false;
      text.remove_prefix(1);
    }
    unsigned octet = 0;
    if (!consume_decimal(text, 3, 255, octet)) return false;
    out[i] = static_cast<std::uint8_t>(octet);
  }
  return text.empty();
}

// An IPv6 address without zone id: 1-4 hex digits per group, "::" at most once and standing for
// at least one zero group, an optional dotted quad as the last two groups.
inline bool parse_ipv6(std::string_view text, Ipv6Bytes& out) noexcept {
  std::array<std::uint16_t, 8> groups{};
  std::size_t count = 0;
  constexpr std::size_t kNoGap = groups.size() + 1;
  std::size_t gap = kNoGap;  // the group index at which "::" stands
  if (text.starts_with("::")) {
    gap = 0;
    text.remove_prefix(2);
  } else if (text.starts_with(':')) {
    return false;
  }
  while (!text.empty()) {
    if (count == groups.size()) return false;
    std::uint16_t group = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), group, 16);
    const auto digits = static_cast<std::size_t>(end - text.data());
    if (digits < text.size() && text[digits] == '.') {  // the trailing dotted quad
      Ipv4Bytes quad;
      if (count > groups.size() - 2 || !parse_ipv4(text, quad)) return false;
      groups[count++] = static_cast<std::uint16_t>(quad[0] << 8 | quad[1]);
      groups[count++] = static_cast<std::uint16_t>(quad[2] << 8 | quad[3]);
      break;
    }
    if (ec != std::errc() || digits == 0 || digits > 4) return false;
    groups[count++] = group;
    text.remove_prefix(digits);
    if (text.empty()) break;
    if (text.front() != ':' || text.size() == 1) return false;  // a trailing single ':'
    text.remove_prefix(1);
    if (text.front() == ':') {
      if (gap != kNoGap) return false;
      gap = count;
      text.remove_prefix(1);
    }
  }
  if (gap == kNoGap ? count != groups.size() : count == groups.size()) return false;
  out.fill(0);
  const std::size_t zeros = groups.size() - count;  // 0 without "::"
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t at = i < gap ? i : i + zeros;
    out[2 * at] = static_cast<std::uint8_t>(groups[i] >> 8);
    out[2 * at + 1] = static_cast<std::uint8_t>(groups[i] & 0xff);
  }
  return true;
}

// True iff `bytes` is an IPv4-mapped IPv6 address (::ffff:0:0/96).
inline bool ipv4_mapped(const Ipv6Bytes& bytes) noexcept {
  for (std::size_t i = 0; i < 10; ++i) {
    if (bytes[i] != 0) return false;
  }
  return bytes[10] == 0xff && bytes[11] == 0xff;
}

inline void append_ipv4(std::string& out, const std::uint8_t* bytes) {
  for (std::size_t i = 0; i < 4; ++i) {
    if (i > 0) out.push_back('.');
    char digits[3];
    auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), unsigned{bytes[i]});
    (void)ec;  // 255 fits three digits
    out.append(digits, end);
  }
}

// RFC 5952: lowercase hex without leading zeros; the longest run of two or more zero groups
// (the leftmost on a tie) is written "::"; IPv4-mapped addresses end in a dotted quad.
inline void append_ipv6(std::string& out, const Ipv6Bytes& bytes) {
  if (ipv4_mapped(bytes)) {
    out.append("::ffff:");
    append_ipv4(out, bytes.data() + 12);
    return;
  }
  std::array<unsigned, 8> groups{};
  for (std::size_t i = 0; i < groups.size(); ++i) {
    groups[i] = static_cast<unsigned>(bytes[2 * i] << 8 | bytes[2 * i + 1]);
  }
  std::size_t run_start = groups.size(), run_length = 1;  // runs of one are not compressed
  for (std::size_t i = 0; i < groups.size();) {
    std::size_t j = i;
    while (j < groups.size() && groups[j] == 0) ++j;
    if (j - i > run_length) {
      run_start = i;
      run_length = j - i;
    }
    i = j == i ? i + 1 : j;
  }
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (i == run_start) {
      out.append("::");
      i += run_length - 1;
      continue;
    }
    if (i > 0 && i != run_start + run_length) out.push_back(':');
    char digits[4];
    auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), groups[i], 16);
    (void)ec;  // 0xffff fits four digits
    out.append(digits, end);
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_IP_TEXT_HPP_
