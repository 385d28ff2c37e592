// sluice/client_address.hpp — the client address of a request, in a form a client cannot choose.
//
// Three pieces:
// - `ClientAddress`: an IPv4 or IPv6 address parsed from text and printed in one canonical form,
//   or invalid. `network_key` turns it into the key component of a limit: its network under
//   `AddressPrefixes` (an IPv6 host usually holds a whole /64, so by default it is keyed by /64;
//   IPv4 by /32). Every unparsable input shares one "invalid" key; raw text is never keyed.
// - `Cidr`: a network such as "10.0.0.0/8", and whether it contains an address.
// - `ClientAddressResolver`: the client behind trusted proxies, from the connection's peer
//   address and the `Forwarded` (RFC 7239) or `X-Forwarded-For` header; behind a stateless
//   translator's IPv6 prefix (`parse_ipv4_translation_prefix`), the IPv4 client it embeds.
//
//   auto resolver = sluice::ClientAddressResolver::create({"10.0.0.0/8"});  // the load balancers
//   if (!resolver.ok()) return resolver.status();  // InvalidArgument names the bad entry
//   sluice::ClientAddress client = resolver->resolve(peer, forwarded, x_forwarded_for);
//   std::string key;
//   sluice::append_key_part(key, network_key(client, sluice::AddressPrefixes{}).bytes());
//   log("client ", client.to_string());  // "2001:db8::7", "203.0.113.7" or "invalid"
//
// Text forms accepted by `ClientAddress::parse` (nothing else; no surrounding whitespace):
// - IPv4 as a dotted quad: four decimal octets, no leading zeros, no octal, hex or short forms
//   ("10.1" and "010.0.0.1" are invalid: inet_aton would read them as other addresses).
// - IPv6 in any RFC 4291 form, including a trailing dotted quad ("::ffff:192.0.2.1") and a zone
//   id ("fe80::1%eth0": unreserved characters only; dropped, the key is the address).
// - "[v6]", "[v6]:port" and "v4:port", as they appear in headers; the port is dropped.
// - An IPv4-mapped IPv6 address (::ffff:a.b.c.d in any spelling) is that IPv4 address.
// The parser is this library's own (sluice/detail/ip_text.hpp), not inet_pton, whose strictness
// varies between C libraries and which knows neither zone ids nor ports.
//
// Resolving behind proxies. With no trusted networks (the default) the client is the peer and
// the headers are ignored: a client can write any header. Otherwise, if the peer is in a trusted
// network, the hop list is walked from the right — each proxy appends the address it received
// the request from — skipping addresses in trusted networks; the client is the first address
// not in one. If every hop is trusted, the leftmost is the client. An element that is no address
// (malformed, "unknown", an obfuscated "_name", a `Forwarded` element without `for`) ends the
// walk at the trusted hop that wrote it: its address is the client. So an untrusted client can
// add elements only to the left of the one its proxy appended, and garbage never picks a key.
//
// Which header: a trusted proxy appends to one of `Forwarded` and `X-Forwarded-For` and usually
// passes the other through as the client wrote it, so by default (`ProxyHeaders::kEither`) a
// header counts only if its rightmost element names a node (well-formed, with `for` in
// `Forwarded`), as the proxy's own element does. One header that counts is walked. When both
// count and their walks settle on different clients, either may be the client's invention, and
// the client is the peer (the trusted hop nearest this service): a client that writes the header
// its proxy does not can neither pick a key nor take a victim's, and lands, with every other
// client doing the same, in its proxy's bucket. Headers that agree, or a proxy that writes both,
// resolve as usual. If your proxies write only one of the two, pin it (`kForwardedOnly`,
// `kXForwardedForOnly`): a client's copy of the other is then ignored instead of sending its
// requests to the proxy's bucket. `kForwardedFirst` (the default up to 0.2) reads `Forwarded`
// whenever its rightmost element is well-formed: safe only where the proxies write `Forwarded`.
//
// Bounds: only the last 8192 bytes of each header are read (an element cut there counts as
// malformed, so a padded header still resolves to the client its proxy appended); at most 20
// hops are examined (then the last trusted one examined is the client); at most 256 trusted
// networks. Complexity: O(header bytes read + hops x trusted networks) per resolve.
//
// Thread-safety: every type here is a value type; const member functions may be called
// concurrently. No floating point, no exceptions.
#ifndef SLUICE_CLIENT_ADDRESS_HPP_
#define SLUICE_CLIENT_ADDRESS_HPP_

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/detail/forwarded.hpp"
#include "sluice/detail/ip_text.hpp"
#include "sluice/detail/text.hpp"

namespace sluice {

// An IPv4 or IPv6 address, or invalid (the default). A mapped IPv4 address is always IPv4.
class ClientAddress {
 public:
  enum class Family : std::uint8_t { kInvalid = 0, kIpv4 = 4, kIpv6 = 6 };

  ClientAddress() = default;

  static ClientAddress ipv4(const std::array<std::uint8_t, 4>& bytes) noexcept {
    ClientAddress address;
    address.family_ = Family::kIpv4;
    std::copy(bytes.begin(), bytes.end(), address.bytes_.begin());
    return address;
  }
  // An IPv4-mapped address (::ffff:0:0/96) becomes the IPv4 address.
  static ClientAddress ipv6(const std::array<std::uint8_t, 16>& bytes) noexcept {
    if (detail::ipv4_mapped(bytes)) return ipv4({bytes[12], bytes[13], bytes[14], bytes[15]});
    ClientAddress address;
    address.family_ = Family::kIpv6;
    address.bytes_ = bytes;
    return address;
  }

  // The address in `text` (forms in the header comment), or an invalid address. O(text size).
  static ClientAddress parse(std::string_view text) noexcept {
    if (text.starts_with('[')) {
      const std::size_t close = text.find(']');
      if (close == std::string_view::npos || !detail::valid_port_suffix(text.substr(close + 1))) {
        return {};
      }
      return parse_ipv6_with_zone(text.substr(1, close - 1));
    }
    const std::size_t colons = static_cast<std::size_t>(std::count(text.begin(), text.end(), ':'));
    if (colons >= 2) return parse_ipv6_with_zone(text);
    std::string_view host = text;
    if (colons == 1) {
      const std::size_t colon = text.find(':');
      if (!detail::valid_port_suffix(text.substr(colon))) return {};
      host = text.substr(0, colon);
    }
    detail::Ipv4Bytes bytes;
    return detail::parse_ipv4(host, bytes) ? ipv4(bytes) : ClientAddress{};
  }

  Family family() const noexcept { return family_; }
  bool valid() const noexcept { return family_ != Family::kInvalid; }
  bool is_ipv4() const noexcept { return family_ == Family::kIpv4; }
  bool is_ipv6() const noexcept { return family_ == Family::kIpv6; }

  // Network byte order: 4 bytes for IPv4, 16 for IPv6, none when invalid.
  std::span<const std::uint8_t> bytes() const noexcept {
    return std::span<const std::uint8_t>(bytes_).first(size());
  }

  // Canonical text: a dotted quad, RFC 5952 IPv6 (lowercase, the longest run of two or more
  // zero groups compressed, the leftmost on a tie), or "invalid". parse(to_string()) == *this.
  std::string to_string() const {
    std::string out;
    if (is_ipv4()) {
      detail::append_ipv4(out, bytes_.data());
    } else if (is_ipv6()) {
      detail::append_ipv6(out, bytes_);
    } else {
      out = "invalid";
    }
    return out;
  }

  friend bool operator==(const ClientAddress&, const ClientAddress&) = default;
  friend std::ostream& operator<<(std::ostream& os, const ClientAddress& address) {
    return os << address.to_string();
  }

 private:
  std::size_t size() const noexcept { return is_ipv4() ? 4 : is_ipv6() ? 16 : 0; }

  // An IPv6 address with an optional zone id of RFC 3986 unreserved characters.
  static ClientAddress parse_ipv6_with_zone(std::string_view text) noexcept {
    const std::size_t percent = text.find('%');
    if (percent != std::string_view::npos) {
      const std::string_view zone = text.substr(percent + 1);
      const bool unreserved = std::all_of(zone.begin(), zone.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '-' || c == '.' || c == '_' || c == '~';
      });
      if (zone.empty() || !unreserved) return {};
      text = text.substr(0, percent);
    }
    detail::Ipv6Bytes bytes;
    return detail::parse_ipv6(text, bytes) ? ipv6(bytes) : ClientAddress{};
  }

  Family family_ = Family::kInvalid;
  std::array<std::uint8_t, 16> bytes_{};  // IPv4 in the first 4 bytes; unused bytes are zero
};

// How much of a client address identifies a client: its network prefix length per family.
struct AddressPrefixes {
  int ipv4 = 32;  // bits, 0..32
  int ipv6 = 64;  // bits, 0..128: one host usually holds a whole /64

  friend bool operator==(const AddressPrefixes&, const AddressPrefixes&) = default;
};

// InvalidArgument unless ipv4 is in [0, 32] and ipv6 in [0, 128].
inline absl::Status validate(const AddressPrefixes& prefixes) {
  if (prefixes.ipv4 < 0 || prefixes.ipv4 > 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("address prefixes: ipv4 must be in [0, 32], got ", prefixes.ipv4));
  }
  if (prefixes.ipv6 < 0 || prefixes.ipv6 > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("address prefixes: ipv6 must be in [0, 128], got ", prefixes.ipv6));
  }
  return absl::OkStatus();
}

// The key component of an address: its family, the prefix length and the network bytes (host
// bits zero, only the bytes the prefix reaches). Two addresses share a key iff they are in the
// same network; an invalid address has the one key no valid address has. Fixed size, no
// allocation; `bytes()` is binary and self-delimiting per family and prefix, so it can be one
// part of a composite key (sluice/key.hpp) but must not be logged as text.
class NetworkKey {
 public:
  std::string_view bytes() const noexcept { return std::string_view(bytes_.data(), size_); }
  friend bool operator==(const NetworkKey& a, const NetworkKey& b) noexcept {
    return a.bytes() == b.bytes();
  }

 private:
  friend NetworkKey network_key(const ClientAddress&, const AddressPrefixes&) noexcept;

  std::array<char, 18> bytes_{};  // family (0, 4 or 6), prefix length, network bytes
  std::uint8_t size_ = 1;         // the default is the invalid key: one zero byte
};

// The key of `address` under `prefixes`. Prefix lengths outside their range (an unvalidated
// AddressPrefixes) are clamped into it. O(1).
// The most bytes a network key has (family, prefix length, 16 address bytes).
inline constexpr std::size_t kMaxNetworkKeySize = 18;

namespace detail {

// The well-known prefix of IPv4-embedded IPv6 addresses (RFC 6052), 64:ff9b::/96: an IPv4
// client that reaches an IPv6-only service through a stateless translator (SIIT, NAT46) arrives
// as this prefix and its IPv4 address.
inline constexpr std::array<std::uint8_t, 12> kIpv4EmbeddingPrefix = {0, 0x64, 0xff, 0x9b, 0, 0,
                                                                      0, 0,    0,    0,    0, 0};

// Writes the key of the network of `family` whose first `bits` are those of `bytes`.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline char* write_network_prefix(char* out,
                                                               ClientAddress::Family family,
                                                               int bits,
                                                               const std::uint8_t* bytes) noexcept {
  const auto whole = static_cast<std::size_t>(bits / 8);
  *out++ = static_cast<char>(family);
  *out++ = static_cast<char>(bits);
  std::memcpy(out, bytes, whole);  // std::copy from bytes to chars copies byte by byte
  out += whole;
  if (const int rest = bits % 8; rest != 0) {
    const auto mask = static_cast<std::uint8_t>(0xff << (8 - rest));
    *out++ = static_cast<char>(bytes[whole] & mask);
  }
  return out;
}

// The key of the IPv4 address that an address under 64:ff9b::/96 embeds. Out of line: the
// common paths of write_network_key stay as short as they were.
ABSL_ATTRIBUTE_NOINLINE inline char* write_embedded_ipv4_key(char* out,
                                                             const ClientAddress& address,
                                                             int ipv4_bits) noexcept {
  return write_network_prefix(out, ClientAddress::Family::kIpv4, std::clamp(ipv4_bits, 0, 32),
                              address.bytes().data() + kIpv4EmbeddingPrefix.size());
}

}  // namespace detail

// Writes network_key(address, prefixes).bytes() at `out` (room for kMaxNetworkKeySize bytes)
// and returns the byte after it: straight into a composite key, with no key object between.
// An address under 64:ff9b::/96 is keyed as the IPv4 address it embeds, under the IPv4 prefix:
// under the IPv6 prefix every IPv4 client of the translator would share one /64's key.
inline char* write_network_key(char* out, const ClientAddress& address,
                               const AddressPrefixes& prefixes) noexcept {
  if (!address.valid()) {
    *out = 0;
    return out + 1;
  }
  const std::uint8_t* const bytes = address.bytes().data();
  if (address.is_ipv6() && std::memcmp(bytes, detail::kIpv4EmbeddingPrefix.data(),
                                       detail::kIpv4EmbeddingPrefix.size()) == 0) {
    return detail::write_embedded_ipv4_key(out, address, prefixes.ipv4);
  }
  const int bits =
      address.is_ipv4() ? std::clamp(prefixes.ipv4, 0, 32) : std::clamp(prefixes.ipv6, 0, 128);
  return detail::write_network_prefix(out, address.family(), bits, bytes);
}

inline NetworkKey network_key(const ClientAddress& address,
                              const AddressPrefixes& prefixes) noexcept {
  NetworkKey key;
  char* const end = write_network_key(key.bytes_.data(), address, prefixes);
  key.size_ = static_cast<std::uint8_t>(end - key.bytes_.data());
  return key;
}

// An IPv4 or IPv6 network: "10.0.0.0/8", "2001:db8::/32"; a bare address is a /32 or /128.
// A v6 network inside the IPv4-mapped range (::ffff:0:0/96 or longer, "::ffff:10.0.0.0/104")
// contains those IPv4 addresses; a broader v6 network ("::/64", "::/0") contains no IPv4 address,
// though it covers the mapped range: it was written for IPv6 peers.
class Cidr {
 public:
  // InvalidArgument, naming the text, for anything but `address[/length]` with a canonical
  // decimal length in range and zero host bits ("10.0.0.1/8" is refused: which was meant, the
  // host or the network?). No zone ids, brackets, ports or whitespace.
  static absl::StatusOr<Cidr> parse(std::string_view text) {
    const std::size_t slash = text.find('/');
    const std::string_view address = text.substr(0, slash);
    Cidr cidr;
    detail::Ipv4Bytes ipv4;
    if (detail::parse_ipv4(address, ipv4)) {
      cidr.family_ = ClientAddress::Family::kIpv4;
      std::copy(ipv4.begin(), ipv4.end(), cidr.network_.begin());
    } else if (detail::parse_ipv6(address, cidr.network_)) {
      cidr.family_ = ClientAddress::Family::kIpv6;
    } else {
      return error(text, "not an IPv4 or IPv6 address");
    }
    const unsigned max_length = cidr.family_ == ClientAddress::Family::kIpv4 ? 32 : 128;
    unsigned length = max_length;
    if (slash != std::string_view::npos) {
      std::string_view digits = text.substr(slash + 1);
      if (!detail::consume_decimal(digits, 3, max_length, length) || !digits.empty()) {
        return error(text,
                     absl::StrCat("the prefix length must be a number in [0, ", max_length, "]"));
      }
    }
    cidr.length_ = static_cast<std::uint8_t>(length);
    for (std::size_t i = 0; i < max_length / 8; ++i) {
      if ((cidr.network_[i] & ~cidr.mask(i)) != 0) {
        return error(text, "host bits are set; write the network address");
      }
    }
    return cidr;
  }

  // True iff `address` is in this network. O(1).
  bool contains(const ClientAddress& address) const noexcept {
    detail::Ipv6Bytes bytes{};
    if (address.family() == family_) {
      std::copy(address.bytes().begin(), address.bytes().end(), bytes.begin());
    } else if (address.is_ipv4() && family_ == ClientAddress::Family::kIpv6 && length_ >= 96) {
      bytes[10] = bytes[11] = 0xff;  // its IPv4-mapped form
      std::copy(address.bytes().begin(), address.bytes().end(), bytes.begin() + 12);
    } else {
      return false;
    }
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      if ((bytes[i] & mask(i)) != network_[i]) return false;
    }
    return true;
  }

  ClientAddress::Family family() const noexcept { return family_; }
  int prefix_length() const noexcept { return length_; }
  // The network address in network byte order: 4 bytes for IPv4, 16 for IPv6.
  std::span<const std::uint8_t> bytes() const noexcept {
    return std::span<const std::uint8_t>(network_).first(
        family_ == ClientAddress::Family::kIpv4 ? 4 : 16);
  }

  // Canonical text: "10.0.0.0/8", "2001:db8::/32", "::ffff:10.0.0.0/104".
  std::string to_string() const {
    std::string out;
    if (family_ == ClientAddress::Family::kIpv4) {
      detail::append_ipv4(out, network_.data());
    } else {
      detail::append_ipv6(out, network_);
    }
    absl::StrAppend(&out, "/", length_);
    return out;
  }

  friend bool operator==(const Cidr&, const Cidr&) = default;
  friend std::ostream& operator<<(std::ostream& os, const Cidr& cidr) {
    return os << cidr.to_string();
  }

 private:
  Cidr() = default;

  static absl::Status error(std::string_view text, absl::string_view problem) {
    return absl::InvalidArgumentError(
        absl::StrCat("network ", detail::quoted(text), ": ", problem));
  }

  // The mask of byte `i` (0 beyond the prefix, so bytes past an IPv4 address compare as 0).
  std::uint8_t mask(std::size_t i) const noexcept {
    const std::size_t bit = 8 * i;
    if (bit + 8 <= length_) return 0xff;
    if (bit >= length_) return 0;
    return static_cast<std::uint8_t>(0xff << (8 - (length_ - bit)));
  }

  ClientAddress::Family family_ = ClientAddress::Family::kIpv4;
  std::uint8_t length_ = 0;      // prefix length in bits
  detail::Ipv6Bytes network_{};  // IPv4 in the first 4 bytes; host bits and unused bytes zero
};

namespace detail {

// The addresses of the network `network`/`length` as one inclusive range of `bits`-bit numbers.
inline std::pair<absl::uint128, absl::uint128> address_range(std::span<const std::uint8_t> network,
                                                             int length, int bits) {
  absl::uint128 first = 0;
  for (const std::uint8_t byte : network) first = first << 8 | byte;
  const int host_bits = bits - length;
  const absl::uint128 hosts =
      host_bits == 128 ? ~absl::uint128(0) : (absl::uint128(1) << host_bits) - 1;
  return {first, first + hosts};
}

// Whether `ranges` (inclusive) together hold every number of [0, last].
inline bool cover(std::vector<std::pair<absl::uint128, absl::uint128>> ranges, absl::uint128 last) {
  std::sort(ranges.begin(), ranges.end());
  absl::uint128 next = 0;  // the smallest number not held yet
  for (const auto& [first, range_last] : ranges) {
    if (first > next) return false;
    if (range_last >= last) return true;
    next = std::max(next, range_last + 1);
  }
  return false;
}

// IPv4 networks no client on the internet connects from (special-purpose blocks: "this"
// network, private, shared, loopback, link-local, protocol assignments, documentation,
// benchmarking, multicast and reserved), as (first four bytes, prefix length).
inline constexpr std::array<std::pair<std::array<std::uint8_t, 4>, int>, 13> kNonPublicIpv4 = {{
    {{0, 0, 0, 0}, 8},
    {{10, 0, 0, 0}, 8},
    {{100, 64, 0, 0}, 10},
    {{127, 0, 0, 0}, 8},
    {{169, 254, 0, 0}, 16},
    {{172, 16, 0, 0}, 12},
    {{192, 0, 0, 0}, 24},
    {{192, 0, 2, 0}, 24},
    {{192, 168, 0, 0}, 16},
    {{198, 18, 0, 0}, 15},
    {{198, 51, 100, 0}, 24},
    {{203, 0, 113, 0}, 24},
    {{224, 0, 0, 0}, 3},  // multicast 224/4 and reserved 240/4
}};

// OK unless `networks` together hold every public IPv4 address (IPv4 networks and IPv6 ones
// inside the IPv4-mapped range; kNonPublicIpv4 aside) or every global unicast IPv6 address
// (2000::/3, where every IPv6 client on the internet is). Behind such a list every client is a
// trusted proxy, so the walk never meets an untrusted hop and the leftmost address, which the
// client writes itself, is the client: each request may name its own key. InvalidArgument
// "<name>: ..." naming the fix. O(networks × log networks).
inline absl::Status check_some_address_untrusted(std::span<const Cidr> networks,
                                                 std::string_view name) {
  constexpr std::array<std::uint8_t, 12> kMappedPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  std::vector<std::pair<absl::uint128, absl::uint128>> v4;
  v4.reserve(kNonPublicIpv4.size() + networks.size());
  for (const auto& [network, length] : kNonPublicIpv4) {
    v4.push_back(address_range(network, length, 32));
  }
  // Held already: every IPv6 address outside 2000::/3 (the IPv4-mapped range among them: its
  // clients are counted with v4).
  const absl::uint128 global_first = absl::MakeUint128(0x2000'0000'0000'0000U, 0);
  const absl::uint128 global_last = absl::MakeUint128(0x3fff'ffff'ffff'ffffU, ~std::uint64_t{0});
  std::vector<std::pair<absl::uint128, absl::uint128>> v6 = {{0, global_first - 1},
                                                             {global_last + 1, ~absl::uint128(0)}};
  for (const Cidr& cidr : networks) {
    const std::span<const std::uint8_t> bytes = cidr.bytes();
    if (cidr.family() == ClientAddress::Family::kIpv4) {
      v4.push_back(address_range(bytes, cidr.prefix_length(), 32));
      continue;
    }
    v6.push_back(address_range(bytes, cidr.prefix_length(), 128));
    if (cidr.prefix_length() >= 96 &&
        std::equal(kMappedPrefix.begin(), kMappedPrefix.end(), bytes.begin())) {
      v4.push_back(address_range(bytes.subspan(12), cidr.prefix_length() - 96, 32));
    }
  }
  const char* family = cover(v4, absl::uint128(0xffffffffU)) ? "IPv4"
                       : cover(v6, ~absl::uint128(0))        ? "IPv6"
                                                             : nullptr;
  if (family == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      absl::string_view(name.data(), name.size()), ": the networks hold every public ", family,
      " address, so every client would be a trusted proxy and name its own address (its own key) "
      "in X-Forwarded-For or Forwarded; list only the networks of your own proxies"));
}

// The IPv4 address that an IPv6 address under a translation prefix of `length` bits embeds
// (RFC 6052): its 32 bits follow the prefix, skipping bits 64 to 71. Those bits and the suffix
// after the IPv4 address are ignored, so an address cannot differ from its translator's form in
// them to be another client. O(1).
inline ClientAddress embedded_ipv4(const ClientAddress& address, int length) noexcept {
  const std::span<const std::uint8_t> bytes = address.bytes();
  std::array<std::uint8_t, 4> ipv4{};
  auto at = static_cast<std::size_t>(length / 8);
  for (std::uint8_t& byte : ipv4) {
    if (at == 8) ++at;  // bits 64-71 hold no address bits
    byte = bytes[at++];
  }
  return ClientAddress::ipv4(ipv4);
}

}  // namespace detail

// An IPv6 prefix under which a stateless translator (SIIT, NAT46; RFC 6052, RFC 7915) presents
// IPv4 clients to an IPv6-only service: "2001:db8:46::/96", or any of the lengths 32, 40, 48, 56
// and 64. InvalidArgument, naming the text, for anything else (an IPv4 network, another length,
// host bits set). 64:ff9b::/96, the well-known prefix, needs no listing: its addresses are keyed
// as the IPv4 address they embed anyway (`network_key`).
inline absl::StatusOr<Cidr> parse_ipv4_translation_prefix(std::string_view text) {
  absl::StatusOr<Cidr> prefix = Cidr::parse(text);
  if (!prefix.ok()) return prefix.status();
  const int length = prefix->prefix_length();
  if (prefix->family() != ClientAddress::Family::kIpv6 ||
      (length != 32 && length != 40 && length != 48 && length != 56 && length != 64 &&
       length != 96)) {
    return absl::InvalidArgumentError(
        absl::StrCat("translation prefix ", sluice::detail::quoted(text),
                     ": must be an IPv6 prefix of 32, 40, 48, 56, 64 or 96 bits (RFC 6052)"));
  }
  return prefix;
}

// Which forwarding header lists the hops; see the header comment.
enum class ProxyHeaders : std::uint8_t {
  kForwardedFirst,     // Forwarded when its rightmost element is well-formed, else X-Forwarded-For
  kForwardedOnly,      // only Forwarded
  kXForwardedForOnly,  // only X-Forwarded-For
  kEither,  // the default: the header whose rightmost element names a node; both, disagreeing:
            // the peer
};

// The client address of a request behind trusted proxies (see the header comment). Immutable.
class ClientAddressResolver {
 public:
  static constexpr std::size_t kMaxTrustedNetworks = 256;
  static constexpr std::size_t kMaxHops = 20;  // hop list elements examined
  static constexpr std::size_t kMaxHeaderBytes = detail::kMaxHeaderBytes;  // read per header
  static constexpr std::size_t kMaxTranslationPrefixes = 16;

  // No trusted networks: every request's client is its peer.
  ClientAddressResolver() = default;

  // `trusted_networks`: CIDR texts (Cidr::parse). InvalidArgument naming the entry by index
  // ("trusted_networks[2]: network \"10.0.0.1/8\": host bits are set; ...") or when there are
  // more than kMaxTrustedNetworks, or when together they hold every IPv4 or every IPv6 address
  // ("0.0.0.0/0", "::/0"): every client would then be a trusted proxy and name its own address.
  // `ipv4_translation_prefixes` (parse_ipv4_translation_prefix; at most kMaxTranslationPrefixes,
  // the entry named by index as above): a client the resolver settles on under one of them is
  // the IPv4 address it embeds (`translated`). Behind a translator with a prefix of its own,
  // every IPv4 client would otherwise share one IPv6 /64's key, and one of them could spend the
  // budget of all.
  template <std::ranges::input_range Range,
            std::ranges::input_range Prefixes = std::initializer_list<std::string_view>>
  requires std::convertible_to<std::ranges::range_reference_t<Range>, std::string_view> &&
      std::convertible_to<std::ranges::range_reference_t<Prefixes>, std::string_view>
  static absl::StatusOr<ClientAddressResolver> create(
      const Range& trusted_networks, ProxyHeaders headers = ProxyHeaders::kEither,
      const Prefixes& ipv4_translation_prefixes = {}) {
    ClientAddressResolver resolver;
    resolver.headers_ = headers;
    for (std::string_view text : ipv4_translation_prefixes) {
      const std::size_t index = resolver.translation_.size();
      if (index == kMaxTranslationPrefixes) {
        return absl::InvalidArgumentError(absl::StrCat("ipv4_translation_prefixes: more than ",
                                                       kMaxTranslationPrefixes, " prefixes"));
      }
      absl::StatusOr<Cidr> prefix = parse_ipv4_translation_prefix(text);
      if (!prefix.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("ipv4_translation_prefixes[", index, "]: ", prefix.status().message()));
      }
      resolver.translation_.push_back(*prefix);
    }
    for (std::string_view text : trusted_networks) {
      const std::size_t index = resolver.trusted_.size();
      if (index == kMaxTrustedNetworks) {
        return absl::InvalidArgumentError(
            absl::StrCat("trusted_networks: more than ", kMaxTrustedNetworks, " networks"));
      }
      absl::StatusOr<Cidr> cidr = Cidr::parse(text);
      if (!cidr.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("trusted_networks[", index, "]: ", cidr.status().message()));
      }
      resolver.trusted_.push_back(*cidr);
    }
    if (absl::Status s =
            detail::check_some_address_untrusted(resolver.trusted_, "trusted_networks");
        !s.ok()) {
      return s;
    }
    return resolver;
  }
  static absl::StatusOr<ClientAddressResolver> create(
      std::initializer_list<std::string_view> trusted_networks,
      ProxyHeaders headers = ProxyHeaders::kEither) {
    return create<std::initializer_list<std::string_view>>(trusted_networks, headers);
  }

  // The client of a request that arrived from `peer` with these header values (each as
  // received, several lines of one header joined by ", "; empty when absent). Never fails: the
  // result is invalid only if the address it settles on is (e.g. an invalid peer).
  ClientAddress resolve(const ClientAddress& peer, std::string_view forwarded,
                        std::string_view x_forwarded_for) const noexcept {
    return resolve(peer, forwarded, x_forwarded_for, headers_);
  }
  ClientAddress resolve(std::string_view peer, std::string_view forwarded,
                        std::string_view x_forwarded_for) const noexcept {
    return resolve(ClientAddress::parse(peer), forwarded, x_forwarded_for);
  }
  // The same, reading the hop list from `headers` instead of `headers()`: an adapter takes the
  // trusted networks from its engine's config and the header choice from its own options.
  ClientAddress resolve(const ClientAddress& peer, std::string_view forwarded,
                        std::string_view x_forwarded_for, ProxyHeaders headers) const noexcept {
    return translated(resolve_hops(peer, forwarded, x_forwarded_for, headers));
  }

  // `address`, or the IPv4 address it embeds when it is under one of the translation prefixes.
  // An adapter that skips `resolve` for an untrusted peer passes the peer through this. O(number
  // of translation prefixes).
  ClientAddress translated(const ClientAddress& address) const noexcept {
    if (translation_.empty() || !address.is_ipv6()) return address;
    for (const Cidr& prefix : translation_) {
      if (prefix.contains(address)) return detail::embedded_ipv4(address, prefix.prefix_length());
    }
    return address;
  }

  // True iff `address` is in a trusted network. O(trusted networks).
  bool trusted(const ClientAddress& address) const noexcept {
    return std::any_of(trusted_.begin(), trusted_.end(),
                       [&address](const Cidr& cidr) { return cidr.contains(address); });
  }

  std::span<const Cidr> trusted_networks() const noexcept { return trusted_; }
  std::span<const Cidr> ipv4_translation_prefixes() const noexcept { return translation_; }
  ProxyHeaders headers() const noexcept { return headers_; }

 private:
  // The client before translation: the peer, or the hop the walk settles on.
  ClientAddress resolve_hops(const ClientAddress& peer, std::string_view forwarded,
                             std::string_view x_forwarded_for,
                             ProxyHeaders headers) const noexcept {
    if (!trusted(peer)) return peer;  // also: no trusted networks
    switch (headers) {
      case ProxyHeaders::kForwardedOnly:
        return walk(peer, detail::ForwardedHops(forwarded));
      case ProxyHeaders::kXForwardedForOnly:
        return walk(peer, detail::XForwardedForHops(x_forwarded_for));
      case ProxyHeaders::kForwardedFirst:
        if (detail::ForwardedHops(forwarded).next().value_or(detail::Hop{}).well_formed) {
          return walk(peer, detail::ForwardedHops(forwarded));
        }
        return walk(peer, detail::XForwardedForHops(x_forwarded_for));
      case ProxyHeaders::kEither: {
        const bool by_forwarded = names_node(detail::ForwardedHops(forwarded));
        if (!names_node(detail::XForwardedForHops(x_forwarded_for))) {
          return by_forwarded ? walk(peer, detail::ForwardedHops(forwarded)) : peer;
        }
        const ClientAddress client = walk(peer, detail::XForwardedForHops(x_forwarded_for));
        if (!by_forwarded) return client;
        return walk(peer, detail::ForwardedHops(forwarded)) == client ? client : peer;
      }
    }
    return peer;
  }

  // A `Forwarded` node ("192.0.2.1", "[2001:db8::1]:4711", "unknown", "_hidden"): RFC 7239
  // brackets every IPv6 address and allows an obfuscated port (":_x"); anything else is invalid.
  static ClientAddress parse_forwarded_node(std::string_view node) noexcept {
    std::size_t host_end = node.starts_with('[') ? node.find(']') : node.find(':');
    if (host_end != std::string_view::npos && node.starts_with('[')) ++host_end;
    const std::string_view host = node.substr(0, host_end);
    const std::string_view port = node.substr(host.size());
    if (!detail::valid_port_suffix(port) && !obfuscated_port_suffix(port)) return {};
    return ClientAddress::parse(host);
  }

  // ":_" followed by RFC 7239 obfuscated-port characters.
  static bool obfuscated_port_suffix(std::string_view suffix) noexcept {
    return suffix.size() > 2 && suffix.starts_with(":_") &&
           std::all_of(suffix.begin() + 2, suffix.end(), [](char c) {
             return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
           });
  }

  // Whether the rightmost element of `hops` names a node, as a proxy's own element does.
  template <typename Hops>
  static bool names_node(Hops hops) noexcept {
    const std::optional<detail::Hop> hop = hops.next();
    return hop && hop->well_formed && hop->has_node;
  }

  // The address a hop names; invalid for a malformed element or one without an address.
  template <typename Hops>
  static ClientAddress address_of(const detail::Hop& hop) noexcept {
    if (!hop.has_node) return {};  // malformed, or a Forwarded element without `for`
    if constexpr (std::same_as<Hops, detail::ForwardedHops>) {
      return parse_forwarded_node(hop.node);
    } else {
      return ClientAddress::parse(hop.node);
    }
  }

  // Walks `hops` from the right starting at the trusted `peer` (see the header comment).
  template <typename Hops>
  ClientAddress walk(const ClientAddress& peer, Hops hops) const noexcept {
    ClientAddress last_trusted = peer;
    for (std::size_t examined = 0; examined < kMaxHops; ++examined) {
      const std::optional<detail::Hop> hop = hops.next();
      if (!hop) break;  // every hop was trusted: the leftmost is the client
      const ClientAddress address = address_of<Hops>(*hop);
      if (!address.valid()) break;  // no address: the last trusted hop's view
      if (!trusted(address)) return address;
      last_trusted = address;
    }
    return last_trusted;
  }

  std::vector<Cidr> trusted_;
  std::vector<Cidr> translation_;  // ipv4_translation_prefixes
  ProxyHeaders headers_ = ProxyHeaders::kEither;
};

}  // namespace sluice

#endif  // SLUICE_CLIENT_ADDRESS_HPP_
