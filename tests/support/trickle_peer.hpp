// Fake Redis servers on 127.0.0.1 that misbehave on purpose, for the client's deadline and
// reply-size tests. Each serves one connection at a time on a thread of its own and stops when
// destroyed.
//
// TricklePeer reads a command and then answers one byte at a time, slowly: the reply it trickles
// never completes (a bulk string announced far longer than what it sends), so only a deadline over
// the whole check ends the wait; each connection gets at most `max_bytes` bytes.
//
//   sluice_test::TricklePeer peer(std::chrono::milliseconds(80));
//   REQUIRE(peer.start().empty());
//   options.connection.port = peer.port();
//
// FloodPeer answers every command with the same bytes, as fast as it can: `head`, then `filler`
// bytes of 'x' (for a reply announced far longer than any check's), in 64 KiB writes until the
// client stops reading or closes.
//
//   sluice_test::FloodPeer peer("$2000000000\r\n", 256 << 20);  // 256 MiB of a "2 GB" string
//
// DeafPeer accepts a connection and never reads from it, so a command of a few hundred KiB fills
// the socket's buffers and the writer blocks. HangUpPeer reads the first bytes of a command and
// then ends the connection (an end of file, then a reset for the bytes left unread) while such a
// command is still being written.
//
// Thread-safety: construct, start and destroy from one thread; bytes_sent() from any.
#ifndef SLUICE_TESTS_SUPPORT_TRICKLE_PEER_HPP_
#define SLUICE_TESTS_SUPPORT_TRICKLE_PEER_HPP_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <utility>

namespace sluice_test {

// A socket listening on a free port of 127.0.0.1 with `backlog`, its port in `port`; -1 if it
// cannot listen (then nothing is left open). `receive_buffer` > 0 sets the accepted sockets'
// receive buffer (SO_RCVBUF, in bytes, which the kernel doubles), and with it the window a
// sender may fill.
inline int listen_on_loopback(int backlog, int& port, int receive_buffer = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (receive_buffer > 0 &&
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer) != 0) {
    close(fd);
    return -1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, backlog) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  port = ntohs(addr.sin_port);
  return fd;
}

// The listener and the serving thread of a fake peer; a derived peer answers each accepted
// connection in serve(fd), and its destructor calls stop() before its members go.
class FakePeer {
 public:
  FakePeer(const FakePeer&) = delete;
  FakePeer& operator=(const FakePeer&) = delete;
  virtual ~FakePeer() {
    stop();
    if (listener_ >= 0) close(listener_);
  }

  // Listens on a free port; returns "" on success, else why not.
  std::string start() {
    listener_ = listen_on_loopback(8, port_, receive_buffer_);
    if (listener_ < 0) return "cannot listen on 127.0.0.1";
    thread_ = std::thread([this] { run(); });
    return "";
  }

  int port() const { return port_; }

 protected:
  FakePeer() = default;
  explicit FakePeer(int receive_buffer) : receive_buffer_(receive_buffer) {}

  // Ends the serving thread; called by the derived destructor, and again here (a no-op then).
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  bool stopping() const { return stop_.load(); }

  // Waits up to `ms` for `fd` to have `events`, in slices so that stop() is seen.
  bool wait(int fd, short events, int ms) const {
    for (int waited = 0; waited < ms && !stopping(); waited += 20) {
      pollfd p{.fd = fd, .events = events, .revents = 0};
      if (poll(&p, 1, 20) > 0) return true;
    }
    return false;
  }

  virtual void serve(int fd) = 0;

 private:
  void run() {
    while (!stopping()) {
      if (!wait(listener_, POLLIN, 10'000)) return;
      const int fd = accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      serve(fd);
      close(fd);
    }
  }

  int receive_buffer_ = 0;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class TricklePeer : public FakePeer {
 public:
  explicit TricklePeer(std::chrono::milliseconds interval, int max_bytes = 60)
      : interval_(interval), max_bytes_(max_bytes) {}
  ~TricklePeer() override { stop(); }

  int bytes_sent() const { return bytes_sent_.load(); }

 private:
  void serve(int fd) override {
    if (!wait(fd, POLLIN, 10'000)) return;  // the command
    char command[4096];
    if (read(fd, command, sizeof command) <= 0) return;
    static constexpr char kReply[] =
        "$100000\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";
    for (int i = 0; i < max_bytes_ && i < static_cast<int>(sizeof kReply) - 1 && !stopping(); ++i) {
      if (send(fd, &kReply[i], 1, MSG_NOSIGNAL) != 1) return;
      bytes_sent_.fetch_add(1);
      std::this_thread::sleep_for(interval_);
    }
  }

  const std::chrono::milliseconds interval_;
  const int max_bytes_;
  std::atomic<int> bytes_sent_{0};
};

class FloodPeer : public FakePeer {
 public:
  FloodPeer(std::string head, std::size_t filler) : head_(std::move(head)), filler_(filler) {}
  ~FloodPeer() override { stop(); }

  std::size_t bytes_sent() const { return bytes_sent_.load(); }

 private:
  // Each command read gets the whole answer.
  void serve(int fd) override {
    char command[4096];
    while (wait(fd, POLLIN, 2'000) && read(fd, command, sizeof command) > 0) {
      if (!answer(fd)) break;
    }
  }

  bool answer(int fd) {
    if (!send_all(fd, head_.data(), head_.size())) return false;
    const std::string chunk(std::size_t{64} << 10, 'x');
    for (std::size_t left = filler_; left > 0 && !stopping();) {
      const std::size_t n = std::min(left, chunk.size());
      if (!send_all(fd, chunk.data(), n)) return false;
      left -= n;
    }
    return true;
  }

  bool send_all(int fd, const char* data, std::size_t size) {
    for (std::size_t sent = 0; sent < size;) {
      if (!wait(fd, POLLOUT, 2'000)) return false;
      const ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
      bytes_sent_.fetch_add(static_cast<std::size_t>(n));
    }
    return true;
  }

  const std::string head_;
  const std::size_t filler_;
  std::atomic<std::size_t> bytes_sent_{0};
};

class DeafPeer : public FakePeer {
 public:
  DeafPeer() : FakePeer(4096) {}  // a small window: a command of a few hundred KiB blocks
  ~DeafPeer() override { stop(); }

 private:
  void serve(int fd) override { wait(fd, 0, 10'000); }  // holds the connection until stopped
};

class HangUpPeer : public FakePeer {
 public:
  HangUpPeer() : FakePeer(4096) {}  // a small window: the writer is still writing at the reset
  ~HangUpPeer() override { stop(); }

 private:
  // The end of file first (the writer's socket then waits to close), then the reset: a write
  // after both fails with EPIPE, the error that raises SIGPIPE.
  void serve(int fd) override {
    char command[4096];
    if (wait(fd, POLLIN, 10'000)) (void)read(fd, command, sizeof command);
    shutdown(fd, SHUT_WR);
  }  // closed by run() with the rest of the command unread
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_TRICKLE_PEER_HPP_
