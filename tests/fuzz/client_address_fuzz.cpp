// libFuzzer target for sluice/client_address.hpp: arbitrary bytes in, never a crash, a hang or
// undefined behaviour out. Built only with clang (SLUICE_BUILD_FUZZERS, preset `fuzz`):
//   build/fuzz/tests/fuzz/client_address_fuzz -max_total_time=30
//       -dict=tests/fuzz/client_address.dict build/fuzz/client_address_corpus
//       tests/fuzz/client_address_corpus
// Beyond not crashing, it checks on every input:
// - the whole input as an address: canonical text parses back to the same address and prints
//   the same; a plain address (no brackets, zone or port) is accepted exactly when the C
//   library's inet_pton accepts it, with the same bytes (glibc's inet_pton is strict);
// - the whole input as a network: its canonical text parses back to the same network, which
//   contains its own network address;
// - the input split at its first two newlines into peer, Forwarded and X-Forwarded-For: every
//   resolver returns the peer or an address written in one of the headers, and a resolver
//   without trusted networks returns the peer.
#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "sluice/client_address.hpp"

namespace {

using sluice::ClientAddress;

[[noreturn]] void violated(const char* what, std::string_view detail) {
  std::fprintf(stderr, "client_address_fuzz: %s: %.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

void check_round_trip(std::string_view text) {
  const ClientAddress address = ClientAddress::parse(text);
  if (!address.valid()) return;
  const std::string canonical = address.to_string();
  const ClientAddress again = ClientAddress::parse(canonical);
  if (again != address) violated("canonical text parses to another address", canonical);
  if (again.to_string() != canonical) violated("canonical text is not stable", canonical);
  if (sluice::network_key(address, {}) == sluice::NetworkKey{}) {
    violated("a valid address has the invalid key", canonical);
  }
}

// Differential check against inet_pton for the forms both accept.
void check_against_inet_pton(std::string_view text) {
  const bool plain = text.find_first_of("[]%") == std::string_view::npos &&
                     std::count(text.begin(), text.end(), ':') != 1 &&
                     text.find('\0') == std::string_view::npos;
  if (!plain) return;
  const std::string terminated(text);
  const ClientAddress ours = ClientAddress::parse(text);
  sluice::detail::Ipv4Bytes v4{};
  sluice::detail::Ipv6Bytes v6{};
  ClientAddress theirs;
  if (inet_pton(AF_INET, terminated.c_str(), v4.data()) == 1) {
    theirs = ClientAddress::ipv4(v4);
  } else if (inet_pton(AF_INET6, terminated.c_str(), v6.data()) == 1) {
    theirs = ClientAddress::ipv6(v6);
  }
  if (ours != theirs) violated("disagrees with inet_pton", text);
}

void check_cidr(std::string_view text) {
  absl::StatusOr<sluice::Cidr> cidr = sluice::Cidr::parse(text);
  if (!cidr.ok()) {
    if (cidr.status().code() != absl::StatusCode::kInvalidArgument) {
      violated("a network error that is not InvalidArgument", text);
    }
    return;
  }
  const std::string canonical = cidr->to_string();
  absl::StatusOr<sluice::Cidr> again = sluice::Cidr::parse(canonical);
  if (!again.ok() || *again != *cidr) violated("canonical network text does not parse back", text);
  const ClientAddress network = ClientAddress::parse(canonical.substr(0, canonical.find('/')));
  if (!cidr->contains(network)) violated("a network does not contain its own address", text);
}

// True iff `address` is written in `header`: some piece between delimiters, or its host part
// (a Forwarded node may carry an obfuscated port that ClientAddress::parse refuses).
bool written_in(const ClientAddress& address, std::string_view header) {
  std::size_t start = 0;
  while (start <= header.size()) {
    std::size_t end = header.find_first_of(",;=\" \t", start);
    if (end == std::string_view::npos) end = header.size();
    const std::string_view piece = header.substr(start, end - start);
    const std::size_t bracket = piece.find(']');
    if (ClientAddress::parse(piece) == address ||
        ClientAddress::parse(piece.substr(0, piece.find(':'))) == address ||
        (bracket != std::string_view::npos &&
         ClientAddress::parse(piece.substr(0, bracket + 1)) == address)) {
      return true;
    }
    start = end + 1;
  }
  return false;
}

const sluice::ClientAddressResolver& resolver(sluice::ProxyHeaders headers) {
  static const std::array<sluice::ClientAddressResolver, 4> resolvers = [] {
    std::array<sluice::ClientAddressResolver, 4> all;
    for (auto mode :
         {sluice::ProxyHeaders::kEither, sluice::ProxyHeaders::kForwardedFirst,
          sluice::ProxyHeaders::kForwardedOnly, sluice::ProxyHeaders::kXForwardedForOnly}) {
      auto created = sluice::ClientAddressResolver::create(
          {"10.0.0.0/8", "2001:db8::/32", "::ffff:192.168.0.0/112"}, mode);
      if (!created.ok()) std::abort();
      all[static_cast<std::size_t>(mode)] = *created;
    }
    return all;
  }();
  return resolvers[static_cast<std::size_t>(headers)];
}

void check_resolvers(std::string_view text) {
  const std::size_t first = text.find('\n');
  const std::size_t second = first == std::string_view::npos ? first : text.find('\n', first + 1);
  const std::string_view peer = text.substr(0, first);
  const std::string_view forwarded =
      first == std::string_view::npos ? "" : text.substr(first + 1, second - first - 1);
  const std::string_view x_forwarded_for =
      second == std::string_view::npos ? "" : text.substr(second + 1);
  const ClientAddress peer_address = ClientAddress::parse(peer);
  if (sluice::ClientAddressResolver().resolve(peer, forwarded, x_forwarded_for) != peer_address) {
    violated("a resolver without trusted networks did not return the peer", text);
  }
  for (auto mode :
       {sluice::ProxyHeaders::kEither, sluice::ProxyHeaders::kForwardedFirst,
        sluice::ProxyHeaders::kForwardedOnly, sluice::ProxyHeaders::kXForwardedForOnly}) {
    const ClientAddress client = resolver(mode).resolve(peer, forwarded, x_forwarded_for);
    if (client != peer_address && !written_in(client, forwarded) &&
        !written_in(client, x_forwarded_for)) {
      violated("resolved to an address that is in no input", client.to_string());
    }
  }
  // Reading either header, the client is the peer or what one pinned header gives.
  const ClientAddress either =
      resolver(sluice::ProxyHeaders::kEither).resolve(peer, forwarded, x_forwarded_for);
  if (either != peer_address &&
      either != resolver(sluice::ProxyHeaders::kForwardedOnly)
                    .resolve(peer, forwarded, x_forwarded_for) &&
      either != resolver(sluice::ProxyHeaders::kXForwardedForOnly)
                    .resolve(peer, forwarded, x_forwarded_for)) {
    violated("kEither resolved to neither the peer nor a pinned header's client",
             either.to_string());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_round_trip(text);
  check_against_inet_pton(text);
  check_cidr(text);
  check_resolvers(text);
  return 0;
}
