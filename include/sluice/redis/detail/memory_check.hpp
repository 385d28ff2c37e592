// sluice/redis/detail/memory_check.hpp — refuse a server whose memory is unbounded or whose
// eviction can silently forget a spent budget. Internal: the pool runs it on each new connection.
//
//   absl::Status ok = sluice::redis::detail::check_memory_settings(
//       context, deadline, sluice::redis::MemoryCheck::kRequireBounded);
//   // FailedPrecondition: "maxmemory is 0 ..." / "maxmemory-policy is allkeys-lru ..."
//
// Thread-safety: uses one connection, which one thread holds at a time.
#ifndef SLUICE_REDIS_DETAIL_MEMORY_CHECK_HPP_
#define SLUICE_REDIS_DETAIL_MEMORY_CHECK_HPP_

#include <hiredis/hiredis.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/redis/detail/io.hpp"
#include "sluice/redis/options.hpp"

namespace sluice::redis::detail {

// The verdict on settings read from the server (`maxmemory` in bytes).
inline absl::Status memory_settings_status(std::uint64_t maxmemory, std::string_view policy,
                                           MemoryCheck mode) {
  const absl::string_view shown(policy.data(), policy.size());
  if (mode == MemoryCheck::kSkip) {
    return absl::OkStatus();
  }
  const bool unbounded_allowed = mode == MemoryCheck::kAllowUnbounded;
  if (maxmemory == 0) {
    if (unbounded_allowed) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "sluice::redis: the server's maxmemory is 0 (unbounded): a spray of identities grows it "
        "without limit; set maxmemory and maxmemory-policy volatile-ttl, or opt out with "
        "memory_check = MemoryCheck::kAllowUnbounded");
  }
  if (policy == "volatile-ttl" || (unbounded_allowed && policy == "noeviction")) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "sluice::redis: the server's maxmemory-policy is ", shown.substr(0, 64),
      ", which can evict a spent budget and admit it again unnoticed; set volatile-ttl",
      unbounded_allowed ? " (or noeviction)" : "",
      ", or opt out with memory_check = MemoryCheck::kSkip"));
}

// The value of a `CONFIG GET name` reply: [name, value].
inline absl::StatusOr<std::string_view> config_value(const redisReply& reply) {
  if (reply.type == REDIS_REPLY_ERROR) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sluice::redis: cannot read the server's memory settings (",
        absl::string_view(reply.str, reply.len).substr(0, 200),
        "); where CONFIG is renamed or denied, set memory_check = MemoryCheck::kSkip"));
  }
  if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 2 ||
      reply.element[1]->type != REDIS_REPLY_STRING) {
    return absl::InternalError("sluice::redis: CONFIG GET returned an unexpected reply");
  }
  return std::string_view(reply.element[1]->str, reply.element[1]->len);
}

// Reads maxmemory and maxmemory-policy (one round trip, by `end`) and judges them.
inline absl::Status check_memory_settings(redisContext* context, Deadline end, MemoryCheck mode) {
  if (mode == MemoryCheck::kSkip) {
    return absl::OkStatus();
  }
  Command maxmemory;
  Command policy;
  for (Command* command : {&maxmemory, &policy}) {
    command->add("CONFIG");
    command->add("GET");
  }
  maxmemory.add("maxmemory");
  policy.add("maxmemory-policy");
  const Command commands[] = {maxmemory, policy};
  absl::StatusOr<std::vector<ReplyPtr>> replies = exchange_on(context, end, commands);
  if (!replies.ok()) return replies.status();
  absl::StatusOr<std::string_view> bytes = config_value(*(*replies)[0]);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::string_view> name = config_value(*(*replies)[1]);
  if (!name.ok()) return name.status();
  std::uint64_t limit = 0;
  if (!absl::SimpleAtoi(absl::string_view(bytes->data(), bytes->size()), &limit)) {
    return absl::InternalError("sluice::redis: CONFIG GET maxmemory is not a number");
  }
  return memory_settings_status(limit, *name, mode);
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_MEMORY_CHECK_HPP_
