// sluice/prometheus.hpp — an engine's counters in the Prometheus text exposition format 0.0.4.
//
// Serve the text at a metrics endpoint with the content type `kPrometheusContentType`:
//
//   std::string body;
//   sluice::append_prometheus_text(body, engine);   // or holder.current() of a reloading holder
//   respond(200, sluice::kPrometheusContentType, body);
//
// Families (each with HELP and TYPE lines), every name prefixed `sluice_`:
//   sluice_engine_evaluations_total, sluice_engine_backend_errors_total,
//   sluice_engine_reloads_total, sluice_engine_failed_reloads_total       (counters, no labels)
//   sluice_rule_allowed_total, sluice_rule_denied_total, sluice_rule_dry_denied_total,
//   sluice_rule_evictions_total, sluice_rule_idle_reclaimed_total,
//   sluice_rule_capacity_denials_total                                     (counters)
//   sluice_rule_keys                                                       (gauge)
//   sluice_rule_limit_factor_permille (gauge), sluice_rule_limit_decreases_total (counter): only
//   where the config has adaptive rules, one sample per adaptive rule
//   sluice_engine_degraded_evaluations_total, sluice_rule_degraded_total (counters): only where
//   the engine runs with `on_backend_error: local` or has decided a request on its local share
// Rule families carry the labels `rule` (the rule's label, "<bundle>/<rule>") and `dry_run`
// ("true"/"false"). Their meaning is that of sluice::EngineStats and sluice::RuleStats. Label
// values are escaped as the format requires (backslash, double quote, line feed), so no name in a
// config can break a line or forge a sample. No key or other client-chosen text is written.
//
// Counters survive reloads: a generation compiled by `reload` shares the engine counters and the
// counters of its unchanged rules with the previous one.
//
// Thread-safety: reads the engine's counters without locks; call it from any thread, at any time.
// Complexity: O(rules × kStoreShards) atomic loads; allocates nothing but `out`'s growth and one
// buffer of counts per call.
#ifndef SLUICE_PROMETHEUS_HPP_
#define SLUICE_PROMETHEUS_HPP_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/prometheus_text.hpp"
#include "sluice/engine.hpp"

namespace sluice {

namespace detail {

// One sample of a per-rule family: `name{rule="<label>",dry_run="<bool>"} value`.
inline void append_rule_sample(std::string& out, std::string_view name, const CompiledRule& rule,
                               std::uint64_t value) {
  out.append(name);
  out.append("{rule=\"");
  append_prometheus_label_value(out, rule.label);
  absl::StrAppend(&out, "\",dry_run=\"", rule.dry_run ? "true" : "false", "\"} ", value, "\n");
}

// The engine's own counters; the degraded family only where the local failure mode is (or was)
// configured, `local`.
inline void append_engine_families(std::string& out, const EngineStats& totals, bool local) {
  const struct {
    PrometheusFamily family;
    std::uint64_t value = 0;
  } engine_families[] = {
      {{"sluice_engine_evaluations_total", "counter",
        "Requests the engine evaluated (exempt paths excluded)."},
       totals.evaluations},
      {{"sluice_engine_backend_errors_total", "counter",
        "Evaluations during which the limiter backend failed."},
       totals.backend_errors},
      {{"sluice_engine_reloads_total", "counter", "Successful config reloads."}, totals.reloads},
      {{"sluice_engine_failed_reloads_total", "counter",
        "Config reloads that failed and kept the previous config."},
       totals.failed_reloads},
      {{"sluice_engine_degraded_evaluations_total", "counter",
        "Evaluations decided in process on the local share while the limiter backend failed."},
       totals.degraded_evaluations},
  };
  for (const auto& f : engine_families) {
    if (!local && f.family.name == "sluice_engine_degraded_evaluations_total") continue;
    append_prometheus_family(out, f.family, f.value);
  }
}

// Every rule's counters, one family at a time.
template <class Engine>
void append_rule_families(std::string& out, const Engine& engine, bool local) {
  absl::InlinedVector<RuleCounts, 16> counts;
  for (std::size_t i = 0; i < engine.rule_count(); ++i) counts.push_back(engine.rule_counts(i));
  const struct {
    PrometheusFamily family;
    std::uint64_t (*value)(const RuleCounts&) = nullptr;
  } rule_families[] = {
      {{"sluice_rule_allowed_total", "counter",
        "Admitted requests the rule applied to (for a dry-run rule, also those it would deny)."},
       [](const RuleCounts& c) { return c.admitted; }},
      {{"sluice_rule_denied_total", "counter", "Requests the rule denied (live rules)."},
       [](const RuleCounts& c) { return c.denied; }},
      {{"sluice_rule_dry_denied_total", "counter",
        "Requests the rule would have denied (dry-run rules)."},
       [](const RuleCounts& c) { return c.dry_denied; }},
      {{"sluice_rule_evictions_total", "counter",
        "Live keys evicted from the rule's full store (each got a fresh bucket)."},
       [](const RuleCounts& c) { return c.store.live_evicted; }},
      {{"sluice_rule_idle_reclaimed_total", "counter",
        "Idle keys dropped from the rule's full store."},
       [](const RuleCounts& c) { return c.store.idle_reclaimed; }},
      {{"sluice_rule_capacity_denials_total", "counter",
        "New keys denied because the rule's store was full."},
       [](const RuleCounts& c) { return c.store.capacity_denials; }},
      {{"sluice_rule_keys", "gauge", "Keys the rule's store holds."},
       [](const RuleCounts& c) { return c.store.size; }},
      {{"sluice_rule_degraded_total", "counter",
        "Requests the rule decided in process on the local share while the backend failed."},
       [](const RuleCounts& c) { return c.degraded; }},
  };
  for (const auto& f : rule_families) {
    if (!local && f.family.name == "sluice_rule_degraded_total") continue;
    append_prometheus_header(out, f.family);
    for (std::size_t i = 0; i < counts.size(); ++i) {
      append_rule_sample(out, f.family.name, engine.rule(i).compiled, f.value(counts[i]));
    }
  }
}

// Adaptive rules: the limit factor each runs at, and how often it was cut.
template <class Engine>
void append_adaptive_families(std::string& out, const Engine& engine) {
  absl::InlinedVector<std::pair<std::size_t, AdaptiveState>, 4> adaptive;
  for (std::size_t i = 0; i < engine.rule_count(); ++i) {
    if (std::optional<AdaptiveState> state = engine.adaptive_state(i)) {
      adaptive.emplace_back(i, *state);
    }
  }
  if (adaptive.empty()) return;
  const struct {
    PrometheusFamily family;
    std::uint64_t (*value)(const AdaptiveState&) = nullptr;
  } adaptive_families[] = {
      {{"sluice_rule_limit_factor_permille", "gauge",
        "The adaptive rule's limit factor in permille (1000 = the configured limit)."},
       [](const AdaptiveState& a) { return std::uint64_t{a.factor_permille}; }},
      {{"sluice_rule_limit_decreases_total", "counter",
        "Times the adaptive rule's limit factor was cut (overloaded intervals, 429/503 answers)."},
       [](const AdaptiveState& a) { return a.decreases; }},
  };
  for (const auto& f : adaptive_families) {
    append_prometheus_header(out, f.family);
    for (const auto& [i, state] : adaptive) {
      append_rule_sample(out, f.family.name, engine.rule(i).compiled, f.value(state));
    }
  }
}

}  // namespace detail

// Appends every counter of `engine` (a BasicRateLimitEngine) to `out`.
template <class Engine>
void append_prometheus_text(std::string& out, const Engine& engine) {
  const EngineStats totals = engine.engine_stats();
  // The local failure mode's counters: where it is configured, or was before a reload.
  const bool local =
      engine.failure_mode() == FailureMode::kLocal || totals.degraded_evaluations != 0;
  detail::append_engine_families(out, totals, local);
  detail::append_rule_families(out, engine, local);
  detail::append_adaptive_families(out, engine);
}

// The text of append_prometheus_text in a new string.
template <class Engine>
std::string prometheus_text(const Engine& engine) {
  std::string out;
  append_prometheus_text(out, engine);
  return out;
}

}  // namespace sluice

#endif  // SLUICE_PROMETHEUS_HPP_
