// GcraLimiter's reserve, cancel, wait, check_estimated and settle, and DirectGcraLimiter's
// reserve, cancel, wait and reset: exact instants and exact give-backs under a ManualClock.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "sluice/clock.hpp"
#include "sluice/direct_gcra.hpp"
#include "sluice/gcra.hpp"

using namespace std::chrono_literals;
using Gcra = sluice::GcraLimiter<sluice::ManualClock>;
using sluice::Decision;
using sluice::Reason;
using std::chrono::nanoseconds;

namespace {

Gcra make(sluice::ManualClock clock, std::vector<sluice::GcraWindow> windows,
          sluice::StoreOptions options = {.seed = 1}) {
  auto limiter = Gcra::create(std::move(windows), options, std::move(clock));
  REQUIRE(limiter.ok());
  return *std::move(limiter);
}
Decision check(Gcra& limiter, std::string_view key, std::uint64_t cost = 1) {
  auto d = limiter.check(key, cost);
  REQUIRE(d.ok());
  return *d;
}
Gcra::Reservation reserve(Gcra& limiter, std::string_view key, std::uint64_t cost = 1) {
  auto r = limiter.reserve(key, cost);
  REQUIRE(r.ok());
  return *std::move(r);
}
// How many cost-1 checks the key admits right now (consuming them).
int drain(Gcra& limiter, std::string_view key) {
  int admitted = 0;
  while (check(limiter, key).allowed()) ++admitted;
  return admitted;
}

}  // namespace

// --- reserve ----------------------------------------------------------------------------------

TEST_CASE("a reservation that fits now has no wait and books like an admitted check") {
  sluice::ManualClock clock(10s);
  Gcra limiter = make(clock, {{.requests = 10, .period = 1s}});
  Gcra::Reservation r = reserve(limiter, "k", 3);
  CHECK(r.wait() == 0ns);
  CHECK(r.instant() == 10s);
  CHECK(r.cost() == 3);
  CHECK(r.cancellable());
  Gcra twin = make(clock, {{.requests = 10, .period = 1s}});
  REQUIRE(check(twin, "k", 3).allowed());
  CHECK(limiter.inspect("k") == twin.inspect("k"));
  CHECK(drain(limiter, "k") == 7);
}

TEST_CASE("reservations queue one emission interval apart, and checks queue behind them") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 1, .period = 1s}});
  CHECK(reserve(limiter, "k").wait() == 0s);
  CHECK(reserve(limiter, "k").wait() == 1s);
  CHECK(reserve(limiter, "k").wait() == 2s);
  Decision d = check(limiter, "k");
  CHECK(d.reason == Reason::kQuotaExceeded);
  CHECK(d.retry_after == 3s);
  clock.advance(3s);
  CHECK(check(limiter, "k").allowed());
}

TEST_CASE("with stacked windows the instant is the latest any window needs, rounded up to a ns") {
  sluice::ManualClock clock;
  // T = 0.5 s, bucket 2; T = 10/3 s, bucket 3.
  Gcra limiter = make(clock, {{.requests = 2, .period = 1s}, {.requests = 3, .period = 10s}});
  CHECK(reserve(limiter, "k").wait() == 0ns);
  CHECK(reserve(limiter, "k").wait() == 0ns);
  // The 1 s window has room again at 0.5 s; the 10 s window still has one of 3.
  CHECK(reserve(limiter, "k").wait() == 500ms);
  // Now the 10 s window binds: its TAT is 10 s and a request needs 10/3 s within a 10 s bucket.
  CHECK(reserve(limiter, "k").wait() == 3'333'333'334ns);
  // A check waits for the same two windows.
  Decision d = check(limiter, "k");
  CHECK(d.reason == Reason::kQuotaExceeded);
  CHECK(d.retry_after == 6'666'666'667ns);
}

TEST_CASE("a reservation longer than max_wait is refused and books nothing") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 1, .period = 1s}});
  (void)reserve(limiter, "k");
  const Decision before = limiter.inspect("k");
  auto r = limiter.reserve("k", 1, 999ms);
  REQUIRE(r.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(r.status().message().find("1000000000 ns") != std::string_view::npos);
  CHECK(limiter.inspect("k") == before);
  CHECK(limiter.reserve("k", 1, 1s).ok());  // exactly max_wait is fine
}

TEST_CASE("a cost that can never fit is an error, never an endless wait") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 10, .period = 1s}, {.requests = 5, .period = 1min}});
  CHECK(limiter.reserve("k", 6).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(limiter.reserve("k", 0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(limiter.reserve("k", 5).ok());
  CHECK(limiter.stats().size == 1);
}

TEST_CASE("a reservation is refused beyond 2^61 ns ahead and a full store refuses new keys") {
  sluice::ManualClock clock;
  // T = 2^55 ns (the longest period), burst 1: reservation k starts k·2^55 ns ahead, so the 65th
  // (k = 64) starts exactly 2^61 ns ahead and the next would start past it.
  constexpr nanoseconds kT{std::int64_t{1} << 55};
  Gcra far = make(clock, {{.requests = 1, .period = kT}});
  for (int k = 0; k <= 64; ++k) REQUIRE(reserve(far, "k").wait() == k * kT);
  const sluice::Decision before = far.inspect("k");
  CHECK(far.reserve("k").status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(far.inspect("k") == before);

  Gcra full =
      make(clock, {{.requests = 1, .period = 1min}},
           {.max_keys_per_shard = 2, .overflow = sluice::Overflow::kRejectNewKeys, .seed = 1});
  int refused = 0;
  for (int i = 0; i < 1000 && refused == 0; ++i) {
    auto r = full.reserve("key-" + std::to_string(i));
    if (!r.ok()) {
      CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
      ++refused;
    }
  }
  CHECK(refused == 1);
}

// --- cancel -----------------------------------------------------------------------------------

TEST_CASE("cancelling right after reserving leaves the key exactly as it was") {
  sluice::ManualClock clock(1h);
  // Stacked windows, so that a reservation books a gap in the window that does not bind.
  Gcra limiter = make(clock, {{.requests = 2, .period = 1s}, {.requests = 3, .period = 10s}});
  Gcra twin = make(clock, {{.requests = 2, .period = 1s}, {.requests = 3, .period = 10s}});
  for (int i = 0; i < 2; ++i) {
    REQUIRE(check(limiter, "k").allowed());
    REQUIRE(check(twin, "k").allowed());
  }
  clock.advance(250ms);
  Gcra::Reservation r = reserve(limiter, "k", 2);
  REQUIRE(r.wait() > 0ns);
  CHECK(limiter.cancel(r));
  CHECK_FALSE(r.cancellable());
  CHECK(limiter.inspect("k") == twin.inspect("k"));
  // And the same decisions from here on.
  for (int i = 0; i < 12; ++i) {
    clock.advance(700ms);
    CHECK(check(limiter, "k") == check(twin, "k"));
  }
}

TEST_CASE("cancel after other traffic gives back exactly what the reservation booked") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 1, .period = 1s}});
  Gcra::Reservation a = reserve(limiter, "k");  // at 0
  Gcra::Reservation b = reserve(limiter, "k");  // at 1 s
  Gcra::Reservation c = reserve(limiter, "k");  // at 2 s
  REQUIRE(c.wait() == 2s);
  CHECK(check(limiter, "k").retry_after == 3s);  // a denied check books nothing
  CHECK(limiter.cancel(b));
  // One second given back: the next reservation starts where c's ended minus b's share.
  CHECK(check(limiter, "k").retry_after == 2s);
  Gcra::Reservation d = reserve(limiter, "k");
  CHECK(d.wait() == 2s);
  // Cancelling b again gives nothing more.
  CHECK_FALSE(limiter.cancel(b));
  CHECK(check(limiter, "k").retry_after == 3s);
  (void)a;
}

TEST_CASE("cancel gives back only the part of a booking still ahead of now") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 1, .period = 1s, .burst = 4}});
  Gcra::Reservation r = reserve(limiter, "k", 4);  // at 0, the whole bucket
  REQUIRE(r.wait() == 0ns);
  clock.advance(2500ms);  // 2.5 of the 4 have refilled; the instant has passed
  CHECK_FALSE(limiter.cancel(r));
  CHECK(drain(limiter, "k") == 2);  // floor(2.5)

  // At its instant a reservation can still be cancelled, and gives back all of itself.
  Gcra other = make(clock, {{.requests = 1, .period = 1s, .burst = 4}});
  REQUIRE(drain(other, "k") == 4);
  Gcra::Reservation later = reserve(other, "k", 2);
  REQUIRE(later.wait() == 2s);
  clock.advance(2s);
  CHECK(other.cancel(later));
  CHECK(drain(other, "k") == 2);  // the two that refilled, as if it had never been booked
}

TEST_CASE("a moved-from or default reservation cancels nothing") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 1, .period = 1s}});
  Gcra::Reservation r = reserve(limiter, "k");
  Gcra::Reservation moved = std::move(r);
  CHECK_FALSE(limiter.cancel(r));  // NOLINT(bugprone-use-after-move): what the test is about
  Gcra::Reservation none;
  CHECK_FALSE(limiter.cancel(none));
  CHECK(limiter.cancel(moved));
  CHECK(check(limiter, "k").allowed());
}

TEST_CASE("after a reset, cancelling an old reservation gives back nothing later traffic booked") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 1, .period = 1min, .burst = 5}});
  Gcra::Reservation r = reserve(limiter, "k", 5);
  limiter.reset("k");
  REQUIRE(drain(limiter, "k") == 5);  // the key's state is its own again: the bucket is spent
  CHECK(limiter.cancel(r));           // not passed, so it counts as cancelled...
  CHECK_FALSE(check(limiter, "k").allowed());  // ...but gives back nothing
}

// --- wait -------------------------------------------------------------------------------------

TEST_CASE("wait sleeps until the reservation's instant and books nothing past its deadline") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 2, .period = 1s}});
  std::vector<nanoseconds> slept;
  auto sleeper = [&](nanoseconds d) {
    slept.push_back(d);
    clock.advance(d);
  };
  CHECK(limiter.wait("k", 1, 10s, sleeper).ok());
  CHECK(limiter.wait("k", 1, 10s, sleeper).ok());
  CHECK(limiter.wait("k", 1, 10s, sleeper).ok());  // waits 0.5 s
  CHECK(slept == std::vector<nanoseconds>{500ms});
  CHECK(clock.now() == 500ms);

  const Decision before = limiter.inspect("k");
  absl::Status late = limiter.wait("k", 1, clock.now() + 499ms, sleeper);
  CHECK(late.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(limiter.inspect("k") == before);  // nothing booked
  CHECK(slept.size() == 1);
  CHECK(limiter.wait("k", 1, clock.now() - 1ns, sleeper).code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(limiter.wait("k", 3, clock.now() + 1h, sleeper).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(limiter.wait("k", 1, clock.now() + 500ms, sleeper).ok());
  CHECK(clock.now() == 1s);
}

TEST_CASE("wait with the default sleeper blocks the thread for the wait") {
  sluice::SteadyClock clock;
  auto limiter = sluice::GcraLimiter<>::create({{.requests = 1, .period = 20ms}}, {.seed = 1});
  REQUIRE(limiter.ok());
  REQUIRE(limiter->wait("k", 1, clock.now() + 1s).ok());
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(limiter->wait("k", 1, clock.now() + 1s).ok());
  // At least most of the 20 ms interval: the first call booked at most a few µs earlier.
  CHECK(std::chrono::steady_clock::now() - start >= 15ms);
}

// --- settle -----------------------------------------------------------------------------------

TEST_CASE("settling at the estimate changes nothing") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 10, .period = 1s}});
  auto e = limiter.check_estimated("k", 4);
  REQUIRE(e.ok());
  REQUIRE(e->decision.allowed());
  CHECK(e->decision.remaining == 6);
  auto after = limiter.settle(e->receipt, 4);
  REQUIRE(after.ok());
  CHECK(after->remaining == 6);
  CHECK_FALSE(e->receipt.open());
  CHECK(limiter.settle(e->receipt, 4).status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("settling above the estimate charges the difference, into debt") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 10, .period = 1s}});
  auto e = limiter.check_estimated("k", 2);
  REQUIRE(e.ok());
  auto after = limiter.settle(e->receipt, 25);  // 15 more than the bucket holds
  REQUIRE(after.ok());
  CHECK(after->reason == Reason::kQuotaExceeded);  // in debt: nothing left
  CHECK(after->remaining == 0);
  CHECK(after->retry_after == 1500ms);  // until the debt is paid
  Decision d = check(limiter, "k");
  CHECK_FALSE(d.allowed());
  CHECK(d.retry_after == 1600ms);  // and one interval more for a request
  clock.advance(1600ms);
  CHECK(check(limiter, "k").allowed());
  CHECK_FALSE(check(limiter, "k").allowed());
}

TEST_CASE("settling below the estimate refunds the surplus exactly") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 10, .period = 1s}, {.requests = 100, .period = 1min}});
  Gcra twin = make(clock, {{.requests = 10, .period = 1s}, {.requests = 100, .period = 1min}});
  auto e = limiter.check_estimated("k", 8);
  REQUIRE(e.ok());
  REQUIRE(check(twin, "k", 3).allowed());
  auto after = limiter.settle(e->receipt, 3);
  REQUIRE(after.ok());
  CHECK(*after == twin.inspect("k"));
  for (int i = 0; i < 10; ++i) {
    clock.advance(150ms);
    CHECK(check(limiter, "k") == check(twin, "k"));
  }
}

TEST_CASE("a refund never gives back what time already refilled or later requests booked") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 10, .period = 1s}});
  auto e = limiter.check_estimated("k", 10);  // the whole bucket, TAT 1 s ahead
  REQUIRE(e.ok());
  clock.advance(600ms);  // 6 refilled: only 0.4 s of the booking is still ahead
  REQUIRE(check(limiter, "k", 6).allowed());
  // Settling at 0 refunds only the 4 still ahead; the 6 just admitted stay booked.
  auto after = limiter.settle(e->receipt, 0);
  REQUIRE(after.ok());
  CHECK(after->remaining == 4);
  CHECK(drain(limiter, "k") == 4);

  // At the extremes: an estimate of the whole bucket settled at 0 right away is a full refund.
  auto whole = limiter.check_estimated("fresh", 10);
  REQUIRE(whole.ok());
  REQUIRE(limiter.settle(whole->receipt, 0).ok());
  CHECK(limiter.inspect("fresh") == limiter.inspect("never-seen"));
  CHECK(limiter.stats().size == 1);  // its room is free again: only "k" is tracked
}

TEST_CASE("a denied estimated check has no receipt to settle, and bad costs are errors") {
  sluice::ManualClock clock;
  Gcra limiter = make(clock, {{.requests = 10, .period = 1s}});
  REQUIRE(check(limiter, "k", 10).allowed());
  auto e = limiter.check_estimated("k", 1);
  REQUIRE(e.ok());
  CHECK_FALSE(e->decision.allowed());
  CHECK_FALSE(e->receipt.open());
  CHECK(limiter.settle(e->receipt, 0).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(limiter.check_estimated("k", 11).status().code() == absl::StatusCode::kInvalidArgument);
  auto ok = limiter.check_estimated("other", 1);
  REQUIRE(ok.ok());
  CHECK(limiter.settle(ok->receipt, (std::uint64_t{1} << 32) + 1).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ok->receipt.open());  // a refused settle leaves it open
}

TEST_CASE("a huge charge saturates at 2^61 ns of debt instead of overflowing") {
  sluice::ManualClock clock(nanoseconds{std::int64_t{1} << 61});
  Gcra limiter = make(clock, {{.requests = 1, .period = nanoseconds{std::int64_t{1} << 55}}});
  std::vector<Gcra::Receipt> receipts;
  for (int i = 0; i < 4; ++i) {
    auto e = limiter.check_estimated("k", 0);  // pay later: nothing booked yet
    REQUIRE(e.ok());
    REQUIRE(e->receipt.open());
    receipts.push_back(std::move(e->receipt));
  }
  for (Gcra::Receipt& r : receipts) REQUIRE(limiter.settle(r, std::uint64_t{1} << 32).ok());
  Decision d = limiter.inspect("k");
  CHECK_FALSE(d.allowed());
  CHECK(d.retry_after == nanoseconds{(std::int64_t{1} << 61) - (std::int64_t{1} << 55)});
}

// --- DirectGcraLimiter ------------------------------------------------------------------------

namespace {

using Direct = sluice::DirectGcraLimiter<sluice::ManualClock>;

// A scripted random sequence of checks, reservations, cancels and clock moves, applied to the
// keyed limiter (one key) and the unkeyed one: every answer must be the same.
void expect_same_script(const std::vector<sluice::GcraWindow>& windows, std::uint64_t seed) {
  sluice::ManualClock clock(7s);
  Gcra keyed = make(clock, windows);
  auto made = Direct::create(windows, clock);
  REQUIRE(made.ok());
  Direct& direct = *made;
  std::uint64_t max_cost = ~std::uint64_t{0};
  for (const auto& w : keyed.windows()) max_cost = std::min(max_cost, w.burst);
  std::mt19937_64 random(seed);
  std::vector<std::pair<Gcra::Reservation, Direct::Reservation>> open;
  for (int step = 0; step < 3000; ++step) {
    INFO("step " << step);
    const std::uint64_t cost = 1 + random() % max_cost;
    switch (random() % 6) {
      case 0:
        clock.advance(nanoseconds{static_cast<std::int64_t>(random() % 700'000'000)});
        break;
      case 1: {
        auto a = keyed.check("k", cost);
        auto b = direct.check(cost);
        REQUIRE(a.ok());
        REQUIRE(b.ok());
        REQUIRE(*a == *b);
        break;
      }
      case 2:
      case 3: {
        const auto max_wait = nanoseconds{static_cast<std::int64_t>(random() % 4'000'000'000)};
        auto a = keyed.reserve("k", cost, max_wait);
        auto b = direct.reserve(cost, max_wait);
        REQUIRE(a.status().code() == b.status().code());
        if (a.ok()) {
          REQUIRE(a->wait() == b->wait());
          REQUIRE(a->instant() == b->instant());
          open.emplace_back(*std::move(a), *std::move(b));
        }
        break;
      }
      case 4:
        if (!open.empty()) {
          const std::size_t i = random() % open.size();
          REQUIRE(keyed.cancel(open[i].first) == direct.cancel(open[i].second));
          open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
        }
        break;
      default:
        REQUIRE(keyed.inspect("k") == direct.inspect());
    }
  }
}

}  // namespace

TEST_CASE("DirectGcraLimiter reserves and cancels exactly as GcraLimiter does for one key") {
  expect_same_script({{.requests = 3, .period = 1s}}, 1);
  expect_same_script({{.requests = 3, .period = 1s, .burst = 5}}, 2);
  expect_same_script({{.requests = 2, .period = 1s}, {.requests = 5, .period = 10s}}, 3);
  expect_same_script({{.requests = 10, .period = 1s, .burst = 4},
                      {.requests = 30, .period = 10s},
                      {.requests = 100, .period = 1min}},
                     4);
}

TEST_CASE("DirectGcraLimiter's reset forgets every booking, and older reservations give nothing") {
  sluice::ManualClock clock;
  for (std::size_t windows : {1, 2}) {
    std::vector<sluice::GcraWindow> w{{.requests = 1, .period = 1min, .burst = 5}};
    if (windows == 2) w.push_back({.requests = 10, .period = 1h});
    auto made = Direct::create(w, clock);
    REQUIRE(made.ok());
    Direct& limiter = *made;
    auto r = limiter.reserve(5);
    REQUIRE(r.ok());
    CHECK(limiter.inspect().remaining == 0);
    limiter.reset();
    CHECK(limiter.inspect().remaining == 5);
    for (int i = 0; i < 5; ++i) REQUIRE(limiter.check()->allowed());
    CHECK(limiter.cancel(*r));
    CHECK_FALSE(limiter.check()->allowed());
  }
}

TEST_CASE("DirectGcraLimiter's wait sleeps until the instant, and refuses a cost that never fits") {
  sluice::ManualClock clock;
  auto made = Direct::create({{.requests = 2, .period = 1s}}, clock);
  REQUIRE(made.ok());
  auto sleeper = [&](nanoseconds d) { clock.advance(d); };
  CHECK(made->wait(2, 1s, sleeper).ok());
  CHECK(made->wait(1, 1s, sleeper).ok());
  CHECK(clock.now() == 500ms);
  CHECK(made->wait(1, clock.now() + 100ms, sleeper).code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(made->wait(3, clock.now() + 1h, sleeper).code() == absl::StatusCode::kInvalidArgument);
  CHECK(made->reserve(0).status().code() == absl::StatusCode::kInvalidArgument);
}

// --- concurrency (run under ThreadSanitizer in CI) --------------------------------------------

namespace {

// 8 threads reserve (with no wait allowed), cancel half of what they reserved, and check, on a
// frozen clock; then what is left is drained. The net bookings must be exactly the burst.
template <class Reserve, class Cancel, class Check>
std::int64_t net_bookings(Reserve reserve_one, Cancel cancel_one, Check check_one) {
  std::atomic<std::int64_t> net{0};
  std::vector<std::thread> threads;
  threads.reserve(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        if ((i + t) % 3 == 0) {
          if (check_one()) ++net;
        } else if (auto r = reserve_one(); r.ok()) {
          ++net;
          if (i % 2 == 0 && cancel_one(*r)) --net;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  while (check_one()) ++net;
  return net.load();
}

}  // namespace

TEST_CASE("concurrent reservations, cancels and checks book exactly the burst") {
  sluice::ManualClock clock(1s);  // frozen
  const std::vector<std::vector<sluice::GcraWindow>> configs = {
      {{.requests = 1, .period = 1min, .burst = 500}},
      {{.requests = 1, .period = 1min, .burst = 500}, {.requests = 1000, .period = 1h}}};
  for (const auto& windows : configs) {
    Gcra keyed = make(clock, windows);
    CHECK(net_bookings([&] { return keyed.reserve("k", 1, 0ns); },
                       [&](Gcra::Reservation& r) { return keyed.cancel(r); },
                       [&] { return keyed.check("k")->allowed(); }) == 500);
    auto direct = Direct::create(windows, clock);
    REQUIRE(direct.ok());
    CHECK(net_bookings([&] { return direct->reserve(1, 0ns); },
                       [&](Direct::Reservation& r) { return direct->cancel(r); },
                       [&] { return direct->check()->allowed(); }) == 500);
  }
}

TEST_CASE("a reservation or receipt of another limiter gives nothing back there", "[attack]") {
  sluice::ManualClock clock;
  // Two unkeyed limiters of one configuration: nothing names which one booked a reservation.
  auto booked = Direct::create({{.requests = 1, .period = 1min}}, clock);
  auto other = Direct::create({{.requests = 1, .period = 1min}}, clock);
  REQUIRE(booked.ok());
  REQUIRE(other.ok());
  auto direct = booked->reserve(1);
  REQUIRE(direct.ok());
  REQUIRE(other->check()->allowed());
  CHECK_FALSE(other->cancel(*direct));
  CHECK_FALSE(other->check()->allowed());  // its one request a minute is spent
  CHECK(direct->cancellable());            // still its own limiter's to cancel
  CHECK(booked->cancel(*direct));

  // Two keyed limiters under one digest seed (a fixed seed, as replicas or tests use).
  Gcra first = make(clock, {{.requests = 1, .period = 1min}});
  Gcra second = make(clock, {{.requests = 1, .period = 1min}});
  Gcra::Reservation r = reserve(first, "k");
  REQUIRE(check(second, "k").allowed());
  CHECK_FALSE(second.cancel(r));
  CHECK_FALSE(check(second, "k").allowed());
  CHECK(r.cancellable());

  auto estimated = first.check_estimated("j", 1);
  REQUIRE(estimated.ok());
  REQUIRE(estimated->decision.allowed());
  REQUIRE(check(second, "j").allowed());
  CHECK(second.settle(estimated->receipt, 0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(check(second, "j").allowed());
  CHECK(estimated->receipt.open());
}
