// Internal: a std::mutex that clang's thread-safety analysis understands, with a timed wait.
//
// Why not absl::Mutex: Debian's Abseil is a prebuilt library without ThreadSanitizer
// instrumentation, so TSan cannot see absl::Mutex's locking and reports false races on the data
// it guards. std::mutex is intercepted by TSan wherever it runs; this wrapper adds the
// capability annotations that libstdc++'s std::mutex lacks.
#ifndef SLUICE_DETAIL_MUTEX_HPP_
#define SLUICE_DETAIL_MUTEX_HPP_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace sluice::detail {

class ABSL_LOCKABLE Mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mutex_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mutex_.unlock(); }

  // With the mutex held: waits until `ready()` holds or `timeout` has passed, releasing the mutex
  // while it sleeps; returns `ready()`. Wakes on notify_all().
  template <class Ready>
  bool wait_for(std::chrono::nanoseconds timeout, Ready ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> held(mutex_, std::adopt_lock);
    const bool result = changed_.wait_for(held, timeout, ready);
    held.release();  // still locked: the caller's MutexLock unlocks it
    return result;
  }
  // Wakes every waiter; call after changing what their `ready` reads.
  void notify_all() noexcept { changed_.notify_all(); }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
};

// RAII holder of a Mutex.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ABSL_EXCLUSIVE_LOCK_FUNCTION(mutex) : mutex_(mutex) {
    mutex_.lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_MUTEX_HPP_
