// sluice/redis/detail/sigpipe_guard.hpp — no SIGPIPE while this thread talks to Redis. Internal.
//
// hiredis writes with write(2), and a write to a closed socket raises SIGPIPE, whose default
// action ends the process. The guard blocks SIGPIPE on the calling thread for its lifetime; a
// SIGPIPE raised meanwhile is consumed before the old mask returns. No process-wide state
// changes.
//
//   {
//     sluice::redis::detail::SigpipeGuard guard;
//     if (redisGetReply(context, &reply) != REDIS_OK) guard.note_failure();
//   }  // the thread's signal mask is as before
//
// Thread-safety: acts on the calling thread only; use each guard from the thread that made it.
#ifndef SLUICE_REDIS_DETAIL_SIGPIPE_GUARD_HPP_
#define SLUICE_REDIS_DETAIL_SIGPIPE_GUARD_HPP_

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

namespace sluice::redis::detail {

class SigpipeGuard {
 public:
  SigpipeGuard() noexcept {
    sigemptyset(&sigpipe_);
    sigaddset(&sigpipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe_, &old_mask_);
  }
  ~SigpipeGuard() {
    if (failed_ && sigismember(&old_mask_, SIGPIPE) == 0) {
      sigset_t pending;
      if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&sigpipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

  // A write or read failed: a SIGPIPE may be pending and is consumed on destruction.
  void note_failure() noexcept { failed_ = true; }

 private:
  sigset_t sigpipe_{};
  sigset_t old_mask_{};
  bool failed_ = false;
};

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_SIGPIPE_GUARD_HPP_
