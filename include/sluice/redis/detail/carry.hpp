// sluice/redis/detail/carry.hpp — carrying a key's state from earlier limits into its current
// limit (a rule whose windows a reload changed). Internal.
//
// The GCRA script, given a carry mask, refuses to decide while a flagged key holds no state and
// replies CARRY (sluice/redis/script.hpp). The client then reads the key's state under each
// earlier limit with kCarryReadScript (the value and the reading node's TIME, on the old key's
// own node, so a Cluster needs no cross-slot script), converts it here with 128-bit integers —
// the same spent share of each window's bucket as the in-memory GcraLimiter::carry_from, rounded
// toward less room — and writes it with SET NX, so that of two replicas carrying one key at once
// the first write stands and the other decides on it. Then it calls the script again unflagged.
//
//   std::vector<CarryRead> reads = ...;  // one per earlier limit, from parse_carry_read
//   absl::StatusOr<std::optional<CarriedState>> s = carried_state(limit, reads);
//   // s->value: the state to SET NX PX s->ttl_ms at the new key (nullopt: nothing was spent)
//
// Complexity: O(windows² × earlier limits). Thread-safety: pure functions.
#ifndef SLUICE_REDIS_DETAIL_CARRY_HPP_
#define SLUICE_REDIS_DETAIL_CARRY_HPP_

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/detail/gcra_carry.hpp"
#include "sluice/detail/gcra_cell.hpp"
#include "sluice/redis/detail/exact_double.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/window.hpp"

namespace sluice::redis::detail {

// Reads one key's state and the node's clock: {seconds, microseconds, value or nil}.
inline constexpr std::string_view kCarryReadScript = R"lua(-- sluice carry read v1
local t = redis.call('TIME')
return {t[1], t[2], redis.call('GET', KEYS[1])}
)lua";

// The status the script's CARRY reply becomes; the client handles it and never returns it.
inline absl::Status carry_needed() { return absl::AbortedError("sluice::redis: carry needed"); }
inline bool is_carry_needed(const absl::Status& s) {
  return s.code() == absl::StatusCode::kAborted && s.message() == "sluice::redis: carry needed";
}
inline bool is_carry_reply(const redisReply& reply) {
  return reply.type == REDIS_REPLY_STATUS && std::string_view(reply.str, reply.len) == "CARRY";
}

// A key's state under an earlier limit, as read: the reading node's time (ns since the Unix
// epoch) and the stored value, if any.
struct CarryRead {
  const Limit* limit = nullptr;
  std::uint64_t now = 0;
  std::optional<std::string> value;
};

// The state to write at the new key and its time to live.
struct CarriedState {
  std::string value;
  std::uint64_t ttl_ms = 0;
};

// kCarryReadScript's reply for `limit`; Internal for a reply out of shape.
inline absl::StatusOr<CarryRead> parse_carry_read(const redisReply& reply, const Limit& limit) {
  const auto number = [](const redisReply* e) -> std::optional<std::uint64_t> {
    std::uint64_t v = 0;
    if (e->type != REDIS_REPLY_STRING) return std::nullopt;
    const auto r = std::from_chars(e->str, e->str + e->len, v);
    if (r.ec != std::errc() || r.ptr != e->str + e->len) return std::nullopt;
    return v;
  };
  if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 3) {
    return absl::InternalError("sluice::redis: carry read reply of unexpected shape");
  }
  const std::optional<std::uint64_t> s = number(reply.element[0]);
  const std::optional<std::uint64_t> us = number(reply.element[1]);
  const redisReply& value = *reply.element[2];
  // TIME's seconds within the range the scripts read (read_time), microseconds within one: a
  // larger value would wrap the product below and date the carried state decades back.
  if (!s || !us || *s > 10'000'000'000 || *us >= 1'000'000 ||
      (value.type != REDIS_REPLY_NIL && value.type != REDIS_REPLY_STRING)) {
    return absl::InternalError("sluice::redis: carry read reply of unexpected shape");
  }
  CarryRead read{.limit = &limit, .now = *s * kNanosPerSecond + *us * 1000, .value = {}};
  if (value.type == REDIS_REPLY_STRING) read.value.emplace(value.str, value.len);
  return read;
}

// The GCRA constants that carrying needs (requests, period, burst·period).
inline sluice::detail::GcraParams carry_params(const GcraWindow& w) {
  const auto period = static_cast<std::uint64_t>(w.period.count());
  return {.requests = w.requests,
          .period = w.period.count(),
          .burst = w.burst,
          .interval_whole = 0,
          .interval_fraction = 0,
          .tolerance = absl::uint128(w.burst) * period,
          .tolerance_whole = 0,
          .tolerance_fraction = 0,
          .by_period = {}};
}

// Per window of `read.limit`, how far its TAT is ahead of `read.now`, scaled by its requests
// (≤ 0: a full bucket); nullopt for a value that is not a state of that limit.
inline std::optional<std::vector<absl::int128>> stored_aheads(const CarryRead& read) {
  const std::vector<GcraWindow>& windows = read.limit->windows();
  std::vector<absl::int128> aheads(windows.size(), 0);
  if (!read.value) return aheads;
  const std::string_view in = *read.value;
  if (in.size() != 16 + 16 * windows.size()) return std::nullopt;
  std::size_t pos = 0;
  const auto ws = read_double(in, pos, 10'000'000'000);
  const auto wns = read_double(in, pos, kNanosPerSecond - 1);
  if (!ws || !wns) return std::nullopt;
  const absl::int128 written = absl::int128(*ws) * kNanosPerSecond + *wns;
  for (std::size_t i = 0; i < windows.size(); ++i) {
    const auto ns = read_double(in, pos, std::uint64_t{1} << 52);
    const auto frac = read_double(in, pos, windows[i].requests - 1);
    if (!ns || !frac) return std::nullopt;
    const absl::int128 r(windows[i].requests);
    aheads[i] = (written + *ns - absl::int128(read.now)) * r + *frac;
  }
  return aheads;
}

// The window of `from` that window `to_index` of `to` carries from: the one with the same
// period, or the only one when both limits have one window; nullopt for none (it starts full).
inline std::optional<std::size_t> source_window(const Limit& from, const Limit& to,
                                                std::size_t to_index) {
  if (from.windows().size() == 1 && to.windows().size() == 1) return 0;
  for (std::size_t j = 0; j < from.windows().size(); ++j) {
    if (from.windows()[j].period == to.windows()[to_index].period) return j;
  }
  return std::nullopt;
}

// The state `to` holds for a key whose states under earlier limits were `reads`: per window
// the most spent carried share among them (sluice::detail::carried_ahead), at the latest time
// read; a debt beyond 2^52 ns (the script's range) is cut there, a spent bucket staying spent.
// nullopt when every carried window is full (the key starts fresh); Internal for a corrupt
// value.
inline absl::StatusOr<std::optional<CarriedState>> carried_state(const Limit& to,
                                                                 std::span<const CarryRead> reads) {
  const std::size_t n = to.windows().size();
  std::uint64_t at = 0;
  for (const CarryRead& read : reads) at = std::max(at, read.now);
  std::vector<absl::int128> debt(n, 0);  // ahead of `at`, scaled by each window's requests
  for (const CarryRead& read : reads) {
    const std::optional<std::vector<absl::int128>> aheads = stored_aheads(read);
    if (!aheads) return absl::InternalError("sluice::redis: corrupt state under an earlier limit");
    for (std::size_t i = 0; i < n; ++i) {
      const std::optional<std::size_t> j = source_window(*read.limit, to, i);
      if (!j || (*aheads)[*j] <= 0) continue;
      const GcraWindow& w = to.windows()[i];
      const absl::int128 carried = sluice::detail::carried_ahead(
          (*aheads)[*j], carry_params(read.limit->windows()[*j]), carry_params(w));
      const absl::int128 shift = absl::int128(at - read.now) * absl::int128(w.requests);
      debt[i] = std::max(debt[i], carried - shift);
    }
  }
  if (std::all_of(debt.begin(), debt.end(), [](const absl::int128& d) { return d <= 0; })) {
    return std::nullopt;
  }
  CarriedState state;
  append_double(state.value, at / kNanosPerSecond);
  append_double(state.value, at % kNanosPerSecond);
  std::uint64_t most = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const absl::int128 r(to.windows()[i].requests);
    const absl::int128 d = std::max(debt[i], absl::int128(0));
    constexpr std::uint64_t kMostDebt = std::uint64_t{1} << 52;
    const bool cut = d / r > absl::int128(kMostDebt);
    const std::uint64_t ns = cut ? kMostDebt : absl::Int128Low64(d / r);
    const std::uint64_t frac = cut ? 0 : absl::Int128Low64(d % r);
    append_double(state.value, ns);
    append_double(state.value, frac);
    most = std::max(most, ns + (frac != 0 ? 1 : 0));
  }
  state.ttl_ms = most / 1'000'000 + 1;
  return state;
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_CARRY_HPP_
