// sluice_test_upstream — a small HTTP upstream for the gateway's end-to-end tests, which can be
// made slow or failing while it runs.
//
//   sluice_test_upstream        (binds 127.0.0.1 on a free port and prints
//                                "upstream: listening on http://127.0.0.1:<port>")
//   GET /__control?delay_ms=N&status=S&retry_after=R   sets how every later request is answered:
//                                after N ms (at most 10000), with status S (100 ... 599), and with
//                                Retry-After: R when R > 0. Parameters left out keep their value.
//   GET /__stats                 "requests <n>": requests answered so far, controls excluded
//   GET <…/unavailable>          always 503 with Retry-After: 300, whatever is set (a path the
//                                upstream cannot serve, next to paths it serves well)
//   GET <…/large>                answered as set, with a body of 64 MiB
//   GET <…/headers>              200 with 300000 headers (some 20 MiB of them) and a small body
//   GET <…/trickle>              200 with a chunked body of 60 bytes, one byte every 500 ms (not
//                                counted in /__stats: it ends after the test's other checks)
//   GET <anything else>          answered as set, with a small JSON body naming the path (and
//                                the query, as the request target carried it)
// SIGINT or SIGTERM stops it (the default action).
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

namespace {

std::atomic<int> delay_ms{0};
std::atomic<int> status{200};
std::atomic<int> retry_after{0};
std::atomic<std::uint64_t> answered{0};

// The parameter `name` of `request` as an integer in [min, max]; none if absent or malformed.
std::optional<int> param(const httplib::Request& request, const char* name, int min, int max) {
  if (!request.has_param(name)) return std::nullopt;
  const std::string text = request.get_param_value(name);
  int value = 0;
  const char* const end = text.data() + text.size();
  const auto [parsed_to, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || parsed_to != end || value < min || value > max) return std::nullopt;
  return value;
}

}  // namespace

int main() {
  httplib::Server server;
  server.Get("/__control", [](const httplib::Request& request, httplib::Response& response) {
    if (auto v = param(request, "delay_ms", 0, 10000)) delay_ms = *v;
    if (auto v = param(request, "status", 100, 599)) status = *v;
    if (auto v = param(request, "retry_after", 0, 86400)) retry_after = *v;
    response.set_content("ok\n", "text/plain");
  });
  server.Get("/__stats", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("requests " + std::to_string(answered.load()) + "\n", "text/plain");
  });
  server.Get(".*/headers", [](const httplib::Request&, httplib::Response& response) {
    const std::string filler(48, 'x');
    for (int i = 0; i < 300'000; ++i) response.set_header("X-Filler-" + std::to_string(i), filler);
    response.set_content("{}\n", "application/json");
  });
  server.Get(".*/trickle", [](const httplib::Request&, httplib::Response& response) {
    response.set_chunked_content_provider(
        "text/plain", [](std::size_t offset, httplib::DataSink& sink) {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          if (offset >= 60) {
            sink.done();
            return true;
          }
          return sink.write("x", 1);
        });
  });
  server.Get(".*", [](const httplib::Request& request, httplib::Response& response) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
    response.status = status.load();
    if (std::string_view(request.path).ends_with("/large")) {
      response.set_content(std::string(std::size_t{64} << 20, 'x'), "text/plain");
      ++answered;
      return;
    }
    if (std::string_view(request.path).ends_with("/unavailable")) {
      response.status = 503;
      response.set_header("Retry-After", "300");
    } else if (const int seconds = retry_after.load(); seconds > 0) {
      response.set_header("Retry-After", std::to_string(seconds));
    }
    // The path, and the query as it came in the request target (if any), as JSON strings: only
    // plain characters are kept.
    auto plain = [](std::string_view text) {
      std::string out;
      for (char c : text) {
        if (c >= 0x21 && c <= 0x7e && c != '"' && c != '\\') out.push_back(c);
      }
      return out;
    };
    std::string body = "{\"upstream\":\"ok\",\"path\":\"" + plain(request.path) + "\"";
    if (const std::size_t query = request.target.find('?'); query != std::string::npos) {
      body += ",\"query\":\"" + plain(std::string_view(request.target).substr(query + 1)) + "\"";
    }
    response.set_content(body + "}\n", "application/json");
    ++answered;
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  if (port <= 0) {
    std::fputs("upstream: cannot bind 127.0.0.1\n", stderr);
    return 1;
  }
  std::printf("upstream: listening on http://127.0.0.1:%d\n", port);
  std::fflush(stdout);
  return server.listen_after_bind() ? 0 : 1;
}
