// An engine's event hook: log dry-run denials, backend errors, evictions and reloads
// (sluice/engine_events.hpp). The hook runs on the request (or reloading) thread: it only formats
// a line; a real service would hand it to its logger.
#include <cstdio>
#include <string>
#include <variant>

#include "sluice/engine.hpp"
#include "sluice/engine_events.hpp"

namespace {

void log_event(const sluice::EngineEvent& event) {
  if (const auto* d = std::get_if<sluice::DryRunDenialEvent>(&event)) {
    std::printf("dry-run rule %.*s would deny (retry after %lld ms)\n",
                static_cast<int>(d->rule_label.size()), d->rule_label.data(),
                static_cast<long long>(d->decision.retry_after.count() / 1'000'000));
  } else if (const auto* b = std::get_if<sluice::BackendErrorEvent>(&event)) {
    // At most one a second per status code; `suppressed` counts those held back before it.
    std::printf(
        "limiter backend failed, requests follow on_backend_error: %s (%llu more since "
        "the last report)\n",
        b->status.ToString().c_str(), static_cast<unsigned long long>(b->suppressed));
  } else if (const auto* e = std::get_if<sluice::EvictionEvent>(&event)) {
    std::printf("rule %.*s: %llu live keys evicted\n", static_cast<int>(e->rule_label.size()),
                e->rule_label.data(), static_cast<unsigned long long>(e->evicted));
  } else if (const auto* r = std::get_if<sluice::ReloadEvent>(&event)) {
    std::printf("reload: %s (%zu rules, %zu kept their state)\n", r->status.ToString().c_str(),
                r->rules, r->rules_kept);
  }
}

}  // namespace

int main() {
  const sluice::PolicyConfig config{
      .policies = {{.name = "shadow",
                    .rate_limits = {{.name = "strict",
                                     .selector = {sluice::Selector::kIp},
                                     .requests_per = {.s = 1}}},
                    .dry_run = true}},
      .gateway = {.global_policies = {"shadow"}}};
  auto engine = sluice::RateLimitEngine::create(config, {}, {}, log_event);
  if (!engine.ok()) return 1;
  engine->evaluate({.client_ip = "203.0.113.7", .path = "/v1/items"});
  engine->evaluate({.client_ip = "203.0.113.7", .path = "/v1/items"});  // a dry-run denial

  auto next = engine->reload(config);  // "reload: OK (1 rules, 1 kept their state)"
  return next.ok() ? 0 : 1;
}
