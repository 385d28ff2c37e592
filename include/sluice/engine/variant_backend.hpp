// sluice/engine/variant_backend.hpp — one engine backend chosen at run time among several types.
//
// `VariantBackend<Backends...>` holds one of its backends (a std::variant) and forwards every
// call to it: one switch on the held index per call, so an engine over it pays a few
// instructions per evaluate over the static engine of the same backend. Which one it holds is
// decided when the engine is created: by the code (`Options::backend`) or by the config's
// `backend` section (sluice/backend_config.hpp), never both. sluice/runtime_engine.hpp names
// the variant of every backend this build includes: `sluice::RuntimeRateLimitEngine`.
//
// Every alternative models EngineBackend and provides `static bool serves(BackendKind)` and
// `static absl::StatusOr<Options> options_for(const BackendConfig&)` (opens its client). The
// variant models bookings (where the held backend books; else a settlement stays closed), reset
// (every alternative resets), standing reports (where every alternative has them) and a clock
// (the held backend's, else the steady clock); a rule
// whose only change is its windows keeps its keys' spent share where the held backend carries
// windows (in memory).
//
// Thread-safety: as the held backend (check_rules, check_rules_as_they_stand,
// check_rules_booking, reset_key and rule_store_stats may be called concurrently).
// Complexity: the held backend's, plus one branch.
#ifndef SLUICE_ENGINE_VARIANT_BACKEND_HPP_
#define SLUICE_ENGINE_VARIANT_BACKEND_HPP_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/backend_config.hpp"
#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/engine/backend.hpp"
#include "sluice/policy.hpp"
#include "sluice/store.hpp"

namespace sluice {

// What an alternative of VariantBackend provides besides EngineBackend.
template <class B>
concept SelectableBackend = EngineBackend<B> && requires(const BackendConfig& section) {
  { B::serves(BackendKind{}) } -> std::same_as<bool>;
  { B::options_for(section) } -> std::same_as<absl::StatusOr<typename B::Options>>;
};

template <SelectableBackend... Backends>
class VariantBackend {
 public:
  static_assert(sizeof...(Backends) > 0);
  using Choice = std::variant<typename Backends::Options...>;

  struct Options {
    // Chosen in code: one alternative's options, e.g. redis::RedisEngineBackend::Options{client}
    // (the config must then have no `backend` section). None: the config's section chooses (no
    // section: the first alternative, built from an empty section: memory).
    std::optional<Choice> backend{};
    // Filled in when the engine is created: the section the choice was made from, which every
    // reload must repeat.
    BackendConfig section{};
  };

  // The options an engine creates its first generation with (`reload` false), or a reload's
  // (`reload` true: the section must equal the one the backend was made from, FailedPrecondition
  // otherwise). InvalidArgument for a choice in both code and config, and for a type that no
  // alternative serves (not in this build); an alternative's client errors as they come.
  static absl::StatusOr<Options> configure(const BackendConfig& section, Options options,
                                           bool reload) {
    if (reload) {
      if (section == options.section) return options;
      return absl::FailedPreconditionError(
          "backend: the section differs from the one the engine was created with; the backend "
          "is chosen once, when the engine is created: restart the service to apply it (the "
          "running config keeps serving)");
    }
    if (options.backend) {
      if (!section.type) return options;
      return absl::InvalidArgumentError(
          "backend.type: the backend was also chosen in code; remove the config's backend "
          "section or the code's choice");
    }
    const BackendKind kind = section.type.value_or(BackendKind::kMemory);
    absl::StatusOr<Choice> choice = choose<0>(kind, section);
    if (!choice.ok()) return choice.status();
    options.backend = *std::move(choice);
    options.section = section;
    return options;
  }

  // Windows are carried where the chosen alternative carries them.
  static bool carries_windows(const Options& options) {
    constexpr bool kCarries[] = {WindowCarryingBackend<Backends>...};
    return options.backend && kCarries[options.backend->index()];
  }

  // The chosen alternative over `rules`, taking over `previous`'s state when it holds the same
  // alternative. FailedPrecondition for options that configure() did not fill in.
  static absl::StatusOr<VariantBackend> create(std::span<const CompiledRule> rules,
                                               const VariantBackend* previous,
                                               const Options& options) {
    if (!options.backend) {
      return absl::FailedPreconditionError("VariantBackend: no backend chosen (see configure)");
    }
    return create_held<0>(rules, previous, options);
  }

  absl::Status check_rules(std::span<const RuleKey> keys, ConsumptionMode mode,
                           std::span<Decision> out) {
    return std::visit([&](auto& b) { return b.check_rules(keys, mode, out); }, held_);
  }

  StoreStats rule_store_stats(std::size_t rule) const {
    return std::visit([&](const auto& b) { return b.rule_store_stats(rule); }, held_);
  }

  // One admission's booking, of the alternative that made it.
  using Booking = std::variant<typename detail::BookingOf<Backends>::type...>;

  // The held backend's bookings where it books; where it does not, check_rules, and `bookings`
  // stays empty (the engine's settlement then stays closed).
  absl::Status check_rules_booking(std::span<const RuleKey> keys, ConsumptionMode mode,
                                   std::span<Decision> out, std::vector<Booking>& bookings) {
    bookings.clear();
    return std::visit(
        [&](auto& b) -> absl::Status {
          using B = std::remove_cvref_t<decltype(b)>;
          if constexpr (BookingBackend<B>) {
            std::vector<typename B::Booking> own;
            absl::Status s = b.check_rules_booking(keys, mode, out, own);
            for (auto& booking : own) {
              bookings.emplace_back(std::in_place_type<typename B::Booking>, std::move(booking));
            }
            return s;
          } else {
            return b.check_rules(keys, mode, out);
          }
        },
        held_);
  }

  static absl::StatusOr<Decision> settle_booking(const Booking& booking, std::uint64_t units) {
    return settle_held<0>(booking, units);
  }

  // A request's bookings are its one alternative's: settled together where that alternative
  // settles by one deadline (BatchSettlingBackend), else one by one.
  static std::vector<absl::StatusOr<Decision>> settle_bookings(
      std::span<const Booking* const> bookings, std::span<const std::uint64_t> units) {
    if (bookings.empty()) return {};
    return settle_all_held<0>(bookings, units);
  }

  // Where every alternative reports a denied request's keys as they stand (StandingBackend):
  // the held one's.
  absl::Status check_rules_as_they_stand(
      std::span<const RuleKey> keys,
      std::span<Decision> out) requires(StandingBackend<Backends>&&...) {
    return std::visit([&](auto& b) { return b.check_rules_as_they_stand(keys, out); }, held_);
  }

  absl::Status reset_key(std::size_t rule,
                         std::string_view key) requires(ResettableBackend<Backends>&&...) {
    return std::visit([&](auto& b) { return b.reset_key(rule, key); }, held_);
  }

  // The held backend's clock, or the steady clock for one without.
  std::chrono::nanoseconds now() const {
    return std::visit(
        [](const auto& b) {
          if constexpr (ClockedBackend<std::remove_cvref_t<decltype(b)>>) {
            return b.now();
          } else {
            return SteadyClock{}.now();
          }
        },
        held_);
  }

  // The held alternative, or null when it is another.
  template <class B>
  const B* get_if() const noexcept {
    return std::get_if<B>(&held_);
  }
  template <class B>
  B* get_if() noexcept {
    return std::get_if<B>(&held_);
  }

 private:
  explicit VariantBackend(std::variant<Backends...> held) : held_(std::move(held)) {}

  template <std::size_t I>
  static absl::StatusOr<Choice> choose(BackendKind kind, const BackendConfig& section) {
    if constexpr (I == sizeof...(Backends)) {
      return absl::InvalidArgumentError(absl::StrCat("backend.type: ", std::string(to_string(kind)),
                                                     " is not in this build of sluice",
                                                     std::string(build_hint(kind))));
    } else {
      using B = std::variant_alternative_t<I, std::variant<Backends...>>;
      if (!B::serves(kind)) return choose<I + 1>(kind, section);
      absl::StatusOr<typename B::Options> options = B::options_for(section);
      if (!options.ok()) return options.status();
      return Choice(std::in_place_index<I>, *std::move(options));
    }
  }

  static std::string_view build_hint(BackendKind kind) {
    switch (kind) {
      case BackendKind::kRedis:
      case BackendKind::kRedisCluster:
        return " (link sluice::redis, built where hiredis is found)";
      case BackendKind::kPostgres:
        return " (link sluice::postgres, built where libpq is found)";
      case BackendKind::kMemory:
        break;
    }
    return "";
  }

  template <std::size_t I>
  static absl::StatusOr<VariantBackend> create_held(std::span<const CompiledRule> rules,
                                                    const VariantBackend* previous,
                                                    const Options& options) {
    if constexpr (I == sizeof...(Backends)) {
      return absl::InternalError("VariantBackend: no alternative holds the choice");
    } else {
      using B = std::variant_alternative_t<I, std::variant<Backends...>>;
      if (options.backend->index() != I) return create_held<I + 1>(rules, previous, options);
      const B* kept = previous != nullptr ? std::get_if<I>(&previous->held_) : nullptr;
      absl::StatusOr<B> created = B::create(rules, kept, std::get<I>(*options.backend));
      if (!created.ok()) return created.status();
      return VariantBackend(std::variant<Backends...>(std::in_place_index<I>, *std::move(created)));
    }
  }

  template <std::size_t I>
  static std::vector<absl::StatusOr<Decision>> settle_all_held(
      std::span<const Booking* const> bookings, std::span<const std::uint64_t> units) {
    if constexpr (I == sizeof...(Backends)) {
      std::vector<absl::StatusOr<Decision>> out;
      for (std::size_t i = 0; i < bookings.size(); ++i) {
        out.push_back(settle_booking(*bookings[i], units[i]));
      }
      return out;
    } else {
      using B = std::variant_alternative_t<I, std::variant<Backends...>>;
      const bool all_held = std::all_of(bookings.begin(), bookings.end(),
                                        [](const Booking* b) { return b->index() == I; });
      if constexpr (BatchSettlingBackend<B>) {
        if (all_held) {
          std::vector<const typename B::Booking*> held;
          for (const Booking* b : bookings) held.push_back(&std::get<I>(*b));
          return B::settle_bookings(held, units);
        }
      }
      (void)all_held;
      return settle_all_held<I + 1>(bookings, units);
    }
  }

  template <std::size_t I>
  static absl::StatusOr<Decision> settle_held(const Booking& booking, std::uint64_t units) {
    if constexpr (I == sizeof...(Backends)) {
      return absl::InternalError("VariantBackend: a booking of no alternative");
    } else {
      using B = std::variant_alternative_t<I, std::variant<Backends...>>;
      if (booking.index() != I) return settle_held<I + 1>(booking, units);
      if constexpr (BookingBackend<B>) {
        return B::settle_booking(std::get<I>(booking), units);
      } else {
        return absl::UnimplementedError("this engine backend cannot settle costs");
      }
    }
  }

  std::variant<Backends...> held_;
};

}  // namespace sluice

#endif  // SLUICE_ENGINE_VARIANT_BACKEND_HPP_
