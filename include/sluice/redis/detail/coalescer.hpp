// sluice/redis/detail/coalescer.hpp — the Redis client's coalescer of single-key checks: checks
// decided at one time (nullopt: the server's TIME) share a script call. See
// sluice/detail/coalescer.hpp.
#ifndef SLUICE_REDIS_DETAIL_COALESCER_HPP_
#define SLUICE_REDIS_DETAIL_COALESCER_HPP_

#include <chrono>
#include <optional>

#include "sluice/detail/coalescer.hpp"
#include "sluice/redis/limit.hpp"

namespace sluice::redis::detail {

using Coalescer = sluice::detail::Coalescer<CheckItem, std::optional<std::chrono::nanoseconds>>;

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_COALESCER_HPP_
