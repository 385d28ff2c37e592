// A fake Redis on 127.0.0.1 that answers every command with the same bytes, as fast as it can:
// `head`, then `filler` bytes of 'x' (for a reply announced far longer than any check's), in
// 64 KiB writes until the client stops reading or closes.
//
//   sluice_test::FloodPeer peer("$2000000000\r\n", 256 << 20);  // a 2 GB bulk string, 256 MiB of
//   it REQUIRE(peer.start().empty()); options.connection.port = peer.port();
//
// Thread-safety: construct, start and destroy from one thread; bytes_sent() from any.
#ifndef SLUICE_TESTS_SUPPORT_FLOOD_PEER_HPP_
#define SLUICE_TESTS_SUPPORT_FLOOD_PEER_HPP_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <string>
#include <thread>
#include <utility>

namespace sluice_test {

class FloodPeer {
 public:
  FloodPeer(std::string head, std::size_t filler) : head_(std::move(head)), filler_(filler) {}
  FloodPeer(const FloodPeer&) = delete;
  FloodPeer& operator=(const FloodPeer&) = delete;
  ~FloodPeer() {
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
  std::size_t bytes_sent() const { return bytes_sent_.load(); }

 private:
  // Waits up to `ms` for `fd` to have `events`, in slices so that stop_ is seen.
  bool wait(int fd, short events, int ms) const {
    for (int waited = 0; waited < ms && !stop_.load(); waited += 20) {
      pollfd p{.fd = fd, .events = events, .revents = 0};
      if (poll(&p, 1, 20) > 0) return true;
    }
    return false;
  }

  // One connection at a time: each command read gets the whole answer.
  void serve() {
    while (!stop_.load()) {
      if (!wait(listener_, POLLIN, 10'000)) return;
      const int fd = accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      char command[4096];
      while (wait(fd, POLLIN, 2'000) && read(fd, command, sizeof command) > 0) {
        if (!answer(fd)) break;
      }
      close(fd);
    }
  }

  bool answer(int fd) {
    if (!send_all(fd, head_.data(), head_.size())) return false;
    const std::string chunk(std::size_t{64} << 10, 'x');
    for (std::size_t left = filler_; left > 0 && !stop_.load();) {
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
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> bytes_sent_{0};
  std::thread thread_;
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_FLOOD_PEER_HPP_
