// sluice/postgres/schema.hpp — installing sluice's schema, and the bounded cleanup of idle rows.
//
// Call `migrate` before serving traffic (at deploy, or at every start: it is idempotent). It
// installs schema `sluice` — versioned in `sluice.schema_version`; each version is applied once,
// in one transaction, under an advisory lock, so concurrent replicas can all call it — and sets
// the per-shard row capacity. Schedule `cleanup_expired` to delete idle rows (keys whose every
// window is full again, which behave exactly like keys never seen).
//
//   auto pool = sluice::postgres::ConnectionPool::create({.conninfo = "dbname=app"});
//   absl::StatusOr<int> version = sluice::postgres::migrate(**pool, {.rows_per_shard = 8192});
//   ...
//   // every few seconds, from one replica or all:
//   absl::StatusOr<std::uint64_t> deleted = sluice::postgres::cleanup_expired(**pool, 1000);
//
// Capacity: 256 shards (the first byte of a key's digest) × rows_per_shard rows. A new key whose
// shard is full is denied with Reason::kStoreFull (after the check itself reclaims up to 16 idle
// rows of that shard); existing keys keep working, and live rows are never evicted.
// Thread-safety: both functions may run concurrently with checks and with each other.
#ifndef SLUICE_POSTGRES_SCHEMA_HPP_
#define SLUICE_POSTGRES_SCHEMA_HPP_

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/postgres/connection_pool.hpp"
#include "sluice/postgres/detail/schema_sql.hpp"

namespace sluice::postgres {

// The schema version this header installs and calls. Version 2 adds what `reset` calls, version
// 3 a check with a cost per item, version 4 a check that carries a key's state from earlier
// limits (a rule whose windows changed), version 5 the one-key check of one UPDATE (rows updated
// in place, no shard lock for a key that has a row), version 6 drops the CHECK constraint on the
// digest's length (the functions check it; PostgreSQL parsed the constraint again at every
// write); an older database is upgraded in place by `migrate`, keeping every row.
inline constexpr int kSchemaVersion = 6;
static_assert(std::size(detail::kSchemaSteps) == static_cast<std::size_t>(kSchemaVersion));
// Shards of the row bound: worst case rows = kShards × rows_per_shard.
inline constexpr int kShards = 256;

namespace detail {

// The integer that is the whole value of a result of one row and one field, or nothing (another
// shape, or a value that is not exactly one integer of the type: "7abc" is nothing).
template <class Integer>
std::optional<Integer> single_integer(const PGresult* result) {
  if (PQntuples(result) != 1 || PQnfields(result) != 1 || PQgetisnull(result, 0, 0)) {
    return std::nullopt;
  }
  const std::string_view value(PQgetvalue(result, 0, 0));
  Integer n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc{} || end != value.data() + value.size()) return std::nullopt;
  return n;
}

}  // namespace detail

struct MigrationOptions {
  std::uint32_t rows_per_shard = 4096;  // 1..2^31-1; applies to every replica (stored in the DB)
  std::chrono::milliseconds timeout{30'000};  // for the whole migration transaction
};

// Installs every schema version up to kSchemaVersion not yet installed and sets the capacity.
// Returns the installed version. Running it again changes nothing but the capacity. On a database
// a newer sluice migrated it installs nothing and returns that newer version: a replica of the
// older release (mid-deploy, or rolled back) still starts, and the functions it calls are kept
// by every later version, as verify_database assumes.
inline absl::StatusOr<int> migrate(ConnectionPool& pool, const MigrationOptions& options = {}) {
  if (options.rows_per_shard < 1 || options.rows_per_shard > 0x7fffffffU) {
    return absl::InvalidArgumentError("sluice::postgres: rows_per_shard must be in [1, 2^31-1]");
  }
  absl::StatusOr<ConnectionPool::Lease> lease = pool.acquire();
  if (!lease.ok()) return lease.status();
  std::string steps;
  for (int version = 1; version <= kSchemaVersion; ++version) {
    absl::StrAppend(
        &steps, "IF NOT EXISTS (SELECT 1 FROM sluice.schema_version WHERE version = ", version,
        ") THEN\n", detail::kSchemaSteps[version - 1],
        "INSERT INTO sluice.schema_version (version) VALUES (", version, ");\nEND IF;\n");
  }
  // One simple query without BEGIN: the server runs it as one implicit transaction, so an error
  // anywhere (a timeout waiting for another replica's lock, say) rolls all of it back and leaves
  // the session idle, never inside an aborted transaction.
  const std::string sql = absl::StrCat(
      "SET LOCAL client_min_messages = warning;\n"
      "SET LOCAL statement_timeout = ",
      options.timeout.count(), ";\nSET LOCAL lock_timeout = ", options.timeout.count(),
      ";\nSELECT pg_catalog.pg_advisory_xact_lock(", detail::kLockClass,
      ", -1);\n"
      "CREATE SCHEMA IF NOT EXISTS sluice;\n"
      "CREATE TABLE IF NOT EXISTS sluice.schema_version (\n"
      "  version integer PRIMARY KEY,\n"
      "  applied_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp());\n"
      "DO $migrate$ BEGIN\n",
      steps,
      "END $migrate$;\n"
      "UPDATE sluice.shards SET capacity = ",
      options.rows_per_shard, " WHERE capacity <> ", options.rows_per_shard,
      ";\n"
      "SELECT pg_catalog.max(version) FROM sluice.schema_version;\n");
  absl::StatusOr<detail::ResultPtr> r = lease->run_simple(
      sql, options.timeout + pool.options().reply_grace, detail::Effect::kOneTransaction);
  if (!r.ok()) return r.status();
  const std::optional<int> version = detail::single_integer<int>(r->get());
  if (!version) return absl::InternalError("sluice::postgres: migrate: malformed schema version");
  return *version;
}

// Whether the database can hold limits as this sluice needs them, asked at an engine's or a
// limiter's creation so that a misconfiguration is refused then, not discovered by every check
// (which fail-open limits would admit): FailedPrecondition naming the fix when the schema is
// missing (migrate was not run), older than kSchemaVersion, or the session is read-only (a hot
// standby, default_transaction_read_only). A newer schema is accepted: a rolling deploy runs
// older and newer replicas against it. OK too when the database cannot be reached in time (a
// service may start while it is down; its checks fail until it is up). One round trip.
inline absl::Status verify_database(ConnectionPool& pool) {
  absl::StatusOr<ConnectionPool::Lease> lease = pool.acquire();
  if (!lease.ok()) return absl::OkStatus();  // unreachable now: the checks will tell
  const std::chrono::milliseconds timeout =
      pool.options().statement_timeout + pool.options().reply_grace;
  absl::StatusOr<detail::ResultPtr> r = lease->run_simple(
      "SELECT pg_catalog.to_regclass('sluice.schema_version') IS NOT NULL, "
      "pg_catalog.current_setting('transaction_read_only') = 'on' OR "
      "pg_catalog.pg_is_in_recovery()",
      timeout, detail::Effect::kReadOnly);
  if (!r.ok()) {
    const absl::StatusCode code = r.status().code();
    if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
      return absl::OkStatus();
    }
    return r.status();
  }
  if (PQntuples(r->get()) != 1 || PQnfields(r->get()) != 2) {
    return absl::InternalError("sluice::postgres: unexpected reply to the database check");
  }
  if (std::string_view(PQgetvalue(r->get(), 0, 1)) == "t") {
    return absl::FailedPreconditionError(
        "sluice::postgres: the database is read-only (a standby, or default_transaction_read_only "
        "is on), so every check would fail; point conninfo at the primary");
  }
  if (std::string_view(PQgetvalue(r->get(), 0, 0)) != "t") {
    return absl::FailedPreconditionError(absl::StrCat(
        "sluice::postgres: the database has no sluice schema; run sluice::postgres::migrate "
        "(schema version ",
        kSchemaVersion, ") before creating limiters"));
  }
  r = lease->run_simple("SELECT pg_catalog.max(version) FROM sluice.schema_version", timeout,
                        detail::Effect::kReadOnly);
  if (!r.ok()) return r.status();
  const std::optional<int> version = detail::single_integer<int>(r->get());
  if (!version) return absl::InternalError("sluice::postgres: malformed schema version");
  if (*version < kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sluice::postgres: the database's sluice schema is version ", *version,
        ", older than this sluice's ", kSchemaVersion, "; run sluice::postgres::migrate"));
  }
  return absl::OkStatus();
}

// Deletes at most `max_rows` idle rows, visiting shards in ascending order and skipping any a
// check holds at that moment; one round trip, bounded by the pool's statement timeout. Returns
// how many rows it deleted. An unknown outcome (kUnknown) means rows may have been deleted; idle
// rows are indistinguishable from absent ones, so calling it again is always safe.
// `time_source`, when set, tells the time instead of the database clock (as
// ClientOptions::time_source: pass the one the limiters use).
inline absl::StatusOr<std::uint64_t> cleanup_expired(ConnectionPool& pool, std::uint32_t max_rows,
                                                     const TimeSource& time_source = {}) {
  absl::StatusOr<ConnectionPool::Lease> lease = pool.acquire();
  if (!lease.ok()) return lease.status();
  const Param params[] = {
      Param{.value = absl::StrCat(std::min<std::uint32_t>(max_rows, 0x7fffffffU))},
      time_source ? Param{.value = absl::StrCat(time_source().count())}
                  : Param{.value = {}, .binary = false, .null = true}};
  absl::StatusOr<detail::ResultPtr> r =
      lease->run("sluice_cleanup_v1", "SELECT sluice.cleanup_v1($1::integer, $2::bigint)", params,
                 detail::Effect::kWrites);
  if (!r.ok()) return r.status();
  const std::optional<std::uint64_t> deleted = detail::single_integer<std::uint64_t>(r->get());
  if (!deleted || *deleted > max_rows) {  // it deletes at most max_rows
    return absl::InternalError("sluice::postgres: cleanup: malformed reply");
  }
  return *deleted;
}

}  // namespace sluice::postgres

#endif  // SLUICE_POSTGRES_SCHEMA_HPP_
