// sluice/redis/detail/connection_pool.hpp — a bounded pool of hiredis connections.
// Internal: `Client` owns one (tests and benchmarks reach it through `pool_for_testing`).
//
// A connection that failed is closed, never reused; the next acquire opens a fresh one (that is
// the reconnect). An idle connection is probed before it is handed out (one poll(2), no I/O): one
// the server closed meanwhile (a restart) is replaced before any command is written to it.
// Connections open lazily, so a pool exists while Redis is down. Each new connection is checked
// (server_check.hpp: version, Cluster mode, memory settings) before its first use; a server that
// fails the check is refused: FailedPrecondition naming the fix.
//
// Every lease carries the deadline of the one check it serves: the wait for a connection, the
// connect, and every write and read of `exchange` (command.hpp) end by it.
//
//   sluice::redis::detail::ConnectionPool pool({.unix_socket = "/run/redis/redis.sock"});
//   absl::StatusOr<sluice::redis::detail::ConnectionPool::Lease> lease = pool.acquire();
//   if (!lease.ok()) return lease.status();  // DeadlineExceeded, Unavailable, ...
//   redisContext* context = lease->get();     // back to the pool when `lease` ends
//
// Thread-safety: thread-safe. A Lease is used by one thread at a time and must not outlive the
// pool.
#ifndef SLUICE_REDIS_DETAIL_CONNECTION_POOL_HPP_
#define SLUICE_REDIS_DETAIL_CONNECTION_POOL_HPP_

#include <errno.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/host_resolver.hpp"
#include "sluice/detail/mutex.hpp"
#include "sluice/redis/detail/io.hpp"
#include "sluice/redis/detail/server_check.hpp"
#include "sluice/redis/detail/status.hpp"
#include "sluice/redis/options.hpp"

namespace sluice::redis::detail {

class ConnectionPool {
 public:
  // One connection, leased: returned to the pool on destruction unless marked broken.
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)),
          context_(std::exchange(other.context_, nullptr)),
          deadline_(other.deadline_) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr) {
        pool_->release(context_);
      }
    }

    // The connection; nullptr once marked broken.
    redisContext* get() const noexcept { return context_; }
    // When the check this lease serves must be answered.
    Deadline deadline() const noexcept { return deadline_; }
    // The connection failed: close it instead of returning it to the pool.
    void mark_broken() noexcept {
      if (context_ != nullptr) {
        redisFree(context_);
      }
      context_ = nullptr;
    }

   private:
    friend class ConnectionPool;
    Lease(ConnectionPool* pool, redisContext* context, Deadline deadline)
        : pool_(pool), context_(context), deadline_(deadline) {}

    ConnectionPool* pool_;
    redisContext* context_;
    Deadline deadline_;
  };

  // `cluster`: the server must be a Redis Cluster node (else a standalone server).
  explicit ConnectionPool(ConnectionOptions options, bool cluster = false)
      : options_(std::move(options)),
        required_{.memory = options_.memory_check, .cluster = cluster},
        resolver_(options_.host) {}
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;
  ~ConnectionPool() {
    for (redisContext* context : idle_) {
      redisFree(context);
    }
  }

  const ConnectionOptions& options() const noexcept { return options_; }

  // An idle connection, or a new one while fewer than max_connections are open, for one check
  // that must end by `deadline` (default: command_timeout from now). Waits until the deadline at
  // most for one to come back; a new connection's connect ends by it too.
  absl::StatusOr<Lease> acquire() {
    return acquire(std::chrono::steady_clock::now() + options_.command_timeout);
  }
  absl::StatusOr<Lease> acquire(Deadline deadline) {
    // Each pass takes an idle connection or opens one; a dead idle one is closed and replaced, so
    // the passes end when the idle list is exhausted at the latest.
    for (;;) {
      redisContext* idle = nullptr;
      {
        sluice::detail::MutexLock lock(mu_);
        const bool ready = mu_.wait_for(
            deadline - std::chrono::steady_clock::now(),
            [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // called by wait_for with mu_ held
              return has_capacity();
            });
        if (!ready) {
          return absl::DeadlineExceededError(
              "sluice::redis: no free connection within the command timeout");
        }
        if (!idle_.empty()) {
          idle = idle_.back();
          idle_.pop_back();
        } else {
          ++open_;
        }
      }
      if (idle == nullptr) {
        absl::StatusOr<redisContext*> context = connect(deadline);
        if (!context.ok()) {
          release(nullptr);
          return context.status();
        }
        return Lease(this, *context, deadline);
      }
      if (is_alive(*idle)) {
        return Lease(this, idle, deadline);
      }
      redisFree(idle);
      release(nullptr);
    }
  }

  // The server's verdict, asked once: FailedPrecondition naming the fix when the server fails the
  // check; OK when a connection passed it (then at once on every later call), and OK when no
  // connection could be opened by `deadline` (Unavailable, DeadlineExceeded, no free
  // connection): the first connection that opens later is checked instead.
  absl::Status verify_server(Deadline deadline) {
    if (verified_.load(std::memory_order_acquire)) return absl::OkStatus();
    absl::StatusOr<Lease> lease = acquire(deadline);
    if (lease.ok() || lease.status().code() != absl::StatusCode::kFailedPrecondition) {
      return absl::OkStatus();
    }
    return lease.status();
  }

  // Connections open now, idle or leased.
  std::size_t open_connections() const {
    sluice::detail::MutexLock lock(mu_);
    return open_;
  }

 private:
  bool has_capacity() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !idle_.empty() || open_ < options_.max_connections;
  }

  // Returns a healthy connection to the free list, or (nullptr) gives up a closed one's slot.
  // Wakes the waiters in acquire(): has_capacity() may have turned true.
  void release(redisContext* context) {
    {
      sluice::detail::MutexLock lock(mu_);
      if (context != nullptr) {
        idle_.push_back(context);
      } else {
        --open_;
      }
    }
    mu_.notify_all();
  }

  // An idle connection has nothing to read: readable, or bytes left in its reader, means the
  // server closed it (end of file), reset it, or sent something unasked; any of them makes it
  // unusable.
  static bool is_alive(const redisContext& context) {
    if (context.reader != nullptr && context.reader->pos < context.reader->len) return false;
    pollfd probe{.fd = context.fd, .events = POLLIN | POLLRDHUP, .revents = 0};
    return context.err == 0 && poll(&probe, 1, 0) == 0;
  }

  absl::StatusOr<redisContext*> connect(Deadline deadline) {
    absl::StatusOr<redisContext*> context = open_socket(deadline);
    if (!context.ok()) return context.status();
    // Scripts are tried on the first connection only: later ones reach the same server, and
    // their script calls would show in its statistics as the limiter's own.
    if (absl::Status status =
            check_server(*context, deadline, required_, !verified_.load(std::memory_order_acquire));
        !status.ok()) {
      redisFree(*context);
      return status;
    }
    verified_.store(true, std::memory_order_release);
    return context;
  }

  // A connected socket: the unix socket, or the host's addresses (resolved within
  // connect_timeout) tried in order until one accepts, each for at most connect_timeout, all by
  // `deadline`.
  absl::StatusOr<redisContext*> open_socket(Deadline deadline) {
    if (!options_.unix_socket.empty()) return open_one(options_.unix_socket, deadline);
    absl::StatusOr<sluice::detail::HostAddresses> addresses = resolver_.resolve(
        std::min(deadline, std::chrono::steady_clock::now() + options_.connect_timeout));
    if (!addresses.ok()) {
      return absl::Status(addresses.status().code(),
                          absl::StrCat("sluice::redis: ", addresses.status().message()));
    }
    absl::StatusOr<redisContext*> context;
    for (const std::string& address : *addresses) {
      context = open_one(address, deadline);
      const absl::StatusCode code = context.status().code();
      if (code != absl::StatusCode::kUnavailable && code != absl::StatusCode::kDeadlineExceeded) {
        break;  // connected, or out of memory
      }
    }
    return context;
  }

  // One connection to `address` (a numeric address, or the unix socket's path).
  absl::StatusOr<redisContext*> open_one(const std::string& address, Deadline deadline) {
    const std::chrono::microseconds left = time_left(deadline);
    if (left <= std::chrono::microseconds::zero()) {
      return absl::DeadlineExceededError("sluice::redis: no time left to connect");
    }
    const timeval connect_timeout = to_timeval(std::min<std::chrono::microseconds>(
        left, std::chrono::duration_cast<std::chrono::microseconds>(options_.connect_timeout)));
    redisContext* context =
        options_.unix_socket.empty()
            ? redisConnectWithTimeout(address.c_str(), options_.port, connect_timeout)
            : redisConnectUnixWithTimeout(address.c_str(), connect_timeout);
    const int saved_errno = errno;
    if (context == nullptr) {
      return absl::ResourceExhaustedError("sluice::redis: cannot allocate a connection");
    }
    if (context->err != 0) {
      absl::Status status = io_status(*context, saved_errno, "connect");
      redisFree(context);
      return status;
    }
    return context;
  }

  const ConnectionOptions options_;
  const ServerRequirements required_;
  sluice::detail::HostResolver resolver_;  // the host's addresses (unused with a unix socket)
  std::atomic<bool> verified_{false};      // a connection passed check_server
  mutable sluice::detail::Mutex mu_;
  std::vector<redisContext*> idle_ ABSL_GUARDED_BY(mu_);
  std::size_t open_ ABSL_GUARDED_BY(mu_) = 0;  // idle + leased
};

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_CONNECTION_POOL_HPP_
