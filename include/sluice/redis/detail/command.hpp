// sluice/redis/detail/command.hpp — commands out, replies in, pipelined on a pooled connection.
// Internal.
//
//   sluice::redis::detail::Command get;
//   get.add("GET");
//   get.add("some-key");
//   absl::StatusOr<std::vector<sluice::redis::detail::ReplyPtr>> replies =
//       sluice::redis::detail::exchange(lease, std::span(&get, 1));  // one write, one reply each
//
// Thread-safety: `exchange` uses the lease's connection, which one thread holds at a time.
#ifndef SLUICE_REDIS_DETAIL_COMMAND_HPP_
#define SLUICE_REDIS_DETAIL_COMMAND_HPP_

#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/redis/detail/connection_pool.hpp"
#include "sluice/redis/detail/io.hpp"

namespace sluice::redis::detail {

// Sends `commands` in one write (pipelined) and reads one reply per command, all by the lease's
// deadline. On an I/O error or the deadline the connection is closed and every reply is lost.
inline absl::StatusOr<std::vector<ReplyPtr>> exchange(ConnectionPool::Lease& lease,
                                                      std::span<const Command> commands) {
  absl::StatusOr<std::vector<ReplyPtr>> replies =
      exchange_on(lease.get(), lease.deadline(), commands);
  if (!replies.ok()) {
    lease.mark_broken();
  }
  return replies;
}

// The two halves of `exchange`, for talking to several connections at once: write to each, then
// read from each. Each closes the connection on an error.
inline absl::Status send(ConnectionPool::Lease& lease, std::span<const Command> commands) {
  absl::Status sent = send_on(lease.get(), lease.deadline(), commands);
  if (!sent.ok()) {
    lease.mark_broken();
  }
  return sent;
}
// `max_bytes`: reply_budget of the commands sent.
inline absl::StatusOr<std::vector<ReplyPtr>> receive(ConnectionPool::Lease& lease,
                                                     std::size_t count, std::size_t max_bytes) {
  absl::StatusOr<std::vector<ReplyPtr>> replies =
      receive_on(lease.get(), lease.deadline(), count, max_bytes);
  if (!replies.ok()) {
    lease.mark_broken();
  }
  return replies;
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_COMMAND_HPP_
