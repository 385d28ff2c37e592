// sluice::detail::HostResolver: a backend's host name is resolved within the call's deadline,
// whatever the system resolver does.
//
// The lookups here are stand-ins that block until the test lets them answer, so a resolver
// outage is reproduced without a name server; one case asks the system resolver for localhost.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <string_view>

#include "catch.hpp"
#include "sluice/detail/host_resolver.hpp"

namespace {

using sluice::detail::HostAddresses;
using sluice::detail::HostResolver;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

// A lookup that answers `addresses` once `go` is set, counting the lookups started.
struct BlockedLookup {
  std::shared_future<void> go;
  std::shared_ptr<std::atomic<int>> started = std::make_shared<std::atomic<int>>(0);

  absl::StatusOr<HostAddresses> operator()(const std::string& host) const {
    started->fetch_add(1);
    go.wait();
    return HostAddresses{"192.0.2.7", host == "db.internal" ? "2001:db8::7" : "192.0.2.8"};
  }
};

milliseconds since(steady_clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
}

}  // namespace

TEST_CASE("a numeric address is its own answer, without a lookup") {
  std::promise<void> never;
  BlockedLookup lookup{.go = never.get_future().share()};
  for (const std::string host : {"10.0.0.5", "::1", "2001:db8::5"}) {
    HostResolver resolver(host, lookup);
    absl::StatusOr<HostAddresses> addresses = resolver.resolve(steady_clock::now());
    REQUIRE(addresses.ok());
    CHECK(*addresses == HostAddresses{host});
  }
  CHECK(lookup.started->load() == 0);
}

TEST_CASE("a lookup that does not answer ends each call at its deadline, and runs only once") {
  std::promise<void> answer;
  BlockedLookup lookup{.go = answer.get_future().share()};
  HostResolver resolver("db.internal", lookup);
  resolver.start();  // the calls below wait for this lookup

  for (int call = 0; call < 3; ++call) {
    const steady_clock::time_point start = steady_clock::now();
    absl::StatusOr<HostAddresses> addresses = resolver.resolve(start + milliseconds(50));
    const milliseconds elapsed = since(start);
    CHECK(addresses.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(elapsed >= milliseconds(50));
    CHECK(elapsed < milliseconds(1000));
  }
  // Every call waited for the lookup start() began: one thread per host at most.
  CHECK(lookup.started->load() == 1);

  answer.set_value();
  absl::StatusOr<HostAddresses> addresses =
      resolver.resolve(steady_clock::now() + std::chrono::seconds(10));
  REQUIRE(addresses.ok());
  CHECK(*addresses == HostAddresses{"192.0.2.7", "2001:db8::7"});
  CHECK(lookup.started->load() <= 2);
}

TEST_CASE("a lookup that outlives its resolver finishes on its own") {
  std::promise<void> answer;
  BlockedLookup lookup{.go = answer.get_future().share()};
  {
    HostResolver resolver("db.internal", lookup);
    CHECK(resolver.resolve(steady_clock::now() + milliseconds(10)).status().code() ==
          absl::StatusCode::kDeadlineExceeded);
  }
  answer.set_value();  // the lookup's thread answers into state it owns, not the resolver's
  HostResolver again("db.internal", lookup);
  absl::StatusOr<HostAddresses> addresses =
      again.resolve(steady_clock::now() + std::chrono::seconds(10));
  REQUIRE(addresses.ok());
  CHECK(addresses->size() == 2);
}

TEST_CASE("a lookup's error is the call's, and the next call looks up again") {
  auto failures = std::make_shared<std::atomic<int>>(0);
  HostResolver resolver("db.internal",
                        [failures](const std::string&) -> absl::StatusOr<HostAddresses> {
                          if (failures->fetch_add(1) == 0)
                            return absl::UnavailableError("no name server answered");
                          return HostAddresses{"192.0.2.9"};
                        });
  const steady_clock::time_point far = steady_clock::now() + std::chrono::seconds(10);
  CHECK(resolver.resolve(far).status() == absl::UnavailableError("no name server answered"));
  absl::StatusOr<HostAddresses> addresses = resolver.resolve(far);
  REQUIRE(addresses.ok());
  CHECK(*addresses == HostAddresses{"192.0.2.9"});
}

TEST_CASE("the system resolver answers localhost with a loopback address") {
  HostResolver resolver("localhost");
  absl::StatusOr<HostAddresses> addresses =
      resolver.resolve(steady_clock::now() + std::chrono::seconds(10));
  INFO(addresses.status());
  REQUIRE(addresses.ok());
  CHECK(std::any_of(addresses->begin(), addresses->end(),
                    [](const std::string& a) { return a == "127.0.0.1" || a == "::1"; }));
}

TEST_CASE("a host name's control bytes reach a resolver's message escaped", "[attack]") {
  // The host comes from a config file (backend.address) or from a Redis Cluster node's
  // CLUSTER SLOTS reply; its message becomes a backend error event that services log. A line
  // feed or a terminal escape there would forge or hide log lines.
  const std::string host = "cache\n2026-12-07T00:00:00Z sluice: all clear\x1b[2J";
  const auto has_control_byte = [](const std::string& text) {
    return std::any_of(text.begin(), text.end(), [](char c) {
      const auto byte = static_cast<unsigned char>(c);
      return byte < 0x20 || byte == 0x7f;
    });
  };
  const std::string shown = "\"cache\\x0a2026-12-07T00:00:00Z sluice: all clear\\x1b[2J\"";

  std::promise<void> never;
  HostResolver stalled(host, BlockedLookup{.go = never.get_future().share()});
  const absl::Status late = stalled.resolve(steady_clock::now()).status();
  CHECK(late.code() == absl::StatusCode::kDeadlineExceeded);
  const std::string late_message(late.message());
  CHECK_FALSE(has_control_byte(late_message));
  CHECK(late_message.find(shown) != std::string::npos);

  // The system resolver finds no such host (or does not answer in time): either message.
  HostResolver system(host);
  const absl::Status failed =
      system.resolve(steady_clock::now() + std::chrono::seconds(5)).status();
  CHECK_FALSE(failed.ok());
  const std::string failed_message(failed.message());
  CHECK_FALSE(has_control_byte(failed_message));
  CHECK(failed_message.find(shown) != std::string::npos);
  never.set_value();
}
