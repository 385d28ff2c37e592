#include "sluice/decision.hpp"

#include <sstream>
#include <string>

#include "catch.hpp"
#include "sluice/rate_limiter.hpp"

using namespace std::chrono_literals;

TEST_CASE("a decision is allowed only for Reason::kAllowed") {
  CHECK(sluice::Decision{.reason = sluice::Reason::kAllowed}.allowed());
  CHECK_FALSE(sluice::Decision{.reason = sluice::Reason::kQuotaExceeded}.allowed());
  CHECK_FALSE(sluice::Decision{.reason = sluice::Reason::kStoreFull}.allowed());
}

TEST_CASE("reasons have stable names") {
  CHECK(sluice::to_string(sluice::Reason::kAllowed) == "allowed");
  CHECK(sluice::to_string(sluice::Reason::kQuotaExceeded) == "quota_exceeded");
  CHECK(sluice::to_string(sluice::Reason::kStoreFull) == "store_full");
}

TEST_CASE("a decision prints every field") {
  sluice::Decision d{.reason = sluice::Reason::kQuotaExceeded,
                     .limit = 10,
                     .remaining = 0,
                     .retry_after = 250ms,
                     .reset_after = 1s,
                     .binding_window = 1};
  std::ostringstream out;
  out << d;
  CHECK(out.str() ==
        "Decision{quota_exceeded, limit=10, remaining=0, retry_after=250000000ns, "
        "reset_after=1000000000ns, binding_window=1}");
}

namespace {
// The smallest thing that models RateLimiter: admits every third request.
struct EveryThird {
  int calls = 0;
  absl::StatusOr<sluice::Decision> check(std::string_view, std::uint64_t cost) {
    if (cost == 0) return absl::InvalidArgumentError("cost");
    bool allowed = (calls++ % 3) == 0;
    return sluice::Decision{.reason = allowed ? sluice::Reason::kAllowed
                                              : sluice::Reason::kQuotaExceeded};
  }
};
struct WrongReturn {
  bool check(std::string_view, std::uint64_t) { return true; }
};

template <sluice::RateLimiter L>
int admitted(L& limiter, int n) {
  int count = 0;
  for (int i = 0; i < n; ++i) {
    auto d = limiter.check("k", 1);
    count += d.ok() && d->allowed();
  }
  return count;
}
}  // namespace

TEST_CASE("generic code is written once against the RateLimiter concept") {
  STATIC_REQUIRE(sluice::RateLimiter<EveryThird>);
  STATIC_REQUIRE_FALSE(sluice::RateLimiter<WrongReturn>);
  STATIC_REQUIRE_FALSE(sluice::RateLimiter<int>);
  EveryThird limiter;
  CHECK(admitted(limiter, 9) == 3);
  CHECK(limiter.check("k", 0).status().code() == absl::StatusCode::kInvalidArgument);
}
