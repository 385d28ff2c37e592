// sluice/config_requirement.hpp — what an adapter serving from a reloading holder needs every
// config to have, so that a reload lacking it is refused instead of served.
//
// An adapter given a listener (the one it serves) or an unknown consumer (what unknown credentials
// get) depends on the config having that name: without it the listener's limits never apply to
// the adapter's requests, which all pass, or every unknown credential is refused instead of
// limited. Over a fixed engine the adapter's `create` checks the names once. Over a holder that
// follows a file (sluice::yaml::ReloadingEngine), the adapter's holder overload of `create` also
// registers them with the holder (`require`), which checks them against the generation serving
// now and then against every config a reload would load, and refuses one that lacks them (the
// running generation keeps serving; the error is returned, counted and reported like any refused
// reload):
//
//   auto holder = sluice::yaml::ReloadingEngine<>::create("gateway.yaml");
//   auto limiter = sluice::HttplibLimiter<>::create(**holder, {.listener = "public"});
//   // from now on a reload whose listeners[] has no "public" fails, and "public" stays limited
//
// A registration lasts while its RequirementHandle is held: an adapter keeps it in every copy of
// itself, so the holder stops requiring the names once the last copy is gone. An adapter fed a
// plain function returning the current generation cannot register: a reload can then drop its
// names unnoticed, so over a reloading holder pass the holder itself.
#ifndef SLUICE_CONFIG_REQUIREMENT_HPP_
#define SLUICE_CONFIG_REQUIREMENT_HPP_

#include <algorithm>
#include <concepts>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/text.hpp"
#include "sluice/policy/model.hpp"

namespace sluice {

// The config names an adapter depends on; "" for one it does not use.
struct ConfigRequirement {
  std::string listener{};          // a listeners[].name: the listener the adapter serves
  std::string unknown_consumer{};  // a consumers[].name: what the adapter's unknown credentials get
};

// Keeps a ConfigRequirement registered with its holder while this handle or a copy is held.
using RequirementHandle = std::shared_ptr<const ConfigRequirement>;

// A holder of engine generations that a reload may replace (`current()`), which takes the names
// its adapters need (`require`, as sluice::yaml::ReloadingEngine documents it) and refuses a
// reload whose config lacks them. `require` returns the error and registers nothing when the
// generation serving now lacks a name.
template <class Holder>
concept EngineHolder = requires(const Holder& holder) {
  holder.current();
}
&&requires(Holder& holder, ConfigRequirement requirement) {
  { holder.require(std::move(requirement)) } -> std::same_as<absl::StatusOr<RequirementHandle>>;
};

// OK when `config` has every name `requirement` gives; otherwise FailedPrecondition naming the
// adapter's setting, what serving `config` would do to its requests, and the fix. What a holder
// runs on every config before it loads it. O(listeners + consumers).
inline absl::Status check_requirement(const PolicyConfig& config,
                                      const ConfigRequirement& requirement) {
  const std::string& listener = requirement.listener;
  if (!listener.empty() &&
      std::none_of(config.listeners.begin(), config.listeners.end(),
                   [&](const Listener& candidate) { return candidate.name == listener; })) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the config has no listener ", detail::quoted(listener),
        ", which a running adapter serves (its listener setting): that listener's bundles and "
        "routes would no longer apply to the adapter's requests, which would all pass; keep a "
        "listener named ",
        detail::quoted(listener),
        " in listeners[], or give the adapter another listener (recreate it) before removing "
        "this one"));
  }
  const std::string& consumer = requirement.unknown_consumer;
  if (!consumer.empty() &&
      std::none_of(config.consumers.begin(), config.consumers.end(),
                   [&](const Consumer& candidate) { return candidate.name == consumer; })) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the config has no consumer ", detail::quoted(consumer),
        ", which a running adapter gives unknown credentials (its unknown_consumer setting): "
        "every unknown credential would be refused instead of limited; keep a consumer named ",
        detail::quoted(consumer),
        " in consumers[], or give the adapter another unknown_consumer (recreate it) before "
        "removing this one"));
  }
  return absl::OkStatus();
}

}  // namespace sluice

#endif  // SLUICE_CONFIG_REQUIREMENT_HPP_
