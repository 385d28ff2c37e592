// sluice/postgres/limiter.hpp — GCRA and fixed-window limiters with their state in PostgreSQL.
//
// `PostgresGcraLimiter` makes the decisions of sluice::GcraLimiter, `PostgresFixedWindowLimiter`
// those of sluice::FixedWindowLimiter (stacked windows, atomic across windows, a denial consumes
// nothing, cost 0 peeks, a cost above the smallest burst is InvalidArgument), with each key's
// state in one row, so every replica using the same database, name, windows and key seed shares
// one budget. The clock is the database's `pg_catalog.clock_timestamp()`, or the client's
// ClientOptions::time_source when set (tests drive a sluice::ManualClock through it).
//
//   auto client = sluice::postgres::Client::create({.connection = {.conninfo = "dbname=app"},
//                                                    .key_seed = kFleetSeed});
//   if (!client.ok()) return client.status();
//   auto limiter = sluice::postgres::PostgresGcraLimiter::create(
//       {{.requests = 10, .period = 1s}, {.requests = 600, .period = 60s}}, *client, "api");
//   absl::StatusOr<sluice::Decision> d = limiter->check(client_ip);
//   if (!d.ok()) { /* see sluice/postgres/client.hpp for the errors; fail open or closed */ }
//   else if (!d->allowed()) { respond_429(d->retry_after); }
//
// A capacity denial (Reason::kStoreFull) is returned for a new key whose shard is full; see
// sluice/postgres/schema.hpp. For operators, `inspect(key)` reports a key's state without
// consuming anything and `reset(key)` forgets it, with the in-memory limiters' semantics.
// One round trip per check, batch, inspect and reset; errors as listed in client.hpp.
// Thread-safety: thread-safe (the client is); copies share the client. Every call may run
// concurrently with every other, from any replica.
#ifndef SLUICE_POSTGRES_LIMITER_HPP_
#define SLUICE_POSTGRES_LIMITER_HPP_

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/decision.hpp"
#include "sluice/postgres/client.hpp"
#include "sluice/postgres/limit.hpp"
#include "sluice/rate_limiter.hpp"
#include "sluice/window.hpp"

namespace sluice::postgres {

// `Window` is sluice::GcraWindow or sluice::FixedWindow; use the aliases below.
template <class Window>
class PostgresLimiter {
 public:
  // InvalidArgument naming the bad window (see limit.hpp for the ranges) or a null client.
  static absl::StatusOr<PostgresLimiter> create(std::vector<Window> windows,
                                                std::shared_ptr<Client> client,
                                                std::string_view name = {}) {
    if (client == nullptr) return absl::InvalidArgumentError("sluice::postgres: null client");
    absl::StatusOr<Limit> limit = [&] {
      if constexpr (std::is_same_v<Window, GcraWindow>) {
        return Limit::gcra(std::move(windows), name);
      } else {
        return Limit::fixed_window(std::move(windows), name);
      }
    }();
    if (!limit.ok()) return limit.status();
    return PostgresLimiter(*std::move(limit), std::move(client));
  }

  absl::StatusOr<Decision> check(std::string_view key, std::uint64_t cost = 1) {
    const CheckItem item{key, &limit_, cost};
    return first(client_->check_all(std::span(&item, 1)));
  }

  // Every key for `cost`, all-or-nothing, in one round trip: one decision per key, in order.
  absl::StatusOr<std::vector<Decision>> check_batch(std::span<const std::string_view> keys,
                                                    std::uint64_t cost = 1) {
    absl::InlinedVector<CheckItem, 8> items;
    for (std::string_view key : keys) items.push_back({key, &limit_, cost});
    return client_->check_all(items, BatchMode::kAllOrNothing);
  }

  // --- Operators: inspect and reset one key.

  // The key's state without consuming anything: exactly what check(key, 0) reports (see
  // GcraLimiter::inspect and FixedWindowLimiter::inspect), decided at the database clock: reason
  // kAllowed, retry_after 0, remaining = units a request could take now from the window with the
  // least left, reset_after = until that window is full again (GCRA) or ends (fixed window; 0 if
  // it has counted nothing). A key never seen, or idle, reports every window full. Writes
  // nothing: it creates no row and never answers kStoreFull; a lost reply is Unavailable or
  // DeadlineExceeded, never Unknown. One round trip.
  absl::StatusOr<Decision> inspect(std::string_view key) { return check(key, 0); }

  // Forgets the key: its next check sees every window full, as for a key never seen, and its row
  // (and its slot in its shard) is free at once; a key without a row is left as it is. One round
  // trip, serialized with the checks of the key. Errors as for check (Unknown: the key
  // may or may not have been forgotten; resetting again is always safe).
  absl::Status reset(std::string_view key) { return client_->reset(key, limit_); }

  // Sorted shortest first; Decision::binding_window indexes this.
  const std::vector<Window>& windows() const noexcept {
    if constexpr (std::is_same_v<Window, GcraWindow>) {
      return limit_.gcra_windows();
    } else {
      return limit_.fixed_windows();
    }
  }
  const Limit& limit() const noexcept { return limit_; }
  const std::shared_ptr<Client>& client() const noexcept { return client_; }

 private:
  static_assert(std::is_same_v<Window, GcraWindow> || std::is_same_v<Window, FixedWindow>);

  PostgresLimiter(Limit limit, std::shared_ptr<Client> client)
      : limit_(std::move(limit)), client_(std::move(client)) {}

  static absl::StatusOr<Decision> first(absl::StatusOr<std::vector<Decision>> d) {
    if (!d.ok()) return d.status();
    return d->front();
  }

  Limit limit_;
  std::shared_ptr<Client> client_;
};

using PostgresGcraLimiter = PostgresLimiter<GcraWindow>;
using PostgresFixedWindowLimiter = PostgresLimiter<FixedWindow>;

static_assert(RateLimiter<PostgresGcraLimiter>);
static_assert(RateLimiter<PostgresFixedWindowLimiter>);

}  // namespace sluice::postgres

#endif  // SLUICE_POSTGRES_LIMITER_HPP_
