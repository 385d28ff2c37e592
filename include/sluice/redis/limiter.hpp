// sluice/redis/limiter.hpp — fleet-wide GCRA limits with their state in Redis.
//
// `RedisGcraLimiter` gives exactly the decisions of the in-memory GCRA limiter (sluice/gcra.hpp:
// stacked windows, atomic across windows, a denial consumes nothing, cost 0 peeks) while keeping
// each key's state in one Redis key, so every replica of a service shares one budget. A check is
// one round trip: one EVALSHA of the bundled script (sluice/redis/script.hpp), which reads the
// server's clock (Redis `TIME`), decides for every window of the key and reserves the cost
// atomically.
//
//   auto limiter = sluice::redis::RedisGcraLimiter::create(
//       {{.requests = 10, .period = std::chrono::seconds(1)},
//        {.requests = 600, .period = std::chrono::minutes(1)}},
//       {.connection = {.unix_socket = "/run/redis/redis.sock"},
//        .key_prefix = "rl:login:", .key_seed = kFleetSecretSeed});
//   if (!limiter.ok()) return limiter.status();          // invalid windows or options
//   absl::StatusOr<sluice::Decision> d = limiter->check(client_ip);
//   if (!d.ok()) { /* Unavailable / DeadlineExceeded: the caller fails open or closed */ }
//   else if (!d->allowed()) { respond_429(d->retry_after); }
//
// Units, key scheme and errors: as the client's (sluice/redis/client.hpp). Time: the server's
// TIME, or ClientOptions::time_source when set (tests drive a sluice::ManualClock through it).
// Thread-safety: thread-safe; copies share the client.
#ifndef SLUICE_REDIS_LIMITER_HPP_
#define SLUICE_REDIS_LIMITER_HPP_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/detail/open_flag.hpp"
#include "sluice/rate_limiter.hpp"
#include "sluice/redis/client.hpp"
#include "sluice/redis/detail/booking.hpp"
#include "sluice/redis/detail/exact_double.hpp"
#include "sluice/redis/detail/script_reply.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/redis/options.hpp"
#include "sluice/window.hpp"

namespace sluice::redis {

// Models sluice::RateLimiter.
class RedisGcraLimiter {
 public:
  // InvalidArgument for invalid windows (see Limit::create) or options; FailedPrecondition,
  // naming the fix, for a server that cannot hold the limits (Client::verify_server). Creation
  // succeeds while Redis cannot be reached (checks then report Unavailable); the server is checked
  // when a connection first opens.
  static absl::StatusOr<RedisGcraLimiter> create(std::vector<GcraWindow> windows,
                                                 ClientOptions options = {}) {
    absl::StatusOr<Limit> limit = Limit::create(std::move(windows));
    if (!limit.ok()) {
      return limit.status();
    }
    // Checks the server once (verify_server): the other overload's check would be a second wait
    // while Redis cannot be reached.
    absl::StatusOr<std::shared_ptr<Client>> client = Client::create(std::move(options));
    if (!client.ok()) {
      return client.status();
    }
    return RedisGcraLimiter(*std::move(limit), *std::move(client));
  }
  static absl::StatusOr<RedisGcraLimiter> create(std::vector<GcraWindow> windows,
                                                 std::shared_ptr<Client> client) {
    if (client == nullptr) {
      return absl::InvalidArgumentError("sluice::redis: null client");
    }
    absl::StatusOr<Limit> limit = Limit::create(std::move(windows));
    if (!limit.ok()) {
      return limit.status();
    }
    if (absl::Status verdict = client->verify_server(); !verdict.ok()) return verdict;
    return RedisGcraLimiter(*std::move(limit), std::move(client));
  }

  // cost 0 peeks (reports availability, changes nothing); a cost above the smallest burst is
  // InvalidArgument. One round trip, bounded by the client's timeouts; concurrent checks share
  // script calls when the client coalesces (ClientOptions::coalesce), each decided on its own.
  absl::StatusOr<Decision> check(std::string_view key, std::uint64_t cost = 1) {
    return client_->check({.key = key, .limit = &limit_, .cost = cost});
  }

  // The key's state without consuming anything: exactly what check(key, 0) reports (see
  // GcraLimiter::inspect), decided at the server's TIME. One round trip; creates no state.
  absl::StatusOr<Decision> inspect(std::string_view key) { return check(key, 0); }

  // Forgets the key (one script call, one round trip): its next check sees every window full;
  // reservations and receipts from before it give nothing back.
  absl::Status reset(std::string_view key) { return client_->reset(key, limit_); }

  // --- Reserve, cancel and wait; check_estimated and settle. GcraLimiter's exact rules
  // (sluice/gcra.hpp), decided at the server's TIME, one round trip each. A window's debt is
  // bounded by 2^52 ns (about 52 days) in Redis: a reservation that would pass it is refused
  // (ResourceExhausted), a charge saturates at it. Transport and server errors are returned as
  // by `check`; a reservation or receipt whose call failed is spent (what the server did with it
  // is unknown, and it is never retried).

  // One window of a booking: the TAT it left (ns since the Unix epoch × requests + fraction)
  // and what it added there (ns, fraction of 1/requests ns).
  struct BookedWindow {
    absl::uint128 tat = 0;
    std::uint64_t added_ns = 0;
    std::uint64_t added_frac = 0;
  };

  class Reservation {
   public:
    Reservation() = default;

    // From the server's clock reading at the reservation to its instant; 0: proceed now.
    std::chrono::nanoseconds wait() const noexcept { return wait_; }
    // The instant, in ns since the Unix epoch on the server's clock.
    std::chrono::nanoseconds instant() const noexcept { return instant_; }
    std::uint64_t cost() const noexcept { return cost_; }
    bool cancellable() const noexcept { return open_.is_open(); }

   private:
    friend class RedisGcraLimiter;
    std::string key_;  // the Redis key (a digest, never the caller's key)
    std::vector<BookedWindow> windows_;
    std::uint64_t serial_ = 0;  // the key's reset count when booked
    std::chrono::nanoseconds instant_{0}, wait_{0};
    std::uint64_t cost_ = 0;
    sluice::detail::OpenFlag open_;  // move-only: acted on at most once
  };

  class Receipt {
   public:
    Receipt() = default;

    std::uint64_t estimate() const noexcept { return booked_.estimate; }
    bool open() const noexcept { return open_.is_open(); }

   private:
    friend class RedisGcraLimiter;
    detail::Receipt booked_;
    sluice::detail::OpenFlag open_;  // move-only: acted on at most once
  };
  struct Estimated {
    Decision decision;
    Receipt receipt;  // open iff decision.allowed()
  };

  static constexpr std::chrono::nanoseconds kNoMaxWait = std::chrono::nanoseconds::max();

  // Books `cost` at the earliest instant at which it fits in every window (GcraLimiter::reserve).
  // InvalidArgument if cost is 0 or above the smallest burst; DeadlineExceeded if the instant
  // is more than `max_wait` away; ResourceExhausted past the 2^52 ns debt bound; Internal for
  // a reply the script cannot give (a wait past `max_wait`, a value out of range), so that no
  // reply makes `wait` sleep past its timeout. Nothing is booked on any other error.
  absl::StatusOr<Reservation> reserve(std::string_view key, std::uint64_t cost = 1,
                                      std::chrono::nanoseconds max_wait = kNoMaxWait) {
    if (cost == 0) return absl::InvalidArgumentError("a reservation's cost must be at least 1");
    if (cost > limit_.max_cost()) return cost_error();
    Reservation out;
    out.key_ = client_->redis_key(key, limit_);
    absl::StatusOr<Ints> reply =
        call(out.key_, "r", amount_params(cost), absl::StrCat(max_wait.count()));
    if (!reply.ok()) return reply.status();
    const Ints& v = *reply;
    const std::size_t n = limit_.windows().size();
    if (v.size() == 2 && v[0] == 1) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the cost fits in ", v[1], " ns, more than the ", max_wait.count(), " ns allowed"));
    }
    if (v.size() == 1 && v[0] == 2) {
      return absl::ResourceExhaustedError(
          "the reservation would put a window's debt past 2^52 ns, the Redis state's range");
    }
    // The script books only within max_wait, and never past the 2^52 ns debt bound: a wait
    // beyond either is not its reply, and would be slept on by `wait`.
    if (v.size() != 5 + 4 * n || v[0] != 0 || v[3] > detail::kMaxAmountNs ||
        static_cast<std::int64_t>(v[3]) > max_wait.count() ||
        !detail::booking_serial_in_range(v[4]) || !detail::booking_in_range(limit_, v, 5, 2)) {
      return malformed();
    }
    const absl::uint128 at = decision_time(v[1], v[2]);
    out.wait_ = std::chrono::nanoseconds{v[3]};
    out.instant_ = to_ns(at + v[3]);
    out.serial_ = v[4];
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t r = limit_.windows()[i].requests;
      out.windows_.push_back({.tat = at * r + absl::uint128(v[5 + 4 * i]) * r + v[6 + 4 * i],
                              .added_ns = v[7 + 4 * i],
                              .added_frac = v[8 + 4 * i]});
    }
    out.cost_ = cost;
    out.open_.open();
    return out;
  }

  // Gives back what `reservation` booked unless the server's clock has passed its instant
  // (GcraLimiter::cancel's rule). True iff cancelled; false if it had passed, or was not
  // cancellable. After a reset of the key it is cancelled but gives nothing back.
  absl::StatusOr<bool> cancel(Reservation& reservation) {
    if (!reservation.open_.take()) return false;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> amounts;
    for (const BookedWindow& w : reservation.windows_) {
      amounts.emplace_back(w.added_ns, w.added_frac);
    }
    std::vector<absl::uint128> tats;
    for (const BookedWindow& w : reservation.windows_) tats.push_back(w.tat);
    absl::StatusOr<Ints> reply =
        call(reservation.key_, "g", detail::booking_params(limit_, amounts),
             detail::give_back_extra(limit_, reservation.serial_, reservation.instant_, tats));
    if (!reply.ok()) return reply.status();
    if (reply->size() == 1 && (*reply)[0] == 3) return false;
    if (reply->size() != 3 + 2 * reservation.windows_.size() ||
        ((*reply)[0] != 0 && (*reply)[0] != 4)) {
      return malformed();
    }
    return true;
  }

  // Books `cost` if it fits within `timeout` from now on the server's clock, then sleeps until
  // its instant with `sleep_for`; DeadlineExceeded, with nothing booked, if it cannot fit by
  // then. The errors of `reserve` otherwise.
  template <class SleepFor = ThreadSleepFor>
  absl::Status wait(std::string_view key, std::uint64_t cost, std::chrono::nanoseconds timeout,
                    SleepFor&& sleep_for = {}) {
    if (timeout < std::chrono::nanoseconds{0}) {
      return absl::DeadlineExceededError("the deadline has passed");
    }
    absl::StatusOr<Reservation> r = reserve(key, cost, timeout);
    if (!r.ok()) return r.status();
    if (r->wait() > std::chrono::nanoseconds{0}) sleep_for(r->wait());
    return absl::OkStatus();
  }

  // `check(key, estimate)` that also returns a receipt of what it booked (GcraLimiter's).
  absl::StatusOr<Estimated> check_estimated(std::string_view key, std::uint64_t estimate) {
    if (estimate > limit_.max_cost()) return cost_error();
    Estimated out;
    detail::Receipt& booked = out.receipt.booked_;
    booked.key = client_->redis_key(key, limit_);
    absl::StatusOr<Ints> reply = call(booked.key, "e", amount_params(estimate), "");
    if (!reply.ok()) return reply.status();
    const Ints& v = *reply;
    const std::size_t n = limit_.windows().size();
    if (v.size() != 4 + 2 * n || (v[0] != 0 && v[0] != 5) ||
        !detail::booking_serial_in_range(v[3]) || !detail::booking_in_range(limit_, v, 4, 1)) {
      return malformed();
    }
    const absl::uint128 at = decision_time(v[1], v[2]);
    std::vector<detail::ScaledWindow> scaled(n);
    for (std::size_t i = 0; i < n; ++i) {
      const GcraWindow& w = limit_.windows()[i];
      const absl::uint128 period = static_cast<std::uint64_t>(w.period.count());
      scaled[i].before = absl::uint128(v[4 + 2 * i]) * w.requests + v[5 + 2 * i];
      scaled[i].after = scaled[i].before + absl::uint128(estimate) * period;
      scaled[i].burst = absl::uint128(w.burst) * period;
    }
    const bool admitted = detail::admits(scaled);
    if (admitted != (v[0] == 0)) return malformed();
    out.decision = admitted ? detail::admitted_decision(limit_.windows(), scaled)
                            : detail::denied_decision(limit_.windows(), scaled);
    if (admitted) {
      for (std::size_t i = 0; i < n; ++i) {
        booked.tats.push_back(at * limit_.windows()[i].requests + scaled[i].after);
      }
      booked.serial = v[3];
      booked.estimate = estimate;
      out.receipt.open_.open();
    }
    return out;
  }

  // Settles `receipt` at `actual` units (GcraLimiter::settle's rules) and returns the key's
  // state after it, as `inspect` would. FailedPrecondition if the receipt is not open;
  // InvalidArgument if actual > 2^32.
  absl::StatusOr<Decision> settle(Receipt& receipt, std::uint64_t actual) {
    if (actual > (std::uint64_t{1} << 32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("an actual cost must be at most 2^32, got ", actual));
    }
    if (!receipt.open_.take()) {
      return absl::FailedPreconditionError("the receipt was settled already or never admitted");
    }
    return detail::settle_receipt(*client_, limit_, receipt.booked_, actual);
  }

  // Sorted shortest period first; Decision::binding_window indexes this.
  const std::vector<GcraWindow>& windows() const noexcept { return limit_.windows(); }
  const Limit& limit() const noexcept { return limit_; }
  const std::shared_ptr<Client>& client() const noexcept { return client_; }
  std::string redis_key(std::string_view key) const { return client_->redis_key(key, limit_); }

 private:
  RedisGcraLimiter(Limit limit, std::shared_ptr<Client> client)
      : limit_(std::move(limit)), client_(std::move(client)) {}

  using Ints = detail::BookingInts;
  static constexpr std::uint64_t kNanos = 1'000'000'000;

  static absl::Status malformed() { return detail::malformed_booking_reply(); }
  absl::Status cost_error() const {
    return absl::InvalidArgumentError(
        "sluice::redis: cost exceeds the smallest burst of the limit and can never pass");
  }
  static absl::uint128 decision_time(std::uint64_t s, std::uint64_t ns) {
    return absl::uint128(s) * kNanos + ns;
  }
  static std::chrono::nanoseconds to_ns(absl::uint128 t) {
    return std::chrono::nanoseconds{static_cast<std::int64_t>(absl::Uint128Low64(t))};
  }
  std::string amount_params(std::uint64_t cost) const {
    return detail::booking_params(limit_, cost);
  }
  absl::StatusOr<Ints> call(const std::string& redis_key, std::string_view op, std::string params,
                            std::string extra) {
    return detail::call_booking(*client_, redis_key, op, std::move(params), std::move(extra));
  }

  Limit limit_;
  std::shared_ptr<Client> client_;
};

static_assert(sluice::RateLimiter<RedisGcraLimiter>);

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_LIMITER_HPP_
