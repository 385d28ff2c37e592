// sluice/redis/detail/script_call.hpp — the arguments of one script call. Internal.
//
// Encodes (key, limit, cost) items into what `kGcraScript` (sluice/redis/script.hpp, which
// documents the layout) reads: per window cost·T and burst·T as exact (ns, frac) pairs computed
// with 128-bit integers, and optionally a fixed server time.
//
//   const sluice::redis::detail::ScriptCall call =
//       sluice::redis::detail::ScriptCall::create(items, std::move(redis_keys), std::nullopt);
//   const sluice::redis::detail::Command command = call.evalsha(script_sha);  // refers to `call`
//
// Complexity: O(items × windows). Thread-safety: plain values.
#ifndef SLUICE_REDIS_DETAIL_SCRIPT_CALL_HPP_
#define SLUICE_REDIS_DETAIL_SCRIPT_CALL_HPP_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/strings/str_cat.h"
#include "sluice/redis/detail/command.hpp"
#include "sluice/redis/detail/exact_double.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/window.hpp"

namespace sluice::redis::detail {

// Everything one script call needs, owning its strings.
struct ScriptCall {
  std::vector<std::string> keys;    // the Redis keys, one per item
  std::vector<std::string> params;  // per item, 5 exact doubles per window
  std::string time_s, time_ns;      // both "": the script reads TIME
  std::string num_keys;
  std::string carry_mask;  // empty, or per item '1' if it names earlier keys (the script's mask)

  // `redis_keys[i]` holds `items[i]`'s state (a booking check then names each item's reset
  // marker, in the same order); `time` (ns since the Unix epoch, ≥ 0) replaces
  // the server's clock when set. Items with `carried_from` get the script's carry mask.
  static ScriptCall create(std::span<const CheckItem> items, std::vector<std::string> redis_keys,
                           std::optional<std::chrono::nanoseconds> time) {
    ScriptCall call;
    call.keys = std::move(redis_keys);
    call.params.reserve(items.size());
    for (const CheckItem& item : items) {
      call.params.push_back(window_params(item));
    }
    call.num_keys = absl::StrCat(call.keys.size());  // 2 per item for a booking check
    for (const CheckItem& item : items) {
      if (!item.carried_from.empty()) call.carry_mask.resize(items.size(), '0');
    }
    for (std::size_t i = 0; i < call.carry_mask.size(); ++i) {
      if (!items[i].carried_from.empty()) call.carry_mask[i] = '1';
    }
    if (time) {
      const auto ns = static_cast<std::uint64_t>(time->count());
      call.time_s = absl::StrCat(ns / kNanosPerSecond);
      call.time_ns = absl::StrCat(ns % kNanosPerSecond);
    }
    return call;
  }

  // Per window of `item`: cost·T as (ns, frac), burst·T as (ns, frac), requests; T = period / r.
  static std::string window_params(const CheckItem& item) {
    if (item.limit->algorithm() == Algorithm::kFixedWindow) return fixed_params(item);
    std::string p;
    p.reserve(40 * item.limit->windows().size());
    for (const GcraWindow& w : item.limit->windows()) {
      const absl::uint128 r = w.requests;
      const absl::uint128 period = static_cast<std::uint64_t>(w.period.count());
      const absl::uint128 cost_scaled = absl::uint128(item.cost) * period;  // cost·T·r
      const absl::uint128 burst_scaled = absl::uint128(w.burst) * period;   // burst·T·r
      append_double(p, absl::Uint128Low64(cost_scaled / r));
      append_double(p, absl::Uint128Low64(cost_scaled % r));
      append_double(p, absl::Uint128Low64(burst_scaled / r));
      append_double(p, absl::Uint128Low64(burst_scaled % r));
      append_double(p, w.requests);
    }
    return p;
  }

  // A fixed-window item: 'F', the cost, then per window its limit and length (ns); every value
  // below 2^53 (Limit::fixed_window), so exact.
  static std::string fixed_params(const CheckItem& item) {
    std::string p = "F";
    append_double(p, item.cost);
    for (const GcraWindow& w : item.limit->windows()) {
      append_double(p, w.requests);
      append_double(p, static_cast<std::uint64_t>(w.period.count()));
    }
    return p;
  }

  // True if no two of `keys` are equal. O(k log k).
  bool keys_distinct() const {
    std::vector<std::string_view> sorted(keys.begin(), keys.end());
    std::sort(sorted.begin(), sorted.end());
    return std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  }

  // The EVALSHA of the script cached under `sha`; refers to this call's strings and `sha`.
  Command evalsha(std::string_view sha) const {
    Command command;
    command.add("EVALSHA");
    command.add(sha);
    command.add(num_keys);
    for (const std::string& key : keys) {
      command.add(key);
    }
    command.add(time_s);
    command.add(time_ns);
    for (const std::string& p : params) {
      command.add(p);
    }
    if (!carry_mask.empty()) {
      command.add(carry_mask);
      command.add("carry");
    }
    return command;
  }
};

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_SCRIPT_CALL_HPP_
