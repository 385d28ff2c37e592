// sluice/redis/detail/io.hpp — commands out, replies in, on one hiredis connection, by a deadline.
// Internal: `exchange` (command.hpp) runs it on a pooled connection; the pool runs it on a new
// connection to read the server's settings.
//
//   sluice::redis::detail::Command get;
//   get.add("GET");
//   get.add("some-key");
//   const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
//   absl::StatusOr<std::vector<sluice::redis::detail::ReplyPtr>> replies =
//       sluice::redis::detail::exchange_on(context, end, std::span(&get, 1));
//
// A Command refers to its arguments' bytes: they must outlive it. Thread-safety: a Command is a
// plain value; `exchange_on` uses one connection, which one thread holds at a time.
#ifndef SLUICE_REDIS_DETAIL_IO_HPP_
#define SLUICE_REDIS_DETAIL_IO_HPP_

#include <errno.h>
#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/redis/detail/sigpipe_guard.hpp"
#include "sluice/redis/detail/status.hpp"

namespace sluice::redis::detail {

// When a check must have its answer (steady clock).
using Deadline = std::chrono::steady_clock::time_point;

inline timeval to_timeval(std::chrono::microseconds d) {
  const auto us = d.count();
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

// The time left before `deadline`, rounded up to whole microseconds; ≤ 0 once it has passed.
inline std::chrono::microseconds time_left(Deadline deadline) {
  return std::chrono::ceil<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now());
}

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

// Arms a socket's send and receive timeouts with the time left before one deadline, before each
// blocking call: a peer that answers a byte at a time cannot stretch a check past the deadline.
// Re-arming is skipped within kRearmAfter of the last arming (two system calls saved on the
// common one-write-one-read path), so a call may end up to kRearmAfter past the deadline.
class SocketDeadline {
 public:
  static constexpr std::chrono::microseconds kRearmAfter{1000};

  SocketDeadline(redisContext& context, Deadline deadline) : context_(context), end_(deadline) {}

  // DeadlineExceeded once the deadline has passed.
  absl::Status arm() {
    const auto now = std::chrono::steady_clock::now();
    if (armed_ && now - armed_at_ < kRearmAfter) {
      return absl::OkStatus();
    }
    const std::chrono::microseconds left = std::chrono::ceil<std::chrono::microseconds>(end_ - now);
    if (left <= std::chrono::microseconds::zero()) {
      return absl::DeadlineExceededError("sluice::redis: no reply within the command timeout");
    }
    if (redisSetTimeout(&context_, to_timeval(left)) != REDIS_OK) {
      return io_status(context_, errno, "set timeout");
    }
    armed_ = true;
    armed_at_ = now;
    return absl::OkStatus();
  }

 private:
  redisContext& context_;
  const Deadline end_;
  bool armed_ = false;
  std::chrono::steady_clock::time_point armed_at_{};
};

// Sends `commands` in one write (pipelined), by `end`. After an error the connection is unusable:
// the caller closes it.
inline absl::Status send_on(redisContext* context, Deadline end,
                            std::span<const Command> commands) {
  SigpipeGuard guard;
  SocketDeadline deadline(*context, end);
  const auto fail = [&](absl::Status status) {
    guard.note_failure();
    return status;
  };
  for (const Command& command : commands) {
    if (redisAppendCommandArgv(context, static_cast<int>(command.argv.size()),
                               const_cast<const char**>(command.argv.data()),
                               command.lengths.data()) != REDIS_OK) {
      return fail(io_status(*context, errno, "append command"));
    }
  }
  for (int written = 0; written == 0;) {
    if (absl::Status armed = deadline.arm(); !armed.ok()) {
      return fail(armed);
    }
    if (redisBufferWrite(context, &written) != REDIS_OK) {
      return fail(io_status(*context, errno, "write"));
    }
  }
  return absl::OkStatus();
}

// The most bytes the replies to `commands` may take: sluice's replies are no longer than a few
// times their commands' arguments (a script's reply holds per item what its arguments name), and
// 1 MiB covers every reply of a fixed size (INFO, CLUSTER SLOTS). hiredis 0.14 bounds neither a
// bulk string's length nor an array's count, so a server, or anything in between, that sends
// more would otherwise grow this process for as long as the deadline lets it (an array of tiny
// elements costs ~17 times its bytes).
inline std::size_t reply_budget(std::span<const Command> commands) {
  constexpr std::size_t kFloor = std::size_t{1} << 20;
  constexpr std::size_t kPerArgumentByte = 16;
  std::size_t bytes = 0;
  for (const Command& command : commands) {
    for (std::size_t n : command.lengths) bytes += n;
  }
  return kFloor + kPerArgumentByte * bytes;
}

// Reads `count` replies (to commands sent before), by `end`, in at most `max_bytes`
// (reply_budget). Internal when the server sends more, or anything after the last reply (unasked:
// the replies may be off by one). After an error the connection is unusable (a reply may be half
// read): the caller closes it.
inline absl::StatusOr<std::vector<ReplyPtr>> receive_on(redisContext* context, Deadline end,
                                                        std::size_t count, std::size_t max_bytes) {
  SocketDeadline deadline(*context, end);
  std::vector<ReplyPtr> replies;
  replies.reserve(count);
  std::size_t received = 0;
  while (replies.size() < count) {
    void* reply = nullptr;
    if (redisGetReplyFromReader(context, &reply) != REDIS_OK) {
      return io_status(*context, errno, "reply");
    }
    if (reply != nullptr) {
      replies.emplace_back(static_cast<redisReply*>(reply));
      continue;
    }
    if (absl::Status armed = deadline.arm(); !armed.ok()) {
      return armed;
    }
    const std::size_t before = context->reader->len;  // a read only appends to the buffer
    if (redisBufferRead(context) != REDIS_OK) {
      return io_status(*context, errno, "read");
    }
    received += context->reader->len - before;
    if (received > max_bytes) {
      return absl::InternalError(absl::StrCat("sluice::redis: the server's reply exceeded ",
                                              max_bytes,
                                              " bytes, far more than these commands call for"));
    }
  }
  if (context->reader->pos < context->reader->len) {
    return absl::InternalError("sluice::redis: the server sent more replies than were asked for");
  }
  return replies;
}

// Sends `commands` in one write (pipelined) and reads one reply per command, all by `end`. After
// an error the connection is unusable (a reply may be half read): the caller closes it.
inline absl::StatusOr<std::vector<ReplyPtr>> exchange_on(redisContext* context, Deadline end,
                                                         std::span<const Command> commands) {
  if (absl::Status sent = send_on(context, end, commands); !sent.ok()) {
    return sent;
  }
  return receive_on(context, end, commands.size(), reply_budget(commands));
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_IO_HPP_
