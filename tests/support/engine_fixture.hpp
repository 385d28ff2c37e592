// The in-memory policy engine as the engine tests build it: ManualClock time, a fixed digest
// seed, and a loop that counts admissions.
#ifndef SLUICE_TESTS_ENGINE_FIXTURE_HPP_
#define SLUICE_TESTS_ENGINE_FIXTURE_HPP_

#include <utility>

#include "catch.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"

namespace sluice::testing {

using TestEngine = BasicRateLimitEngine<InMemoryBackend<ManualClock>>;

// The engine for `config` on `clock` (REQUIREs that it compiles).
inline TestEngine make_engine(const PolicyConfig& config, ManualClock clock = ManualClock(),
                              const EngineEventHook& on_event = {},
                              StoreOptions store = {.seed = 1}) {
  auto engine =
      TestEngine::create(config, {.store = store, .clock = std::move(clock)}, {}, on_event);
  REQUIRE(engine.ok());
  return *std::move(engine);
}

// How many of `n` evaluations of `request` the engine admits.
template <class E>
int admitted(const E& engine, const RequestContext& request, int n) {
  int count = 0;
  for (int i = 0; i < n; ++i) count += engine.evaluate(request).allowed ? 1 : 0;
  return count;
}

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_ENGINE_FIXTURE_HPP_
