// sluice/decision.hpp — what a rate limiter answers for one request.
//
// A `Decision` says whether the request may proceed and, for the window that bound the decision,
// how much is left and how long to wait:
//
//   absl::StatusOr<sluice::Decision> d = limiter.check(client_ip);
//   if (!d.ok()) { /* bad cost or backend failure: choose fail-open or fail-closed */ }
//   else if (!d->allowed()) { respond_429(d->retry_after); }
//
// All durations are integer nanoseconds, rounded up so that waiting exactly `retry_after` is
// always enough.
#ifndef SLUICE_DECISION_HPP_
#define SLUICE_DECISION_HPP_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>

namespace sluice {

// Why a request was or was not admitted.
enum class Reason {
  kAllowed,        // admitted; the cost was reserved
  kQuotaExceeded,  // a window of the key's limit has no room for the cost
  kStoreFull,      // the key is new and its store refuses new keys (Overflow::kRejectNewKeys)
};

constexpr std::string_view to_string(Reason reason) noexcept {
  switch (reason) {
    case Reason::kAllowed:
      return "allowed";
    case Reason::kQuotaExceeded:
      return "quota_exceeded";
    case Reason::kStoreFull:
      return "store_full";
  }
  return "unknown";
}

inline std::ostream& operator<<(std::ostream& os, Reason reason) { return os << to_string(reason); }

// The outcome of one check. Value type; fields describe the binding window, which for a denial is
// the first denying window (shortest period first) and for an admission the window with the least
// remaining.
struct Decision {
  Reason reason = Reason::kAllowed;
  std::uint64_t limit = 0;      // binding window's burst (bucket size)
  std::uint64_t remaining = 0;  // binding window, after this request
  std::chrono::nanoseconds retry_after{
      0};  // 0 when allowed; else the wait until every window admits
  std::chrono::nanoseconds reset_after{0};  // until the binding window is full again
  std::size_t binding_window = 0;           // index into the limiter's windows, shortest first

  bool allowed() const noexcept { return reason == Reason::kAllowed; }

  friend bool operator==(const Decision&, const Decision&) = default;
};

inline std::ostream& operator<<(std::ostream& os, const Decision& d) {
  return os << "Decision{" << d.reason << ", limit=" << d.limit << ", remaining=" << d.remaining
            << ", retry_after=" << d.retry_after.count()
            << "ns, reset_after=" << d.reset_after.count()
            << "ns, binding_window=" << d.binding_window << "}";
}

}  // namespace sluice

#endif  // SLUICE_DECISION_HPP_
