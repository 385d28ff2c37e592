// The service of docs/integration.md: a cpp-httplib server limited by the config file it is
// given, with the backend that file chooses (memory, Redis, Redis Cluster or PostgreSQL), a
// /metrics route, reload when the file changes (polled every second) and on SIGHUP.
//   sluice_example_service service.yaml [PORT]    (PORT 0 or absent: any free port)
// It prints "listening on http://127.0.0.1:<port>" and serves until it is killed.
#include <httplib.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "sluice/httplib.hpp"
#include "sluice/runtime_engine.hpp"
#include "sluice/yaml/reloading_engine.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s CONFIG.yaml [PORT]\n", argv[0]);
    return 2;
  }
  httplib::Server server;
  server.Get("/v1/items", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("[]\n", "application/json");
  });

  // --- the sluice glue (docs/integration.md counts it: these 8 lines and the 3 includes) ---
  using Holder = sluice::yaml::ReloadingEngine<sluice::RuntimeRateLimitEngine>;
  auto holder =
      Holder::create(argv[1], {.poll_interval = std::chrono::seconds(1), .reload_signal = SIGHUP});
  const absl::Status s = holder.ok() ? sluice::install(server, **holder) : holder.status();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  // --- end of the glue ---

  const int port = argc == 3 ? std::atoi(argv[2]) : 0;
  const int bound = port > 0 ? (server.bind_to_port("127.0.0.1", port) ? port : -1)
                             : server.bind_to_any_port("127.0.0.1");
  if (bound < 0) return 1;
  std::printf("listening on http://127.0.0.1:%d\n", bound);
  std::fflush(stdout);
  return server.listen_after_bind() ? 0 : 1;
}
