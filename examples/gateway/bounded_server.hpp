// BoundedServer — an httplib::Server (cpp-httplib 0.11) that bounds what one connection can cost.
//
// cpp-httplib serves each connection on one worker thread, and its read timeout applies to each
// read on its own: a client that sends one header byte every few seconds (slowloris) holds a
// worker for as long as it likes, and a handful of such clients hold them all, so that nothing
// else, health checks included, is answered. Nor does it bound a request's size unless told.
// BoundedServer adds, per request:
// - a deadline: the request line, the headers and the body must all arrive within
//   `request_read_timeout` of the first byte being awaited, or the connection is closed;
// - a size cap: at most `max_header_bytes` + the payload limit bytes are read, then the
//   connection is closed (cpp-httplib 0.11 bounds each header line, not their number);
// - an idle bound between keep-alive requests (the server's keep-alive timeout) that also
//   notices stop() within 100 ms;
// and serves connections on `workers` threads (cpp-httplib's default is 8 on a small machine).
// With these, a connection holds a worker for at most about request_read_timeout + the handler's
// time + the response's write timeout, and at most workers x (max_header_bytes + payload limit)
// bytes of request text are held at once. A client with more connections than there are workers
// can still delay others by up to request_read_timeout each round: put a proxy that caps
// connections per client in front of anything public.
//
// Usage: construct, call set_payload_max_length (the body cap) and the timeouts as usual, then
// bind and listen. Thread-safety: as httplib::Server. Linux/POSIX only.
#ifndef SLUICE_EXAMPLES_GATEWAY_BOUNDED_SERVER_HPP_
#define SLUICE_EXAMPLES_GATEWAY_BOUNDED_SERVER_HPP_

#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>

#include "deadline_stream.hpp"

namespace gateway {

struct ServerLimits {
  std::size_t workers = 64;
  std::chrono::milliseconds request_read_timeout{10'000};
  std::size_t max_header_bytes = 64 * 1024;  // request line and headers together
  std::size_t max_body_bytes = 64 * 1024;    // also set as the server's payload limit
};

class BoundedServer : public httplib::Server {
 public:
  explicit BoundedServer(ServerLimits limits) : limits_(limits) {
    new_task_queue = [workers = limits.workers] { return new httplib::ThreadPool(workers); };
    set_payload_max_length(limits.max_body_bytes);
    // A client that asks before sending a body (Expect: 100-continue, as curl does for large
    // ones) is refused before it sends a byte of a body over the limit.
    set_expect_100_continue_handler([max = limits.max_body_bytes](const httplib::Request& request,
                                                                  httplib::Response& response) {
      const std::string length = request.get_header_value("Content-Length");
      std::uint64_t value = 0;
      const auto [parsed_to, error] =
          std::from_chars(length.data(), length.data() + length.size(), value);
      const bool too_large =
          error == std::errc::result_out_of_range || (error == std::errc() && value > max);
      if (!too_large) return 100;
      response.status = 413;
      return 413;
    });
  }

 private:
  using Clock = DeadlineStream::Clock;

  // Replaces cpp-httplib's connection loop (same keep-alive rules) to use DeadlineStream.
  bool process_and_close_socket(socket_t sock) override {
    DeadlineStream stream(sock, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::seconds(write_timeout_sec_) +
                                    std::chrono::microseconds(write_timeout_usec_)));
    bool ok = true;
    for (std::size_t left = keep_alive_max_count_; left > 0 && wait_for_request(sock); --left) {
      stream.start(Clock::now() + limits_.request_read_timeout,
                   limits_.max_header_bytes + payload_max_length_);
      bool connection_closed = false;
      ok = process_request(stream, left == 1, connection_closed, nullptr);
      if (!ok || connection_closed || stream.cut_off()) break;
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  // True once `sock` has bytes to read, within the keep-alive timeout and while running.
  bool wait_for_request(socket_t sock) const {
    const Clock::time_point until = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    while (svr_sock_ != INVALID_SOCKET && Clock::now() < until) {
      pollfd fd{.fd = sock, .events = POLLIN, .revents = 0};
      const int ready = ::poll(&fd, 1, 100);
      if (ready > 0) return true;
      if (ready < 0 && errno != EINTR) return false;
    }
    return false;
  }

  ServerLimits limits_;
};

}  // namespace gateway

#endif  // SLUICE_EXAMPLES_GATEWAY_BOUNDED_SERVER_HPP_
