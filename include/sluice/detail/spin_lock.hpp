// Internal: the per-shard lock. A test-and-test-and-set spin lock that yields after a short spin:
// critical sections are a few dozen instructions (a probe and an integer update), so an
// uncontended acquire is one atomic exchange and a release is one store — cheaper than a mutex,
// which matters when the whole check costs tens of nanoseconds. The rare long section (an
// eviction sweep) makes waiters yield instead of burning their core.
#ifndef SLUICE_DETAIL_SPIN_LOCK_HPP_
#define SLUICE_DETAIL_SPIN_LOCK_HPP_

#include <atomic>
#include <thread>

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
    while (locked_.exchange(true, std::memory_order_acquire)) {
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins < 64) {
          cpu_relax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  void unlock() ABSL_UNLOCK_FUNCTION() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
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
