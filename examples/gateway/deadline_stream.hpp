// DeadlineStream — a connection's socket as a cpp-httplib 0.11 Stream whose reads end at one
// deadline and stop after a byte budget, however slowly the peer sends.
//
// cpp-httplib's own socket stream applies its read timeout to each read on its own, so a peer that
// sends a byte now and then holds the connection for as long as it likes. DeadlineStream bounds
// all the reads of one exchange together: after start(deadline, budget), a read waits only until
// the deadline and is refused once `budget` bytes were read (cut_off() then says so). Writes wait
// at most the write timeout each, and not past the write deadline when one is set. Reads are
// buffered: cpp-httplib reads header lines one byte at a time.
//
// Used by BoundedServer (a request from a client) and UpstreamClient (an answer from an
// upstream). Thread-safety: one thread at a time. Linux/POSIX only.
#ifndef SLUICE_EXAMPLES_GATEWAY_DEADLINE_STREAM_HPP_
#define SLUICE_EXAMPLES_GATEWAY_DEADLINE_STREAM_HPP_

#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace gateway {

class DeadlineStream final : public httplib::Stream {
 public:
  using Clock = std::chrono::steady_clock;

  DeadlineStream(socket_t sock, std::chrono::milliseconds write_timeout)
      : sock_(sock), write_timeout_(write_timeout) {}

  // The reads from now on end at `deadline` and take at most `budget` bytes in all.
  void start(Clock::time_point deadline, std::size_t budget) {
    deadline_ = deadline;
    budget_ = budget;
  }
  // No write waits past `deadline` (each still waits at most the write timeout).
  void set_write_deadline(Clock::time_point deadline) { write_deadline_ = deadline; }
  // True once a read was refused (deadline or budget): cpp-httplib may still answer 400 or 413,
  // but the connection must close, or the rest of the message would be read as the next.
  bool cut_off() const { return cut_off_; }

  bool is_readable() const override { return begin_ < end_ || wait(POLLIN, until(deadline_)); }
  bool is_writable() const override {
    return wait(POLLOUT, write_deadline_ ? std::min(write_timeout_, until(*write_deadline_))
                                         : write_timeout_);
  }

  ssize_t read(char* ptr, std::size_t size) override {
    if (begin_ == end_) {
      const std::size_t want = std::min(buffer_.size(), budget_);
      if (want == 0 || !wait(POLLIN, until(deadline_))) {
        cut_off_ = true;
        return -1;
      }
      const ssize_t n = ::recv(sock_, buffer_.data(), want, 0);
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<std::size_t>(n);
      budget_ -= end_;
    }
    const std::size_t n = std::min(size, end_ - begin_);
    std::memcpy(ptr, buffer_.data() + begin_, n);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, std::size_t size) override {
    if (!is_writable()) return -1;
    return ::send(sock_, ptr, size, MSG_NOSIGNAL);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address(&::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address(&::getsockname, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  static std::chrono::milliseconds until(Clock::time_point deadline) {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
  }
  bool wait(short events, std::chrono::milliseconds timeout) const {
    pollfd fd{.fd = sock_, .events = events, .revents = 0};
    int ready = 0;
    do {
      ready = ::poll(&fd, 1, static_cast<int>(timeout.count()));
    } while (ready < 0 && errno == EINTR);
    return ready > 0;
  }
  void address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage storage{};
    socklen_t length = sizeof(storage);
    std::array<char, NI_MAXHOST> host{};
    std::array<char, NI_MAXSERV> service{};
    if (get(sock_, reinterpret_cast<sockaddr*>(&storage), &length) != 0 ||
        ::getnameinfo(reinterpret_cast<sockaddr*>(&storage), length, host.data(), host.size(),
                      service.data(), service.size(), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      return;
    }
    ip = host.data();
    port = std::atoi(service.data());
  }

  socket_t sock_;
  std::chrono::milliseconds write_timeout_;
  Clock::time_point deadline_{};
  std::size_t budget_ = 0;
  std::optional<Clock::time_point> write_deadline_;
  std::array<char, 4096> buffer_{};
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  bool cut_off_ = false;
};

}  // namespace gateway

#endif  // SLUICE_EXAMPLES_GATEWAY_DEADLINE_STREAM_HPP_
