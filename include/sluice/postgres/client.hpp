// sluice/postgres/client.hpp — checks against limits whose state lives in PostgreSQL.
//
// A `Client` owns the connection pool, the key seed and the time source, and decides batches:
// every item of a batch is decided in one call of the server-side function `sluice.check_v2` (one
// round trip, one transaction) at one reading of the database clock,
// `pg_catalog.clock_timestamp()` (or of ClientOptions::time_source when set). The function locks
// the shards of the batch's keys in ascending order, decides, and stores. A lone item of a
// one-window GCRA limit with cost >= 1 (a limiter's `check`) calls `sluice.check_one_v1` instead:
// a key that has a row is decided and stored in one UPDATE under its row lock alone, a key that
// has none goes on to check_v2 in the same call. Such checks that start while others are in
// flight share one statement over their distinct keys (ClientOptions::coalesce; docs/postgres.md,
// "Concurrent checks share a statement"). `reset` forgets one key in one call of
// `sluice.reset_v1`, under its shard's lock likewise.
//
//   auto client = sluice::postgres::Client::create({.connection = {.conninfo = "dbname=app"},
//                                                    .key_seed = kFleetSeed});
//   auto per_user = sluice::postgres::Limit::gcra({{.requests = 10, .period = 1s}}, "user");
//   auto per_org = sluice::postgres::Limit::gcra({{.requests = 100, .period = 1s}}, "org");
//   sluice::postgres::CheckItem items[] = {{user_id, &*per_user}, {org_id, &*per_org, 5}};
//   absl::StatusOr<std::vector<sluice::Decision>> d = (*client)->check_all(items);
//
// Batch modes: kAllOrNothing stores nothing unless every item is admitted (a denied batch
// consumes nothing anywhere); kEachItem decides and stores each item on its own. Items repeating
// a key see the earlier items' effect. Each item has its own cost (0: a peek, which stores
// nothing). Keys reach the database only as 16-byte digests (seeded
// XXH3-128 over the limit's identity and the key).
//
// Errors (absl::Status), never a silent allow, never retried:
//   InvalidArgument — a bad cost or batch; nothing was sent.
//   Unavailable / DeadlineExceeded — the call did not run or was rolled back: nothing consumed
//     (includes the server's statement timeout, a terminated backend, no free connection).
//   Unknown — the acknowledgement of the call's commit was lost (connection broken or reply
//     later than statement_timeout + reply_grace): it may or may not have consumed.
//   FailedPrecondition — the schema is not installed, or older than this header (call migrate).
//   Internal — a reply out of shape.
// Thread-safety: thread-safe; share one Client between limiters and engine generations.
#ifndef SLUICE_POSTGRES_CLIENT_HPP_
#define SLUICE_POSTGRES_CLIENT_HPP_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/decision.hpp"
#include "sluice/detail/coalescer.hpp"
#include "sluice/key.hpp"
#include "sluice/postgres/connection_pool.hpp"
#include "sluice/postgres/detail/check_call.hpp"
#include "sluice/postgres/limit.hpp"

namespace sluice::postgres {

struct ClientOptions {
  ConnectionOptions connection{};
  // Seeds the key digests. Every replica sharing limits must use the same seed; keep it secret so
  // that clients cannot aim their keys at one shard.
  std::uint64_t key_seed = 0;
  // Empty (the default): decide on the database clock. See TimeSource (connection_pool.hpp).
  TimeSource time_source{};
  // Concurrent single-key checks (a limiter's `check`) of one limit and cost, whose interval is a
  // whole number of nanoseconds, decided on the database clock (no time_source), that start
  // while max_coalesced_calls such calls are in flight queue and go out together as one
  // statement: up to max_coalesced_checks distinct keys, one transaction and one commit, each
  // key decided on its own exactly as when sent alone. A check that finds fewer calls in flight
  // is sent at once, alone, so one caller sees no change.
  bool coalesce = true;
  std::size_t max_coalesced_checks = 64;  // 1..1000: keys in one statement
  // 1..1000: such statements in flight at once. 2 by measurement (docs/benchmarks.md, 2-vCPU
  // host, three interleaved rounds each, against a prepared upsert per check): 2 in flight did
  // 2.8-3.2x its rate at 32 callers and 0.94-1.12x at 8; 4 did 1.4-2.3x and 0.92-1.10x; 8 did
  // 1.6-2.6x and 0.68-0.97x.
  std::size_t max_coalesced_calls = 2;
};

// Where a key's state may still be held under an earlier GCRA limit: the key it had there.
struct CarriedFrom {
  std::string_view key{};
  const Limit* limit = nullptr;
};

// One key against one limit, for `cost` units (0 peeks). `limit` must outlive the call.
// `carried_from` (GCRA only; the policy engine sets it for a rule whose windows a reload
// changed): when the key has no row under `limit`, the same call first gives it the spent share
// of its rows under those limits (sluice.check_carried_v1; schema version 4).
struct CheckItem {
  std::string_view key{};
  const Limit* limit = nullptr;
  std::uint64_t cost = 1;
  std::span<const CarriedFrom> carried_from{};
};

enum class BatchMode {
  kAllOrNothing,  // stored only if every item is admitted
  kEachItem,      // each item decided and stored on its own
};

class Client {
 public:
  // Connects lazily: creation succeeds while the database is down.
  // InvalidArgument: bad connection options, or max_coalesced_checks or max_coalesced_calls
  // outside 1..1000.
  static absl::StatusOr<std::shared_ptr<Client>> create(ClientOptions options) {
    for (const std::size_t n : {options.max_coalesced_checks, options.max_coalesced_calls}) {
      if (n == 0 || n > 1000) {
        return absl::InvalidArgumentError(
            "sluice::postgres: max_coalesced_checks and max_coalesced_calls must be in 1..1000");
      }
    }
    absl::StatusOr<std::shared_ptr<ConnectionPool>> pool =
        ConnectionPool::create(std::move(options.connection));
    if (!pool.ok()) return pool.status();
    return std::make_shared<Client>(*std::move(pool), std::move(options));
  }

  // A client over `pool` (options.connection is not used). Coalesces as `options` say.
  Client(std::shared_ptr<ConnectionPool> pool, ClientOptions options)
      : pool_(std::move(pool)),
        hasher_(options.key_seed),
        time_source_(std::move(options.time_source)),
        coalesce_(options.coalesce),
        coalescer_(options.max_coalesced_checks, options.max_coalesced_calls) {}

  Client(std::shared_ptr<ConnectionPool> pool, std::uint64_t key_seed, TimeSource time_source = {})
      : Client(std::move(pool),
               ClientOptions{.key_seed = key_seed, .time_source = std::move(time_source)}) {}

  // Decides every item for its cost in one round trip. All items must use limits of one
  // algorithm. One decision per item, in order.
  absl::StatusOr<std::vector<Decision>> check_all(std::span<const CheckItem> items,
                                                  BatchMode mode = BatchMode::kAllOrNothing) {
    if (items.empty()) return std::vector<Decision>{};
    const detail::Deadline deadline = pool_->call_deadline();  // building the call counts too
    absl::InlinedVector<KeyDigest, 8> digests;
    absl::InlinedVector<const Limit*, 8> limits;
    absl::InlinedVector<std::uint64_t, 8> costs;
    std::vector<detail::CarrySourceParam> sources;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const CheckItem& item = items[i];
      if (absl::Status valid = validate(item, items[0].limit); !valid.ok()) return valid;
      digests.push_back(digest(item.key, *item.limit));
      limits.push_back(item.limit);
      costs.push_back(item.cost);
      for (const CarriedFrom& from : item.carried_from) {
        sources.push_back(
            {.item = i, .digest = digest(from.key, *from.limit), .limit = from.limit});
      }
    }
    const bool carrying = !sources.empty();
    const std::optional<std::chrono::nanoseconds> unix_time = now();
    const char* name = detail::kCheckStatement;
    const char* sql = detail::kCheckSql;
    std::vector<Param> params;
    if (detail::fits_check_one(limits, costs, carrying)) {
      // One key of a one-window GCRA limit: one UPDATE, in bigint when the interval is whole,
      // shared with concurrent checks of the same limit and cost when coalescing.
      if (std::optional<std::vector<Param>> whole =
              detail::check_interval_params(digests[0], *limits[0], costs[0], unix_time)) {
        if (coalesce_ && !unix_time) {  // a time source's times differ: nothing would share
          return check_coalesced(digests[0],
                                 SetGroup{.limit = limits[0], .cost = costs[0], .time = unix_time},
                                 deadline);
        }
        name = detail::kCheckIntervalStatement;
        sql = detail::kCheckIntervalSql;
        params = *std::move(whole);
      } else {
        name = detail::kCheckOneStatement;
        sql = detail::kCheckOneSql;
        params = detail::check_one_params(digests[0], *limits[0], costs[0], unix_time);
      }
    } else {
      params = detail::check_params(items[0].limit->algorithm(), digests, limits, costs,
                                    mode == BatchMode::kAllOrNothing, unix_time);
      if (carrying) {
        name = detail::kCheckCarriedStatement;
        sql = detail::kCheckCarriedSql;
        detail::append_carry_params(sources, params);
      }
    }
    // A peek writes nothing, so a lost reply to it is plain Unavailable / DeadlineExceeded.
    const bool writes = std::any_of(costs.begin(), costs.end(), [](auto c) { return c > 0; });
    absl::StatusOr<detail::ResultPtr> r =
        run(name, sql, params,
            writes || carrying ? detail::Effect::kWrites : detail::Effect::kReadOnly, deadline);
    if (!r.ok()) return r.status();
    if (PQntuples(r->get()) != 1 || PQnfields(r->get()) != 1 || PQgetisnull(r->get(), 0, 0)) {
      return absl::InternalError("sluice::postgres: malformed reply from sluice.check_v2");
    }
    return detail::decode_check_reply(PQgetvalue(r->get(), 0, 0), limits);
  }

  // Checks that went out in one statement together with at least one other check.
  std::uint64_t coalesced_checks() const { return coalescer_.coalesced_checks(); }
  // The most coalescing statements that were in flight at once (≤ max_coalesced_calls).
  std::size_t peak_coalesced_calls() const { return coalescer_.peak_in_flight(); }

  const TimeSource& time_source() const noexcept { return time_source_; }

  // Forgets `key` under `limit`: deletes its row, so that its next check sees every window full,
  // as for a key never seen; a key without a row is left as it is. One round trip (one
  // transaction, under the key's shard lock and then its row lock: it falls wholly before or
  // after each check of that key). Errors as for check_all; Unknown means the row may or may not
  // have been deleted, and resetting again is always safe.
  absl::Status reset(std::string_view key, const Limit& limit) {
    Param param{.value = {}, .binary = true};
    detail::append_digest(param.value, digest(key, limit));
    absl::StatusOr<ConnectionPool::Lease> lease = pool_->acquire();
    if (!lease.ok()) return lease.status();
    absl::StatusOr<detail::ResultPtr> r =
        lease->run("sluice_reset_v1", "SELECT sluice.reset_v1($1::bytea)", std::span(&param, 1),
                   detail::Effect::kWrites);
    if (!r.ok()) return r.status();
    if (PQntuples(r->get()) != 1 || PQnfields(r->get()) != 1 || PQgetisnull(r->get(), 0, 0)) {
      return absl::InternalError("sluice::postgres: malformed reply from sluice.reset_v1");
    }
    return absl::OkStatus();
  }

  // The digest stored for `key` under `limit` (for operators and tests).
  KeyDigest digest(std::string_view key, const Limit& limit) const {
    std::string bytes = limit.identity();
    append_key_part(bytes, key);
    return hasher_(bytes);
  }

  ConnectionPool& pool() const noexcept { return *pool_; }
  const std::shared_ptr<ConnectionPool>& shared_pool() const noexcept { return pool_; }

 private:
  static absl::Status validate(const CheckItem& item, const Limit* first) {
    if (item.limit == nullptr || first == nullptr ||
        item.limit->algorithm() != first->algorithm()) {
      return absl::InvalidArgumentError(
          "sluice::postgres: every item of a batch needs a limit, all of one algorithm");
    }
    for (const CarriedFrom& from : item.carried_from) {
      if (from.limit == nullptr || from.limit->algorithm() != Algorithm::kGcra ||
          item.limit->algorithm() != Algorithm::kGcra) {
        return absl::InvalidArgumentError(
            "sluice::postgres: a key's state is carried between GCRA limits only");
      }
    }
    if (item.cost > item.limit->max_cost()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sluice::postgres: cost ", item.cost, " exceeds the smallest burst ",
                       item.limit->max_cost(), " and can never be admitted"));
    }
    return absl::OkStatus();
  }

  // What coalesced checks share: the limit, the cost and the time they are decided at.
  struct SetGroup {
    const Limit* limit = nullptr;
    std::uint64_t cost = 0;
    std::optional<std::chrono::nanoseconds> time;
    bool operator==(const SetGroup&) const = default;
  };
  // Two checks of one key never share a statement: its UPDATE would store the key once.
  struct SameKey {
    bool operator()(const KeyDigest& a, const KeyDigest& b) const noexcept { return a == b; }
  };

  // One check of `key` in `group`, alone or sharing a statement with concurrent ones.
  absl::StatusOr<std::vector<Decision>> check_coalesced(const KeyDigest& key, const SetGroup& group,
                                                        detail::Deadline deadline) {
    absl::StatusOr<Decision> d = coalescer_.check(
        key, group, deadline,
        [this](std::span<const KeyDigest> keys, const SetGroup& g, detail::Deadline by,
               std::span<absl::StatusOr<Decision>> results) { check_set(keys, g, by, results); });
    if (!d.ok()) return d.status();
    return std::vector<Decision>{*d};
  }

  absl::StatusOr<detail::ResultPtr> run(const char* name, const char* sql,
                                        std::span<const Param> params, detail::Effect effect,
                                        detail::Deadline deadline) {
    absl::StatusOr<ConnectionPool::Lease> lease = pool_->acquire(deadline);
    if (!lease.ok()) return lease.status();
    return lease->run(name, sql, params, effect, deadline);
  }

  // Coalesced checks of distinct `keys` under one limit and cost, by `deadline`: one statement,
  // one result per key. A key the statement left alone (another session held its shard) is sent
  // again on its own, by the same deadline; nothing that may have run is sent again.
  void check_set(std::span<const KeyDigest> keys, const SetGroup& group, detail::Deadline deadline,
                 std::span<absl::StatusOr<Decision>> results) {
    if (keys.size() == 1) {
      results[0] = check_alone(keys[0], group, deadline);
      return;
    }
    const auto fill = [&](const absl::Status& status) {
      std::fill(results.begin(), results.end(), status);
    };
    std::optional<std::vector<Param>> params =
        detail::check_set_params(keys, *group.limit, group.cost, group.time);
    if (!params) {  // not reached: the group's first check had these parameters
      return fill(absl::InternalError("sluice::postgres: no statement for a coalesced check"));
    }
    absl::StatusOr<detail::ResultPtr> r = run(detail::kCheckSetStatement, detail::kCheckSetSql,
                                              *params, detail::Effect::kWrites, deadline);
    if (!r.ok()) return fill(r.status());
    if (PQntuples(r->get()) != static_cast<int>(keys.size()) || PQnfields(r->get()) != 1) {
      return fill(absl::InternalError("sluice::postgres: malformed reply to coalesced checks"));
    }
    std::vector<std::size_t> left;  // keys of shards another session held
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const int row = static_cast<int>(i);
      if (PQgetisnull(r->get(), row, 0)) {
        left.push_back(i);
      } else {
        results[i] = decoded(PQgetvalue(r->get(), row, 0), *group.limit);
      }
    }
    for (const std::size_t i : left) results[i] = check_alone(keys[i], group, deadline);
  }

  // One check of `key` in `group`, alone: the one-key statement (no shard lock for a key that
  // has a row), by `deadline`.
  absl::StatusOr<Decision> check_alone(const KeyDigest& key, const SetGroup& group,
                                       detail::Deadline deadline) {
    std::optional<std::vector<Param>> params =
        detail::check_interval_params(key, *group.limit, group.cost, group.time);
    if (!params) {  // not reached: the group's first check had these parameters
      return absl::InternalError("sluice::postgres: no statement for a coalesced check");
    }
    absl::StatusOr<detail::ResultPtr> r =
        run(detail::kCheckIntervalStatement, detail::kCheckIntervalSql, *params,
            detail::Effect::kWrites, deadline);
    if (!r.ok()) return r.status();
    if (PQntuples(r->get()) != 1 || PQnfields(r->get()) != 1 || PQgetisnull(r->get(), 0, 0)) {
      return absl::InternalError("sluice::postgres: malformed reply to coalesced checks");
    }
    return decoded(PQgetvalue(r->get(), 0, 0), *group.limit);
  }

  // One check's reply under the one-window `limit`.
  static absl::StatusOr<Decision> decoded(const char* reply, const Limit& limit) {
    const Limit* const limits[] = {&limit};
    absl::StatusOr<std::vector<Decision>> d = detail::decode_check_reply(reply, limits);
    if (!d.ok()) return d.status();
    return (*d)[0];
  }

  // The time source's reading, or nullopt for the database clock.
  std::optional<std::chrono::nanoseconds> now() const {
    if (!time_source_) return std::nullopt;
    return time_source_();
  }

  std::shared_ptr<ConnectionPool> pool_;
  KeyHasher hasher_;
  TimeSource time_source_;
  bool coalesce_ = true;
  sluice::detail::Coalescer<KeyDigest, SetGroup, SameKey> coalescer_;
};

}  // namespace sluice::postgres

#endif  // SLUICE_POSTGRES_CLIENT_HPP_
