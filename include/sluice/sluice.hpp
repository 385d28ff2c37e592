// sluice/sluice.hpp — the umbrella header for sluice's core.
//
// Includes the clocks, decisions and the RateLimiter concept, plus every in-memory part. The
// optional parts that pull extra dependencies (`sluice/redis.hpp`, `sluice/yaml.hpp`) are never
// included from here.
#ifndef SLUICE_SLUICE_HPP_
#define SLUICE_SLUICE_HPP_

#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/engine.hpp"
#include "sluice/fixed_window.hpp"
#include "sluice/gcra.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/key.hpp"
#include "sluice/policy.hpp"
#include "sluice/rate_limiter.hpp"
#include "sluice/store.hpp"
#include "sluice/version.hpp"

#endif  // SLUICE_SLUICE_HPP_
