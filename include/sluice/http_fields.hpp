// sluice/http_fields.hpp — the HTTP response fields that describe a rate-limit decision.
//
// Turns a `sluice::Decision` (or plain values) into (name, value) pairs that the caller writes into
// its framework's response; nothing here knows about any HTTP library:
//
//   sluice::Decision d = ...;                                   // from a limiter or the engine
//   auto now = std::chrono::system_clock::now();                // wall clock, read by the caller
//   for (const auto& [name, value] : sluice::response_fields(d, now)) response.set(name, value);
//   // denied:  Retry-After: 1, X-RateLimit-Limit: 20, X-RateLimit-Remaining: 0,
//   //          X-RateLimit-Reset: 1700000002
//
//   std::array<sluice::QuotaPolicy, 2> policies{{{"per-ip/s", 10, std::chrono::seconds(1)},
//                                                {"per-ip/minute", 600, std::chrono::minutes(1)}}};
//   sluice::ratelimit_policy_field(policies);
//   // RateLimit-Policy: "per-ip/s";q=10;w=1, "per-ip/minute";q=600;w=60
//   sluice::ratelimit_field(sluice::service_limit("per-ip/s", d));
//   // RateLimit: "per-ip/s";r=0;t=1
//
// Fields:
// - `Retry-After` (RFC 9110 delay-seconds): retry_after rounded up to whole seconds, at least 1.
// - `X-RateLimit-Limit`: the binding window's burst; `X-RateLimit-Remaining`: what that window has
//   left after this request; `X-RateLimit-Reset`: Unix epoch seconds at which the binding window is
//   full again (now + reset_after, rounded up). These three are de-facto fields, printed as plain
//   decimal integers.
// - `RateLimit-Policy` and `RateLimit` per draft-ietf-httpapi-ratelimit-headers-11: RFC 9651 Lists
//   of Items whose value is an sf-string naming the policy, with Integer parameters
//   (`q` quota, `w` window seconds; `r` available quota, `t` effective window seconds). Members are
//   joined by ", " (RFC 9651 canonical serialization).
//
// RFC 9651 limits, and what these helpers do at them (they never fail):
// - sf-string: `"` and `\` are escaped with a backslash; a byte outside printable ASCII
//   (0x20-0x7E) cannot be represented and is replaced by `?`. Policy validation
//   (sluice/policy.hpp) rejects such bytes in every name, so a validated config never hits this.
// - sf-integer: at most 15 digits; larger values are clamped to 999999999999999.
//
// Units: durations are integer nanoseconds; wall-clock "now" is an argument (any
// `std::chrono::system_clock` time point converts implicitly), never read here. No floating point.
// Thread-safety: every function is pure; the value types are thread-compatible.
#ifndef SLUICE_HTTP_FIELDS_HPP_
#define SLUICE_HTTP_FIELDS_HPP_

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "sluice/decision.hpp"
#include "sluice/detail/short_copy.hpp"
#include "sluice/detail/text.hpp"

namespace sluice {

// One response header field. An aggregate, so `auto& [name, value] = field;` works.
struct HttpField {
  std::string_view name{};  // one of the k*Field constants: static storage, no allocation
  std::string value{};

  friend bool operator==(const HttpField&, const HttpField&) = default;
};

// The fields for one response, in the order they should be written. Up to six fit inline (the
// most any sluice decision produces), so building them allocates only for long values.
using HttpFields = absl::InlinedVector<HttpField, 6>;

inline std::ostream& operator<<(std::ostream& os, const HttpField& field) {
  return os << field.name << ": " << field.value;
}

inline constexpr std::string_view kRetryAfterField = "Retry-After";
inline constexpr std::string_view kXRateLimitLimitField = "X-RateLimit-Limit";
inline constexpr std::string_view kXRateLimitRemainingField = "X-RateLimit-Remaining";
inline constexpr std::string_view kXRateLimitResetField = "X-RateLimit-Reset";
inline constexpr std::string_view kRateLimitPolicyField = "RateLimit-Policy";
inline constexpr std::string_view kRateLimitField = "RateLimit";

// The largest RFC 9651 Integer (15 decimal digits). Larger values are clamped to it.
inline constexpr std::uint64_t kMaxStructuredInteger = 999'999'999'999'999;

// A wall-clock instant in ns since the Unix epoch. `std::chrono::system_clock::now()` converts to
// it implicitly.
using WallTime = std::chrono::sys_time<std::chrono::nanoseconds>;

// `d` in whole seconds, rounded up; 0 for d <= 0. Exact for every int64 nanosecond count.
constexpr std::int64_t ceil_seconds(std::chrono::nanoseconds d) noexcept {
  if (d.count() <= 0) return 0;
  return std::chrono::ceil<std::chrono::seconds>(d).count();
}

// The Retry-After delay-seconds for `retry_after`: rounded up, at least 1 (a client told 0 would
// retry at once into another denial).
constexpr std::int64_t retry_after_seconds(std::chrono::nanoseconds retry_after) noexcept {
  return std::max<std::int64_t>(1, ceil_seconds(retry_after));
}

// Unix epoch seconds of `now + reset_after`, rounded up; negative reset_after counts as 0 and a
// result before the epoch is reported as 0. Exact (no overflow) for every pair of int64 inputs.
constexpr std::int64_t reset_epoch_seconds(WallTime now,
                                           std::chrono::nanoseconds reset_after) noexcept {
  constexpr std::int64_t kNanosPerSecond = 1'000'000'000;
  // now as whole seconds (floored, also before the epoch) and the ns past them, in [0, 1 s),
  // without ever forming the floored second in ns: before 1677-09-21 00:12:44 it is below the
  // int64 range.
  const std::int64_t now_ns = now.time_since_epoch().count();
  const bool past_second = now_ns % kNanosPerSecond < 0;
  const std::int64_t now_s = now_ns / kNanosPerSecond - (past_second ? 1 : 0);
  const std::int64_t now_frac = now_ns % kNanosPerSecond + (past_second ? kNanosPerSecond : 0);
  std::int64_t reset_ns = std::max<std::int64_t>(0, reset_after.count());
  std::int64_t frac = now_frac + reset_ns % kNanosPerSecond;  // < 2 s: no overflow
  // |now_s| and reset_ns / 1e9 are each below 9.3e9, so the sum cannot overflow.
  std::int64_t seconds = now_s + reset_ns / kNanosPerSecond + frac / kNanosPerSecond +
                         (frac % kNanosPerSecond != 0 ? 1 : 0);
  return std::max<std::int64_t>(0, seconds);
}

namespace detail {

// Appends `value` in decimal.
inline void append_decimal(std::string& out, std::uint64_t value) {
  char buffer[20];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  (void)ec;  // 20 digits always fit a uint64
  out.append(buffer, static_cast<std::size_t>(end - buffer));
}
inline void append_decimal(std::string& out, std::int64_t value) {
  char buffer[20];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  (void)ec;  // sign + 19 digits always fit an int64
  out.append(buffer, static_cast<std::size_t>(end - buffer));
}

}  // namespace detail

// Appends `value` as an RFC 9651 Integer, clamped to kMaxStructuredInteger.
inline void append_structured_integer(std::string& out, std::uint64_t value) {
  detail::append_decimal(out, std::min(value, kMaxStructuredInteger));
}

// Appends `value` as an RFC 9651 String: quoted, `"` and `\` escaped; each byte outside
// printable ASCII (0x20-0x7E) is replaced by `?` since sf-string cannot carry it.
inline void append_structured_string(std::string& out, std::string_view value) {
  out.push_back('"');
  detail::append_escaped(out, value, [](std::string& to, unsigned char) { to.push_back('?'); });
  out.push_back('"');
}

// --- Retry-After and X-RateLimit-*
// ----------------------------------------------------------------

// `Retry-After: <retry_after_seconds(retry_after)>`.
inline HttpField retry_after_field(std::chrono::nanoseconds retry_after) {
  HttpField field{kRetryAfterField, {}};
  detail::append_decimal(field.value, retry_after_seconds(retry_after));
  return field;
}

namespace detail {
// Slot `index` of `out`, added if `out` is shorter. Its string keeps its capacity: writing the
// same fields again allocates nothing once each slot has held its longest value.
inline HttpField& slot(HttpFields& out, std::size_t index) {
  if (out.size() <= index) out.resize(index + 1);
  return out[index];
}

// Sets `value` to the concatenation of `parts`, reusing its storage: resized only when its length
// changes, then each part copied in place.
inline void assign_parts(std::string& value, std::initializer_list<std::string_view> parts) {
  std::size_t size = 0;
  for (std::string_view part : parts) size += part.size();
  if (value.size() != size) value.resize(size);
  char* out = value.data();
  for (std::string_view part : parts) {
    copy_short(out, part.data(), part.size());
    out += part.size();
  }
}

// Sets `field` to `name` and `value` in decimal, reusing its string.
inline void set_decimal(HttpField& field, std::string_view name, std::uint64_t value) {
  field.name = name;
  const std::size_t size = decimal_size(value);
  if (field.value.size() != size) field.value.resize(size);
  write_decimal(field.value.data() + size, value);
}

// Gives `out` `count` slots whose last two hold the strings with the most room: the long values
// (RateLimit-Policy, RateLimit) go there, so alternating 5 and 6 fields allocates nothing once
// two strings have grown long enough.
inline void arrange_fields(HttpFields& out, std::size_t count) {
  if (out.size() < count) out.resize(count);
  for (std::size_t j = count - 2; j < count; ++j) {
    std::size_t roomiest = j;
    for (std::size_t k = 0; k < out.size(); ++k) {
      const bool long_slot = k == count - 2 || k == count - 1;
      if (!long_slot && out[k].value.capacity() > out[roomiest].value.capacity()) roomiest = k;
    }
    if (roomiest != j) out[j].value.swap(out[roomiest].value);
  }
  out.resize(count);
}
}  // namespace detail

// Writes `Retry-After` into slot `index` of `out`, reusing the slot's string.
inline void write_retry_after_field(HttpFields& out, std::size_t index,
                                    std::chrono::nanoseconds retry_after) {
  detail::set_decimal(detail::slot(out, index), kRetryAfterField,
                      static_cast<std::uint64_t>(retry_after_seconds(retry_after)));  // ≥ 1
}

// Writes X-RateLimit-Limit, -Remaining and -Reset for the decision's binding window into slots
// `first` ... `first + 2` of `out`, reusing the slots' strings. Returns the next slot.
inline std::size_t write_x_ratelimit_fields(HttpFields& out, std::size_t first,
                                            const Decision& decision, WallTime now) {
  detail::set_decimal(detail::slot(out, first), kXRateLimitLimitField, decision.limit);
  detail::set_decimal(detail::slot(out, first + 1), kXRateLimitRemainingField, decision.remaining);
  detail::set_decimal(detail::slot(out, first + 2), kXRateLimitResetField,
                      static_cast<std::uint64_t>(reset_epoch_seconds(now, decision.reset_after)));
  return first + 3;
}

// Appends X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset for the decision's
// binding window.
inline void append_x_ratelimit_fields(HttpFields& out, const Decision& decision, WallTime now) {
  write_x_ratelimit_fields(out, out.size(), decision, now);
}

// The classic fields for one decision: for a denial Retry-After then X-RateLimit-*; for an
// admission X-RateLimit-* only.
inline HttpFields response_fields(const Decision& decision, WallTime now) {
  HttpFields out;
  std::size_t next = 0;
  if (!decision.allowed()) write_retry_after_field(out, next++, decision.retry_after);
  write_x_ratelimit_fields(out, next, decision, now);
  return out;
}

// --- draft-ietf-httpapi-ratelimit-headers-11
// ------------------------------------------------------

// One Quota Policy Item of RateLimit-Policy: `"<name>";q=<quota>;w=<window seconds>`.
struct QuotaPolicy {
  std::string_view name{};             // the policy's identifier; must outlive the call
  std::uint64_t quota = 0;             // q: requests per window
  std::chrono::nanoseconds window{0};  // w: rounded up to whole seconds, at least 1 (w is non-zero)
};

// One Service Limit Item of RateLimit: `"<name>";r=<available>;t=<effective window seconds>`.
struct ServiceLimit {
  std::string_view name{};                       // the policy's identifier; must outlive the call
  std::uint64_t available = 0;                   // r: quota units left
  std::chrono::nanoseconds effective_window{0};  // t: rounded up to whole seconds (0 allowed)
};

// The service limit a decision reports for policy `name`: r = remaining, and
// - allowed: t = reset_after (the binding window is full again after t, rounded up);
// - denied: t = the Retry-After value, since the draft says Retry-After should not point earlier
//   than the end of the effective window, and r = 0 holds until then.
inline ServiceLimit service_limit(std::string_view name, const Decision& decision) noexcept {
  std::chrono::nanoseconds t = decision.reset_after;
  if (!decision.allowed()) {
    // Whole seconds, which as nanoseconds overflow only for the longest waits (ceil(2^63 - 1 ns)
    // = 9223372037 s): nanoseconds::max() rounds up to that same count.
    constexpr std::chrono::seconds kLongest =
        std::chrono::ceil<std::chrono::seconds>(std::chrono::nanoseconds::max());
    const std::chrono::seconds wait(retry_after_seconds(decision.retry_after));
    t = wait < kLongest ? std::chrono::nanoseconds(wait) : std::chrono::nanoseconds::max();
  }
  return ServiceLimit{.name = name, .available = decision.remaining, .effective_window = t};
}

// The RateLimit-Policy value: one Item per policy, joined by ", ". Empty input gives "" (the field
// must then be omitted: the draft requires a non-empty List).
inline std::string ratelimit_policy_value(std::span<const QuotaPolicy> policies) {
  std::string out;
  for (const QuotaPolicy& policy : policies) {
    if (!out.empty()) out.append(", ");
    append_structured_string(out, policy.name);
    out.append(";q=");
    append_structured_integer(out, policy.quota);
    out.append(";w=");
    append_structured_integer(
        out, static_cast<std::uint64_t>(std::max<std::int64_t>(1, ceil_seconds(policy.window))));
  }
  return out;
}
inline HttpField ratelimit_policy_field(std::span<const QuotaPolicy> policies) {
  return HttpField{kRateLimitPolicyField, ratelimit_policy_value(policies)};
}
inline HttpField ratelimit_policy_field(const QuotaPolicy& policy) {
  return ratelimit_policy_field(std::span<const QuotaPolicy>(&policy, 1));
}

// The start of one RateLimit item, up to its numbers: `"<name>";r=`. Precompute it per policy
// name and finish each item with append_ratelimit_item_numbers.
inline void append_ratelimit_item_prefix(std::string& out, std::string_view name) {
  append_structured_string(out, name);
  out.append(";r=");
}
// The rest of one RateLimit item after its prefix: `<available>;t=<effective window seconds>`.
inline void append_ratelimit_item_numbers(std::string& out, const ServiceLimit& limit) {
  append_structured_integer(out, limit.available);
  out.append(std::string_view(";t="));
  append_structured_integer(out, static_cast<std::uint64_t>(ceil_seconds(limit.effective_window)));
}

// The RateLimit value: one Item per service limit, joined by ", ".
inline std::string ratelimit_value(std::span<const ServiceLimit> limits) {
  std::string out;
  for (const ServiceLimit& limit : limits) {
    if (!out.empty()) out.append(", ");
    append_ratelimit_item_prefix(out, limit.name);
    append_ratelimit_item_numbers(out, limit);
  }
  return out;
}
inline HttpField ratelimit_field(std::span<const ServiceLimit> limits) {
  return HttpField{kRateLimitField, ratelimit_value(limits)};
}
inline HttpField ratelimit_field(const ServiceLimit& limit) {
  return ratelimit_field(std::span<const ServiceLimit>(&limit, 1));
}

// Every field of one decision of a policy whose values were precomputed once
// (`policy_value` from ratelimit_policy_value, `item_prefix` from append_ratelimit_item_prefix for
// the binding window's name): Retry-After for a denial, the three X-RateLimit-* fields,
// RateLimit-Policy and RateLimit, in that order. `out` is overwritten and its strings reused,
// so writing one decision after another allocates nothing once each slot has held its longest
// value. O(length of the values).
inline void write_decision_fields(HttpFields& out, const Decision& decision, WallTime now,
                                  std::string_view policy_value, std::string_view item_prefix) {
  const std::size_t count = decision.allowed() ? 5 : 6;
  if (out.size() != count) detail::arrange_fields(out, count);
  std::size_t next = 0;
  if (!decision.allowed()) write_retry_after_field(out, next++, decision.retry_after);
  next = write_x_ratelimit_fields(out, next, decision, now);
  HttpField* field = &out[next];
  field->name = kRateLimitPolicyField;
  detail::assign_parts(field->value, {policy_value});
  ++field;
  field->name = kRateLimitField;
  // append_ratelimit_item_numbers, written in place: the prefix, r, ";t=", t.
  const ServiceLimit limit = service_limit({}, decision);
  const std::uint64_t r = std::min(limit.available, kMaxStructuredInteger);
  const std::uint64_t t = std::min(static_cast<std::uint64_t>(ceil_seconds(limit.effective_window)),
                                   kMaxStructuredInteger);
  const std::size_t r_size = detail::decimal_size(r), t_size = detail::decimal_size(t);
  constexpr std::string_view kT = ";t=";
  const std::size_t size = item_prefix.size() + r_size + kT.size() + t_size;
  if (field->value.size() != size) field->value.resize(size);
  char* at = field->value.data();
  detail::copy_short(at, item_prefix.data(), item_prefix.size());
  at += item_prefix.size() + r_size;
  detail::write_decimal(at, r);
  std::memcpy(at, kT.data(), kT.size());
  detail::write_decimal(at + kT.size() + t_size, t);
}

// --- one response, several limiters ----------------------------------------------------------

// Every field name the helpers above write.
inline constexpr std::array<std::string_view, 6> kRateLimitFieldNames = {
    kRetryAfterField,      kXRateLimitLimitField, kXRateLimitRemainingField,
    kXRateLimitResetField, kRateLimitPolicyField, kRateLimitField};

// Makes `fields` the only rate-limit fields of a response: `erase(name)` for each of
// kRateLimitFieldNames, then `set(name, value)` for each of `fields`. For a request that passed
// one limiter, which wrote its fields (the engine through an adapter), and was then denied by
// another (the attempt limiter, a concurrency limit, a limiter of the service's own): the denial
// must carry the fields of the limiter that denied, and none of the other's, or a client reads
// `Retry-After: 4` beside another rule's `X-RateLimit-Remaining: 8`. `erase` removes every field
// of that name (ASCII case-insensitive, as HTTP compares names). O(fields).
//
//   sluice::replace_rate_limit_fields(
//       sluice::attempt_fields(*d),
//       [&](std::string_view name) { response.headers.erase(std::string(name)); },
//       [&](std::string_view name, const std::string& value) {
//         response.set_header(std::string(name), value);
//       });
template <class Erase, class Set>
void replace_rate_limit_fields(const HttpFields& fields, Erase&& erase, Set&& set) {
  for (const std::string_view name : kRateLimitFieldNames) erase(name);
  for (const HttpField& field : fields) set(field.name, field.value);
}

// --- concurrency limits (sluice/concurrency.hpp): the draft's `concurrent-requests` quota unit
// ----------------------------------------------------------------------------------------------

// The draft's quota unit for a cap on requests in flight (parameter `qu`).
inline constexpr std::string_view kConcurrentRequestsUnit = "concurrent-requests";

// The RateLimit-Policy value of a concurrency limit: `"<name>";q=<max in flight>;qu="concurrent-
// requests"`, without `w` (a concurrency quota has no time window).
inline std::string concurrency_policy_value(std::string_view name, std::uint64_t max_in_flight) {
  std::string out;
  append_structured_string(out, name);
  out.append(";q=");
  append_structured_integer(out, max_in_flight);
  out.append(";qu=");
  append_structured_string(out, kConcurrentRequestsUnit);
  return out;
}
inline HttpField concurrency_policy_field(std::string_view name, std::uint64_t max_in_flight) {
  return HttpField{kRateLimitPolicyField, concurrency_policy_value(name, max_in_flight)};
}

// The RateLimit value of a concurrency decision: `"<name>";r=<free slots>`; a denial adds
// `;t=<seconds>`, the Retry-After value (until the earliest lease of the key runs out).
inline std::string concurrency_value(std::string_view name, const Decision& decision) {
  std::string out;
  append_structured_string(out, name);
  out.append(";r=");
  append_structured_integer(out, decision.remaining);
  if (!decision.allowed()) {
    out.append(";t=");
    append_structured_integer(
        out, static_cast<std::uint64_t>(retry_after_seconds(decision.retry_after)));
  }
  return out;
}
inline HttpField concurrency_field(std::string_view name, const Decision& decision) {
  return HttpField{kRateLimitField, concurrency_value(name, decision)};
}

}  // namespace sluice

#endif  // SLUICE_HTTP_FIELDS_HPP_
