// sluice/redis/detail/script_reply.hpp — decisions from the script's reply, recomputed. Internal.
//
// The script returns its verdict and the state it decided from (layout in sluice/redis/script.hpp).
// The reply is untrusted: this side recomputes every decision field from that state with 128-bit
// integers, exactly as the in-memory GCRA limiter would, and requires the script's verdict to
// agree. Any deviation — a short reply, a value that is not an exact integer, a debt beyond its
// bucket, a verdict that disagrees — is Internal, never a decision.
//
//   absl::StatusOr<std::vector<sluice::Decision>> decisions =
//       sluice::redis::detail::decode_reply(items, *reply);  // one decision per item
//   sluice::redis::detail::decode_independent_replies(items, *reply, results);  // one per item
//
// The same state also gives each item's decision at cost 0 (`standing`): what a peek would
// answer at the same time had nothing changed, which reports a denied request's limits as they
// stand without a second call.
//
// Complexity: O(items × windows). Thread-safety: pure functions.
#ifndef SLUICE_REDIS_DETAIL_SCRIPT_REPLY_HPP_
#define SLUICE_REDIS_DETAIL_SCRIPT_REPLY_HPP_

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/decision.hpp"
#include "sluice/redis/detail/carry.hpp"
#include "sluice/redis/detail/exact_double.hpp"
#include "sluice/redis/detail/fixed_reply.hpp"
#include "sluice/redis/detail/status.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/window.hpp"

namespace sluice::redis::detail {

// One window of one item, in units of 1/requests ns ("scaled"): the debt before and after this
// request's cost, and the bucket (burst·period). Admitted iff after ≤ burst in every window.
struct ScaledWindow {
  absl::uint128 before;
  absl::uint128 after;
  absl::uint128 burst;
};

// What the reply says about one item's key before the decision.
struct KeyState {
  bool present = false;  // the key held state
  absl::uint128
      elapsed{};       // ns from its last write to the decision; 0 if none or the clock went back
  absl::uint128 at{};  // the time decided at: max(now, its last write), ns since the Unix epoch
};

// What a booking check took for one item, to settle its cost later: per window the TAT it left,
// scaled (ns since the Unix epoch × requests + fraction), and the key's reset count. For a
// fixed-window item (only given back, in a Cluster): per window its end, ns since the epoch.
struct ItemBooking {
  std::vector<absl::uint128> tats;
  std::uint64_t serial = 0;
};

inline absl::Status malformed_reply() {
  return absl::InternalError("sluice::redis: script reply of unexpected shape");
}

inline absl::uint128 ceil_div(absl::uint128 a, absl::uint128 b) { return (a + b - 1) / b; }

inline std::chrono::nanoseconds to_nanoseconds(absl::uint128 ns) {
  return std::chrono::nanoseconds(static_cast<std::int64_t>(absl::Uint128Low64(ns)));
}

// A time as the script writes it, (seconds, ns within), in ns since the Unix epoch.
inline std::optional<absl::uint128> read_time(std::string_view in, std::size_t& pos) {
  const auto s = read_double(in, pos, 10'000'000'000);
  const auto ns = read_double(in, pos, kNanosPerSecond - 1);
  if (!s || !ns) {
    return std::nullopt;
  }
  return absl::uint128(*s) * kNanosPerSecond + *ns;
}

// An item's marker ('0': no state; '1': its write time follows), decided at `now`.
inline std::optional<KeyState> read_key_state(std::string_view in, std::size_t& pos,
                                              absl::uint128 now) {
  if (pos >= in.size()) {
    return std::nullopt;
  }
  const char marker = in[pos++];
  if (marker == '0') {
    return KeyState{.at = now};
  }
  if (marker != '1') {
    return std::nullopt;
  }
  const std::optional<absl::uint128> written = read_time(in, pos);
  if (!written) {
    return std::nullopt;
  }
  return KeyState{.present = true,
                  .elapsed = now > *written ? now - *written : 0,
                  .at = std::max(now, *written)};
}

// Each window's debt as stored, drained by the elapsed time, then with `item.cost` added.
inline std::optional<std::vector<ScaledWindow>> read_windows(std::string_view in, std::size_t& pos,
                                                             const CheckItem& item,
                                                             const KeyState& state) {
  const std::vector<GcraWindow>& windows = item.limit->windows();
  std::vector<ScaledWindow> scaled(windows.size());
  for (std::size_t i = 0; i < windows.size(); ++i) {
    const GcraWindow& w = windows[i];
    const absl::uint128 period = static_cast<std::uint64_t>(w.period.count());
    absl::uint128 debt = 0;
    if (state.present) {
      const auto debt_ns = read_double(in, pos, std::uint64_t{1} << 52);
      const auto debt_frac = read_double(in, pos, w.requests - 1);
      if (!debt_ns || !debt_frac) {
        return std::nullopt;
      }
      if (absl::uint128(*debt_ns) >= state.elapsed) {
        debt = (absl::uint128(*debt_ns) - state.elapsed) * w.requests + *debt_frac;
      }
    }
    // A debt may exceed the bucket (a reservation booked ahead, a settled charge): the key is
    // then denied until it is paid off.
    scaled[i].burst = absl::uint128(w.burst) * period;
    scaled[i].before = debt;
    scaled[i].after = debt + absl::uint128(item.cost) * period;
  }
  return scaled;
}

inline bool admits(std::span<const ScaledWindow> scaled) {
  return std::all_of(scaled.begin(), scaled.end(),
                     [](const ScaledWindow& s) { return s.after <= s.burst; });
}

// Binding: the least remaining after this request; ties go to the shorter period.
inline Decision admitted_decision(std::span<const GcraWindow> windows,
                                  std::span<const ScaledWindow> scaled) {
  Decision d;
  std::optional<std::uint64_t> least;
  for (std::size_t i = 0; i < windows.size(); ++i) {
    const absl::uint128 period = static_cast<std::uint64_t>(windows[i].period.count());
    const auto remaining = absl::Uint128Low64((scaled[i].burst - scaled[i].after) / period);
    if (!least || remaining < *least) {
      least = remaining;
      d.binding_window = i;
    }
  }
  const std::size_t b = d.binding_window;
  d.reason = Reason::kAllowed;
  d.limit = windows[b].burst;
  d.remaining = *least;
  d.reset_after = to_nanoseconds(ceil_div(scaled[b].after, windows[b].requests));
  return d;
}

// Binding: the first denying window; retry_after: the longest wait of any denying one.
inline Decision denied_decision(std::span<const GcraWindow> windows,
                                std::span<const ScaledWindow> scaled) {
  std::optional<std::size_t> binding;
  absl::uint128 retry = 0;
  for (std::size_t i = 0; i < windows.size(); ++i) {
    if (scaled[i].after <= scaled[i].burst) {
      continue;
    }
    if (!binding) {
      binding = i;
    }
    retry = std::max(retry, ceil_div(scaled[i].after - scaled[i].burst, windows[i].requests));
  }
  const std::size_t b = *binding;
  const absl::uint128 period = static_cast<std::uint64_t>(windows[b].period.count());
  Decision d;
  d.reason = Reason::kQuotaExceeded;
  d.binding_window = b;
  d.limit = windows[b].burst;
  d.remaining = scaled[b].before >= scaled[b].burst
                    ? 0
                    : absl::Uint128Low64((scaled[b].burst - scaled[b].before) / period);
  d.retry_after = to_nanoseconds(retry);
  d.reset_after = to_nanoseconds(ceil_div(scaled[b].before, windows[b].requests));
  return d;
}

// The decision a cost-0 check would take from the same state at the same time: the item's
// windows as they stand, nothing added.
inline Decision standing_decision(std::span<const GcraWindow> windows,
                                  std::span<const ScaledWindow> scaled) {
  std::vector<ScaledWindow> standing(scaled.begin(), scaled.end());
  for (ScaledWindow& w : standing) w.after = w.before;
  return admits(standing) ? admitted_decision(windows, standing)
                          : denied_decision(windows, standing);
}
inline Decision standing_fixed_decision(std::span<const FixedCount> counts) {
  std::vector<FixedCount> standing(counts.begin(), counts.end());
  for (FixedCount& c : standing) c.after = c.before;
  return fixed_decision(standing);
}

// What decoding an item appends to, besides its decision: its booking (a booking check) and its
// standing decision (standing_decision), each when set.
struct ItemExtras {
  std::vector<ItemBooking>* bookings = nullptr;
  std::vector<Decision>* standing = nullptr;
};

// One item's decision (and extras) read at `pos` and appended; false for a malformed reply.
// `admitted` becomes false if the item was denied.
inline bool decode_item(std::string_view in, std::size_t& pos, const CheckItem& item,
                        absl::uint128 now, std::vector<Decision>& decisions, ItemExtras extras,
                        bool& admitted) {
  const std::optional<KeyState> state = read_key_state(in, pos, now);
  if (!state) return false;
  std::vector<ItemBooking>* bookings = extras.bookings;
  if (item.limit->algorithm() == Algorithm::kFixedWindow) {
    const auto counts = read_fixed_windows(in, pos, item, state->present, state->elapsed);
    if (!counts) return false;
    admitted = admitted && fixed_admits(*counts);
    decisions.push_back(fixed_decision(*counts));
    if (extras.standing != nullptr) extras.standing->push_back(standing_fixed_decision(*counts));
    if (bookings != nullptr) {  // per window the end it has once the item counts (ns)
      ItemBooking& b = bookings->emplace_back();
      for (const FixedCount& c : *counts) {
        b.tats.push_back(state->at + (c.left == 0 ? c.length : c.left));
      }
    }
    return true;
  }
  const std::optional<std::vector<ScaledWindow>> scaled = read_windows(in, pos, item, *state);
  if (!scaled) return false;
  const std::vector<GcraWindow>& windows = item.limit->windows();
  const bool item_admitted = admits(*scaled);
  admitted = admitted && item_admitted;
  decisions.push_back(item_admitted ? admitted_decision(windows, *scaled)
                                    : denied_decision(windows, *scaled));
  if (extras.standing != nullptr) extras.standing->push_back(standing_decision(windows, *scaled));
  if (bookings != nullptr) {
    ItemBooking& b = bookings->emplace_back();
    for (std::size_t i = 0; i < windows.size(); ++i) {
      b.tats.push_back(state->at * windows[i].requests + (*scaled)[i].after);
    }
  }
  return true;
}

// One decision per item, recomputed from the reply to the script call made for `items`. For a
// booking check (the call named the reset markers), `bookings` receives one ItemBooking per item;
// `standing`, when set, each item's standing decision: from the state the reply says its key
// held when the script reached it (for an item whose key an earlier item of the call reserved,
// that reservation included).
inline absl::StatusOr<std::vector<Decision>> decode_reply(
    std::span<const CheckItem> items, const redisReply& reply,
    std::vector<ItemBooking>* bookings = nullptr, std::vector<Decision>* standing = nullptr) {
  if (reply.type == REDIS_REPLY_ERROR) {
    return server_error_status(std::string_view(reply.str, reply.len));
  }
  if (is_carry_reply(reply)) return carry_needed();
  if (reply.type != REDIS_REPLY_STRING) {
    return malformed_reply();
  }
  const std::string_view in(reply.str, reply.len);
  std::size_t pos = 0;
  const std::optional<std::uint64_t> all_admitted = read_double(in, pos, 1);
  const std::optional<absl::uint128> now = read_time(in, pos);
  if (!all_admitted || !now) {
    return malformed_reply();
  }
  std::vector<Decision> decisions;
  decisions.reserve(items.size());
  bool every_item_admitted = true;
  if (standing != nullptr) standing->clear();
  for (const CheckItem& item : items) {
    if (!decode_item(in, pos, item, *now, decisions, {.bookings = bookings, .standing = standing},
                     every_item_admitted)) {
      return malformed_reply();
    }
  }
  if (bookings != nullptr) {
    for (ItemBooking& b : *bookings) {
      const std::optional<std::uint64_t> serial =
          read_double(in, pos, (std::uint64_t{1} << 53) - 1);
      if (!serial) {
        return malformed_reply();
      }
      b.serial = *serial;
    }
  }
  if (pos != in.size() || every_item_admitted != (*all_admitted == 1)) {
    return malformed_reply();
  }
  return decisions;
}

// One item's decision from a lone check's reply (decode_reply's rules).
inline absl::StatusOr<Decision> decode_one(const CheckItem& item, const redisReply& reply) {
  absl::StatusOr<std::vector<Decision>> d = decode_reply(std::span(&item, 1), reply);
  if (!d.ok()) {
    return d.status();
  }
  return (*d)[0];
}

// The result of a call that flagged no key for carrying (a call after the carry, a coalesced
// one): the script asks for a carry only of a flagged key, so CARRY then is not its reply
// (Internal), never the client's own "carry needed" status, nor a second round of carrying.
template <class Result>
Result carried_once(Result result) {
  if (!result.ok() && is_carry_needed(result.status())) return malformed_reply();
  return result;
}

// One result per item of a call of independent single-key checks: for one item, a lone check's
// reply; for several, the independent-items reply (sluice/redis/script.hpp), an array of each
// item's own reply or error, each decoded and cross-checked as a lone check's. An error reply
// or an array of the wrong size is every item's status.
inline void decode_independent_replies(std::span<const CheckItem> items, const redisReply& reply,
                                       std::span<absl::StatusOr<Decision>> results) {
  if (items.size() == 1) {
    results[0] = carried_once(decode_one(items[0], reply));
    return;
  }
  absl::Status whole;
  if (reply.type == REDIS_REPLY_ERROR) {
    whole = server_error_status(std::string_view(reply.str, reply.len));
  } else if (reply.type != REDIS_REPLY_ARRAY || reply.elements != items.size()) {
    whole = malformed_reply();
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    results[i] = whole.ok() ? carried_once(decode_one(items[i], *reply.element[i])) : whole;
  }
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_SCRIPT_REPLY_HPP_
