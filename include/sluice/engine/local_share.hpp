// sluice/engine/local_share.hpp — the `local` failure mode's half in this process.
//
// Internal to BasicRateLimitEngine (sluice/engine.hpp). While a shared backend fails, the engine
// decides requests on this replica's share of every rule: the same rules with every window's
// requests and burst scaled to max(1, floor(n × share‰ / 1000)), same periods, in in-memory
// limiters kept for the engine's life. After a failure it skips the backend until the retry
// interval has passed; then one request per interval calls it again (BackendProbe).
//
// Thread-safety: every const member function may be called concurrently.
#ifndef SLUICE_ENGINE_LOCAL_SHARE_HPP_
#define SLUICE_ENGINE_LOCAL_SHARE_HPP_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/clock.hpp"
#include "sluice/detail/limiter_common.hpp"
#include "sluice/detail/local_mode.hpp"
#include "sluice/engine/backend.hpp"
#include "sluice/engine/in_memory_backend.hpp"
#include "sluice/key.hpp"
#include "sluice/policy.hpp"

namespace sluice::detail {

template <Clock LocalClock>
class LocalShare {
 public:
  // The local share of `rules` at `permille`, retrying the backend every `retry_interval` of
  // `clock`. A rule whose fingerprint and share are unchanged keeps the local state `previous`
  // had for it, one whose windows or share changed its keys' spent share; the backend's health
  // carries over too (a reload during an outage stays local).
  static absl::StatusOr<std::unique_ptr<LocalShare>> create(std::span<const CompiledRule> rules,
                                                            std::uint64_t permille,
                                                            LocalClock clock,
                                                            std::chrono::nanoseconds retry_interval,
                                                            const LocalShare* previous) {
    auto local = std::unique_ptr<LocalShare>(new LocalShare(clock, retry_interval));
    std::vector<CompiledRule> scaled(rules.begin(), rules.end());
    for (CompiledRule& rule : scaled) {
      local->shared_max_.push_back(smallest_bucket(limiter_windows(rule)));
      rule.windows = local_share_windows(std::move(rule.windows), permille);
      append_key_part(rule.fingerprint, absl::StrCat("local share ", permille));
      local->local_max_.push_back(smallest_bucket(limiter_windows(rule)));
    }
    auto backend = InMemoryBackend<LocalClock>::create(
        scaled, previous != nullptr ? previous->backend_.get() : nullptr,
        typename InMemoryBackend<LocalClock>::Options{.clock = clock});
    if (!backend.ok()) return backend.status();
    local->backend_ = std::make_unique<InMemoryBackend<LocalClock>>(*std::move(backend));
    if (previous != nullptr) local->probe_ = previous->probe_;
    return local;
  }

  // Whether this request calls the backend (true) or is decided here at once (false).
  bool should_call() const { return probe_->should_call(now(), retry_interval_); }
  void record_success() const { probe_->record_success(); }
  void record_failure() const { probe_->record_failure(now(), retry_interval_); }
  // True from a backend failure until the backend answers again.
  bool failing() const noexcept { return probe_->failing(); }

  // Decides `keys` on the local share. A cost the shared limit holds but the local bucket cannot
  // takes the whole local bucket (admitted only when it is full); a cost the shared limit can
  // never admit is InvalidArgument (naming the rule by `label(rule)`), as the backend answers it.
  template <class Label>
  absl::Status check(std::span<const RuleKey> keys, ConsumptionMode mode, std::span<Decision> out,
                     Label&& label) const {
    absl::InlinedVector<RuleKey, 16> local(keys.begin(), keys.end());
    if (absl::Status s = scale_costs(local, label); !s.ok()) return s;
    return backend_->check_rules(local, mode, out);
  }

  // check() in ConsumptionMode::kAllOrNothing that reports a denied request's admitting keys as
  // they stand (InMemoryBackend::check_rules_as_they_stand).
  template <class Label>
  absl::Status check_as_they_stand(std::span<const RuleKey> keys, std::span<Decision> out,
                                   Label&& label) const {
    absl::InlinedVector<RuleKey, 16> local(keys.begin(), keys.end());
    if (absl::Status s = scale_costs(local, label); !s.ok()) return s;
    return backend_->check_rules_as_they_stand(local, out);
  }

  StoreStats rule_store_stats(std::size_t rule) const { return backend_->rule_store_stats(rule); }

 private:
  LocalShare(LocalClock clock, std::chrono::nanoseconds retry_interval)
      : clock_(std::move(clock)), retry_interval_(retry_interval) {}

  // Each cost on the local share (see check).
  template <class Label>
  absl::Status scale_costs(std::span<RuleKey> keys, Label& label) const {
    for (RuleKey& k : keys) {
      if (k.cost > shared_max_[k.rule]) {
        return absl::InvalidArgumentError(absl::StrCat(
            std::string(label(k.rule)), ": cost exceeds the smallest burst and can never pass"));
      }
      k.cost = std::min(k.cost, local_max_[k.rule]);
    }
    return absl::OkStatus();
  }

  // The local clock's reading, saturated like every limiter's.
  std::int64_t now() const { return saturate_time(clock_.now().count()); }

  std::unique_ptr<InMemoryBackend<LocalClock>> backend_;
  std::vector<std::uint64_t> shared_max_;  // per rule: the largest cost the shared limit holds
  std::vector<std::uint64_t> local_max_;   // per rule: the largest the local share holds
  LocalClock clock_;
  std::chrono::nanoseconds retry_interval_;
  std::shared_ptr<BackendProbe> probe_ = std::make_shared<BackendProbe>();
};

}  // namespace sluice::detail

#endif  // SLUICE_ENGINE_LOCAL_SHARE_HPP_
