// Internal: text for error messages built from untrusted input (config values, replies), and the
// escaper and hex writer behind every other text sluice writes.
#ifndef SLUICE_DETAIL_TEXT_HPP_
#define SLUICE_DETAIL_TEXT_HPP_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::detail {

// Appends `text` with `"` and `\` backslash-escaped; `other(out, byte)` writes each byte outside
// printable ASCII (0x20-0x7E). The one escaper behind error messages and RFC 9651 strings.
template <class Other>
void append_escaped(std::string& out, std::string_view text, Other other) {
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (byte >= 0x20 && byte <= 0x7e) {
      out.push_back(c);
    } else {
      other(out, byte);
    }
  }
}

// Appends the `digits` low hex digits of `value` (at most 16), most significant first, lowercase:
// the one hex writer (escaped bytes, key digests, script SHA-1s).
inline void append_hex(std::string& out, std::uint64_t value, int digits) {
  constexpr char kHex[] = "0123456789abcdef";
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) {
    out.push_back(kHex[(value >> shift) & 0xf]);
  }
}

// `text` with `"` and `\` escaped and every byte outside printable ASCII written as \xNN, so that
// untrusted text can neither forge nor break a message.
// (absl::CHexEscape writes \n and \t instead, which error messages here never use: one form.)
inline std::string escaped(std::string_view text) {
  std::string out;
  append_escaped(out, text, [](std::string& to, unsigned char byte) {
    to.append("\\x");
    append_hex(to, byte, 2);
  });
  return out;
}

// The length of the well-formed UTF-8 sequence (RFC 3629: no overlong form, surrogate or code
// point past U+10FFFF) that starts at `text[at]`; 0 if none does.
inline std::size_t utf8_sequence_size(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[at + k]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  std::size_t size = 4;
  unsigned char low = 0x80;  // the second byte's range; every later byte's is 0x80-0xBF
  unsigned char high = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf) {
    size = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    size = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead == 0xf0) {
    low = 0x90;
  } else if (lead == 0xf4) {
    high = 0x8f;
  } else if (lead < 0xf1 || lead > 0xf3) {
    return 0;
  }
  if (text.size() - at < size || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t k = 2; k < size; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xbf) return 0;
  }
  return size;
}

// `text` with every byte that is not part of well-formed UTF-8 written as \xNN: raw bytes (a
// config value in Latin-1) made fit for where only UTF-8 may go (a protobuf string, a Prometheus
// label). Well-formed UTF-8 comes back unchanged.
inline std::string utf8_escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t size = utf8_sequence_size(text, i);
    if (size == 0) {
      out.append("\\x");
      append_hex(out, static_cast<unsigned char>(text[i]), 2);
      ++i;
    } else {
      out.append(text.substr(i, size));
      i += size;
    }
  }
  return out;
}

// `escaped(text)` in double quotes: how a value from untrusted input appears in a message.
inline std::string quoted(std::string_view text) { return '"' + escaped(text) + '"'; }

// quoted() of at most the first `max_bytes` bytes of `text`, then "..." if it was longer: how a
// value of unbounded length from untrusted input (a request's, a server reply's) appears in a
// message, so that a megabyte of it is not a megabyte of log.
inline std::string quoted_prefix(std::string_view text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return quoted(text);
  return quoted(text.substr(0, max_bytes)) + "...";
}

// True iff every byte of `text` is printable ASCII (0x20-0x7E).
inline bool printable(std::string_view text) {
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte > 0x7e) return false;
  }
  return true;
}

// `text` as it is when it is printable ASCII, else quoted(text): how a name that is plain as a
// rule (a file's path, a descriptor's path) appears in a message, so that one built from untrusted
// input (a file name in a directory others write to) can neither forge nor break a log line.
inline std::string plain_or_quoted(std::string_view text) {
  return printable(text) ? std::string(text) : quoted(text);
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_TEXT_HPP_
