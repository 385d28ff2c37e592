// The policy configs and rule helpers shared by the engine's tests and benchmarks.
#ifndef SLUICE_TESTS_SUPPORT_EXAMPLE_CONFIG_HPP_
#define SLUICE_TESTS_SUPPORT_EXAMPLE_CONFIG_HPP_

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

#include "absl/status/status.h"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"
#include "sluice/policy.hpp"

namespace sluice::testing {

// A rule in one line: `rule("per-ip", {Selector::kIp}, {.s = 10}, 20)`.
inline Rule rule(std::string name, std::vector<Selector> selector, RequestsPer per,
                 std::optional<std::uint64_t> burst = std::nullopt) {
  return {.name = std::move(name),
          .selector = std::move(selector),
          .requests_per = per,
          .burst = burst};
}

// The example of docs/policies.md: bundle public-api-limits (10/s burst 20 and 600/min per ip;
// 2000/min per ip and route) on route `public` (path prefix /v1).
inline PolicyConfig documented_example() {
  return {
      .policies = {{.name = "public-api-limits",
                    .rate_limits = {rule("per-ip", {Selector::kIp}, {.s = 10, .minute = 600}, 20),
                                    rule("per-route-flood", {Selector::kIp, Selector::kRoute},
                                         {.minute = 2000})}}},
      .routes = {{.name = "public", .path_prefix = "/v1", .policies = {"public-api-limits"}}}};
}

// A fixed wall clock for X-RateLimit-Reset: 2023-11-14T22:13:20Z.
inline const WallTime kWall{std::chrono::seconds(1'700'000'000)};

// A request from `ip` on `route`, at kWall.
inline RequestContext on_route(std::string_view ip, std::string_view route) {
  return {.client_ip = ip, .route = route, .path = "/v1/items", .wall_time = kWall};
}

// The value of field `name` in `e`, or "<absent>".
inline std::string field(const Evaluation& e, std::string_view name) {
  for (const auto& f : e.fields) {
    if (f.name == name) return f.value;
  }
  return "<absent>";
}

// Compiled rules for a backend's own tests: 3 a second (an interval of 333333333.33 ns); 2 a
// second stacked with 5 a minute; a fixed window of 4 per 10 s.
inline std::vector<CompiledRule> standing_rules() {
  using namespace std::chrono_literals;
  std::vector<CompiledRule> rules(3);
  rules[0].windows = {{.requests = 3, .period = 1s, .burst = 3}};
  rules[1].windows = {{.requests = 2, .period = 1s, .burst = 2},
                      {.requests = 5, .period = 60s, .burst = 5}};
  rules[2].windows = {{.requests = 4, .period = 10s, .burst = 4}};
  rules[2].algorithm = Algorithm::kFixedWindow;
  for (std::size_t r = 0; r < rules.size(); ++r) {
    rules[r].label = rules[r].identity = rules[r].fingerprint = "rule " + std::to_string(r);
  }
  return rules;
}

// Requests over standing_rules(), one per 111 ms, that admit, then deny on one rule while keys of
// others admit with room left: a key repeated in a request (a second occurrence denied by the
// first's cost; both admitted beside a denial, each reporting the key as it stood before the
// request), a fixed window filled then denied, two rules denying at once.
inline std::vector<std::vector<RuleKey>> standing_requests() {
  return {
      {{0, "a", 2}, {1, "u", 1}},
      {{0, "a", 2}, {1, "u", 1}},  // a denies: u as it stands
      {{0, "b", 2}, {0, "b", 2}},  // the second b denies after the first: b as it stands
      {{0, "c", 1}, {2, "t", 4}, {0, "c", 1}},  // t fills its window
      {{0, "c", 1}, {2, "t", 1}, {0, "c", 1}},  // t and the second c deny: the first c stands
      {{0, "e", 1}, {2, "t", 1}, {0, "e", 1}},  // t denies: e stands twice, as before the call
      {{2, "t2", 3}, {1, "v", 2}, {0, "d", 3}},
      {{1, "v", 1}, {2, "t2", 1}, {0, "d", 1}},  // v and d deny: t2 as it stands
  };
}

// standing_rules() and a fourth rule of 1 a second, burst 1: a key repeated in a request whose
// second occurrence cannot fit after the first. Without `fixed_window` (a backend that lacks
// it), rule 2 is GCRA at the same rate.
inline std::vector<CompiledRule> repeat_rules(bool fixed_window = true) {
  using namespace std::chrono_literals;
  std::vector<CompiledRule> rules = standing_rules();
  if (!fixed_window) rules[2].algorithm = Algorithm::kGcra;
  CompiledRule& one = rules.emplace_back();
  one.windows = {{.requests = 1, .period = 1s, .burst = 1}};
  one.label = one.identity = one.fingerprint = "rule 3";
  return rules;
}

// Requests over repeat_rules() that name one (rule, key) more than once, one per 111 ms: both
// occurrences fit; the second does not (a tracked key, a new key, a fixed window); more than
// eight keys; a cost of 0 beside a repeated cost.
inline std::vector<std::vector<RuleKey>> repeated_key_requests() {
  return {
      {{0, "a", 1}, {0, "a", 1}},               // a new key, both fit
      {{0, "a", 1}, {0, "a", 1}, {0, "a", 1}},  // tracked: the third denies
      {{3, "f", 1}, {3, "f", 1}},               // a new key, burst 1: the second denies
      {{3, "g", 1}, {0, "a", 1}, {3, "g", 1}},  // the same between another rule's key
      {{2, "t", 3}, {2, "t", 2}},               // a fixed window of 4: the second denies
      {{2, "t", 2}, {2, "t", 2}},               // both fit the window
      {{0, "k1", 1},
       {0, "k2", 1},
       {0, "k3", 1},
       {0, "k4", 1},
       {0, "k5", 1},
       {0, "k6", 1},
       {0, "k7", 1},
       {3, "h", 1},
       {3, "h", 1}},  // nine keys: h's second occurrence denies
      {{0, "k1", 1},
       {0, "k2", 1},
       {0, "k3", 1},
       {0, "k4", 1},
       {0, "k5", 1},
       {0, "k6", 1},
       {0, "k7", 1},
       {0, "k8", 1},
       {1, "u", 1},
       {1, "u", 1}},               // ten keys, all fit
      {{1, "v", 2}, {1, "v", 0}},  // a peek after the cost sees it taken
  };
}

// Each item checked alone, in order, at one time (one kEveryRule call per item): what an
// all-or-nothing request of these items answers (consuming only if all admit).
template <class Backend>
std::vector<Decision> checked_one_by_one(Backend& backend, std::span<const RuleKey> keys) {
  std::vector<Decision> out(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!backend
             .check_rules(keys.subspan(i, 1), ConsumptionMode::kEveryRule,
                          std::span<Decision>(out).subspan(i, 1))
             .ok()) {
      return {};
    }
  }
  return out;
}

// How run_repeated_key_requests calls a backend: check_rules in either mode, the standing
// report, or check_rules_booking all or nothing.
enum class RepeatedWay { kAllOrNothing, kEveryRule, kAsTheyStand, kBooking };

// What a backend answered to repeated_key_requests(): per request its decisions and (kBooking)
// how many bookings it left.
struct RepeatedAnswers {
  std::vector<std::vector<Decision>> decisions;
  std::vector<std::size_t> booked;
  friend bool operator==(const RepeatedAnswers&, const RepeatedAnswers&) = default;
};

// repeated_key_requests() against `backend` in `way`, each key behind `prefix` (keys of their
// own in a shared store), `clock` advanced 111 ms before each: the same sequence any backend
// must answer identically. A failed call ends the answers early.
template <class Backend>
RepeatedAnswers run_repeated_key_requests(Backend& backend, ManualClock& clock, RepeatedWay way,
                                          std::string_view prefix = "") {
  using namespace std::chrono_literals;
  RepeatedAnswers answers;
  for (std::vector<RuleKey> keys : repeated_key_requests()) {
    std::vector<std::string> named;
    named.reserve(keys.size());
    for (RuleKey& k : keys) k.key = named.emplace_back(std::string(prefix) + std::string(k.key));
    clock.advance(111ms);
    std::vector<Decision> out(keys.size());
    absl::Status status;
    if (way == RepeatedWay::kAsTheyStand) {
      status = backend.check_rules_as_they_stand(keys, out);
    } else if (way == RepeatedWay::kBooking) {
      if constexpr (requires { typename Backend::Booking; }) {
        std::vector<typename Backend::Booking> bookings;
        status = backend.check_rules_booking(keys, ConsumptionMode::kAllOrNothing, out, bookings);
        answers.booked.push_back(bookings.size());
      }
    } else {
      status = backend.check_rules(keys,
                                   way == RepeatedWay::kEveryRule ? ConsumptionMode::kEveryRule
                                                                  : ConsumptionMode::kAllOrNothing,
                                   out);
    }
    if (!status.ok()) break;
    answers.decisions.push_back(std::move(out));
  }
  return answers;
}

// check_rules all or nothing, then, when a key denied, a peek at cost 0 for every admitting key:
// the two calls a caller makes over a backend without StandingBackend. False if either failed.
template <class Backend>
bool decide_then_peek(Backend& backend, std::span<const RuleKey> keys, std::span<Decision> out) {
  if (!backend.check_rules(keys, ConsumptionMode::kAllOrNothing, out).ok()) return false;
  if (std::all_of(out.begin(), out.end(), [](const Decision& d) { return d.allowed(); })) {
    return true;
  }
  std::vector<RuleKey> peek(keys.begin(), keys.end());
  for (RuleKey& k : peek) k.cost = 0;
  std::vector<Decision> standing(keys.size());
  if (!backend.check_rules(peek, ConsumptionMode::kAllOrNothing, standing).ok()) return false;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (out[i].allowed()) out[i] = standing[i];
  }
  return true;
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_SUPPORT_EXAMPLE_CONFIG_HPP_
