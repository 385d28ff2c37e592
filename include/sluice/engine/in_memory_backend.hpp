// sluice/engine/in_memory_backend.hpp — the policy engine's state in this process.
//
// `InMemoryBackend` models every power of sluice/engine/backend.hpp: one GcraLimiter per rule
// (a FixedWindowLimiter for a fixed-window rule); an all-or-nothing request takes the shard locks
// of all its keys (in one global order), decides every key (a (rule, key) the request repeats
// after its earlier occurrences, on a copy of its cell), and commits only if all admit.
// Bookings (settlement) cover GCRA rules: a request with a fixed-window rule books nothing.
// check_rules_as_they_stand reports a denied request's admitting keys at cost 0 under the same
// locks (StandingBackend).
//
// Thread-safety: check_rules, check_rules_as_they_stand, check_rules_booking, reset_key and
// rule_store_stats may be called concurrently. Complexity: O(keys) per call, plus sorting the
// keys' shard locks (a denied check_rules_as_they_stand decides its admitting keys twice), plus
// O(keys²) comparisons of rule indices to find repeated keys (their digests compared only
// within one rule).
#ifndef SLUICE_ENGINE_IN_MEMORY_BACKEND_HPP_
#define SLUICE_ENGINE_IN_MEMORY_BACKEND_HPP_

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/backend_config.hpp"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/engine/backend.hpp"
#include "sluice/fixed_window.hpp"
#include "sluice/gcra.hpp"
#include "sluice/policy.hpp"
#include "sluice/store.hpp"

namespace sluice {

namespace detail {

// The GCRA limiters one rule identity has had across reloads: each reload that changes the
// rule's windows carries its keys into a new limiter, so a charge settled on an older one must
// land in the newer ones too. Members are weak: a generation nobody serves any more drops out.
template <Clock ClockT>
class RuleLineage {
 public:
  void add(const std::shared_ptr<GcraLimiter<ClockT>>& limiter) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(members_, [](const auto& m) { return m.expired(); });
    members_.push_back(limiter);
  }
  // Every member still alive but `self`.
  std::vector<std::shared_ptr<GcraLimiter<ClockT>>> others(const GcraLimiter<ClockT>* self) const {
    std::vector<std::shared_ptr<GcraLimiter<ClockT>>> out;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& m : members_) {
      if (auto alive = m.lock(); alive != nullptr && alive.get() != self) out.push_back(alive);
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::weak_ptr<GcraLimiter<ClockT>>> members_;
};

// One rule's limiter in the in-memory backend: a GcraLimiter, or a FixedWindowLimiter for a
// fixed-window rule (exactly one is set). Each call forwards to it.
template <Clock ClockT>
struct EngineRuleLimiter {
  std::shared_ptr<GcraLimiter<ClockT>> gcra{};
  std::shared_ptr<FixedWindowLimiter<ClockT>> fixed{};
  std::shared_ptr<RuleLineage<ClockT>> lineage{};  // with `gcra`

  template <class Fn>
  decltype(auto) visit(Fn&& fn) const {
    return gcra != nullptr ? fn(*gcra) : fn(*fixed);
  }
};

}  // namespace detail

// The in-memory backend: one limiter per rule, all-or-nothing commits under every involved
// shard lock taken in ascending address order.
template <Clock ClockT = SteadyClock>
class InMemoryBackend {
  using RuleLimiter = detail::EngineRuleLimiter<ClockT>;

 public:
  struct Options {
    StoreOptions store{};  // per rule; overflow must stay kEvict for all-or-nothing commits
    ClockT clock{};
  };

  // A rule whose windows change (same identity) keeps each key's spent share (see create).
  static constexpr bool kCarriesWindows = true;

  // One limiter per rule. With `previous` (a reload): a rule whose fingerprint `previous` has
  // shares its limiter; a rule whose identity it has but with other windows gets a new limiter
  // into which every live key of the previous one is copied at once, each window holding the
  // same spent share of its new bucket (GcraLimiter::carry_from: rounded toward less room, an
  // added window empty, a removed one dropped). That copy is O(keys + store capacity) of the
  // previous limiter, taking its shard locks one at a time; admissions the previous generation
  // makes after its shard was copied are not carried, but a charge settled on the previous
  // limiter later also lands in the new one (settle_booking). A fixed-window rule carries each
  // key's count (FixedWindowLimiter::carry_from). Any other rule starts empty.
  static absl::StatusOr<InMemoryBackend> create(std::span<const CompiledRule> rules,
                                                const InMemoryBackend* previous,
                                                const Options& options) {
    if (options.store.overflow != Overflow::kEvict) {
      return absl::InvalidArgumentError("the engine's in-memory stores must use Overflow::kEvict");
    }
    InMemoryBackend backend(options.clock);
    for (const CompiledRule& rule : rules) {
      RuleLimiter limiter = previous != nullptr
                                ? previous->find(previous->by_fingerprint_, rule.fingerprint)
                                : RuleLimiter{};
      if (limiter.gcra == nullptr && limiter.fixed == nullptr) {
        const RuleLimiter carried = previous != nullptr
                                        ? previous->find(previous->by_identity_, rule.identity)
                                        : RuleLimiter{};
        auto created = rule.algorithm == Algorithm::kFixedWindow
                           ? new_fixed_limiter(rule, carried.fixed, options)
                           : new_limiter(rule, carried, options);
        if (!created.ok()) return created.status();
        limiter = *std::move(created);
      }
      backend.any_fixed_ = backend.any_fixed_ || limiter.fixed != nullptr;
      backend.by_fingerprint_.emplace(rule.fingerprint, backend.limiters_.size());
      backend.by_identity_.emplace(rule.identity, backend.limiters_.size());
      backend.gcra_.push_back(limiter.gcra.get());
      backend.limiters_.push_back(std::move(limiter));
    }
    return backend;
  }

  // As an alternative of VariantBackend: serves `memory`, which a section configures nothing of.
  static bool serves(BackendKind kind) { return kind == BackendKind::kMemory; }
  static absl::StatusOr<Options> options_for(const BackendConfig& /*section*/) { return Options{}; }

  absl::Status check_rules(std::span<const RuleKey> keys, ConsumptionMode mode,
                           std::span<Decision> out) {
    if (mode == ConsumptionMode::kAllOrNothing) {
      return check_all_or_nothing(keys, out, Report::kAtCost);
    }
    if (absl::Status s = validate_costs(keys); !s.ok()) return s;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      out[i] = *limiters_[keys[i].rule].visit(
          [&](auto& l) { return l.check(keys[i].key, keys[i].cost); });
    }
    return absl::OkStatus();
  }

  // check_rules in kAllOrNothing; when the request is denied, each admitting key is decided
  // again at cost 0 under the same shard locks and at the same time, once every reservation was
  // put back: its limit as it stands (StandingBackend). O(keys) more work on a denial only.
  absl::Status check_rules_as_they_stand(std::span<const RuleKey> keys, std::span<Decision> out) {
    return check_all_or_nothing(keys, out, Report::kAsTheyStand);
  }

  StoreStats rule_store_stats(std::size_t rule) const {
    return limiters_[rule].visit([](auto& l) { return l.stats(); });
  }

  // One live rule's admission of a request, kept to settle its cost later
  // (BasicRateLimitEngine::settle). It holds the rule's limiter, so it outlives reloads.
  struct Booking {
    std::shared_ptr<GcraLimiter<ClockT>> limiter{};
    std::shared_ptr<detail::RuleLineage<ClockT>> lineage{};
    detail::GcraBooking booking{};
    std::uint64_t units = 0;  // the cost taken, in the rule's limiter units
  };

  // `check_rules` that also records each key's booking when every key was admitted (else
  // `bookings` is left empty). Each key's decision and booking are taken under its shard lock;
  // each occurrence of a (rule, key) the request repeats books the state it left, before the
  // later occurrences, so that a refund gives back only what that occurrence holds ahead. A
  // request with a fixed-window rule is only checked: it books nothing, so its settlement stays
  // closed.
  absl::Status check_rules_booking(std::span<const RuleKey> keys, ConsumptionMode mode,
                                   std::span<Decision> out, std::vector<Booking>& bookings) {
    bookings.clear();
    if (has_fixed(keys)) return check_rules(keys, mode, out);
    if (absl::Status s = validate_costs(keys); !s.ok()) return s;
    absl::InlinedVector<KeyDigest, 8> digests;
    for (const RuleKey& k : keys) digests.push_back(limiters_[k.rule].gcra->digest(k.key));
    const std::int64_t now = detail::saturate_time(clock_.now().count());
    // Key i's booking, `later` units admitted after it for its (rule, key).
    auto record = [&](const HeldShardLocks& held, std::size_t i, std::uint64_t later) {
      Booking b{.limiter = limiters_[keys[i].rule].gcra,
                .lineage = limiters_[keys[i].rule].lineage,
                .units = keys[i].cost};
      b.limiter->record_locked(held, digests[i], now, keys[i].cost, later, b.booking);
      bookings.push_back(std::move(b));
    };
    bool all = true;
    if (mode == ConsumptionMode::kEveryRule) {
      for (std::size_t i = 0; i < keys.size(); ++i) {
        ShardLockSet locks;
        limiters_[keys[i].rule].gcra->add_lock(locks, digests[i]);
        const HeldShardLocks held(locks);
        limiters_[keys[i].rule].gcra->decide_locked(held, digests[i], now, keys[i].cost, true,
                                                    out[i]);
        all = all && out[i].allowed();
        if (all) record(held, i, 0);
      }
    } else {
      ShardLockSet locks;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        limiters_[keys[i].rule].gcra->add_lock(locks, digests[i]);
      }
      const HeldShardLocks held(locks);
      commit_all(held, keys, digests, out);
      for (std::size_t i = 0; i < keys.size(); ++i) all = all && out[i].allowed();
      if (all) {
        for (std::size_t i = 0; i < keys.size(); ++i) {
          record(held, i, cost_after(keys, digests, i));
        }
      }
    }
    if (!all) bookings.clear();
    return absl::OkStatus();
  }

  // Settles one booking at `units` (charge or refund, as GcraLimiter::settle): the key's state
  // after it. A charge also lands in every limiter a reload carried the rule's keys into since
  // (the same digest: a carried limiter keeps its predecessor's seed), so that a reload between
  // a request and its settlement lets no charge escape; a refund stays in the booking's limiter.
  static absl::StatusOr<Decision> settle_booking(const Booking& b, std::uint64_t units) {
    absl::StatusOr<Decision> settled = b.limiter->settle_booking(b.booking, b.units, units);
    if (units > b.units && b.lineage != nullptr) {
      for (const auto& newer : b.lineage->others(b.limiter.get())) {
        (void)newer->settle_booking(b.booking, b.units, units);
      }
    }
    return settled;
  }

  // Forgets rule `rule`'s state for `key` (BasicRateLimitEngine::reset).
  absl::Status reset_key(std::size_t rule, std::string_view key) {
    limiters_[rule].visit([&](auto& l) { l.reset(key); });
    return absl::OkStatus();
  }

  // The backend's clock: the engine's time for rate-limiting eviction events.
  std::chrono::nanoseconds now() const { return clock_.now(); }

 private:
  // Keys decided in one pass on the stack (commit_all); a request with more takes the general way.
  static constexpr std::size_t kInline = 8;

  explicit InMemoryBackend(ClockT clock) : clock_(std::move(clock)) {}

  RuleLimiter find(const absl::flat_hash_map<std::string, std::size_t>& index,
                   const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? RuleLimiter{} : limiters_[it->second];
  }

  absl::Status validate_costs(std::span<const RuleKey> keys) const {
    for (const RuleKey& k : keys) {
      absl::Status s = limiters_[k.rule].visit([&](auto& l) { return l.validate_cost(k.cost); });
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  bool has_fixed(std::span<const RuleKey> keys) const {
    if (!any_fixed_) return false;
    for (const RuleKey& k : keys) {
      if (limiters_[k.rule].fixed != nullptr) return true;
    }
    return false;
  }

  // A new limiter for `rule`. With `carried` (the previous generation's limiter of a rule with
  // the same identity but other windows): under its digest seed, holding each of its keys' spent
  // share (GcraLimiter::carry_from), copied eagerly here, O(carried's keys).
  static absl::StatusOr<RuleLimiter> new_limiter(const CompiledRule& rule,
                                                 const RuleLimiter& carried,
                                                 const Options& options) {
    StoreOptions store = options.store;
    if (carried.gcra != nullptr) store.seed = carried.gcra->seed();
    auto created = GcraLimiter<ClockT>::create(limiter_windows(rule), store, options.clock);
    if (!created.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(rule.label, ": ", created.status().message()));
    }
    auto limiter = std::make_shared<GcraLimiter<ClockT>>(*std::move(created));
    auto lineage = std::make_shared<detail::RuleLineage<ClockT>>();
    if (carried.gcra != nullptr) {
      limiter->carry_from(*carried.gcra);
      if (carried.lineage != nullptr) lineage = carried.lineage;
    }
    lineage->add(limiter);
    return RuleLimiter{.gcra = std::move(limiter), .lineage = std::move(lineage)};
  }

  // new_limiter for a fixed-window rule: each window admits its requests per period.
  static absl::StatusOr<RuleLimiter> new_fixed_limiter(
      const CompiledRule& rule, const std::shared_ptr<FixedWindowLimiter<ClockT>>& carried,
      const Options& options) {
    StoreOptions store = options.store;
    if (carried != nullptr) store.seed = carried->seed();
    std::vector<FixedWindow> windows;
    for (const GcraWindow& w : limiter_windows(rule)) {
      windows.push_back({.limit = w.requests, .window = w.period});
    }
    auto created = FixedWindowLimiter<ClockT>::create(std::move(windows), store, options.clock);
    if (!created.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(rule.label, ": ", created.status().message()));
    }
    auto limiter = std::make_shared<FixedWindowLimiter<ClockT>>(*std::move(created));
    if (carried != nullptr) limiter->carry_from(*carried);
    return RuleLimiter{.fixed = std::move(limiter)};
  }

  // What a denied all-or-nothing request reports for its admitting keys: the decision at their
  // cost (check_rules), or their limit as it stands (check_rules_as_they_stand).
  enum class Report { kAtCost, kAsTheyStand };

  // Every key under all their shard locks (taken in one global order); commits only if all admit.
  absl::Status check_all_or_nothing(std::span<const RuleKey> keys, std::span<Decision> out,
                                    Report report) {
    if (keys.size() <= kInline && !has_fixed(keys)) return check_gcra_rules(keys, out, report);
    if (absl::Status s = validate_costs(keys); !s.ok()) return s;
    absl::InlinedVector<KeyDigest, kInline> digests;
    ShardLockSet locks;
    for (const RuleKey& k : keys) {
      // Copied field by field: a digest stored as two words and reloaded as one 16-byte value
      // stalls the store forwarding.
      const KeyDigest d = limiters_[k.rule].visit([&](auto& l) { return l.digest(k.key); });
      KeyDigest& slot = digests.emplace_back();
      slot.low = d.low;
      slot.high = d.high;
      limiters_[k.rule].visit([&](auto& l) { l.add_lock(locks, slot); });
    }
    commit_all(HeldShardLocks(locks), keys, digests, out, report);
    return absl::OkStatus();
  }

  // check_rules of a request's GCRA rules, all or nothing, at most kInline keys: each key is
  // validated and digested and its shard added in one pass over the rules' limiters.
  absl::Status check_gcra_rules(std::span<const RuleKey> keys, std::span<Decision> out,
                                Report report) {
    // An InlinedVector, not a std::array of value-initialized digests: clearing 128 bytes on
    // every request was measurable.
    absl::InlinedVector<KeyDigest, kInline> digests;
    ShardLockSet locks;
    for (const RuleKey& k : keys) {
      const GcraLimiter<ClockT>& limiter = *gcra_[k.rule];
      if (absl::Status s = limiter.validate_cost(k.cost); !s.ok()) return s;
      const KeyDigest d = limiter.digest_and_lock(k.key, locks);
      KeyDigest& slot = digests.emplace_back();  // field by field, as in check_rules
      slot.low = d.low;
      slot.high = d.high;
    }
    commit_all(HeldShardLocks(locks), keys, digests, out, report);
    return absl::OkStatus();
  }

  // Decides every key under `held` (all their shard locks), in order, each after the earlier
  // occurrences of its (rule, key); commits only if all admit. One pass when no key repeats: each
  // tracked key is reserved as it is decided, and put back if a later key denies (the locks are
  // held throughout, so no other request sees the reservation). Keys absent from their store are
  // only decided, and inserted once every key has admitted: nothing is inserted (or evicted) for
  // a denied request, and no insertion moves a cell an undo points to. With
  // Report::kAsTheyStand, a denied request's admitting keys are decided again at cost 0 once
  // every reservation was put back.
  void commit_all(const HeldShardLocks& held, std::span<const RuleKey> keys,
                  std::span<const KeyDigest> digests, std::span<Decision> out,
                  Report report = Report::kAtCost) {
    const std::int64_t now = detail::saturate_time(clock_.now().count());
    if (keys.size() > kInline || has_fixed(keys)) {
      return decide_then_commit(held, keys, digests, out, now, report);
    }
    std::array<typename GcraLimiter<ClockT>::Undo, kInline> undo;
    std::uint32_t reserved = 0;  // bit i: key i's cell advanced
    std::size_t i = 0;
    for (; i < keys.size(); ++i) {
      GcraLimiter<ClockT>& limiter = *gcra_[keys[i].rule];
      if (limiter.decide_tracked_locked(held, digests[i], now, keys[i].cost, out[i], undo[i])) {
        reserved |= std::uint32_t{1} << i;
      }
      if (!out[i].allowed()) break;
    }
    // A repeated key decided here saw its earlier occurrences only if it is tracked (reserved in
    // its cell): every key admitted with no absent key repeated, the pass stands; otherwise the
    // request is decided again in order (redo_in_order).
    if (i == keys.size()) {  // every key admitted: insert the absent ones
      const std::uint32_t absent = ~reserved & ((std::uint32_t{1} << keys.size()) - 1);
      if ((absent & (absent - 1)) != 0 && has_repeats(keys, digests, absent)) {
        return redo_in_order(held, keys, digests, out, now, report, undo, reserved, keys.size());
      }
      for (std::size_t j = 0; j < keys.size(); ++j) {
        if ((reserved >> j & 1U) == 0 && keys[j].cost != 0) {
          gcra_[keys[j].rule]->admit_locked(held, digests[j], now, keys[j].cost);
        }
      }
      return;
    }
    if (has_repeats(keys, digests, ~std::uint32_t{0})) {
      return redo_in_order(held, keys, digests, out, now, report, undo, reserved, i);
    }
    // Key i denied: put the reserved keys back and decide every other key as it stands.
    for (std::size_t j = 0; j < keys.size(); ++j) {
      if (j == i) continue;
      if (j < i && (reserved >> j & 1U) != 0) undo[j].restore();
      gcra_[keys[j].rule]->decide_locked(held, digests[j], now, keys[j].cost, false, out[j]);
      if (report == Report::kAsTheyStand && out[j].allowed() && keys[j].cost != 0) {
        gcra_[keys[j].rule]->decide_locked(held, digests[j], now, 0, false, out[j]);
      }
    }
  }

  // Puts back the reservations of the first `reached` keys, latest first, and decides the
  // request in order (decide_then_commit): commit_all's way out when a key repeats. Out of line,
  // so that the pass it leaves keeps its registers.
  template <class Undos>
  ABSL_ATTRIBUTE_NOINLINE void redo_in_order(const HeldShardLocks& held,
                                             std::span<const RuleKey> keys,
                                             std::span<const KeyDigest> digests,
                                             std::span<Decision> out, std::int64_t now,
                                             Report report, const Undos& undo,
                                             std::uint32_t reserved, std::size_t reached) {
    for (std::size_t j = reached; j-- > 0;) {
      if ((reserved >> j & 1U) != 0) undo[j].restore();
    }
    decide_then_commit(held, keys, digests, out, now, report);
  }

  // Whether a (rule, key) occurs twice among the keys (at most kInline) whose bit `among` has:
  // pairwise, the rules compared first, so a request whose rules differ (the engine's) compares
  // no digest. Asked only when a request is denied or two of its keys are absent from their
  // stores: a repeated tracked key, all admitted, was decided after its earlier occurrences.
  static bool has_repeats(std::span<const RuleKey> keys, std::span<const KeyDigest> digests,
                          std::uint32_t among) {
    for (std::size_t i = 1; i < keys.size(); ++i) {
      if ((among >> i & 1U) == 0) continue;
      for (std::size_t j = 0; j < i; ++j) {
        if ((among >> j & 1U) != 0 && keys[i].rule == keys[j].rule && digests[i] == digests[j]) {
          return true;
        }
      }
    }
    return false;
  }

  // commit_all for many keys, with a fixed-window rule or with a repeated (rule, key): decide
  // every key without committing (a repeated one after its earlier occurrences), then admit them
  // all in order.
  void decide_then_commit(const HeldShardLocks& held, std::span<const RuleKey> keys,
                          std::span<const KeyDigest> digests, std::span<Decision> out,
                          std::int64_t now, Report report) {
    bool all = true;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!decided_with_earlier(keys, digests, i)) {
        decide_occurrences(held, keys, digests, out, now, i);
      }
    }
    for (std::size_t i = 0; i < keys.size(); ++i) all = all && out[i].allowed();
    if (!all) {
      if (report == Report::kAsTheyStand) peek_admitted(held, keys, digests, out, now);
      return;
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].cost == 0) continue;
      limiters_[keys[i].rule].visit(
          [&](auto& l) { l.admit_locked(held, digests[i], now, keys[i].cost); });
    }
  }

  // Whether key i repeats an earlier key's (rule, key), and so was decided with it. O(i).
  static bool decided_with_earlier(std::span<const RuleKey> keys,
                                   std::span<const KeyDigest> digests, std::size_t i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (keys[j].rule == keys[i].rule && digests[j] == digests[i]) return true;
    }
    return false;
  }

  // The cost of the occurrences of key i's (rule, key) after it. O(keys).
  static std::uint64_t cost_after(std::span<const RuleKey> keys, std::span<const KeyDigest> digests,
                                  std::size_t i) {
    std::uint64_t cost = 0;
    for (std::size_t j = i + 1; j < keys.size(); ++j) {
      if (keys[j].rule == keys[i].rule && digests[j] == digests[i]) cost += keys[j].cost;
    }
    return cost;
  }

  // Decides key i and every later occurrence of its (rule, key), in order, without committing.
  void decide_occurrences(const HeldShardLocks& held, std::span<const RuleKey> keys,
                          std::span<const KeyDigest> digests, std::span<Decision> out,
                          std::int64_t now, std::size_t i) {
    absl::InlinedVector<std::uint64_t, kInline> costs;
    absl::InlinedVector<Decision*, kInline> outs;
    for (std::size_t j = i; j < keys.size(); ++j) {
      if (keys[j].rule != keys[i].rule || digests[j] != digests[i]) continue;
      costs.push_back(keys[j].cost);
      outs.push_back(&out[j]);
    }
    limiters_[keys[i].rule].visit([&](auto& l) {
      if (costs.size() == 1) return l.decide_locked(held, digests[i], now, costs[0], false, out[i]);
      l.decide_in_order_locked(held, digests[i], now, costs, outs);
    });
  }

  // A denied request's admitting keys, decided again at cost 0 (nothing was reserved).
  void peek_admitted(const HeldShardLocks& held, std::span<const RuleKey> keys,
                     std::span<const KeyDigest> digests, std::span<Decision> out,
                     std::int64_t now) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!out[i].allowed() || keys[i].cost == 0) continue;
      limiters_[keys[i].rule].visit(
          [&](auto& l) { l.decide_locked(held, digests[i], now, 0, false, out[i]); });
    }
  }

  ClockT clock_;
  absl::flat_hash_map<std::string, std::size_t> by_fingerprint_;  // -> index into limiters_
  absl::flat_hash_map<std::string, std::size_t> by_identity_;     // -> index into limiters_
  std::vector<RuleLimiter> limiters_;
  std::vector<GcraLimiter<ClockT>*> gcra_;  // per rule: limiters_[r].gcra, read without a copy
  bool any_fixed_ = false;                  // some rule is a fixed window
};

static_assert(BookingBackend<InMemoryBackend<>> && ResettableBackend<InMemoryBackend<>> &&
              ClockedBackend<InMemoryBackend<>> && WindowCarryingBackend<InMemoryBackend<>> &&
              StandingBackend<InMemoryBackend<>>);

}  // namespace sluice

#endif  // SLUICE_ENGINE_IN_MEMORY_BACKEND_HPP_
