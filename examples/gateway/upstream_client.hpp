// UpstreamClient — one exchange with the gateway's upstream (cpp-httplib 0.11), ended by one
// deadline, its answer read up to a byte budget.
//
// httplib::Client's timeouts bound the connect and each read or write on its own, so an upstream
// that sends its answer a byte at a time held the request, and the gateway worker serving it, for
// as long as it kept sending. UpstreamClient ends the whole exchange (connecting, sending the
// request, reading the status line, the headers and the body) at its deadline: a read that would
// wait past it fails, and the request's Result is then an error. Nor does httplib::Client bound
// how many header lines it reads, or how long a chunk-size line is: UpstreamClient reads at most
// `head` bytes up to the end of the headers and `body` bytes after them (the body with its chunk
// framing); a read past either fails the same way.
//
//   std::optional<gateway::UpstreamAddress> upstream = gateway::parse_upstream("http://h:8080");
//   gateway::UpstreamClient client(*upstream, gateway::UpstreamClient::Clock::now() + 10s,
//                                  {.head = 64 * 1024, .body = 2 * 1024 * 1024});
//   httplib::Result result = client.get("/v1/items", on_head, on_body);
//
// Thread-safety: one exchange at a time; the gateway makes a client per exchange. Linux/POSIX.
#ifndef SLUICE_EXAMPLES_GATEWAY_UPSTREAM_CLIENT_HPP_
#define SLUICE_EXAMPLES_GATEWAY_UPSTREAM_CLIENT_HPP_

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "deadline_stream.hpp"

namespace gateway {

// Where the upstream listens: a host name or address (an IPv6 address without its brackets) and
// a port.
struct UpstreamAddress {
  std::string host;
  int port = 80;
};

// "http://HOST:PORT", "http://HOST" (port 80) or "http://[IPV6]:PORT"; nullopt for anything else
// (another scheme, a path, a port that is not 1 ... 65535).
inline std::optional<UpstreamAddress> parse_upstream(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (!url.starts_with(kScheme)) return std::nullopt;
  std::string_view rest = url.substr(kScheme.size());
  UpstreamAddress out;
  std::size_t host_end = 0;
  if (rest.starts_with('[')) {
    host_end = rest.find(']');
    if (host_end == std::string_view::npos) return std::nullopt;
    out.host = std::string(rest.substr(1, host_end - 1));
    ++host_end;
  } else {
    host_end = std::min(rest.find(':'), rest.size());
    out.host = std::string(rest.substr(0, host_end));
  }
  const std::string_view port = rest.substr(host_end);
  if (out.host.empty() || out.host.find_first_of("/?#@[] ") != std::string::npos) {
    return std::nullopt;
  }
  if (port.empty()) return out;
  const char* const end = port.data() + port.size();
  const auto [parsed_to, error] = std::from_chars(port.data() + 1, end, out.port);
  if (!port.starts_with(':') || error != std::errc() || parsed_to != end || out.port < 1 ||
      out.port > 65535) {
    return std::nullopt;
  }
  return out;
}

// The most bytes of an answer read: up to the end of its headers, and after them.
struct ReadBudget {
  std::size_t head = 0;
  std::size_t body = 0;
};

class UpstreamClient final : public httplib::ClientImpl {
 public:
  using Clock = DeadlineStream::Clock;

  // The longest one connect may take, and one write may wait, within the deadline.
  static constexpr std::chrono::milliseconds kConnectTimeout{2000};
  static constexpr std::chrono::milliseconds kWriteTimeout{2000};

  UpstreamClient(const UpstreamAddress& upstream, Clock::time_point deadline, ReadBudget budget)
      : httplib::ClientImpl(upstream.host, upstream.port), deadline_(deadline), budget_(budget) {
    set_connection_timeout(
        std::clamp(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                   std::chrono::milliseconds(1), kConnectTimeout));
  }

  // GET `target`: `on_head` sees the status and headers once they came within budget.head bytes,
  // then `on_body` the body, read within budget.body bytes.
  httplib::Result get(const std::string& target, const httplib::ResponseHandler& on_head,
                      httplib::ContentReceiver on_body) {
    return Get(
        target, httplib::Headers{},
        [this, &on_head](const httplib::Response& head) {
          if (stream_ != nullptr) stream_->start(deadline_, budget_.body);
          return on_head(head);
        },
        std::move(on_body));
  }

 private:
  // Every read and write of the exchange goes through a DeadlineStream that ends at deadline_.
  bool process_socket(const Socket& socket,
                      std::function<bool(httplib::Stream&)> callback) override {
    DeadlineStream stream(socket.sock, kWriteTimeout);
    stream.start(deadline_, budget_.head);
    stream.set_write_deadline(deadline_);
    stream_ = &stream;
    const bool ok = callback(stream);
    stream_ = nullptr;
    return ok;
  }

  Clock::time_point deadline_;
  ReadBudget budget_;
  DeadlineStream* stream_ = nullptr;  // the exchange's stream, while process_socket runs
};

}  // namespace gateway

#endif  // SLUICE_EXAMPLES_GATEWAY_UPSTREAM_CLIENT_HPP_
