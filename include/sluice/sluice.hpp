// sluice/sluice.hpp — the umbrella header for sluice's limiters.
//
// Includes the clocks, windows, decisions, key digests, the sharded store, the GCRA and
// fixed-window limiters, the unkeyed lock-free GCRA limiter (DirectGcraLimiter), the RateLimiter
// concept and the HTTP response fields: everything a service needs to limit requests in process.
// The policy engine (`sluice/engine.hpp`, with its model in `sluice/policy.hpp`), the attempt
// limiter (`sluice/attempt.hpp`), client addresses (`sluice/client_address.hpp`) and the optional
// parts (`sluice/redis.hpp`, `sluice/yaml.hpp`) have their own headers, so that a file that only
// checks a limiter does not compile them.
#ifndef SLUICE_SLUICE_HPP_
#define SLUICE_SLUICE_HPP_

#include "sluice/clock.hpp"
#include "sluice/concurrency.hpp"
#include "sluice/decision.hpp"
#include "sluice/direct_gcra.hpp"
#include "sluice/fixed_window.hpp"
#include "sluice/gcra.hpp"
#include "sluice/http_fields.hpp"
#include "sluice/key.hpp"
#include "sluice/rate_limiter.hpp"
#include "sluice/store.hpp"
#include "sluice/version.hpp"
#include "sluice/window.hpp"

#endif  // SLUICE_SLUICE_HPP_
