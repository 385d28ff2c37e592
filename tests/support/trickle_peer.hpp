// A fake Redis on 127.0.0.1 that reads a command and then answers one byte at a time, slowly.
//
// For deadline tests: the reply it trickles never completes (a bulk string announced far longer
// than what it sends), so only a deadline over the whole check ends the wait. It serves one
// connection at a time, each for at most `max_bytes` bytes, and stops when destroyed.
//
//   sluice_test::TricklePeer peer(std::chrono::milliseconds(80));
//   REQUIRE(peer.start().empty());
//   options.connection.port = peer.port();
//
// Thread-safety: construct, start and destroy from one thread; bytes_sent() from any.
#ifndef SLUICE_TESTS_SUPPORT_TRICKLE_PEER_HPP_
#define SLUICE_TESTS_SUPPORT_TRICKLE_PEER_HPP_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace sluice_test {

class TricklePeer {
 public:
  explicit TricklePeer(std::chrono::milliseconds interval, int max_bytes = 60)
      : interval_(interval), max_bytes_(max_bytes) {}
  TricklePeer(const TricklePeer&) = delete;
  TricklePeer& operator=(const TricklePeer&) = delete;
  ~TricklePeer() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    if (listener_ >= 0) close(listener_);
  }

  // Listens on a free port; returns "" on success, else why not.
  std::string start() {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    if (listener_ < 0) return "socket failed";
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listener_, 8) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return "bind/listen failed";
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
    return "";
  }

  int port() const { return port_; }
  int bytes_sent() const { return bytes_sent_.load(); }

 private:
  // Waits up to `ms` for `fd` to have `events`, in slices so that stop_ is seen.
  bool wait(int fd, short events, int ms) const {
    for (int waited = 0; waited < ms && !stop_.load(); waited += 20) {
      pollfd p{.fd = fd, .events = events, .revents = 0};
      if (poll(&p, 1, 20) > 0) return true;
    }
    return false;
  }

  void serve() {
    while (!stop_.load()) {
      if (!wait(listener_, POLLIN, 10'000)) return;
      const int fd = accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      trickle(fd);
      close(fd);
    }
  }

  void trickle(int fd) {
    if (!wait(fd, POLLIN, 10'000)) return;  // the command
    char command[4096];
    if (read(fd, command, sizeof command) <= 0) return;
    static constexpr char kReply[] =
        "$100000\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";
    for (int i = 0; i < max_bytes_ && i < static_cast<int>(sizeof kReply) - 1 && !stop_.load();
         ++i) {
      if (send(fd, &kReply[i], 1, MSG_NOSIGNAL) != 1) return;
      bytes_sent_.fetch_add(1);
      std::this_thread::sleep_for(interval_);
    }
  }

  const std::chrono::milliseconds interval_;
  const int max_bytes_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> bytes_sent_{0};
  std::thread thread_;
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_TRICKLE_PEER_HPP_
