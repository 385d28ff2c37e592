// sluice/redis/detail/connection_pool.hpp — a bounded pool of blocking hiredis connections.
// Internal: `Client` owns one (tests and benchmarks reach it through `pool_for_testing`).
//
// A connection that failed is closed, never reused; the next acquire opens a fresh one (that is
// the reconnect). Connections open lazily, so a pool exists while Redis is down.
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
#include <sys/time.h>

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sluice/redis/detail/status.hpp"
#include "sluice/redis/options.hpp"

namespace sluice::redis::detail {

inline timeval to_timeval(std::chrono::milliseconds d) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();  // exact
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

class ConnectionPool {
 public:
  // One connection, leased: returned to the pool on destruction unless marked broken.
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)),
          context_(std::exchange(other.context_, nullptr)) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr) {
        pool_->release(context_);
      }
    }

    // The connection; nullptr once marked broken.
    redisContext* get() const noexcept { return context_; }
    // The connection failed: close it instead of returning it to the pool.
    void mark_broken() noexcept {
      if (context_ != nullptr) {
        redisFree(context_);
      }
      context_ = nullptr;
    }

   private:
    friend class ConnectionPool;
    Lease(ConnectionPool* pool, redisContext* context) : pool_(pool), context_(context) {}

    ConnectionPool* pool_;
    redisContext* context_;
  };

  explicit ConnectionPool(ConnectionOptions options) : options_(std::move(options)) {}
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;
  ~ConnectionPool() {
    for (redisContext* context : idle_) {
      redisFree(context);
    }
  }

  const ConnectionOptions& options() const noexcept { return options_; }

  // An idle connection, or a new one while fewer than max_connections are open; waits at most
  // command_timeout for one to come back.
  absl::StatusOr<Lease> acquire() {
    {
      absl::MutexLock lock(&mu_);
      const bool ready = mu_.AwaitWithTimeout(absl::Condition(this, &ConnectionPool::has_capacity),
                                              absl::FromChrono(options_.command_timeout));
      if (!ready) {
        return absl::DeadlineExceededError(
            "sluice::redis: no free connection within the command timeout");
      }
      if (!idle_.empty()) {
        redisContext* context = idle_.back();
        idle_.pop_back();
        return Lease(this, context);
      }
      ++open_;
    }
    absl::StatusOr<redisContext*> context = connect();
    if (!context.ok()) {
      release(nullptr);
      return context.status();
    }
    return Lease(this, *context);
  }

  // Connections open now, idle or leased.
  std::size_t open_connections() const {
    absl::MutexLock lock(&mu_);
    return open_;
  }

 private:
  bool has_capacity() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !idle_.empty() || open_ < options_.max_connections;
  }

  // Returns a healthy connection to the free list, or (nullptr) gives up a closed one's slot.
  // A waiter in acquire() wakes when has_capacity() turns true (absl::Mutex re-evaluates it).
  void release(redisContext* context) {
    absl::MutexLock lock(&mu_);
    if (context != nullptr) {
      idle_.push_back(context);
    } else {
      --open_;
    }
  }

  absl::StatusOr<redisContext*> connect() const {
    const timeval connect_timeout = to_timeval(options_.connect_timeout);
    redisContext* context =
        options_.unix_socket.empty()
            ? redisConnectWithTimeout(options_.host.c_str(), options_.port, connect_timeout)
            : redisConnectUnixWithTimeout(options_.unix_socket.c_str(), connect_timeout);
    const int saved_errno = errno;
    if (context == nullptr) {
      return absl::ResourceExhaustedError("sluice::redis: cannot allocate a connection");
    }
    if (context->err != 0) {
      absl::Status status = io_status(*context, saved_errno, "connect");
      redisFree(context);
      return status;
    }
    if (redisSetTimeout(context, to_timeval(options_.command_timeout)) != REDIS_OK) {
      absl::Status status = io_status(*context, errno, "set timeout");
      redisFree(context);
      return status;
    }
    return context;
  }

  const ConnectionOptions options_;
  mutable absl::Mutex mu_;
  std::vector<redisContext*> idle_ ABSL_GUARDED_BY(mu_);
  std::size_t open_ ABSL_GUARDED_BY(mu_) = 0;  // idle + leased
};

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_CONNECTION_POOL_HPP_
