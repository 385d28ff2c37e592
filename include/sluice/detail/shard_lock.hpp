// Internal: the lock of a ShardedStore shard (sluice/store.hpp). Uncontended, an acquire is one
// compare-and-swap and a release one exchange. Contended, a waiter parks in the kernel at once
// (a futex on Linux, std::atomic::wait elsewhere) and the release wakes one waiter, as glibc's
// default mutex does; it does not spin. A flood on one key is the case that decides this: every
// thread checks the same cell, and a waiter that spun would take the lock's and the cell's cache
// lines from the holder on nearly every check (both move between cores on each hand-off, the
// dominant cost), and with more threads than cores it would burn the time slice its descheduled
// holder needs. Parked, it lets the holder run its checks back to back on lines that stay in its
// cache. The sections are short (a probe and an integer update; hashing is done before the lock),
// so parking is rare unless one shard is flooded.
//
// The states are those of Drepper's "Futexes Are Tricky" mutex: free, held, and held with waiters
// that may be parked (whose release then wakes one).
#ifndef SLUICE_DETAIL_SHARD_LOCK_HPP_
#define SLUICE_DETAIL_SHARD_LOCK_HPP_

#include <atomic>
#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace sluice::detail {

class ABSL_LOCKABLE ShardLock {
 public:
  ABSL_ATTRIBUTE_ALWAYS_INLINE void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    std::uint32_t expected = kFree;
    if (ABSL_PREDICT_TRUE(state_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire,
                                                         std::memory_order_relaxed))) {
      return;
    }
    lock_contended();
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE void unlock() ABSL_UNLOCK_FUNCTION() {
    if (ABSL_PREDICT_FALSE(state_.exchange(kFree, std::memory_order_release) == kContended)) {
      wake_one();
    }
  }

 private:
  static constexpr std::uint32_t kFree = 0;
  static constexpr std::uint32_t kHeld = 1;
  static constexpr std::uint32_t kContended = 2;  // held; a waiter may be parked

  // Taken with kContended, not kHeld: another waiter may still be parked, and this thread's
  // release must wake it.
  ABSL_ATTRIBUTE_NOINLINE void lock_contended() {
    while (state_.exchange(kContended, std::memory_order_acquire) != kFree) park();
  }

  // Sleeps while the state is kContended (returns at once if it is not; may return spuriously).
  void park() {
#if defined(__linux__)
    // syscall(2) is variadic and is the only interface to futex(2); std::atomic::wait would spin
    // and yield first, which is what this lock must not do.
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&state_), FUTEX_WAIT_PRIVATE, kContended,
            nullptr, nullptr, 0);
#else
    state_.wait(kContended, std::memory_order_relaxed);
#endif
  }
  ABSL_ATTRIBUTE_NOINLINE void wake_one() {
#if defined(__linux__)
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg): as in park()
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&state_), FUTEX_WAKE_PRIVATE, 1, nullptr,
            nullptr, 0);
#else
    state_.notify_one();
#endif
  }

  std::atomic<std::uint32_t> state_{kFree};
};
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t),
              "the futex is the atomic's own word");

// RAII holder of one ShardLock.
class ABSL_SCOPED_LOCKABLE ShardLockHolder {
 public:
  ABSL_ATTRIBUTE_ALWAYS_INLINE explicit ShardLockHolder(ShardLock& lock)
      ABSL_EXCLUSIVE_LOCK_FUNCTION(lock)
      : lock_(lock) {
    lock_.lock();
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE ~ShardLockHolder() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  ShardLockHolder(const ShardLockHolder&) = delete;
  ShardLockHolder& operator=(const ShardLockHolder&) = delete;

 private:
  ShardLock& lock_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_SHARD_LOCK_HPP_
