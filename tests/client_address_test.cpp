#include "sluice/client_address.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"

namespace {

using sluice::AddressPrefixes;
using sluice::Cidr;
using sluice::ClientAddress;
using sluice::ClientAddressResolver;
using sluice::network_key;
using sluice::ProxyHeaders;

std::string text_of(std::string_view text) { return ClientAddress::parse(text).to_string(); }

std::string message_of(const absl::Status& status) { return std::string(status.message()); }

// A resolver that trusts the load balancers in 10.0.0.0/8 and 2001:db8:ffff::/48.
ClientAddressResolver behind_proxies(ProxyHeaders headers = ProxyHeaders::kForwardedFirst) {
  absl::StatusOr<ClientAddressResolver> resolver =
      ClientAddressResolver::create({"10.0.0.0/8", "2001:db8:ffff::/48"}, headers);
  REQUIRE(resolver.ok());
  return *resolver;
}

std::string key_bytes(std::string_view address, AddressPrefixes prefixes = {}) {
  return std::string(network_key(ClientAddress::parse(address), prefixes).bytes());
}

}  // namespace

// --- parsing and canonical text ---------------------------------------------------------------

TEST_CASE("IPv6 text is canonical in the form of RFC 5952") {
  struct Case {
    std::string_view input;
    std::string_view canonical;
  };
  const std::vector<Case> cases = {
      {"2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"},  // leftmost of two equal runs
      {"2001:0db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"},
      {"2001:db8::1:0:0:1", "2001:db8::1:0:0:1"},
      {"2001:db8::0:1:0:0:1", "2001:db8::1:0:0:1"},
      {"2001:0db8::1:0:0:1", "2001:db8::1:0:0:1"},
      {"2001:db8:0:0:1::1", "2001:db8::1:0:0:1"},
      {"2001:db8:0000:0:1::1", "2001:db8::1:0:0:1"},
      {"2001:DB8:0:0:1::1", "2001:db8::1:0:0:1"},
      {"2001:db8:aaaa:bbbb:cccc:dddd:eeee:0001", "2001:db8:aaaa:bbbb:cccc:dddd:eeee:1"},
      {"2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"},  // one zero group is not compressed
      {"2001:0:0:1:0:0:0:1", "2001:0:0:1::1"},           // the longest run wins
      {"2001:db8::", "2001:db8::"},
      {"0:0:0:0:0:0:0:0", "::"},
      {"::", "::"},
      {"0:0:0:0:0:0:0:1", "::1"},
      {"1:0:0:0:0:0:0:0", "1::"},
      {"1::2:3:4:5:6:7", "1:0:2:3:4:5:6:7"},
      {"FE80::ABCD:0:0:1", "fe80::abcd:0:0:1"},
      {"::192.0.2.1", "::c000:201"},  // IPv4-compatible, not mapped: stays IPv6
      {"64:ff9b::192.0.2.1", "64:ff9b::c000:201"},
      {"1:2:3:4:5:6:192.0.2.1", "1:2:3:4:5:6:c000:201"},
  };
  for (const Case& c : cases) {
    INFO(c.input);
    CHECK(text_of(c.input) == c.canonical);
  }
}

TEST_CASE("IPv4 text is a dotted quad of decimal octets") {
  CHECK(text_of("192.0.2.1") == "192.0.2.1");
  CHECK(text_of("0.0.0.0") == "0.0.0.0");
  CHECK(text_of("255.255.255.255") == "255.255.255.255");
  CHECK(ClientAddress::parse("203.0.113.7").bytes().size() == 4);
  CHECK(ClientAddress::parse("203.0.113.7") == ClientAddress::ipv4({203, 0, 113, 7}));
}

TEST_CASE("the parser rejects every text that is not exactly an address") {
  const std::vector<std::string_view> rejected = {
      "",
      " 192.0.2.1",
      "192.0.2.1 ",
      "192.0.2",
      "192.0.2.1.",
      "192.0.2.1.5",
      "192..2.1",
      "010.0.0.1",  // octal in inet_aton
      "0x7f.0.0.1",
      "127.1",
      "2130706433",
      "256.0.0.1",
      "1.2.3.-4",
      "+1.2.3.4",
      "1.2.3.4%eth0",
      "[192.0.2.1]",
      "192.0.2.1:",
      "192.0.2.1:65536",
      "192.0.2.1:080",
      "192.0.2.1:http",
      ":::",
      ":1::",
      "1::2:",
      "1:2:3:4:5:6:7:8:9",
      "1:2:3:4:5:6:7:8::",
      "::1:2:3:4:5:6:7:8",
      "1::2::3",
      "12345::",
      "g::",
      "::1.2.3",
      "::1.2.3.04",
      "1.2.3.4::",
      "1:2:3:4:5:6:7:1.2.3.4",
      "::ffff:1.2.3.4.5",
      "fe80::1%",
      "fe80::1%eth 0",
      "fe80::1%eth/0",
      "[::1",
      "[::1]:",
      "[::1]x",
      "[::1]:65536",
      "::1]",
      "unknown",
      "_hidden",
  };
  for (std::string_view text : rejected) {
    INFO('"' << std::string(text) << '"');
    CHECK_FALSE(ClientAddress::parse(text).valid());
  }
}

TEST_CASE("an IPv4-mapped IPv6 address in any spelling is the IPv4 address") {
  const ClientAddress expected = ClientAddress::parse("192.0.2.1");
  for (std::string_view text : {"::ffff:192.0.2.1", "::FFFF:c000:201", "0:0:0:0:0:ffff:192.0.2.1",
                                "[::ffff:192.0.2.1]:443"}) {
    INFO(text);
    const ClientAddress address = ClientAddress::parse(text);
    CHECK(address.is_ipv4());
    CHECK(address == expected);
  }
}

TEST_CASE("a zone id is dropped and a port is dropped") {
  const ClientAddress link_local = ClientAddress::parse("fe80::1");
  CHECK(ClientAddress::parse("fe80::1%eth0") == link_local);
  CHECK(ClientAddress::parse("[fe80::1%25eth0]:8080") == link_local);
  CHECK(ClientAddress::parse("[2001:db8::1]:4711") == ClientAddress::parse("2001:db8::1"));
  CHECK(ClientAddress::parse("[2001:db8::1]") == ClientAddress::parse("2001:db8::1"));
  CHECK(ClientAddress::parse("192.0.2.1:0") == ClientAddress::parse("192.0.2.1"));
  CHECK(ClientAddress::parse("192.0.2.1:65535") == ClientAddress::parse("192.0.2.1"));
}

TEST_CASE("an address holds its bytes in network order") {
  const ClientAddress address = ClientAddress::parse("2001:db8::8:800:200c:417a");
  const std::vector<std::uint8_t> bytes(address.bytes().begin(), address.bytes().end());
  CHECK(bytes == std::vector<std::uint8_t>{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0x08, 0x08, 0x00,
                                           0x20, 0x0c, 0x41, 0x7a});
  CHECK(address.family() == ClientAddress::Family::kIpv6);
}

TEST_CASE("an invalid address prints as invalid and has no bytes") {
  const ClientAddress address = ClientAddress::parse("not an address");
  CHECK(address == ClientAddress{});
  CHECK(address.to_string() == "invalid");
  CHECK(address.bytes().empty());
}

TEST_CASE("canonical text parses back to the same address") {
  for (std::string_view text : {"2001:db8:0:0:1:0:0:1", "::ffff:10.1.2.3", "fe80::1%eth0",
                                "10.20.30.40", "::", "1::", "[::1]:80",
                                "ffff:ffff:ffff:ffff:"
                                "ffff:ffff:ffff:ffff"}) {
    INFO(text);
    const ClientAddress address = ClientAddress::parse(text);
    REQUIRE(address.valid());
    CHECK(ClientAddress::parse(address.to_string()) == address);
  }
}

// --- network keys -------------------------------------------------------------------------------

TEST_CASE("an IPv6 key is the family, the prefix length and the /64 network by default") {
  CHECK(key_bytes("2001:db8:1:2:3:4:5:6") ==
        std::string("\x06\x40\x20\x01\x0d\xb8\x00\x01\x00\x02", 10));
}

TEST_CASE("two IPv6 addresses in one /64 share a key and different /64s do not") {
  CHECK(key_bytes("2001:db8:1:2::1") == key_bytes("2001:db8:1:2:ffff:ffff:ffff:ffff"));
  CHECK(key_bytes("2001:db8:1:2::1") != key_bytes("2001:db8:1:3::1"));
}

TEST_CASE("an IPv4 key is the whole address by default") {
  CHECK(key_bytes("192.0.2.1") == std::string("\x04\x20\xc0\x00\x02\x01", 6));
  CHECK(key_bytes("192.0.2.1") != key_bytes("192.0.2.2"));
}

TEST_CASE("an IPv4 /24 prefix puts one network's addresses under one key") {
  const AddressPrefixes per_24{.ipv4 = 24};
  CHECK(key_bytes("192.0.2.1", per_24) == std::string("\x04\x18\xc0\x00\x02", 5));
  CHECK(key_bytes("192.0.2.1", per_24) == key_bytes("192.0.2.255", per_24));
  CHECK(key_bytes("192.0.2.1", per_24) != key_bytes("192.0.3.1", per_24));
}

TEST_CASE("a prefix that ends inside a byte keeps only that byte's network bits") {
  const AddressPrefixes per_20{.ipv4 = 20, .ipv6 = 60};
  CHECK(key_bytes("10.0.31.255", per_20) == std::string("\x04\x14\x0a\x00\x10", 5));
  CHECK(key_bytes("10.0.16.0", per_20) == key_bytes("10.0.31.255", per_20));
  CHECK(key_bytes("10.0.32.0", per_20) != key_bytes("10.0.31.255", per_20));
  CHECK(key_bytes("2001:db8:0:ff::", per_20) == key_bytes("2001:db8:0:f0::", per_20));
  CHECK(key_bytes("2001:db8:0:ff::", per_20) != key_bytes("2001:db8:0:ef::", per_20));
}

TEST_CASE("every unparsable address has the one invalid key") {
  const std::string invalid = key_bytes("garbage");
  CHECK(invalid == std::string(1, '\0'));
  CHECK(key_bytes("") == invalid);
  CHECK(key_bytes("192.0.2.1 ") == invalid);
  CHECK(std::string(sluice::NetworkKey{}.bytes()) == invalid);
}

TEST_CASE("the whole-internet prefixes of the two families and the invalid key all differ") {
  const AddressPrefixes everything{.ipv4 = 0, .ipv6 = 0};
  CHECK(key_bytes("192.0.2.1", everything) == std::string("\x04\x00", 2));
  CHECK(key_bytes("2001:db8::1", everything) == std::string("\x06\x00", 2));
  CHECK(key_bytes("garbage", everything) == std::string(1, '\0'));
}

TEST_CASE("a mapped IPv4 address is keyed under the IPv4 prefix") {
  CHECK(key_bytes("::ffff:192.0.2.1") == key_bytes("192.0.2.1"));
}

// [attack] Behind a stateless translator every IPv4 client arrives as 64:ff9b::/96 and its own
// address: under the /64 they all shared one key, so one client could exhaust everyone's limit.
TEST_CASE("an address under 64:ff9b::/96 is keyed as the IPv4 address it embeds") {
  CHECK(key_bytes("64:ff9b::192.0.2.1") == key_bytes("192.0.2.1"));
  CHECK(key_bytes("64:ff9b::c000:201") == key_bytes("192.0.2.1"));
  CHECK(key_bytes("64:ff9b::192.0.2.1") != key_bytes("64:ff9b::192.0.2.2"));
  const AddressPrefixes per_24{.ipv4 = 24, .ipv6 = 64};
  CHECK(key_bytes("64:ff9b::192.0.2.1", per_24) == key_bytes("64:ff9b::192.0.2.255", per_24));
  CHECK(key_bytes("64:ff9b::192.0.2.1", per_24) != key_bytes("64:ff9b::192.0.3.1", per_24));
  // Only the well-known /96: the rest of 64:ff9b::/64, and other prefixes, are IPv6 clients.
  CHECK(key_bytes("64:ff9b::1:c000:201") == key_bytes("64:ff9b::2:c000:201"));
  CHECK(key_bytes("64:ff9b:1::c000:201") != key_bytes("192.0.2.1"));
  // The address itself, its text and its family, is unchanged: only the key embeds.
  CHECK(ClientAddress::parse("64:ff9b::192.0.2.1").to_string() == "64:ff9b::c000:201");
  CHECK(ClientAddress::parse("64:ff9b::192.0.2.1").is_ipv6());
}

TEST_CASE("prefix lengths are validated per family") {
  CHECK(sluice::validate(AddressPrefixes{}).ok());
  CHECK(sluice::validate(AddressPrefixes{.ipv4 = 0, .ipv6 = 128}).ok());
  const absl::Status v4 = sluice::validate(AddressPrefixes{.ipv4 = 33});
  CHECK(v4.code() == absl::StatusCode::kInvalidArgument);
  CHECK(message_of(v4) == "address prefixes: ipv4 must be in [0, 32], got 33");
  const absl::Status v6 = sluice::validate(AddressPrefixes{.ipv6 = -1});
  CHECK(v6.code() == absl::StatusCode::kInvalidArgument);
  CHECK(message_of(v6) == "address prefixes: ipv6 must be in [0, 128], got -1");
}

TEST_CASE("an out-of-range prefix length is clamped when keying") {
  CHECK(key_bytes("192.0.2.1", {.ipv4 = 99}) == key_bytes("192.0.2.1", {.ipv4 = 32}));
  CHECK(key_bytes("2001:db8::1", {.ipv6 = -5}) == key_bytes("2001:db8::2", {.ipv6 = 0}));
}

// --- CIDR networks ------------------------------------------------------------------------------

TEST_CASE("a network parses to its canonical text") {
  struct Case {
    std::string_view input;
    std::string_view canonical;
  };
  const std::vector<Case> cases = {
      {"10.0.0.0/8", "10.0.0.0/8"},
      {"192.0.2.7", "192.0.2.7/32"},
      {"0.0.0.0/0", "0.0.0.0/0"},
      {"2001:DB8:0::/32", "2001:db8::/32"},
      {"2001:db8::1", "2001:db8::1/128"},
      {"::/0", "::/0"},
      {"::ffff:10.0.0.0/104", "::ffff:10.0.0.0/104"},
  };
  for (const Case& c : cases) {
    INFO(c.input);
    absl::StatusOr<Cidr> cidr = Cidr::parse(c.input);
    REQUIRE(cidr.ok());
    CHECK(cidr->to_string() == c.canonical);
  }
}

TEST_CASE("a network with host bits set is refused with a message naming it") {
  absl::StatusOr<Cidr> cidr = Cidr::parse("10.0.0.1/8");
  CHECK(cidr.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(message_of(cidr.status()) ==
        "network \"10.0.0.1/8\": host bits are set; write the network address");
}

TEST_CASE("a network text that is not address/length is refused") {
  const std::vector<std::string_view> rejected = {
      "",
      "/8",
      "10.0.0.0/",
      "10.0.0.0/33",
      "10.0.0.0/08",
      "10.0.0.0/-0",
      "10.0.0.0/8 ",
      "10/8",
      "10.0.0.0/8/8",
      "2001:db8::/129",
      "[::1]/128",
      "fe80::%eth0/64",
      "192.0.2.1:80/32",
      "2001:db8::/0x20",
  };
  for (std::string_view text : rejected) {
    INFO('"' << std::string(text) << '"');
    CHECK(Cidr::parse(text).status().code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(message_of(Cidr::parse("10.0.0.0/33").status()) ==
        "network \"10.0.0.0/33\": the prefix length must be a number in [0, 32]");
  CHECK(message_of(Cidr::parse("10/8").status()) ==
        "network \"10/8\": not an IPv4 or IPv6 address");
}

TEST_CASE("a network contains exactly the addresses under its prefix") {
  const Cidr v4 = *Cidr::parse("10.16.0.0/12");
  CHECK(v4.contains(ClientAddress::parse("10.16.0.0")));
  CHECK(v4.contains(ClientAddress::parse("10.31.255.255")));
  CHECK_FALSE(v4.contains(ClientAddress::parse("10.32.0.0")));
  CHECK_FALSE(v4.contains(ClientAddress::parse("10.15.255.255")));
  const Cidr v6 = *Cidr::parse("2001:db8::/32");
  CHECK(v6.contains(ClientAddress::parse("2001:db8:ffff::1")));
  CHECK_FALSE(v6.contains(ClientAddress::parse("2001:db9::")));
}

TEST_CASE("an IPv4 network contains no IPv6 address and no invalid one") {
  const Cidr all_v4 = *Cidr::parse("0.0.0.0/0");
  CHECK(all_v4.contains(ClientAddress::parse("198.51.100.1")));
  CHECK_FALSE(all_v4.contains(ClientAddress::parse("::")));
  CHECK_FALSE(all_v4.contains(ClientAddress{}));
}

TEST_CASE("an IPv6 network inside the mapped range contains those IPv4 addresses") {
  CHECK(Cidr::parse("::ffff:10.0.0.0/104")->contains(ClientAddress::parse("10.1.2.3")));
  CHECK_FALSE(Cidr::parse("::ffff:10.0.0.0/104")->contains(ClientAddress::parse("11.1.2.3")));
  CHECK(Cidr::parse("::ffff:0:0/96")->contains(ClientAddress::parse("192.0.2.1")));
  CHECK_FALSE(Cidr::parse("2001:db8::/32")->contains(ClientAddress::parse("192.0.2.1")));
}

// A broader IPv6 network also covers the mapped range, but it was written for IPv6: trusting
// "::/64" (or "::/0", every IPv6 proxy) must not trust every IPv4 peer, whose forwarding
// headers would then pick the client.
TEST_CASE("an IPv6 network broader than the mapped range contains no IPv4 address") {
  CHECK_FALSE(Cidr::parse("::/0")->contains(ClientAddress::parse("192.0.2.1")));
  CHECK_FALSE(Cidr::parse("::/64")->contains(ClientAddress::parse("192.0.2.1")));
  CHECK_FALSE(Cidr::parse("::/95")->contains(ClientAddress::parse("192.0.2.1")));
  CHECK(Cidr::parse("::/64")->contains(ClientAddress::parse("::1")));
  CHECK(Cidr::parse("::/0")->contains(ClientAddress::parse("2001:db8::1")));
}

// --- the resolver: configuration ----------------------------------------------------------------

TEST_CASE("a resolver refuses a bad trusted network and names it by index") {
  absl::StatusOr<ClientAddressResolver> resolver =
      ClientAddressResolver::create({"10.0.0.0/8", "10.0.0.1/8"});
  CHECK(resolver.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(message_of(resolver.status()) ==
        "trusted_networks[1]: network \"10.0.0.1/8\": host bits are set; write the network "
        "address");
}

TEST_CASE("a resolver refuses trusted networks that hold every address of a family") {
  absl::StatusOr<ClientAddressResolver> all_v4 =
      ClientAddressResolver::create({"10.0.0.0/8", "0.0.0.0/1", "128.0.0.0/1"});
  CHECK(all_v4.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(message_of(all_v4.status()) ==
        "trusted_networks: the networks hold every public IPv4 address, so every client would be a "
        "trusted proxy and name its own address (its own key) in X-Forwarded-For or Forwarded; "
        "list only the networks of your own proxies");
  CHECK(absl::StrContains(message_of(ClientAddressResolver::create({"::/0"}).status()),
                          "hold every public IPv6 address"));
  CHECK(ClientAddressResolver::create({"::/0"}, sluice::ProxyHeaders::kXForwardedForOnly)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(ClientAddressResolver::create({"0.0.0.0/1", "2000::/4", "::ffff:0.0.0.0/97"}).ok());
}

TEST_CASE("a resolver refuses trusted networks that hold every public address of a family",
          "[attack]") {
  // Every unicast IPv4 address (only multicast and the reserved 240/4 left out), and every global
  // unicast IPv6 address: no client on the internet is outside them, so each could name its own
  // address in X-Forwarded-For.
  for (const std::vector<std::string>& networks : std::vector<std::vector<std::string>>{
           {"0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3"},
           {"1.0.0.0/8", "2.0.0.0/7", "4.0.0.0/6", "8.0.0.0/5", "16.0.0.0/4", "32.0.0.0/3",
            "64.0.0.0/2", "128.0.0.0/2", "192.0.0.0/3"},
           {"::/1"},
           {"2000::/3"},
           {"2000::/4", "3000::/4"}}) {
    CAPTURE(networks);
    absl::StatusOr<ClientAddressResolver> resolver = ClientAddressResolver::create(networks);
    CHECK(resolver.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(message_of(resolver.status()), "every public IPv"));
  }
  // One public network left untrusted: its clients cannot name their own addresses.
  CHECK(ClientAddressResolver::create({"0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/4"}).ok());
  CHECK(ClientAddressResolver::create({"2000::/4", "3000::/5"}).ok());
}

TEST_CASE("a resolver refuses more trusted networks than its cap") {
  const std::vector<std::string> networks(ClientAddressResolver::kMaxTrustedNetworks + 1,
                                          "10.0.0.0/8");
  absl::StatusOr<ClientAddressResolver> resolver = ClientAddressResolver::create(networks);
  CHECK(resolver.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(message_of(resolver.status()) == "trusted_networks: more than 256 networks");
}

TEST_CASE("a resolver keeps its trusted networks in canonical form") {
  const std::vector<std::string> networks = {"10.0.0.0/8", "2001:DB8::/32"};
  absl::StatusOr<ClientAddressResolver> resolver = ClientAddressResolver::create(networks);
  REQUIRE(resolver.ok());
  REQUIRE(resolver->trusted_networks().size() == 2);
  CHECK(resolver->trusted_networks()[1].to_string() == "2001:db8::/32");
}

// --- the resolver: no trusted proxies -----------------------------------------------------------

TEST_CASE("without trusted networks the client is the peer and headers are ignored") {
  const ClientAddressResolver resolver;
  CHECK(resolver.resolve("203.0.113.7", "for=198.51.100.1", "198.51.100.2") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("an untrusted peer's headers are ignored") {
  CHECK(behind_proxies().resolve("203.0.113.7", "for=198.51.100.1", "198.51.100.2") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("an unparsable peer resolves to the invalid address") {
  CHECK(behind_proxies().resolve("garbage", "", "198.51.100.2") == ClientAddress{});
}

// --- the resolver: X-Forwarded-For --------------------------------------------------------------

TEST_CASE("a spoofed leftmost X-Forwarded-For entry resolves to the entry the proxy appended") {
  const ClientAddressResolver resolver = behind_proxies();
  std::vector<std::string> clients;
  for (int spoof = 0; spoof < 300; ++spoof) {
    const std::string header =
        absl::StrCat("198.51.", spoof / 256, ".", spoof % 256, ", 203.0.113.7");
    clients.push_back(resolver.resolve("10.0.0.5", "", header).to_string());
  }
  CHECK(clients == std::vector<std::string>(300, "203.0.113.7"));
}

TEST_CASE("a trusted address written by the client does not move the walk past its proxy") {
  CHECK(behind_proxies().resolve("10.0.0.5", "", "10.0.0.1, 203.0.113.7") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("trusted hops are skipped from the right up to the first untrusted address") {
  CHECK(behind_proxies().resolve("10.0.0.5", "", "198.51.100.9, 203.0.113.7, 10.1.1.1,10.2.2.2") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("when every hop is trusted the leftmost is the client") {
  CHECK(behind_proxies().resolve("10.0.0.5", "", "10.0.0.1, 10.0.0.2") ==
        ClientAddress::parse("10.0.0.1"));
}

TEST_CASE("a trusted peer without a forwarding header is the client") {
  CHECK(behind_proxies().resolve("10.0.0.5", "", "") == ClientAddress::parse("10.0.0.5"));
  CHECK(behind_proxies().resolve("10.0.0.5", " ", " , ") == ClientAddress::parse("10.0.0.5"));
}

TEST_CASE("X-Forwarded-For elements may carry ports, brackets and IPv6 text") {
  CHECK(behind_proxies().resolve("2001:db8:ffff::1", "", "[2001:db8:1:2::7]:443") ==
        ClientAddress::parse("2001:db8:1:2::7"));
  CHECK(behind_proxies().resolve("10.0.0.5", "", "203.0.113.7:51234") ==
        ClientAddress::parse("203.0.113.7"));
  CHECK(behind_proxies().resolve("10.0.0.5", "", "2001:db8:1:2::7") ==
        ClientAddress::parse("2001:db8:1:2::7"));
}

TEST_CASE("an unparsable X-Forwarded-For element ends the walk at the hop that wrote it") {
  const ClientAddressResolver resolver = behind_proxies();
  CHECK(resolver.resolve("10.0.0.5", "", "203.0.113.7, garbage") ==
        ClientAddress::parse("10.0.0.5"));
  CHECK(resolver.resolve("10.0.0.5", "", "203.0.113.7, unknown, 10.0.0.9") ==
        ClientAddress::parse("10.0.0.9"));
  CHECK(resolver.resolve("10.0.0.5", "", "203.0.113.7, 198.51.100.1 198.51.100.2") ==
        ClientAddress::parse("10.0.0.5"));
}

TEST_CASE("padding an X-Forwarded-For header does not hide the address the proxy appended") {
  std::string header;
  while (header.size() < 3 * ClientAddressResolver::kMaxHeaderBytes) header += "198.51.100.1, ";
  header += "203.0.113.7";
  CHECK(behind_proxies().resolve("10.0.0.5", "", header) == ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("an X-Forwarded-For element cut by the read limit is not an address") {
  // The window starts inside "203.0.113.77": its tail "3.0.113.77" would be an address.
  const std::string tail = "10.0.0.9";
  const std::string cut = "3.0.113.77,";
  const std::string header =
      "20" + cut +
      std::string(ClientAddressResolver::kMaxHeaderBytes - cut.size() - tail.size(), ' ') + tail;
  CHECK(behind_proxies().resolve("10.0.0.5", "", header) == ClientAddress::parse("10.0.0.9"));
}

TEST_CASE("at most twenty hops are examined, then the last trusted one examined is the client") {
  std::string header = "203.0.113.7";
  for (int hop = 1; hop <= 25; ++hop) header += absl::StrCat(", 10.0.0.", hop);
  // From the right: 10.0.0.25 down to 10.0.0.6 are the twenty examined.
  CHECK(behind_proxies().resolve("10.0.0.5", "", header) == ClientAddress::parse("10.0.0.6"));
}

// --- the resolver: Forwarded --------------------------------------------------------------------

TEST_CASE("the Forwarded for parameter names the client") {
  CHECK(behind_proxies().resolve("10.0.0.5", "for=192.0.2.60;proto=http;by=203.0.113.43", "") ==
        ClientAddress::parse("192.0.2.60"));
}

TEST_CASE("a spoofed leftmost Forwarded element resolves to the element the proxy appended") {
  CHECK(behind_proxies().resolve("10.0.0.5", "for=198.51.100.1, for=203.0.113.7", "") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("Forwarded accepts a quoted bracketed IPv6 node with a port") {
  CHECK(behind_proxies().resolve("10.0.0.5", "for=\"[2001:db8:cafe::17]:4711\"", "") ==
        ClientAddress::parse("2001:db8:cafe::17"));
  CHECK(behind_proxies().resolve("10.0.0.5", "for=\"[2001:db8:cafe::17]\"", "") ==
        ClientAddress::parse("2001:db8:cafe::17"));
  CHECK(behind_proxies().resolve("10.0.0.5", "for=\"203.0.113.7:_port-1\"", "") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("Forwarded parameter names are case-insensitive and values may be quoted") {
  CHECK(behind_proxies().resolve("10.0.0.5", "For=\"203.0.113.7\"", "") ==
        ClientAddress::parse("203.0.113.7"));
  CHECK(behind_proxies().resolve("10.0.0.5", "proto=https; FOR=203.0.113.7", "") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("Forwarded elements behind several trusted proxies are skipped from the right") {
  CHECK(behind_proxies().resolve(
            "10.0.0.5", "for=198.51.100.1, for=203.0.113.7;proto=https, for=10.0.0.9;by=10.0.0.5",
            "") == ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("an unknown or obfuscated Forwarded node ends the walk at the hop that wrote it") {
  const ClientAddressResolver resolver = behind_proxies();
  CHECK(resolver.resolve("10.0.0.5", "for=unknown", "") == ClientAddress::parse("10.0.0.5"));
  CHECK(resolver.resolve("10.0.0.5", "for=203.0.113.7, for=_hidden, for=10.0.0.9", "") ==
        ClientAddress::parse("10.0.0.9"));
  CHECK(resolver.resolve("10.0.0.5", "proto=https", "") == ClientAddress::parse("10.0.0.5"));
}

TEST_CASE("a Forwarded IPv6 node must be bracketed and quoted") {
  const ClientAddressResolver resolver = behind_proxies(ProxyHeaders::kForwardedOnly);
  CHECK(resolver.resolve("10.0.0.5", "for=\"2001:db8::1\"", "") ==
        ClientAddress::parse("10.0.0.5"));
  CHECK(resolver.resolve("10.0.0.5", "for=[2001:db8::1]", "") == ClientAddress::parse("10.0.0.5"));
}

TEST_CASE("a comma or a for inside a quoted Forwarded value is text, not an element") {
  CHECK(behind_proxies().resolve("10.0.0.5", "for=203.0.113.7;ext=\"x, for=198.51.100.1\"", "") ==
        ClientAddress::parse("203.0.113.7"));
  CHECK(behind_proxies().resolve("10.0.0.5", "for=203.0.113.7;ext=\"a\\\", for=198.51.100.1\"",
                                 "") == ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("a client's unterminated quote cannot hide the element its proxy appended") {
  CHECK(behind_proxies().resolve("10.0.0.5", "for=\"198.51.100.1, for=203.0.113.7", "") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("a Forwarded element that repeats for is malformed") {
  const ClientAddressResolver resolver = behind_proxies(ProxyHeaders::kForwardedOnly);
  CHECK(resolver.resolve("10.0.0.5", "for=203.0.113.7;for=198.51.100.1", "") ==
        ClientAddress::parse("10.0.0.5"));
}

TEST_CASE("a malformed Forwarded element behind a trusted hop ends the walk there") {
  CHECK(behind_proxies().resolve("10.0.0.5", "for=203.0.113.7, for=\"x, for=10.0.0.9", "") ==
        ClientAddress::parse("10.0.0.9"));
  CHECK(behind_proxies().resolve("10.0.0.5", "for=203.0.113.7, for==x, for=10.0.0.9", "") ==
        ClientAddress::parse("10.0.0.9"));
}

TEST_CASE("a padded Forwarded header still resolves to the element the proxy appended") {
  std::string header;
  while (header.size() < 3 * ClientAddressResolver::kMaxHeaderBytes) {
    header += "for=198.51.100.1;ext=\"a,b\", ";
  }
  header += "for=203.0.113.7";
  CHECK(behind_proxies().resolve("10.0.0.5", header, "") == ClientAddress::parse("203.0.113.7"));
}

// --- the resolver: which header -----------------------------------------------------------------

TEST_CASE("kForwardedFirst: a well-formed Forwarded header takes precedence over X-Forwarded-For") {
  CHECK(behind_proxies().resolve("10.0.0.5", "for=203.0.113.7", "198.51.100.1") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE(
    "kForwardedFirst: X-Forwarded-For is read when the rightmost Forwarded element is malformed") {
  CHECK(behind_proxies().resolve("10.0.0.5", "for=\"198.51.100.1", "203.0.113.7") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("a resolver pinned to X-Forwarded-For ignores Forwarded") {
  CHECK(behind_proxies(ProxyHeaders::kXForwardedForOnly)
            .resolve("10.0.0.5", "for=198.51.100.1", "203.0.113.7") ==
        ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("a resolver pinned to Forwarded ignores X-Forwarded-For") {
  CHECK(behind_proxies(ProxyHeaders::kForwardedOnly).resolve("10.0.0.5", "", "198.51.100.1") ==
        ClientAddress::parse("10.0.0.5"));
}

// kEither, the default: a trusted proxy appends to one header and passes the other through.
TEST_CASE("by default a resolver reads either header") {
  auto resolver = ClientAddressResolver::create({"10.0.0.0/8"});
  REQUIRE(resolver.ok());
  CHECK(resolver->headers() == ProxyHeaders::kEither);
  CHECK(resolver->resolve("10.0.0.5", "", "203.0.113.7") == ClientAddress::parse("203.0.113.7"));
  CHECK(resolver->resolve("10.0.0.5", "for=203.0.113.7", "") ==
        ClientAddress::parse("203.0.113.7"));
  CHECK(resolver->resolve("10.0.0.5", "for=203.0.113.7", "203.0.113.7") ==
        ClientAddress::parse("203.0.113.7"));  // a proxy that writes both
  CHECK(resolver->resolve("10.0.0.5", "", "") == ClientAddress::parse("10.0.0.5"));
}

TEST_CASE("behind a proxy that appends X-Forwarded-For, a client's own Forwarded picks no key") {
  const ClientAddressResolver resolver = behind_proxies(ProxyHeaders::kEither);
  const ClientAddress proxy = ClientAddress::parse("10.0.0.5");
  const std::string appended = "198.51.100.7";  // the client the proxy saw
  // Rotating the header, naming a victim, or naming the proxy's network: never a key of the
  // client's choosing. Disagreeing headers resolve to the proxy, the hop nearest the service.
  for (const char* forwarded : {"for=203.0.113.1", "for=203.0.113.2", "for=192.0.2.10",
                                "for=198.51.100.6, for=10.0.0.9", "for=unknown", "for=_hidden"}) {
    INFO(forwarded);
    CHECK(resolver.resolve(proxy, forwarded, appended) == proxy);
  }
  // A Forwarded element that names no node (no `for`, malformed) does not count: the proxy's
  // header decides, and a copy of the truth is the truth.
  for (const char* forwarded :
       {"proto=http", "for=\"203.0.113.1", "for=a;for=b", "", "for=198.51.100.7"}) {
    INFO(forwarded);
    CHECK(resolver.resolve(proxy, forwarded, appended) == ClientAddress::parse(appended));
  }
}

TEST_CASE("behind a proxy that appends Forwarded, a client's own X-Forwarded-For picks no key") {
  const ClientAddressResolver resolver = behind_proxies(ProxyHeaders::kEither);
  const ClientAddress proxy = ClientAddress::parse("10.0.0.5");
  const std::string appended = "for=198.51.100.7;proto=https";
  for (const char* xff :
       {"203.0.113.1", "192.0.2.10", "unknown", "garbage", "198.51.100.6, 10.0.0.9"}) {
    INFO(xff);
    CHECK(resolver.resolve(proxy, appended, xff) == proxy);
  }
  CHECK(resolver.resolve(proxy, appended, "") == ClientAddress::parse("198.51.100.7"));
  CHECK(resolver.resolve(proxy, appended, "198.51.100.7") == ClientAddress::parse("198.51.100.7"));
  // Several trusted hops: the walks agree when the headers name the same client.
  CHECK(resolver.resolve(proxy, "for=203.0.113.9, for=10.0.0.8", "203.0.113.9, 10.0.0.8") ==
        ClientAddress::parse("203.0.113.9"));
}

// --- the resolver: IPv4 clients behind a translator ---------------------------------------------

// [attack] Behind a stateless translator with a prefix of its own, every IPv4 client arrives as
// one IPv6 /64: keyed as IPv6, one client spends the budget of every IPv4 client.
TEST_CASE("under an operator's translation prefix an IPv4 client is keyed as its IPv4 address") {
  const std::string_view prefix[] = {"2001:db8:46::/96"};
  auto resolver = ClientAddressResolver::create(std::initializer_list<std::string_view>{},
                                                ProxyHeaders::kEither, prefix);
  REQUIRE(resolver.ok());
  const ClientAddress a = resolver->resolve("2001:db8:46::c633:6401", "", "");
  const ClientAddress b = resolver->resolve("2001:db8:46::c633:6402", "", "");
  CHECK(a == ClientAddress::parse("198.51.100.1"));
  CHECK(b == ClientAddress::parse("198.51.100.2"));
  CHECK(network_key(a, {}) != network_key(b, {}));
  // Without the prefix the two share the translator's /64.
  auto plain = ClientAddressResolver::create(std::initializer_list<std::string_view>{});
  REQUIRE(plain.ok());
  CHECK(network_key(plain->resolve("2001:db8:46::c633:6401", "", ""), {}) ==
        network_key(plain->resolve("2001:db8:46::c633:6402", "", ""), {}));
  // Other IPv6 clients stay IPv6; IPv4 peers are untouched.
  CHECK(resolver->resolve("2001:db8:47::1", "", "") == ClientAddress::parse("2001:db8:47::1"));
  CHECK(resolver->resolve("203.0.113.7", "", "") == ClientAddress::parse("203.0.113.7"));
}

TEST_CASE("every RFC 6052 prefix length finds the IPv4 address past bits 64 to 71") {
  // 192.0.2.33 embedded under each length, as RFC 6052's table lays it out.
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"2001:db8::/32", "2001:db8:c000:221::"},
      {"2001:db8:100::/40", "2001:db8:1c0:2:21::"},
      {"2001:db8:122::/48", "2001:db8:122:c000:2:2100::"},
      {"2001:db8:122:300::/56", "2001:db8:122:3c0:0:221::"},
      {"2001:db8:122:344::/64", "2001:db8:122:344:c0:2:2100:0"},
      {"2001:db8:122:344::/96", "2001:db8:122:344::192.0.2.33"},
  };
  for (const auto& [prefix, address] : cases) {
    INFO(prefix << " " << address);
    const std::string_view prefixes[] = {prefix};
    auto resolver = ClientAddressResolver::create(std::initializer_list<std::string_view>{},
                                                  ProxyHeaders::kEither, prefixes);
    REQUIRE(resolver.ok());
    CHECK(resolver->translated(ClientAddress::parse(address)) ==
          ClientAddress::parse("192.0.2.33"));
  }
  // Bits 64-71 and the suffix are no part of the client: a set bit there names the same client.
  const std::string_view prefixes[] = {"2001:db8:122::/48"};
  auto resolver = ClientAddressResolver::create(std::initializer_list<std::string_view>{},
                                                ProxyHeaders::kEither, prefixes);
  REQUIRE(resolver.ok());
  CHECK(resolver->translated(ClientAddress::parse("2001:db8:122:c000:ff02:2100:ffff:1")) ==
        ClientAddress::parse("192.0.2.33"));
}

TEST_CASE("behind trusted proxies the client the walk settles on is translated") {
  const std::string_view trusted[] = {"10.0.0.0/8"};
  const std::string_view prefixes[] = {"2001:db8:46::/96"};
  auto resolver = ClientAddressResolver::create(trusted, ProxyHeaders::kEither, prefixes);
  REQUIRE(resolver.ok());
  CHECK(resolver->resolve("10.0.0.5", "", "2001:db8:46::c633:6401") ==
        ClientAddress::parse("198.51.100.1"));
  CHECK(resolver->resolve("10.0.0.5", "for=\"[2001:db8:46::c633:6402]\"", "") ==
        ClientAddress::parse("198.51.100.2"));
}

TEST_CASE("a translation prefix must be an IPv6 prefix of an RFC 6052 length") {
  for (const char* bad : {"10.0.0.0/8", "2001:db8::/72", "2001:db8::/128", "2001:db8::1/96",
                          "2001:db8::/33", "nonsense"}) {
    INFO(bad);
    const std::string_view prefixes[] = {bad};
    auto resolver = ClientAddressResolver::create(std::initializer_list<std::string_view>{},
                                                  ProxyHeaders::kEither, prefixes);
    REQUIRE_FALSE(resolver.ok());
    CHECK(resolver.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(message_of(resolver.status()).starts_with("ipv4_translation_prefixes[0]: "));
  }
  std::vector<std::string> many(ClientAddressResolver::kMaxTranslationPrefixes + 1,
                                "2001:db8::/32");
  auto resolver = ClientAddressResolver::create(std::initializer_list<std::string_view>{},
                                                ProxyHeaders::kEither, many);
  REQUIRE_FALSE(resolver.ok());
  CHECK(message_of(resolver.status()) == "ipv4_translation_prefixes: more than 16 prefixes");
}
