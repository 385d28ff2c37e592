// Internal: the per-shard lock. Uncontended, an acquire is one compare-and-swap and a release one
// exchange, cheaper than a mutex, which matters when the whole check costs tens of nanoseconds.
// Contended, a waiter spins briefly (the holder's section is a probe and an integer update, a few
// dozen instructions), then parks in the kernel (std::atomic::wait, a futex on Linux) until the
// holder's release wakes it. Parking is what keeps a flood on one key fast: a waiter that kept
// spinning would pull the lock's cache line away from the holder on every check, and with more
// threads than cores it would burn the time slice its descheduled holder needs.
//
// The states are those of Drepper's "Futexes Are Tricky" mutex: free, held, held with waiters
// that may be parked (the release then wakes one).
#ifndef SLUICE_DETAIL_SPIN_LOCK_HPP_
#define SLUICE_DETAIL_SPIN_LOCK_HPP_

#include <atomic>
#include <cstdint>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"

namespace sluice::detail {

// Tells the CPU that this thread is spinning (frees the core's resources for its sibling).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class ABSL_LOCKABLE SpinLock {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    std::uint32_t expected = kFree;
    if (ABSL_PREDICT_TRUE(state_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire,
                                                         std::memory_order_relaxed))) {
      return;
    }
    lock_contended();
  }
  void unlock() ABSL_UNLOCK_FUNCTION() {
    if (ABSL_PREDICT_FALSE(state_.exchange(kFree, std::memory_order_release) == kContended)) {
      state_.notify_one();
    }
  }

 private:
  static constexpr std::uint32_t kFree = 0;
  static constexpr std::uint32_t kHeld = 1;
  static constexpr std::uint32_t kContended = 2;  // held; a waiter may be parked
  // Loads of the lock word before parking: about as long as a short section takes to finish.
  static constexpr int kSpins = 32;

  ABSL_ATTRIBUTE_NOINLINE void lock_contended() {
    for (int spins = 0; spins < kSpins; ++spins) {
      cpu_relax();
      std::uint32_t expected = state_.load(std::memory_order_relaxed);
      if (expected == kFree &&
          state_.compare_exchange_weak(expected, kHeld, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
        return;
      }
    }
    // Taken with kContended, not kHeld: another waiter may still be parked, and our release must
    // wake it.
    while (state_.exchange(kContended, std::memory_order_acquire) != kFree) {
      state_.wait(kContended, std::memory_order_relaxed);
    }
  }

  std::atomic<std::uint32_t> state_{kFree};
};

// RAII holder of one SpinLock.
class ABSL_SCOPED_LOCKABLE SpinLockHolder {
 public:
  explicit SpinLockHolder(SpinLock& lock) ABSL_EXCLUSIVE_LOCK_FUNCTION(lock) : lock_(lock) {
    lock_.lock();
  }
  ~SpinLockHolder() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  SpinLockHolder(const SpinLockHolder&) = delete;
  SpinLockHolder& operator=(const SpinLockHolder&) = delete;

 private:
  SpinLock& lock_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_SPIN_LOCK_HPP_
