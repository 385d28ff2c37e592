// sluice/engine/carried_rules.hpp — what a remote backend (Redis, PostgreSQL) remembers of a
// rule's earlier windows, so that a reload changing only a rule's windows carries each key's
// spent share instead of starting it fresh.
//
// Remote backends keep naming a rule's keys by its whole fingerprint (deployed state of unchanged
// rules keeps its keys), so a rule whose windows change reads other keys. Each generation keeps,
// per rule, the window sets the same rule identity had in earlier generations (most recent
// first, at most kMaxCarriedWindowSets), each with the key prefix its keys had; a key the new
// generation has no state for is carried from those keys once, on its first check (the backend's
// client converts and writes it only while the new key is still absent).
//
//   std::vector<CarrySource<Limit>> from = carry_sources<Limit>(rule, previous_rules, now_ns,
//       [](const Limit& l) -> const std::vector<GcraWindow>& { return l.windows(); });
//   std::string old_key = carried_key(from[0], key, rule_key_prefix(rule.fingerprint).size());
//
// Chains: a rule changed again before its keys were carried (A → B → C, a key untouched under B)
// is carried from B's state or, where B has none, A's, up to kMaxCarriedWindowSets window sets
// back; older ones are forgotten. A window set is forgotten too once no key can still hold state
// under it (`live_until`: when it was replaced, plus its longest refill, plus kCarryMargin), so
// that new clients stop paying for the carry. A reload back to a window set the rule had (A → B →
// A) reads A's keys as they are. A replica started with the new config (no previous generation) has
// nothing to carry from. Thread-safety: plain values, built once per generation.
#ifndef SLUICE_ENGINE_CARRIED_RULES_HPP_
#define SLUICE_ENGINE_CARRIED_RULES_HPP_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/numeric/int128.h"
#include "sluice/engine/backend.hpp"
#include "sluice/engine/rule_set.hpp"
#include "sluice/policy.hpp"
#include "sluice/window.hpp"

namespace sluice::detail {

// Window sets of one rule remembered across reloads, most recent first.
inline constexpr std::size_t kMaxCarriedWindowSets = 4;

// Slack for the clocks of the replicas and the store when a window set's keys count as gone.
inline constexpr std::chrono::nanoseconds kCarryMargin = std::chrono::minutes(1);

// One earlier window set of a rule: its limit, the fingerprint it had and its keys' prefix.
template <class Limit>
struct CarrySource {
  std::shared_ptr<const Limit> limit;
  std::string fingerprint;
  std::string key_prefix;  // rule_key_prefix(fingerprint)
  // ns since the Unix epoch after which no key holds state under it (a key within its bucket);
  // a key in debt beyond a full bucket (a settled charge) past that time is not carried.
  std::int64_t live_until = 0;
};

// The longest time any window of `windows` takes to refill from empty, ceil(burst·period /
// requests) ns, saturated to int64.
inline std::int64_t longest_refill(const std::vector<GcraWindow>& windows) {
  absl::uint128 longest = 0;
  for (const GcraWindow& w : windows) {
    const std::uint64_t burst = w.burst == 0 ? w.requests : w.burst;
    const absl::uint128 scaled =
        absl::uint128(burst) * static_cast<std::uint64_t>(w.period.count());
    longest = std::max(longest, (scaled + w.requests - 1) / w.requests);
  }
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  return static_cast<std::int64_t>(absl::Uint128Low64(std::min(longest, absl::uint128(kMax))));
}

// What a generation of a remote backend remembers of one rule for the next generation.
template <class Limit>
struct CarriedRule {
  std::string identity;     // CompiledRule::identity
  std::string fingerprint;  // CompiledRule::fingerprint
  std::shared_ptr<const Limit> limit;
  std::vector<CarrySource<Limit>> sources;  // earlier window sets, most recent first
};

// Every window set one rule identity has had across generations, with its keys' prefix, for the
// settlements of a remote backend: a charge settled on a booking of one generation also lands on
// the rule's keys under the others (the in-memory backend's lineage of limiters), so that a reload
// between a request and its settlement lets no charge escape once the key was carried. Shared by
// the generations and their bookings; a member lives as long as someone holds its limit.
// Thread-safety: add and others may be called concurrently.
template <class Limit>
class WindowSetLineage {
 public:
  struct Member {
    std::shared_ptr<const Limit> limit;
    std::string key_prefix;  // rule_key_prefix(fingerprint)
  };

  void add(const std::shared_ptr<const Limit>& limit, std::string key_prefix) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(members_, [](const Entry& e) { return e.limit.expired(); });
    members_.push_back({limit, std::move(key_prefix)});
  }

  // One live member per key prefix other than `own` (the booking's keys).
  std::vector<Member> others(std::string_view own) const {
    std::vector<Member> out;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Entry& e : members_) {
      if (e.key_prefix == own) continue;
      const bool known = std::any_of(out.begin(), out.end(),
                                     [&](const Member& m) { return m.key_prefix == e.key_prefix; });
      if (std::shared_ptr<const Limit> alive = e.limit.lock(); alive != nullptr && !known) {
        out.push_back({std::move(alive), e.key_prefix});
      }
    }
    return out;
  }

 private:
  struct Entry {
    std::weak_ptr<const Limit> limit;
    std::string key_prefix;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> members_;
};

// The earlier window sets `rule` carries from at `now` (ns since the Unix epoch), given the
// previous generation's rules: none for a rule whose identity is new; the previous rule's own
// sources if its fingerprint is unchanged; else the previous rule's windows (live until `now` +
// their longest refill + kCarryMargin), then its sources. Never the rule's own fingerprint (its
// keys are the current ones) nor a window set no longer live; at most kMaxCarriedWindowSets.
// `windows_of(limit)` gives a limit's GCRA windows. O(previous rules + sources).
template <class Limit, class WindowsOf>
std::vector<CarrySource<Limit>> carry_sources(const CompiledRule& rule,
                                              std::span<const CarriedRule<Limit>> previous,
                                              std::int64_t now, WindowsOf windows_of) {
  const auto same =
      std::find_if(previous.begin(), previous.end(),
                   [&](const CarriedRule<Limit>& p) { return p.identity == rule.identity; });
  if (same == previous.end()) return {};
  std::vector<CarrySource<Limit>> sources;
  if (same->fingerprint != rule.fingerprint) {
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    const std::int64_t refill = longest_refill(windows_of(*same->limit));
    const std::int64_t margin = kCarryMargin.count();
    const std::int64_t lasts = refill > kMax - margin ? kMax : refill + margin;
    sources.push_back({.limit = same->limit,
                       .fingerprint = same->fingerprint,
                       .key_prefix = rule_key_prefix(same->fingerprint),
                       .live_until = now > kMax - lasts ? kMax : now + lasts});
  }
  for (const CarrySource<Limit>& s : same->sources) {
    if (sources.size() == kMaxCarriedWindowSets) break;
    if (s.fingerprint != rule.fingerprint && s.live_until > now) sources.push_back(s);
  }
  return sources;
}

// The engine key that `key` (a key of a rule whose own prefix has `prefix_size` bytes) had under
// the earlier window set `source`.
template <class Limit>
std::string carried_key(const CarrySource<Limit>& source, std::string_view key,
                        std::size_t prefix_size) {
  std::string out = source.key_prefix;
  out.append(key.substr(std::min(prefix_size, key.size())));
  return out;
}

// The keys the items of one check had under their rules' earlier window sets still live, owned
// here for the check's duration. `From` is the backend client's {key, limit} pair.
template <class Limit, class From>
class CarriedKeys {
 public:
  // Room for every source of the rules of `keys`, reserved up front so that the spans `add`
  // hands out stay valid; `unix_now()` (ns since the Unix epoch) is read only if there is one.
  template <class UnixNow>
  CarriedKeys(std::span<const RuleKey> keys, std::span<const CarriedRule<Limit>> rules,
              UnixNow unix_now) {
    std::size_t sources = 0;
    for (const RuleKey& k : keys) sources += rules[k.rule].sources.size();
    if (sources == 0) return;
    now_ = unix_now();
    keys_.reserve(sources);
    from_.reserve(sources);
  }

  // `key`'s keys under `rule`'s earlier window sets that are still live.
  std::span<const From> add(const CarriedRule<Limit>& rule, std::string_view key) {
    const std::size_t first = from_.size();
    for (const CarrySource<Limit>& source : rule.sources) {
      if (source.live_until <= now_) continue;
      keys_.push_back(carried_key(source, key, rule_key_prefix(rule.fingerprint).size()));
      from_.push_back({.key = keys_.back(), .limit = source.limit.get()});
    }
    return std::span<const From>(from_).subspan(first, from_.size() - first);
  }

 private:
  std::int64_t now_ = 0;
  std::vector<std::string> keys_;
  std::vector<From> from_;
};

// Now as ns since the Unix epoch: `time_source()` when set (a test's or a fleet's clock), else
// the system clock.
template <class TimeSource>
std::int64_t unix_now(const TimeSource& time_source) {
  if (time_source) return time_source().count();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace sluice::detail

#endif  // SLUICE_ENGINE_CARRIED_RULES_HPP_
