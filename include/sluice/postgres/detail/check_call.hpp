// Internal: the arguments of sluice.check_v2 and the decoding of its reply (untrusted input:
// anything out of shape is an Internal error, never a decision).
#ifndef SLUICE_POSTGRES_DETAIL_CHECK_CALL_HPP_
#define SLUICE_POSTGRES_DETAIL_CHECK_CALL_HPP_

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/decision.hpp"
#include "sluice/key.hpp"
#include "sluice/postgres/connection_pool.hpp"
#include "sluice/postgres/limit.hpp"

namespace sluice::postgres::detail {

inline constexpr const char* kCheckStatement = "sluice_check_v2";
inline constexpr const char* kCheckSql =
    "SELECT sluice.check_v2($1::integer, $2::bytea, $3::integer[], $4::bigint[], $5::bigint[], "
    "$6::bigint[], $7::bigint[], $8::boolean, $9::bigint)";

// sluice.check_carried_v1 (schema version 4): check_v2's nine parameters, then the sources.
inline constexpr const char* kCheckCarriedStatement = "sluice_check_carried_v1";
inline constexpr const char* kCheckCarriedSql =
    "SELECT sluice.check_carried_v1($1::integer, $2::bytea, $3::integer[], $4::bigint[], "
    "$5::bigint[], $6::bigint[], $7::bigint[], $8::boolean, $9::bigint, $10::integer[], "
    "$11::bytea, $12::integer[], $13::bigint[], $14::bigint[], $15::bigint[])";

// One key, one GCRA window, cost >= 1, with check_v2's reply (schema version 5): one prepared
// statement whose UPDATE decides and stores a key that has a row, under the row lock alone; when
// it updates nothing (a denial, a new key, a row deleted meanwhile), sluice.check_one_v1 decides in
// the same statement. $1 digest, $2 requests, $3 period ns, $4 burst, $5 cost, $6 time (NULL:
// the database clock). No plpgsql call on the common path: with one client, pg_stat_statements
// measured 38 µs of execution for this statement against 69 µs for `SELECT check_one_v1(...)`.
inline constexpr const char* kCheckOneStatement = "sluice_check_one_v1";
inline constexpr const char* kCheckOneSql =
    "WITH t AS (SELECT coalesce($6::bigint, (EXTRACT(EPOCH FROM "
    "pg_catalog.clock_timestamp()) * 1000000)::bigint * 1000) AS now_ns), "
    "u AS (UPDATE sluice.limit_state AS l SET "
    "state = ARRAY[t.now_ns + pg_catalog.div(sluice.gcra_ahead_v1(l.state, $2::bigint, "
    "$3::bigint, $5::bigint, t.now_ns), $2::bigint), pg_catalog.mod(sluice.gcra_ahead_v1(l.state, "
    "$2::bigint, $3::bigint, $5::bigint, t.now_ns), $2::bigint)]::bigint[], "
    "idle_at = t.now_ns + pg_catalog.div(sluice.gcra_ahead_v1(l.state, $2::bigint, $3::bigint, "
    "$5::bigint, t.now_ns) + $2::bigint - 1, $2::bigint)::bigint "
    "FROM t WHERE l.digest = $1::bytea AND pg_catalog.cardinality(l.state) = 2 "
    "AND sluice.gcra_ahead_v1(l.state, $2::bigint, $3::bigint, $5::bigint, t.now_ns) "
    "<= $4::bigint::numeric * $3::bigint "
    "RETURNING ARRAY[t.now_ns, 0, $4::bigint, pg_catalog.div($4::bigint::numeric * $3::bigint - "
    "sluice.gcra_ahead_v1(l.state, $2::bigint, $3::bigint, 0, t.now_ns), $3::bigint), 0, "
    "l.idle_at - t.now_ns, 0]::bigint[] AS r) "
    "SELECT coalesce((SELECT u.r FROM u), sluice.check_one_v1($1::bytea, $2::bigint, "
    "$3::bigint, $4::bigint, $5::bigint, $6::bigint))";

// kCheckOneSql for the usual limit, whose emission interval (period / requests) is a whole number
// of nanoseconds (1000 per second: 1 ms): the same decision, reply and stored row, computed in
// bigint instead of numeric. With such an interval a stored state's fraction stays 0, and the
// bounds of a limit (burst · interval ≤ 2^60 ns) with a time in [0, 2^62) keep every sum below
// 2^63. A row of another shape, a fraction, a later time or a denial falls through to
// sluice.check_one_v1 in the same statement. $1-$6 as kCheckOneSql (check_one_v1's arguments),
// $7 cost · interval, $8 (burst - cost) · interval, $9 burst · interval, $10 interval.
// scripts/postgres_instructions (callgrind, PostgreSQL 15, schema 6): 250k server instructions per
// admitted check against 338k for kCheckOneSql (a prepared upsert of one integer: 123k).
inline constexpr const char* kCheckIntervalStatement = "sluice_check_interval_v1";
inline constexpr const char* kCheckIntervalSql =
    "WITH t AS (SELECT coalesce($6::bigint, (EXTRACT(EPOCH FROM "
    "pg_catalog.clock_timestamp()) * 1000000)::bigint * 1000) AS now_ns), "
    "u AS (UPDATE sluice.limit_state AS l SET "
    "state = ARRAY[greatest(l.state[1], t.now_ns) + $7::bigint, 0]::bigint[], "
    "idle_at = greatest(l.state[1], t.now_ns) + $7::bigint "
    "FROM t WHERE l.digest = $1::bytea AND pg_catalog.cardinality(l.state) = 2 "
    "AND l.state[2] = 0 AND t.now_ns < 4611686018427387904 "
    "AND greatest(l.state[1], t.now_ns) - t.now_ns <= $8::bigint "
    "RETURNING ARRAY[t.now_ns, 0, $4::bigint, ($9::bigint - (l.idle_at - t.now_ns)) / "
    "$10::bigint, 0, l.idle_at - t.now_ns, 0]::bigint[] AS r) "
    "SELECT coalesce((SELECT u.r FROM u), sluice.check_one_v1($1::bytea, $2::bigint, "
    "$3::bigint, $4::bigint, $5::bigint, $6::bigint))";

// kCheckIntervalSql for several distinct keys under one limit and cost, in one statement (what
// concurrent checks coalesce into): $1 the keys' digests, 16 bytes each; $2-$10 as
// kCheckIntervalSql. It takes the shard locks of its keys that are free at once
// (pg_try_advisory_xact_lock: it never waits for one), so that it holds row locks of several keys
// only in shards it holds: no check_v2, cleanup, reset or other batch can then hold a lock it
// waits for while waiting for one of its rows, and no deadlock is possible. Then one UPDATE
// decides every key of those shards that has a row, and sluice.check_one_v1 decides their other
// keys (a denial, a new key) in the same statement. One row per key, in order: check_v2's reply
// for one item, or NULL for a key whose shard another session held, which the statement did not
// touch (the client sends it again alone, by the same deadline). The keys must be distinct: a
// key repeated would be stored once. scripts/postgres_instructions (callgrind, PostgreSQL 15,
// generic plan): 98k server instructions per admitted check for 8 keys, 75k for 16, against 250k
// for kCheckIntervalSql and 123k for a prepared upsert of one integer, each with its own commit.
inline constexpr const char* kCheckSetStatement = "sluice_check_set_v1";
inline constexpr const char* kCheckSetSql =
    "WITH k AS (SELECT pg_catalog.substr($1::bytea, 16 * i - 15, 16) AS digest, i FROM "
    "pg_catalog.generate_series(1, pg_catalog.length($1::bytea) / 16) AS i), "
    "g AS (SELECT pg_catalog.array_agg(x.s) AS held FROM "
    "(SELECT DISTINCT pg_catalog.get_byte(k.digest, 0) AS s FROM k ORDER BY 1) AS x "
    "WHERE pg_catalog.pg_try_advisory_xact_lock(1936483173, x.s)), "
    "t AS (SELECT coalesce($6::bigint, (EXTRACT(EPOCH FROM "
    "pg_catalog.clock_timestamp()) * 1000000)::bigint * 1000) AS now_ns, g.held, "
    "(SELECT pg_catalog.array_agg(k.digest) FROM k "
    "WHERE pg_catalog.get_byte(k.digest, 0) = ANY (g.held)) AS a FROM g), "
    "u AS (UPDATE sluice.limit_state AS l SET "
    "state = ARRAY[greatest(l.state[1], t.now_ns) + $7::bigint, 0]::bigint[], "
    "idle_at = greatest(l.state[1], t.now_ns) + $7::bigint "
    "FROM t WHERE l.digest = ANY (t.a) AND pg_catalog.cardinality(l.state) = 2 "
    "AND l.state[2] = 0 AND t.now_ns < 4611686018427387904 "
    "AND greatest(l.state[1], t.now_ns) - t.now_ns <= $8::bigint "
    "RETURNING l.digest, ARRAY[t.now_ns, 0, $4::bigint, ($9::bigint - (l.idle_at - t.now_ns)) / "
    "$10::bigint, 0, l.idle_at - t.now_ns, 0]::bigint[] AS r) "
    "SELECT CASE WHEN pg_catalog.get_byte(k.digest, 0) = ANY (t.held) THEN "
    "coalesce(u.r, sluice.check_one_v1(k.digest, $2::bigint, $3::bigint, $4::bigint, "
    "$5::bigint, $6::bigint)) END FROM k CROSS JOIN t LEFT JOIN u ON u.digest = k.digest "
    "ORDER BY k.i";

// One earlier state of an item: the item (0-based), the digest and the limit it had there.
struct CarrySourceParam {
  std::size_t item = 0;
  KeyDigest digest{};
  const Limit* limit = nullptr;
};

// 16 bytes, high word first, big-endian: the database's shard is the first byte.
inline void append_digest(std::string& out, const KeyDigest& d) {
  for (std::uint64_t word : {d.high, d.low}) {
    for (int shift = 56; shift >= 0; shift -= 8) {
      out.push_back(static_cast<char>((word >> shift) & 0xff));
    }
  }
}

// The nine parameters of sluice.check_v2 for `limits[i]` checked at `digests[i]` for `costs[i]`.
inline std::vector<Param> check_params(Algorithm algorithm, std::span<const KeyDigest> digests,
                                       std::span<const Limit* const> limits,
                                       std::span<const std::uint64_t> costs, bool all_or_nothing,
                                       std::optional<std::chrono::nanoseconds> unix_time) {
  std::vector<Param> p(9);
  p[0].value = absl::StrCat(static_cast<int>(algorithm));
  p[1].binary = true;
  std::string windows = "{", a = "{", b = "{", c = "{", cost = "{";
  for (std::size_t i = 0; i < digests.size(); ++i) {
    append_digest(p[1].value, digests[i]);
    absl::StrAppend(&windows, i == 0 ? "" : ",", limits[i]->parameters().size());
    absl::StrAppend(&cost, i == 0 ? "" : ",", costs[i]);
    for (const auto& w : limits[i]->parameters()) {
      const char* sep = a.size() == 1 ? "" : ",";
      absl::StrAppend(&a, sep, w[0]);
      absl::StrAppend(&b, sep, w[1]);
      absl::StrAppend(&c, sep, w[2]);
    }
  }
  p[2].value = windows + "}";
  p[3].value = a + "}";
  p[4].value = b + "}";
  p[5].value = c + "}";
  p[6].value = cost + "}";
  p[7].value = all_or_nothing ? "t" : "f";
  if (unix_time) {
    p[8].value = absl::StrCat(unix_time->count());
  } else {
    p[8].null = true;
  }
  return p;
}

// Whether check_one_v1 decides this call: one item, a one-window GCRA limit, cost >= 1.
inline bool fits_check_one(std::span<const Limit* const> limits,
                           std::span<const std::uint64_t> costs, bool carrying) {
  return !carrying && limits.size() == 1 && limits[0]->algorithm() == Algorithm::kGcra &&
         limits[0]->parameters().size() == 1 && costs[0] >= 1;
}

// The six parameters of sluice.check_one_v1 for `limit` (one GCRA window) at `digest`.
inline std::vector<Param> check_one_params(const KeyDigest& digest, const Limit& limit,
                                           std::uint64_t cost,
                                           std::optional<std::chrono::nanoseconds> unix_time) {
  std::vector<Param> p(6);
  p[0].binary = true;
  append_digest(p[0].value, digest);
  const auto& w = limit.parameters().front();
  p[1].value = absl::StrCat(w[0]);
  p[2].value = absl::StrCat(w[1]);
  p[3].value = absl::StrCat(w[2]);
  p[4].value = absl::StrCat(cost);
  if (unix_time) {
    p[5].value = absl::StrCat(unix_time->count());
  } else {
    p[5].null = true;
  }
  return p;
}

// kCheckIntervalSql's ten parameters for `limit` (one GCRA window) at `digest`, or nothing when
// the interval is not a whole number of nanoseconds, the cost is above the burst, or the time is
// outside [0, 2^62 ns).
inline std::optional<std::vector<Param>> check_interval_params(
    const KeyDigest& digest, const Limit& limit, std::uint64_t cost,
    std::optional<std::chrono::nanoseconds> unix_time) {
  const auto& w = limit.parameters().front();
  const std::int64_t requests = w[0], period = w[1], burst = w[2];
  constexpr std::int64_t kTimeLimit = std::int64_t{1} << 62;
  if (period % requests != 0 || cost > static_cast<std::uint64_t>(burst) ||
      (unix_time && (unix_time->count() < 0 || unix_time->count() >= kTimeLimit))) {
    return std::nullopt;
  }
  // burst · interval ≤ 2^60 (Limit's range), so none of these products overflows.
  const std::int64_t interval = period / requests;
  const auto units = static_cast<std::int64_t>(cost);
  std::vector<Param> p = check_one_params(digest, limit, cost, unix_time);
  p.resize(10);
  p[6].value = absl::StrCat(units * interval);
  p[7].value = absl::StrCat((burst - units) * interval);
  p[8].value = absl::StrCat(burst * interval);
  p[9].value = absl::StrCat(interval);
  return p;
}

// kCheckSetSql's ten parameters for distinct `digests` under `limit` (one GCRA window) at one
// cost, or nothing where check_interval_params gives nothing.
inline std::optional<std::vector<Param>> check_set_params(
    std::span<const KeyDigest> digests, const Limit& limit, std::uint64_t cost,
    std::optional<std::chrono::nanoseconds> unix_time) {
  std::optional<std::vector<Param>> p =
      check_interval_params(digests.front(), limit, cost, unix_time);
  if (p) {
    for (const KeyDigest& d : digests.subspan(1)) append_digest((*p)[0].value, d);
  }
  return p;
}

// check_carried_v1's six parameters after check_v2's: per source its item (1-based), its
// digest, its windows' count and parameters.
inline void append_carry_params(std::span<const CarrySourceParam> sources, std::vector<Param>& p) {
  const std::size_t first = p.size();
  p.resize(first + 6);
  p[first + 1].binary = true;
  std::string items = "{", windows = "{", a = "{", b = "{", c = "{";
  for (std::size_t k = 0; k < sources.size(); ++k) {
    const char* sep = k == 0 ? "" : ",";
    absl::StrAppend(&items, sep, sources[k].item + 1);
    append_digest(p[first + 1].value, sources[k].digest);
    absl::StrAppend(&windows, sep, sources[k].limit->parameters().size());
    for (const auto& w : sources[k].limit->parameters()) {
      const char* wsep = a.size() == 1 ? "" : ",";
      absl::StrAppend(&a, wsep, w[0]);
      absl::StrAppend(&b, wsep, w[1]);
      absl::StrAppend(&c, wsep, w[2]);
    }
  }
  p[first].value = items + "}";
  p[first + 2].value = windows + "}";
  p[first + 3].value = a + "}";
  p[first + 4].value = b + "}";
  p[first + 5].value = c + "}";
}

// The integers of a bigint[] in text form ("{1,-2,3}") of at most `max_count` elements: a longer
// text is refused before anything is parsed, so what a reply grows here is bounded by what its
// call asked for, however long the text.
inline std::optional<std::vector<std::int64_t>> parse_bigint_array(std::string_view text,
                                                                   std::size_t max_count) {
  constexpr std::size_t kMostChars = 21;  // "-9223372036854775808," per element
  if (text.size() < 2 || text.size() - 2 > max_count * kMostChars || text.front() != '{' ||
      text.back() != '}') {
    return std::nullopt;
  }
  std::vector<std::int64_t> out;
  const char* p = text.data() + 1;
  const char* end = text.data() + text.size() - 1;
  while (p < end) {
    std::int64_t v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc{}) return std::nullopt;
    out.push_back(v);
    p = next;
    if (p < end && *p++ != ',') return std::nullopt;
  }
  return out;
}

// Whether one item's six integers (reason, limit, remaining, retry_after, reset_after, binding
// window) are a decision `limit` can take: a known reason, a binding window it has, that
// window's burst (fixed window: its limit) as the limit, no more remaining than that, no wait
// when admitted and a wait of at least 1 ns when denied for quota; admitted under GCRA, full
// again within burst × period / requests (the cost is never above the burst). Times may stand
// further ahead only for a denial (a database clock that went back), never negative.
inline bool decision_fits(const std::int64_t* f, const Limit& limit) {
  const auto& windows = limit.parameters();
  if (f[0] < 0 || f[0] > 2 || f[2] < 0 || f[3] < 0 || f[4] < 0 || f[5] < 0 ||
      f[5] >= static_cast<std::int64_t>(windows.size())) {
    return false;
  }
  const auto& w = windows[static_cast<std::size_t>(f[5])];  // (requests, period, burst) or
  const bool gcra = limit.algorithm() == Algorithm::kGcra;  // (limit, window, 0)
  const std::int64_t capacity = gcra ? w[2] : w[0];
  if (f[1] != capacity || f[2] > capacity || (f[0] == 0 && f[3] != 0) || (f[0] == 1 && f[3] == 0)) {
    return false;
  }
  if (f[0] == 0 && gcra) {  // burst · period ≤ 2^87: exact in 128 bits
    const absl::int128 refill = (absl::int128(w[2]) * w[1] + w[0] - 1) / w[0];
    if (absl::int128(f[4]) > refill) return false;
  }
  return true;
}

// Decodes the reply: now, then six integers per item (reason, limit, remaining, retry_after,
// reset_after, binding window), each checked by decision_fits.
inline absl::StatusOr<std::vector<Decision>> decode_check_reply(
    std::string_view text, std::span<const Limit* const> limits) {
  const auto malformed = [] {
    return absl::InternalError("sluice::postgres: malformed reply from sluice.check_v2");
  };
  std::optional<std::vector<std::int64_t>> v = parse_bigint_array(text, 1 + 6 * limits.size());
  if (!v || v->size() != 1 + 6 * limits.size()) return malformed();
  std::vector<Decision> out;
  for (std::size_t i = 0; i < limits.size(); ++i) {
    const std::int64_t* f = v->data() + 1 + 6 * i;
    if (!decision_fits(f, *limits[i])) return malformed();
    out.push_back(Decision{.reason = f[0] == 0   ? Reason::kAllowed
                                     : f[0] == 1 ? Reason::kQuotaExceeded
                                                 : Reason::kStoreFull,
                           .limit = static_cast<std::uint64_t>(f[1]),
                           .remaining = static_cast<std::uint64_t>(f[2]),
                           .retry_after = std::chrono::nanoseconds{f[3]},
                           .reset_after = std::chrono::nanoseconds{f[4]},
                           .binding_window = static_cast<std::size_t>(f[5])});
  }
  return out;
}

}  // namespace sluice::postgres::detail

#endif  // SLUICE_POSTGRES_DETAIL_CHECK_CALL_HPP_
