// An engine that follows its YAML file (sluice/yaml/reloading_engine.hpp): request threads take
// the current generation, a timer polls the file, SIGHUP would call reload().
//   sluice_example_reload gateway.yaml
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "sluice/engine.hpp"
#include "sluice/yaml/reloading_engine.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CONFIG.yaml\n", argv[0]);
    return 2;
  }
  auto holder = sluice::yaml::ReloadingEngine<>::create(argv[1]);
  if (!holder.ok()) {  // the first load must succeed
    std::fprintf(stderr, "%s\n", holder.status().ToString().c_str());
    return 1;
  }

  {  // One request: hold the generation for the whole request, take every view from it.
    std::shared_ptr<const sluice::RateLimitEngine> engine = (*holder)->current();
    auto route = engine->match_route("public", "/v1/items/42");
    sluice::Evaluation e = engine->evaluate({
        .client_ip = "203.0.113.7",
        .route = route ? std::optional(route->route) : std::nullopt,
        .listener = "public",
        .path = "/v1/items/42",
    });
    std::printf("route %s: %s\n", route ? std::string(route->route).c_str() : "(none)",
                e.allowed ? "allowed" : "denied");
  }

  // On a timer: reloads only if the file changed; a bad file keeps the last good config.
  absl::StatusOr<bool> polled = (*holder)->poll();
  if (!polled.ok()) {
    std::fprintf(stderr, "reload failed, still serving the previous config: %s\n",
                 polled.status().ToString().c_str());
  } else {
    std::printf("config %s\n", *polled ? "reloaded" : "unchanged");
  }
  return 0;
}
