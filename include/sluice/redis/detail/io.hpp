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
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
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

// Waits until `fd` is ready for `events` (or has an error, or the peer hung up: the next send or
// recv tells which) by `end`: OK, or DeadlineExceeded once it has passed.
inline absl::Status wait_until_ready(int fd, short events, Deadline end) {
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::nanoseconds>(end - std::chrono::steady_clock::now());
    if (left <= std::chrono::nanoseconds::zero()) {
      return absl::DeadlineExceededError("sluice::redis: no reply within the command timeout");
    }
    const timespec timeout{static_cast<time_t>(left.count() / 1'000'000'000),
                           static_cast<long>(left.count() % 1'000'000'000)};
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = ppoll(&p, 1, &timeout, nullptr);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return socket_status(errno, "wait");
  }
}

// Sends `commands` in one write (pipelined), by `end`. After an error the connection is unusable:
// the caller closes it.
//
// The client writes and reads the socket itself, each call not blocking (MSG_DONTWAIT) and a
// write never raising SIGPIPE (MSG_NOSIGNAL), and waits in ppoll(2) with the time left: so the
// one deadline bounds every wait however a peer trickles or stalls, with no socket timeouts to
// arm and no signal mask to change per call. hiredis encodes the commands and parses the replies.
inline absl::Status send_on(redisContext* context, Deadline end,
                            std::span<const Command> commands) {
  std::string bytes;
  for (const Command& command : commands) {
    char* encoded = nullptr;
    const int n = redisFormatCommandArgv(&encoded, static_cast<int>(command.argv.size()),
                                         const_cast<const char**>(command.argv.data()),
                                         command.lengths.data());
    if (n < 0) return absl::ResourceExhaustedError("sluice::redis: cannot encode a command");
    bytes.append(encoded, static_cast<std::size_t>(n));
    redisFreeCommand(encoded);
  }
  if (std::chrono::steady_clock::now() >= end) {
    return absl::DeadlineExceededError("sluice::redis: no reply within the command timeout");
  }
  for (std::string_view left = bytes; !left.empty();) {
    const ssize_t n = ::send(context->fd, left.data(), left.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      left.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status ready = wait_until_ready(context->fd, POLLOUT, end); !ready.ok()) {
        return ready;
      }
    } else if (errno != EINTR) {
      return socket_status(errno, "write");
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
  std::vector<ReplyPtr> replies;
  replies.reserve(count);
  std::size_t received = 0;
  char buffer[16 * 1024];
  while (replies.size() < count) {
    void* reply = nullptr;
    if (redisGetReplyFromReader(context, &reply) != REDIS_OK) {
      return io_status(*context, errno, "reply");
    }
    if (reply != nullptr) {
      replies.emplace_back(static_cast<redisReply*>(reply));
      continue;
    }
    // A reply is never there at once after its command: wait first, then read.
    if (absl::Status ready = wait_until_ready(context->fd, POLLIN, end); !ready.ok()) {
      return ready;
    }
    const ssize_t n = ::recv(context->fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n == 0) {
      return absl::UnavailableError("sluice::redis: read: the server closed the connection");
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return socket_status(errno, "read");
    }
    received += static_cast<std::size_t>(n);
    if (received > max_bytes) {
      return absl::InternalError(absl::StrCat("sluice::redis: the server's reply exceeded ",
                                              max_bytes,
                                              " bytes, far more than these commands call for"));
    }
    if (redisReaderFeed(context->reader, buffer, static_cast<std::size_t>(n)) != REDIS_OK) {
      return absl::ResourceExhaustedError("sluice::redis: cannot buffer a reply");
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
