// sluice/redis/detail/command.hpp — commands out, replies in, pipelined on one connection.
// Internal.
//
//   sluice::redis::detail::Command get;
//   get.add("GET");
//   get.add("some-key");
//   absl::StatusOr<std::vector<sluice::redis::detail::ReplyPtr>> replies =
//       sluice::redis::detail::exchange(lease, std::span(&get, 1));  // one write, one reply each
//
// A Command refers to its arguments' bytes: they must outlive it. Thread-safety: a Command is a
// plain value; `exchange` uses the lease's connection, which one thread holds at a time.
#ifndef SLUICE_REDIS_DETAIL_COMMAND_HPP_
#define SLUICE_REDIS_DETAIL_COMMAND_HPP_

#include <errno.h>
#include <hiredis/hiredis.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/redis/detail/connection_pool.hpp"
#include "sluice/redis/detail/sigpipe_guard.hpp"
#include "sluice/redis/detail/status.hpp"

namespace sluice::redis::detail {

struct ReplyDeleter {
  void operator()(redisReply* reply) const noexcept { freeReplyObject(reply); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

// One command's arguments, as hiredis takes them.
struct Command {
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;

  void add(std::string_view arg) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
};

// Sends `commands` in one write (pipelined) and reads one reply per command. On an I/O error
// the connection is closed and every reply is lost.
inline absl::StatusOr<std::vector<ReplyPtr>> exchange(ConnectionPool::Lease& lease,
                                                      std::span<const Command> commands) {
  redisContext* context = lease.get();
  SigpipeGuard guard;
  for (const Command& command : commands) {
    if (redisAppendCommandArgv(context, static_cast<int>(command.argv.size()),
                               const_cast<const char**>(command.argv.data()),
                               command.lengths.data()) != REDIS_OK) {
      absl::Status status = io_status(*context, errno, "append command");
      lease.mark_broken();
      return status;
    }
  }
  std::vector<ReplyPtr> replies;
  replies.reserve(commands.size());
  for (std::size_t i = 0; i < commands.size(); ++i) {
    void* reply = nullptr;
    if (redisGetReply(context, &reply) != REDIS_OK || reply == nullptr) {
      const int saved_errno = errno;
      guard.note_failure();
      absl::Status status = io_status(*context, saved_errno, "command");
      lease.mark_broken();
      return status;
    }
    replies.emplace_back(static_cast<redisReply*>(reply));
  }
  return replies;
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_COMMAND_HPP_
