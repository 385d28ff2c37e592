// sluice/envoy/request.hpp — one ShouldRateLimit call and its answer, as plain values.
//
// The limiter (sluice/envoy/limiter.hpp) decides a `Request` into a `Response`; the gRPC service
// (sluice/envoy/service.hpp) converts Envoy's messages to and from them, so the decisions can be
// used and tested without protobuf:
//
//   const sluice::envoy::Entry entries[] = {{"remote_address", "10.0.0.1"}};
//   const sluice::envoy::Descriptor descriptors[] = {{.entries = entries}};
//   sluice::envoy::Response response;
//   absl::Status s = limiter->should_rate_limit({.domain = "edge", .descriptors = descriptors},
//                                               response);
//
// Views must outlive the call. Units: integer nanoseconds. Plain values: thread-compatible.
#ifndef SLUICE_ENVOY_REQUEST_HPP_
#define SLUICE_ENVOY_REQUEST_HPP_

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/envoy/config.hpp"
#include "sluice/http_fields.hpp"

namespace sluice::envoy {

struct Entry {
  std::string_view key{};
  std::string_view value{};
};

// A descriptor's own limit: `requests_per_unit` per `unit`, instead of the configured one (with
// kUnknown, none: the configured one applies).
struct LimitOverride {
  std::uint32_t requests_per_unit = 0;
  Unit unit = Unit::kUnknown;
};

struct Descriptor {
  std::span<const Entry> entries{};
  std::optional<LimitOverride> limit{};
  // Hits this descriptor adds, instead of the request's; 0 checks the limit without adding any.
  std::optional<std::uint64_t> hits_addend{};
};

struct Request {
  std::string_view domain{};
  std::span<const Descriptor> descriptors{};
  std::uint32_t hits_addend = 0;  // hits every descriptor adds; 0 counts as 1
};

// Envoy's response codes, with their values on the wire.
enum class Code : int { kUnknown = 0, kOk = 1, kOverLimit = 2 };

// The limit a descriptor was decided by, in the protocol's terms: a window whose period is not
// one of the protocol's units is reported in the nearest unit (by ratio), its requests scaled to
// that unit and rounded to the nearest integer, at least 1 (0 for a limit that admits nothing).
struct CurrentLimit {
  // The limit's `name`, else its descriptor path ("domain.key_value.key"); each byte of either
  // that is not UTF-8 written as \xNN, so that Envoy can read it.
  std::string name{};
  std::uint32_t requests_per_unit = 0;
  Unit unit = Unit::kUnknown;
  friend bool operator==(const CurrentLimit&, const CurrentLimit&) = default;
};

struct DescriptorStatus {
  Code code = Code::kOk;
  std::optional<CurrentLimit> current_limit{};  // none: no limit applied (or an unlimited one)
  // Hits left in the binding window after this request (before it, when nothing was consumed);
  // 2^32-1 for an unlimited limit, 0 when no limit applied. Saturated to 2^32-1.
  std::uint32_t limit_remaining = 0;
  // Until the binding window's bucket is full again.
  std::chrono::nanoseconds duration_until_reset{0};
  friend bool operator==(const DescriptorStatus&, const DescriptorStatus&) = default;
};

struct Response {
  Code overall_code = Code::kOk;
  std::vector<DescriptorStatus> statuses{};  // one per request descriptor, in request order
  // Over limit: the longest wait until every denying limit would admit its hits (0 when a limit
  // can never admit them: a limit of 0, or more hits than its burst).
  std::chrono::nanoseconds retry_after{0};
  // The backend failed and the failure mode decided (see Options::on_backend_error).
  bool backend_failed = false;
  // Decided in process on this replica's share of the limits (FailureMode::kLocal), because the
  // backend failed on this call or failed recently.
  bool degraded = false;
  // With Options::response_headers: RateLimit-Policy and RateLimit (draft IETF fields) for the
  // binding limit (the first denying one, else the one with the least remaining), and
  // Retry-After when over limit.
  HttpFields headers{};
};

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_REQUEST_HPP_
