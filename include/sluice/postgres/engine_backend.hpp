// sluice/postgres/engine_backend.hpp — the policy engine with every rule's state in PostgreSQL.
//
// `PostgresEngineBackend` models sluice::EngineBackend: one GCRA `Limit` per compiled rule, state
// in the database, so every replica running the same config against the same database (and key
// seed) shares each rule's budget.
//
//   auto client = sluice::postgres::Client::create({.connection = {.conninfo = "dbname=gw"},
//                                                    .key_seed = kFleetSeed});
//   auto engine = sluice::postgres::PostgresRateLimitEngine::create(config, {.client = *client});
//   sluice::Evaluation e = engine->evaluate(request);  // one round trip for the live rules
//
// A request's live rules are one call of sluice.check_v2, each rule's key for its own cost, in
// either consumption mode:
// kAllOrNothing stores nothing unless every rule admits; kEveryRule stores each admitting rule.
// Dry-run rules, when a request has any, are a second round trip. Errors come back as the
// client's absl::Status (see client.hpp; Unknown when a commit's acknowledgement was lost); the
// engine then fails open or closed as configured.
//
// Keys: the engine's key for a rule starts with a hash of the rule's fingerprint and the rule's
// windows are part of the limit's identity, so an unchanged rule keeps its rows across a reload.
// A rule whose only change is its windows (same CompiledRule::identity) has new rows: a key
// without one gets, in the same call, the spent share of its rows under the rule's earlier window
// sets (sluice/engine/carried_rules.hpp, sluice.check_carried_v1 in schema version 4). Old rows go
// idle and are cleaned up.
// Stats: `rule_store_stats` is all zeros (the rows are in the database).
// A denied request reported as it stands (check_rules_as_they_stand) is two statements; when the
// second fails, the request stays denied and the failure is counted in `standing_failures()`,
// which every generation of an engine shares (sluice_postgres_standing_failures_total,
// sluice/postgres/prometheus.hpp).
// Thread-safety: `check_rules`, `check_rules_as_they_stand` and `standing_failures` may be called
// concurrently.
#ifndef SLUICE_POSTGRES_ENGINE_BACKEND_HPP_
#define SLUICE_POSTGRES_ENGINE_BACKEND_HPP_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/backend_config.hpp"
#include "sluice/decision.hpp"
#include "sluice/engine.hpp"
#include "sluice/engine/carried_rules.hpp"
#include "sluice/policy.hpp"
#include "sluice/postgres/client.hpp"
#include "sluice/postgres/limit.hpp"
#include "sluice/postgres/schema.hpp"

namespace sluice::postgres {

class PostgresEngineBackend {
 public:
  struct Options {
    // Required; shared by every generation of the engine. Its ClientOptions::time_source, when
    // set, is the engine's time too.
    std::shared_ptr<Client> client{};
  };

  // InvalidArgument naming the rule's label for a rule outside the supported ranges, an adaptive
  // rule or a fixed-window rule (a batch holds one algorithm), or when `options.client` is null.
  // The first generation (no `previous`) checks the database once (verify_database:
  // FailedPrecondition for a missing or older schema, or a read-only database); one that cannot
  // be reached then is accepted, and its checks fail until it is up.
  static absl::StatusOr<PostgresEngineBackend> create(std::span<const CompiledRule> rules,
                                                      const PostgresEngineBackend* previous,
                                                      const Options& options) {
    if (options.client == nullptr) {
      return absl::InvalidArgumentError("sluice::postgres: the engine backend needs a client");
    }
    PostgresEngineBackend backend(options);
    if (previous != nullptr) backend.standing_failures_ = previous->standing_failures_;
    for (const CompiledRule& rule : rules) {
      if (rule.adaptive) {
        return absl::InvalidArgumentError(absl::StrCat(
            rule.label, ": adaptive rules are not supported by the PostgreSQL backend"));
      }
      if (rule.algorithm == sluice::Algorithm::kFixedWindow) {
        return absl::InvalidArgumentError(absl::StrCat(
            rule.label, ": fixed_window rules are not supported by the PostgreSQL backend"));
      }
      absl::StatusOr<Limit> limit = Limit::gcra(rule.windows);
      if (!limit.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(rule.label, ": ", limit.status().message()));
      }
      backend.limits_.push_back(std::make_shared<const Limit>(*std::move(limit)));
      backend.carried_.push_back(
          {.identity = rule.identity,
           .fingerprint = rule.fingerprint,
           .limit = backend.limits_.back(),
           .sources = previous != nullptr
                          ? sluice::detail::carry_sources<Limit>(
                                rule, std::span(previous->carried_),
                                sluice::detail::unix_now(options.client->time_source()),
                                [](const Limit& l) -> const std::vector<GcraWindow>& {
                                  return l.gcra_windows();
                                })
                          : std::vector<sluice::detail::CarrySource<Limit>>{}});
    }
    if (previous == nullptr) {
      if (absl::Status s = verify_database(options.client->pool()); !s.ok()) return s;
    }
    return backend;
  }

  // As an alternative of VariantBackend (sluice/runtime_engine.hpp): serves `postgres`;
  // options_for makes a Client from the config's section (Client::create's errors).
  static bool serves(BackendKind kind) { return kind == BackendKind::kPostgres; }
  static absl::StatusOr<Options> options_for(const BackendConfig& section) {
    ClientOptions client;
    client.connection.conninfo = section.conninfo;
    client.key_seed = section.key_seed;
    using std::chrono::milliseconds;
    if (section.connect_timeout_ms) {
      client.connection.connect_timeout = milliseconds(*section.connect_timeout_ms);
    }
    if (section.command_timeout_ms) {
      client.connection.statement_timeout = milliseconds(*section.command_timeout_ms);
    }
    if (section.max_connections) client.connection.max_connections = *section.max_connections;
    absl::StatusOr<std::shared_ptr<Client>> created = Client::create(std::move(client));
    if (!created.ok()) return created.status();
    return Options{.client = *std::move(created)};
  }

  // Each rule's key for its own cost, in one round trip.
  absl::Status check_rules(std::span<const RuleKey> keys, ConsumptionMode mode,
                           std::span<Decision> out) {
    if (keys.empty()) return absl::OkStatus();
    absl::InlinedVector<CheckItem, 8> items;
    sluice::detail::CarriedKeys<Limit, CarriedFrom> carried(keys, carried_, [this] {
      return sluice::detail::unix_now(options_.client->time_source());
    });
    for (const RuleKey& k : keys) {
      items.push_back({.key = k.key,
                       .limit = limits_[k.rule].get(),
                       .cost = k.cost,
                       .carried_from = carried.add(carried_[k.rule], k.key)});
    }
    const BatchMode batch =
        mode == ConsumptionMode::kAllOrNothing ? BatchMode::kAllOrNothing : BatchMode::kEachItem;
    absl::StatusOr<std::vector<Decision>> d = options_.client->check_all(items, batch);
    if (!d.ok()) return d.status();
    std::copy(d->begin(), d->end(), out.begin());
    return absl::OkStatus();
  }

  // check_rules in kAllOrNothing that reports a denied request's admitting keys as they stand
  // (StandingBackend). The database answers decisions, not the state they came from, so a denied
  // request costs a second statement: every key at cost 0 (it stores nothing). If that statement
  // fails, the verdict stands: the call is OK, the admitting keys report their decision at their
  // cost (room as it stands, less their cost), and standing_failures() counts the failure.
  absl::Status check_rules_as_they_stand(std::span<const RuleKey> keys, std::span<Decision> out) {
    if (absl::Status s = check_rules(keys, ConsumptionMode::kAllOrNothing, out); !s.ok()) return s;
    if (std::all_of(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(keys.size()),
                    [](const Decision& d) { return d.allowed(); })) {
      return absl::OkStatus();
    }
    absl::InlinedVector<RuleKey, 8> peek(keys.begin(), keys.end());
    for (RuleKey& k : peek) k.cost = 0;
    absl::InlinedVector<Decision, 8> standing(keys.size());
    if (!check_rules(peek, ConsumptionMode::kAllOrNothing, standing).ok()) {
      standing_failures_->fetch_add(1, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (out[i].allowed()) out[i] = standing[i];
    }
    return absl::OkStatus();
  }

  // Zeros: the rows live in the database (see the header comment).
  StoreStats rule_store_stats(std::size_t /*rule*/) const { return {}; }

  // Denied requests whose second statement (check_rules_as_they_stand) failed, over every
  // generation since the first: each stayed denied, its admitting keys reported at their cost.
  std::uint64_t standing_failures() const noexcept {
    return standing_failures_->load(std::memory_order_relaxed);
  }

  // Forgets rule `rule`'s state for `key` (BasicRateLimitEngine::reset): one round trip
  // (Client::reset; FailedPrecondition until the schema is migrated to version 2).
  // A changed rule's keys under its earlier window sets are reset too (one round trip each), or
  // its next check would carry them again.
  absl::Status reset_key(std::size_t rule, std::string_view key) {
    for (const sluice::detail::CarrySource<Limit>& source : carried_[rule].sources) {
      const std::string old_key = sluice::detail::carried_key(source, key, prefix_size(rule));
      if (absl::Status s = options_.client->reset(old_key, *source.limit); !s.ok()) return s;
    }
    return options_.client->reset(key, *limits_[rule]);
  }

  // Rule `rule`'s limit (windows as compiled, shortest first).
  const Limit& limit(std::size_t rule) const { return *limits_[rule]; }
  const std::shared_ptr<Client>& client() const noexcept { return options_.client; }

 private:
  explicit PostgresEngineBackend(Options options) : options_(std::move(options)) {}

  std::size_t prefix_size(std::size_t rule) const {
    return rule_key_prefix(carried_[rule].fingerprint).size();
  }

  Options options_;
  std::vector<std::shared_ptr<const Limit>> limits_;         // per compiled rule
  std::vector<sluice::detail::CarriedRule<Limit>> carried_;  // per compiled rule
  // Shared with every later generation (create's `previous`).
  std::shared_ptr<std::atomic<std::uint64_t>> standing_failures_ =
      std::make_shared<std::atomic<std::uint64_t>>(0);
};

static_assert(EngineBackend<PostgresEngineBackend> && StandingBackend<PostgresEngineBackend>);

// The policy engine with every rule's state in PostgreSQL (fleet-wide limits).
using PostgresRateLimitEngine = BasicRateLimitEngine<PostgresEngineBackend>;

}  // namespace sluice::postgres

#endif  // SLUICE_POSTGRES_ENGINE_BACKEND_HPP_
