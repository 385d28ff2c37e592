// sluice/redis/engine_backend.hpp — the policy engine with every rule's state in Redis.
//
// `RedisEngineBackend` models sluice::EngineBackend (sluice/engine.hpp): one `Limit` per
// compiled rule, state in Redis, so every replica running the same config shares each rule's
// budget. `RedisRateLimitEngine` is the engine over it.
//
//   auto client = sluice::redis::Client::create({.connection = {.unix_socket = "/run/redis.sock"},
//                                                 .key_prefix = "rl:gw:", .key_seed = kSeed});
//   if (!client.ok()) return client.status();
//   auto engine = sluice::redis::RedisRateLimitEngine::create(config, {.client = *client});
//   sluice::Evaluation e = engine->evaluate(request);  // one round trip for the live rules
//
// A request's live rules cost one round trip: kAllOrNothing is one `Client::check_all` (one
// script call, atomic on a single node: a denied request consumes nothing in any rule);
// kEveryRule is one pipelined write of one script call per rule, each deciding alone. Dry-run
// rules, when a request has any, are a second round trip. check_rules_as_they_stand (the
// StandingBackend power) is check_all's one script call too, a denied request's admitting rules
// reported at cost 0 from the state in its reply. Errors come back as the client's
// absl::Status (Unavailable, DeadlineExceeded, Internal); the engine then fails open or closed.
// An error in kEveryRule may come after some rules consumed (their replies were lost).
//
// Keys: the engine's key for a rule starts with a hash of the rule's fingerprint, and the Redis
// key is the client's digest of it under the rule's windows (`Client::redis_key`). So an
// unchanged rule maps to the same Redis key across a reload (its state simply stays in Redis;
// nothing is transferred). A rule whose only change is its windows (same CompiledRule::identity)
// maps to new keys, and each key carries its spent share over from the keys of the rule's earlier
// window sets on its first check in the new generation (sluice/engine/carried_rules.hpp,
// sluice/redis/detail/carry.hpp): up to three more round trips for that check only. Old keys
// expire by themselves.
//
// Stats: `rule_store_stats` is all zeros: Redis holds the keys (count them there); the engine's
// per-rule allowed/denied counters work as with the in-memory backend.
// Thread-safety: `check_rules` and `check_rules_as_they_stand` may be called concurrently (the
// client is thread-safe).
#ifndef SLUICE_REDIS_ENGINE_BACKEND_HPP_
#define SLUICE_REDIS_ENGINE_BACKEND_HPP_

#include <algorithm>
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
#include "sluice/redis/client.hpp"
#include "sluice/redis/detail/booking.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/store.hpp"

namespace sluice::redis {

class RedisEngineBackend {
 public:
  using Lineage = sluice::detail::WindowSetLineage<Limit>;

  struct Options {
    // Required; shared by every generation of the engine. Its ClientOptions::time_source, when
    // set, is the engine's time too.
    std::shared_ptr<Client> client{};
  };

  // InvalidArgument naming the rule's label when its windows are outside the script's exact
  // range (kMaxRequests, kMaxRefill), or when `options.client` is null. A fixed-window rule
  // is a Limit::fixed_window, decided in the same script call as the request's GCRA rules.
  // FailedPrecondition, naming the fix, for a server that cannot hold the limits
  // (Client::verify_server: asked of the server once per client, so a reload costs nothing once it
  // passed). Succeeds while Redis cannot be reached: the server is checked when a connection first
  // opens.
  static absl::StatusOr<RedisEngineBackend> create(std::span<const CompiledRule> rules,
                                                   const RedisEngineBackend* previous,
                                                   const Options& options) {
    if (options.client == nullptr) {
      return absl::InvalidArgumentError("sluice::redis: RedisEngineBackend needs a client");
    }
    RedisEngineBackend backend(options);
    backend.limits_.reserve(rules.size());
    for (const CompiledRule& rule : rules) {
      absl::StatusOr<Limit> limit = rule.algorithm == sluice::Algorithm::kFixedWindow
                                        ? Limit::fixed_window(fixed_windows(rule))
                                        : Limit::create(limiter_windows(rule));
      if (!limit.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(rule.label, ": ", limit.status().message()));
      }
      backend.limits_.push_back(std::make_shared<const Limit>(*std::move(limit)));
      backend.labels_.push_back(rule.label);
      backend.lineages_.push_back(lineage_of(rule, previous));
      backend.lineages_.back()->add(backend.limits_.back(), rule_key_prefix(rule.fingerprint));
      backend.carried_.push_back(
          {.identity = rule.identity,
           .fingerprint = rule.fingerprint,
           .limit = backend.limits_.back(),
           // A fixed-window rule's keys are not carried: a changed one starts fresh.
           .sources = previous != nullptr && rule.algorithm == sluice::Algorithm::kGcra
                          ? sluice::detail::carry_sources<Limit>(
                                rule, std::span(previous->carried_),
                                sluice::detail::unix_now(options.client->options().time_source),
                                [](const Limit& l) -> const std::vector<GcraWindow>& {
                                  return l.windows();
                                })
                          : std::vector<sluice::detail::CarrySource<Limit>>{}});
    }
    if (absl::Status verdict = options.client->verify_server(); !verdict.ok()) return verdict;
    return backend;
  }

  // As an alternative of VariantBackend (sluice/runtime_engine.hpp): serves `redis` and
  // `redis_cluster`; options_for opens a Client from the config's section (Client::create's
  // errors, e.g. FailedPrecondition for a server without bounded memory).
  static bool serves(BackendKind kind) {
    return kind == BackendKind::kRedis || kind == BackendKind::kRedisCluster;
  }
  static absl::StatusOr<Options> options_for(const BackendConfig& section) {
    ClientOptions client;
    client.cluster = section.type == BackendKind::kRedisCluster;
    if (section.unix_socket.empty()) {
      std::optional<HostPort> address = split_host_port(section.address);
      if (!address) return absl::InvalidArgumentError("backend.address: must be host:port");
      client.connection.host = std::move(address->host);
      client.connection.port = address->port;
    } else {
      client.connection.unix_socket = section.unix_socket;
    }
    using std::chrono::milliseconds;
    if (section.connect_timeout_ms) {
      client.connection.connect_timeout = milliseconds(*section.connect_timeout_ms);
    }
    if (section.command_timeout_ms) {
      client.connection.command_timeout = milliseconds(*section.command_timeout_ms);
    }
    if (section.max_connections) client.connection.max_connections = *section.max_connections;
    if (section.key_prefix) client.key_prefix = *section.key_prefix;
    client.key_seed = section.key_seed;
    absl::StatusOr<std::shared_ptr<Client>> created = Client::create(std::move(client));
    if (!created.ok()) return created.status();
    return Options{.client = *std::move(created)};
  }

  // Decides every key (one rule each, its own cost) into `out` (same size), in one round trip.
  absl::Status check_rules(std::span<const RuleKey> keys, ConsumptionMode mode,
                           std::span<Decision> out) {
    if (keys.empty()) {
      return absl::OkStatus();
    }
    absl::InlinedVector<CheckItem, 8> items;
    CarriedKeys carried(keys, carried_, [this] {
      return sluice::detail::unix_now(options_.client->options().time_source);
    });
    if (absl::Status s = make_items(keys, items, carried); !s.ok()) return s;
    if (mode == ConsumptionMode::kEveryRule) {
      return check_each(items, out);
    }
    absl::StatusOr<std::vector<Decision>> decisions = options_.client->check_all(items);
    if (!decisions.ok()) {
      return decisions.status();
    }
    std::copy(decisions->begin(), decisions->end(), out.begin());
    return absl::OkStatus();
  }

  // check_rules in kAllOrNothing that reports a denied request's admitting keys as they stand
  // (StandingBackend): the same one script call (Client::check_all_as_they_stand), each such
  // key's cost-0 decision recomputed from the state the reply carries.
  absl::Status check_rules_as_they_stand(std::span<const RuleKey> keys, std::span<Decision> out) {
    if (keys.empty()) return absl::OkStatus();
    absl::InlinedVector<CheckItem, 8> items;
    CarriedKeys carried(keys, carried_, [this] {
      return sluice::detail::unix_now(options_.client->options().time_source);
    });
    if (absl::Status s = make_items(keys, items, carried); !s.ok()) return s;
    absl::StatusOr<std::vector<Decision>> decisions =
        options_.client->check_all_as_they_stand(items);
    if (!decisions.ok()) return decisions.status();
    std::copy(decisions->begin(), decisions->end(), out.begin());
    return absl::OkStatus();
  }

  // One live rule's admission of a request, kept to settle its cost later
  // (BasicRateLimitEngine::settle). It holds the client, the rule's limit and its lineage, so it
  // outlives reloads.
  struct Booking {
    std::shared_ptr<Client> client{};
    std::shared_ptr<const Limit> limit{};
    detail::Receipt receipt{};  // the Redis key, the TATs booked, the reset count, the cost
    std::shared_ptr<const Lineage> lineage{};
    // The engine key (rule prefix, then the request's key parts): the key under the rule's other
    // window sets, for a charge. Held until settled, never sent or logged.
    std::string key{};
    std::size_t prefix_size = 0;  // of `key`: rule_key_prefix(fingerprint).size()
  };

  // `check_rules` that also records each key's booking when every key was admitted (else
  // `bookings` is left empty): the same round trip, whose script also reads each key's reset
  // count (sluice/redis/script.hpp). A request with a fixed-window rule is only checked: it
  // books nothing, so its settlement stays closed.
  absl::Status check_rules_booking(std::span<const RuleKey> keys, ConsumptionMode mode,
                                   std::span<Decision> out, std::vector<Booking>& bookings) {
    bookings.clear();
    if (keys.empty()) return absl::OkStatus();
    for (const RuleKey& k : keys) {
      if (limits_[k.rule]->algorithm() == sluice::Algorithm::kFixedWindow) {
        return check_rules(keys, mode, out);
      }
    }
    absl::InlinedVector<CheckItem, 8> items;
    CarriedKeys carried(keys, carried_, [this] {
      return sluice::detail::unix_now(options_.client->options().time_source);
    });
    if (absl::Status s = make_items(keys, items, carried); !s.ok()) return s;
    std::vector<detail::ItemBooking> booked;
    if (mode == ConsumptionMode::kEveryRule) {
      std::vector<absl::StatusOr<Decision>> decisions =
          options_.client->check_pipelined_booking(items, booked);
      for (std::size_t i = 0; i < decisions.size(); ++i) {
        if (!decisions[i].ok()) return decisions[i].status();
        out[i] = *decisions[i];
      }
    } else {
      absl::StatusOr<std::vector<Decision>> decisions =
          options_.client->check_all_booking(items, booked);
      if (!decisions.ok()) return decisions.status();
      std::copy(decisions->begin(), decisions->end(), out.begin());
    }
    if (!std::all_of(out.begin(), out.end(), [](const Decision& d) { return d.allowed(); })) {
      return absl::OkStatus();
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::shared_ptr<const Limit>& limit = limits_[keys[i].rule];
      bookings.push_back({.client = options_.client,
                          .limit = limit,
                          .receipt = {.key = options_.client->redis_key(keys[i].key, *limit),
                                      .tats = std::move(booked[i].tats),
                                      .serial = booked[i].serial,
                                      .estimate = keys[i].cost},
                          .lineage = lineages_[keys[i].rule],
                          .key = std::string(keys[i].key),
                          .prefix_size = prefix_size(keys[i].rule)});
    }
    return absl::OkStatus();
  }

  // Settles one booking at `units` (RedisGcraLimiter::settle's rules, one round trip): the key's
  // state after it. As settle_bookings for one booking.
  static absl::StatusOr<Decision> settle_booking(const Booking& b, std::uint64_t units) {
    const Booking* one = &b;
    return std::move(settle_bookings(std::span(&one, 1), std::span(&units, 1))[0]);
  }

  // Settles *bookings[i] at units[i], all by one deadline (the client's command timeout from now):
  // one pipelined round trip for every booking, the nodes of a Cluster in parallel; each key's
  // state after it, in order. A charge also lands on the key under every other window set its rule
  // has had (a reload changed its windows) where that key holds state, in a second round trip by
  // the same deadline, as in memory: a key carried into a new generation before the settlement owes
  // the charge there. A key not carried yet is not written: its first check carries the charged
  // state. Charging first the booked key, then the others, a charge never escapes; a check that
  // carries the key between the two charges it twice. A refund stays on the booked key; a booking
  // whose own call failed (a stalled server) charges no other key.
  static std::vector<absl::StatusOr<Decision>> settle_bookings(
      std::span<const Booking* const> bookings, std::span<const std::uint64_t> units) {
    std::vector<absl::StatusOr<Decision>> settled;
    if (bookings.empty()) return settled;
    Client& client = *bookings[0]->client;  // every generation of an engine shares its client
    const detail::Deadline deadline =
        std::chrono::steady_clock::now() + client.options().connection.command_timeout;
    std::vector<std::vector<std::string>> calls;
    for (std::size_t i = 0; i < bookings.size(); ++i) {
      calls.push_back(
          detail::settle_args(client, *bookings[i]->limit, bookings[i]->receipt, units[i]));
    }
    std::vector<absl::StatusOr<detail::ReplyPtr>> replies = client.run_bookings(calls, deadline);
    calls.clear();
    for (std::size_t i = 0; i < bookings.size(); ++i) {
      const Booking& b = *bookings[i];
      settled.push_back(detail::settled_state(*b.limit, detail::booking_ints(replies[i])));
      if (settled.back().ok() && units[i] > b.receipt.estimate) {
        charge_other_window_sets(b, units[i] - b.receipt.estimate, calls);
      }
    }
    if (!calls.empty()) (void)client.run_bookings(calls, deadline);
    return settled;
  }

  // Zeros: the keys live in Redis (see the class comment).
  StoreStats rule_store_stats(std::size_t /*rule*/) const { return {}; }

  // Forgets rule `rule`'s state for `key` (BasicRateLimitEngine::reset): one round trip, and
  // one more per earlier window set of a changed rule (whose keys would be carried again).
  absl::Status reset_key(std::size_t rule, std::string_view key) {
    for (const sluice::detail::CarrySource<Limit>& source : carried_[rule].sources) {
      const std::string old_key = sluice::detail::carried_key(source, key, prefix_size(rule));
      if (absl::Status s = options_.client->reset(old_key, *source.limit); !s.ok()) return s;
    }
    return options_.client->reset(key, *limits_[rule]);
  }

  // Rule `rule`'s limit (its limiter_windows, shortest first).
  const Limit& limit(std::size_t rule) const { return *limits_[rule]; }
  // The Redis key holding rule `rule`'s state for the engine key `key` (for operators and tests).
  std::string redis_key(std::size_t rule, std::string_view key) const {
    return options_.client->redis_key(key, *limits_[rule]);
  }
  const std::shared_ptr<Client>& client() const noexcept { return options_.client; }

 private:
  explicit RedisEngineBackend(Options options) : options_(std::move(options)) {}

  static std::vector<FixedWindow> fixed_windows(const CompiledRule& rule) {
    std::vector<FixedWindow> out;
    for (const GcraWindow& w : limiter_windows(rule)) {
      out.push_back({.limit = w.requests, .window = w.period});
    }
    return out;
  }

  using CarriedKeys = sluice::detail::CarriedKeys<Limit, CarriedFrom>;

  // Adds to `calls` a charge of `extra` units on `b`'s key under each other GCRA window set of its
  // rule that holds state there ('k').
  static void charge_other_window_sets(const Booking& b, std::uint64_t extra,
                                       std::vector<std::vector<std::string>>& calls) {
    if (b.lineage == nullptr) return;
    const std::string_view own = std::string_view(b.key).substr(0, b.prefix_size);
    for (const Lineage::Member& other : b.lineage->others(own)) {
      if (other.limit->algorithm() != sluice::Algorithm::kGcra) continue;  // never carried
      const std::string key = absl::StrCat(other.key_prefix, b.key.substr(b.prefix_size));
      calls.push_back(detail::booking_args(*b.client, b.client->redis_key(key, *other.limit), "k",
                                           detail::booking_params(*other.limit, extra), ""));
    }
  }

  // The lineage of `rule`'s identity: the previous generation's, or a new one.
  static std::shared_ptr<Lineage> lineage_of(const CompiledRule& rule,
                                             const RedisEngineBackend* previous) {
    if (previous != nullptr) {
      for (std::size_t i = 0; i < previous->carried_.size(); ++i) {
        if (previous->carried_[i].identity == rule.identity) return previous->lineages_[i];
      }
    }
    return std::make_shared<Lineage>();
  }

  std::size_t prefix_size(std::size_t rule) const {
    return rule_key_prefix(carried_[rule].fingerprint).size();
  }

  // One check item per key, with the keys of its rule's earlier window sets; InvalidArgument,
  // before anything is sent, for a cost that can never pass its rule.
  absl::Status make_items(std::span<const RuleKey> keys, absl::InlinedVector<CheckItem, 8>& items,
                          CarriedKeys& carried) const {
    for (const RuleKey& k : keys) {
      const Limit& limit = *limits_[k.rule];
      if (k.cost > limit.max_cost()) {
        return absl::InvalidArgumentError(
            absl::StrCat(labels_[k.rule], ": cost exceeds the smallest burst and can never pass"));
      }
      items.push_back({.key = k.key,
                       .limit = &limit,
                       .cost = k.cost,
                       .carried_from = carried.add(carried_[k.rule], k.key)});
    }
    return absl::OkStatus();
  }

  // kEveryRule: one pipelined script call per item; the first error is the result.
  absl::Status check_each(std::span<const CheckItem> items, std::span<Decision> out) {
    std::vector<absl::StatusOr<Decision>> decisions = options_.client->check_pipelined(items);
    for (std::size_t i = 0; i < decisions.size(); ++i) {
      if (!decisions[i].ok()) {
        return decisions[i].status();
      }
      out[i] = *decisions[i];
    }
    return absl::OkStatus();
  }

  Options options_;
  std::vector<std::shared_ptr<const Limit>> limits_;  // per compiled rule; bookings share them
  std::vector<std::string> labels_;                   // per compiled rule, for errors
  std::vector<sluice::detail::CarriedRule<Limit>> carried_;  // per compiled rule
  std::vector<std::shared_ptr<Lineage>> lineages_;           // per compiled rule
};

static_assert(sluice::EngineBackend<RedisEngineBackend> &&
              sluice::StandingBackend<RedisEngineBackend> &&
              sluice::BatchSettlingBackend<RedisEngineBackend>);

// The policy engine with every rule's state in Redis (fleet-wide limits).
using RedisRateLimitEngine = sluice::BasicRateLimitEngine<RedisEngineBackend>;

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_ENGINE_BACKEND_HPP_
