// Internal to sluice::yaml: how a reloading holder's thread is woken — a pipe that request_reload,
// the destructor and a signal handler write one byte to (write(2) is async-signal-safe), and
// that the thread waits on with poll(2) until its interval ends. POSIX only.
#ifndef SLUICE_YAML_DETAIL_WAKE_PIPE_HPP_
#define SLUICE_YAML_DETAIL_WAKE_PIPE_HPP_

#include <fcntl.h>
#include <poll.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <string>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace sluice::yaml::detail {

// What woke the thread: each byte says one thing.
inline constexpr char kWakeReload = 'r';
inline constexpr char kWakeStop = 's';

struct Wakeups {
  bool timed_out = false;  // the interval ended, nothing was written
  bool reload = false;
  bool stop = false;
};

// errno's text (std::strerror is not thread-safe).
inline std::string error_text(int error) {
  return std::error_code(error, std::generic_category()).message();
}

class WakePipe {
 public:
  static absl::StatusOr<WakePipe> create() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      return absl::InternalError(absl::StrCat("pipe2: ", error_text(errno)));
    }
    return WakePipe(fds[0], fds[1]);
  }
  WakePipe(WakePipe&& other) noexcept
      : read_fd_(std::exchange(other.read_fd_, -1)),
        write_fd_(std::exchange(other.write_fd_, -1)) {}
  WakePipe& operator=(WakePipe&&) = delete;
  ~WakePipe() {
    if (read_fd_ >= 0) ::close(read_fd_);
    if (write_fd_ >= 0) ::close(write_fd_);
  }

  // Async-signal-safe. A full pipe already holds a wakeup, so a failed write loses nothing.
  static void write_byte(int fd, char what) noexcept {
    const int saved = errno;
    [[maybe_unused]] const ssize_t n = ::write(fd, &what, 1);
    errno = saved;
  }
  void notify(char what) const noexcept { write_byte(write_fd_, what); }
  int write_fd() const noexcept { return write_fd_; }

  // Waits until a byte arrives or `interval` ends (0: no end), then reads every byte there is.
  Wakeups wait(std::chrono::milliseconds interval) const {
    pollfd p{.fd = read_fd_, .events = POLLIN, .revents = 0};
    const int timeout = interval.count() > 0 ? static_cast<int>(interval.count()) : -1;
    const int n = ::poll(&p, 1, timeout);
    Wakeups out{.timed_out = n == 0};
    char bytes[64];
    for (;;) {
      const ssize_t got = ::read(read_fd_, bytes, sizeof bytes);
      if (got <= 0) break;  // empty (EAGAIN): every byte read
      for (ssize_t i = 0; i < got; ++i) {
        out.reload = out.reload || bytes[i] == kWakeReload;
        out.stop = out.stop || bytes[i] == kWakeStop;
      }
    }
    return out;
  }

 private:
  WakePipe(int read_fd, int write_fd) : read_fd_(read_fd), write_fd_(write_fd) {}

  int read_fd_ = -1;
  int write_fd_ = -1;
};

// The wake pipe a reload signal writes to: one holder per process. A lock-free atomic, constant
// initialized (no guard to take), so the signal handler may read it.
inline std::atomic<int>& reload_signal_fd() noexcept {
  static constinit std::atomic<int> fd{-1};
  return fd;
}
static_assert(std::atomic<int>::is_always_lock_free);

inline void on_reload_signal(int /*signal*/) {
  const int fd = reload_signal_fd().load(std::memory_order_acquire);
  if (fd >= 0) WakePipe::write_byte(fd, kWakeReload);
}

// Makes `signal` wake `pipe`'s thread to reload: FailedPrecondition when another holder has the
// reload signal; the previous disposition in `previous`.
inline absl::Status take_reload_signal(int signal, const WakePipe& pipe,
                                       struct sigaction& previous) {
  int expected = -1;
  if (!reload_signal_fd().compare_exchange_strong(expected, pipe.write_fd())) {
    return absl::FailedPreconditionError(
        "reload_signal: another reloading holder of this process already reloads on a signal");
  }
  struct sigaction action {};
  action.sa_handler = &on_reload_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (::sigaction(signal, &action, &previous) != 0) {
    reload_signal_fd().store(-1, std::memory_order_release);
    return absl::InvalidArgumentError(
        absl::StrCat("reload_signal ", signal, ": ", error_text(errno)));
  }
  return absl::OkStatus();
}

// Gives the signal back: its previous disposition, and no pipe.
inline void release_reload_signal(int signal, const struct sigaction& previous) {
  ::sigaction(signal, &previous, nullptr);
  reload_signal_fd().store(-1, std::memory_order_release);
}

}  // namespace sluice::yaml::detail

#endif  // SLUICE_YAML_DETAIL_WAKE_PIPE_HPP_
