// sluice/redis/detail/memory_check.hpp — the verdict on a server's memory settings: refuse one
// whose memory is unbounded or whose eviction policy can forget a spent budget, with the commands
// that fix it. Internal: the server check (server_check.hpp) reads the settings and asks here.
//
//   absl::Status ok = sluice::redis::detail::memory_settings_status(
//       0, "noeviction", sluice::redis::MemoryCheck::kRequireBounded);
//   // FailedPrecondition: "... maxmemory is 0 ...; run CONFIG SET maxmemory <bytes> and ..."
//
// Thread-safety: pure functions.
#ifndef SLUICE_REDIS_DETAIL_MEMORY_CHECK_HPP_
#define SLUICE_REDIS_DETAIL_MEMORY_CHECK_HPP_

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/detail/text.hpp"
#include "sluice/redis/options.hpp"

namespace sluice::redis::detail {

// What `policy` does when the server reaches maxmemory ("" for a policy sluice does not know).
inline std::string_view eviction_effect(std::string_view policy) {
  struct Known {
    std::string_view policy;
    std::string_view effect;
  };
  static constexpr Known kKnown[] = {
      {"allkeys-lru", "evicts any key, least recently used first"},
      {"allkeys-lfu", "evicts any key, least frequently used first"},
      {"allkeys-random", "evicts any key at random"},
      {"volatile-lru", "evicts keys with an expiry, least recently used first"},
      {"volatile-lfu", "evicts keys with an expiry, least frequently used first"},
      {"volatile-random", "evicts keys with an expiry at random"},
      {"noeviction", "evicts nothing: once maxmemory is reached every write fails with OOM"}};
  for (const Known& k : kKnown) {
    if (k.policy == policy) return k.effect;
  }
  return "";
}

// The verdict on settings read from the server (`maxmemory` in bytes).
inline absl::Status memory_settings_status(std::uint64_t maxmemory, std::string_view policy,
                                           MemoryCheck mode) {
  if (mode == MemoryCheck::kSkip) return absl::OkStatus();
  const bool unbounded_allowed = mode == MemoryCheck::kAllowUnbounded;
  if (maxmemory == 0) {
    if (unbounded_allowed) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "sluice::redis: the server's maxmemory is 0 (unbounded): every identity a limiter sees "
        "stays a key until its windows refill, so a spray of identities grows the server's memory "
        "without limit; run CONFIG SET maxmemory <bytes> and CONFIG SET maxmemory-policy "
        "volatile-ttl (and write both into redis.conf), or accept unbounded memory with "
        "memory_check = MemoryCheck::kAllowUnbounded");
  }
  if (policy == "volatile-ttl" || (unbounded_allowed && policy == "noeviction")) {
    return absl::OkStatus();
  }
  const std::string shown = sluice::detail::escaped(policy.substr(0, 64));  // the server's text
  const std::string_view effect = eviction_effect(policy);
  const bool refuses_writes = policy == "noeviction";
  return absl::FailedPreconditionError(absl::StrCat(
      "sluice::redis: the server's maxmemory-policy is ", shown, ", which ",
      effect.empty() ? "sluice does not know" : absl::string_view(effect.data(), effect.size()),
      refuses_writes ? ": checks then fail, and under fail-open every request is admitted"
                     : ": every limiter key has an expiry, so a spent budget's key can be evicted "
                       "and its next check admitted as if it were new",
      "; run CONFIG SET maxmemory-policy volatile-ttl (it evicts the keys closest to refilled "
      "first, a spent budget's last) and write it into redis.conf",
      refuses_writes ? ", or accept failing writes at the bound with memory_check = "
                       "MemoryCheck::kAllowUnbounded"
                     : ", or opt out with memory_check = MemoryCheck::kSkip"));
}

// The value of a `CONFIG GET name` reply: [name, value].
inline absl::StatusOr<std::string_view> config_value(const redisReply& reply) {
  if (reply.type == REDIS_REPLY_ERROR) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sluice::redis: cannot read the server's memory settings (",
        sluice::detail::escaped(std::string_view(reply.str, reply.len).substr(0, 200)),
        "); where CONFIG is renamed or denied, check maxmemory and maxmemory-policy yourself and "
        "set memory_check = MemoryCheck::kSkip"));
  }
  if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 2 ||
      reply.element[1]->type != REDIS_REPLY_STRING) {
    return absl::InternalError("sluice::redis: CONFIG GET returned an unexpected reply");
  }
  return std::string_view(reply.element[1]->str, reply.element[1]->len);
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_MEMORY_CHECK_HPP_
