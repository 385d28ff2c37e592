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
