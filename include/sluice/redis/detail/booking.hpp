// sluice/redis/detail/booking.hpp — calls of the booking script (reserve, cancel, settle) shared
// by RedisGcraLimiter and the engine's Redis backend. Internal.
//
// Builds the arguments sluice/redis/detail/booking_script.hpp documents from exact 128-bit
// integers, sends one call, and reads its reply of non-negative integers. Settling a receipt
// (charge the difference or give back the surplus, never past what the booking still holds ahead
// of now, nothing after a reset of the key) lives here so that both users settle alike.
//
// Complexity: O(windows) per call, one round trip. Thread-safety: pure functions over a
// thread-safe Client.
#ifndef SLUICE_REDIS_DETAIL_BOOKING_HPP_
#define SLUICE_REDIS_DETAIL_BOOKING_HPP_

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/decision.hpp"
#include "sluice/redis/client.hpp"
#include "sluice/redis/detail/booking_args.hpp"
#include "sluice/redis/detail/exact_double.hpp"
#include "sluice/redis/detail/script_reply.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/window.hpp"

namespace sluice::redis::detail {

// The arguments of one booking-script call of `op` on `redis_key` (Client::run_booking).
inline std::vector<std::string> booking_args(const Client& client, const std::string& redis_key,
                                             std::string_view op, std::string params,
                                             std::string extra) {
  std::vector<std::string> args = {redis_key,
                                   absl::StrCat(redis_key, ":reset"),
                                   std::string(op),
                                   "",
                                   "",
                                   std::move(params),
                                   std::move(extra)};
  if (const auto time = client.now()) Client::set_time_args(*time, args[3], args[4]);
  return args;
}

// A booking-script reply as non-negative integers.
inline absl::StatusOr<BookingInts> booking_ints(const absl::StatusOr<ReplyPtr>& reply) {
  if (!reply.ok()) return reply.status();
  const redisReply& r = **reply;
  if (r.type != REDIS_REPLY_ARRAY) return malformed_booking_reply();
  BookingInts out;
  for (std::size_t i = 0; i < r.elements; ++i) {
    const redisReply& e = *r.element[i];
    if (e.type != REDIS_REPLY_INTEGER || e.integer < 0) return malformed_booking_reply();
    out.push_back(static_cast<std::uint64_t>(e.integer));
  }
  return out;
}

// Whether a booking reply of checked length holds only values the script can write: the
// decision time (s, ns) at v[1] and v[2], within the range read_time accepts, and from v[first]
// on, per window of `limit`, `pairs` (ns, frac) amounts each within the 2^52 ns debt bound with a
// fraction below the window's requests. Anything else would become a decision's waits (beyond
// 2^63 ns: negative) or a booking's instant.
inline bool booking_in_range(const Limit& limit, const BookingInts& v, std::size_t first,
                             std::size_t pairs) {
  if (v[1] > 10'000'000'000 || v[2] >= kNanosPerSecond) return false;
  const std::vector<GcraWindow>& windows = limit.windows();
  for (std::size_t i = 0; i < windows.size(); ++i) {
    for (std::size_t k = 0; k < pairs; ++k) {
      const std::size_t at = first + 2 * (pairs * i + k);
      if (v[at] > kMaxAmountNs || v[at + 1] >= windows[i].requests) return false;
    }
  }
  return true;
}

// A reset count as the script writes it (an exact double).
inline bool booking_serial_in_range(std::uint64_t serial) {
  return serial < (std::uint64_t{1} << 53);
}

// One booking-script call of `op` on `redis_key`; its reply as non-negative integers.
inline absl::StatusOr<BookingInts> call_booking(Client& client, const std::string& redis_key,
                                                std::string_view op, std::string params,
                                                std::string extra) {
  return booking_ints(
      client.run_booking(booking_args(client, redis_key, op, std::move(params), std::move(extra))));
}

// The key's state after a give-back or charge ({0 or 4, t_s, t_ns, per window debt (ns, frac)}),
// as `inspect` reports it.
inline absl::StatusOr<Decision> state_after(const Limit& limit, const BookingInts& v) {
  const std::size_t n = limit.windows().size();
  if (v.size() != 3 + 2 * n || (v[0] != 0 && v[0] != 4) || !booking_in_range(limit, v, 3, 1)) {
    return malformed_booking_reply();
  }
  std::vector<ScaledWindow> scaled(n);
  for (std::size_t i = 0; i < n; ++i) {
    const GcraWindow& w = limit.windows()[i];
    scaled[i].before = absl::uint128(v[3 + 2 * i]) * w.requests + v[4 + 2 * i];
    scaled[i].after = scaled[i].before;
    scaled[i].burst = absl::uint128(w.burst) * static_cast<std::uint64_t>(w.period.count());
  }
  return admits(scaled) ? admitted_decision(limit.windows(), scaled)
                        : denied_decision(limit.windows(), scaled);
}

// The booking-script call that settles `r` at `actual` units (settle_receipt).
inline std::vector<std::string> settle_args(const Client& client, const Limit& limit,
                                            const Receipt& r, std::uint64_t actual) {
  return actual > r.estimate
             ? booking_args(client, r.key, "c", booking_params(limit, actual - r.estimate), "")
             : booking_args(client, r.key, "g", booking_params(limit, r.estimate - actual),
                            give_back_extra(limit, r.serial, kNeverPasses, r.tats));
}

// The key's state after a settling call answered `reply`.
inline absl::StatusOr<Decision> settled_state(const Limit& limit,
                                              const absl::StatusOr<BookingInts>& reply) {
  if (!reply.ok()) return reply.status();
  return state_after(limit, *reply);
}

// Settles `r` at `actual` units: charges actual − estimate (into debt, saturating at 2^52 ns), or
// gives back estimate − actual, bounded by what the booking still holds ahead of now, and nothing
// if the key was reset since. Returns the key's state after it. One round trip.
inline absl::StatusOr<Decision> settle_receipt(Client& client, const Limit& limit, const Receipt& r,
                                               std::uint64_t actual) {
  return settled_state(limit,
                       booking_ints(client.run_booking(settle_args(client, limit, r, actual))));
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_BOOKING_HPP_
