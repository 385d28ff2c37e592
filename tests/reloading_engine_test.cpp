#include "sluice/yaml/reloading_engine.hpp"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "example_config.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"

using Engine = sluice::BasicRateLimitEngine<sluice::InMemoryBackend<sluice::ManualClock>>;
using Holder = sluice::yaml::ReloadingEngine<Engine>;
using sluice::testing::on_route;

namespace {

// A fresh directory under the system's temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "sluice_reload_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Bundle `api`: per-ip at `per_second` (burst = the same), on route `route` (prefix /v1) and on
// every request; `extra` is appended to the policies.
std::string config_text(int per_second, const std::string& route = "public",
                        const std::string& extra = "") {
  return absl::StrCat(
      "policies:\n"
      "  - name: api\n"
      "    rate_limits:\n"
      "      - { name: per-ip, selector: [ip], requests_per: { s: ",
      per_second, " } }\n", extra,
      "routes:\n"
      "  - { name: ",
      route,
      ", path_prefix: /v1 }\n"
      "gateway:\n"
      "  global_policies: [api]\n");
}

// Every ReloadEvent's status as text ("OK" for a success).
struct ReloadLog {
  std::shared_ptr<std::vector<std::string>> lines = std::make_shared<std::vector<std::string>>();
  std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
  sluice::EngineEventHook hook() const {
    return [lines = lines, mutex = mutex](const sluice::EngineEvent& event) {
      if (const auto* reload = std::get_if<sluice::ReloadEvent>(&event)) {
        std::lock_guard lock(*mutex);
        lines->push_back(reload->status.ok() ? "OK" : reload->status.ToString());
      }
    };
  }
  std::vector<std::string> take() const {
    std::lock_guard lock(*mutex);
    return std::exchange(*lines, {});
  }
};

std::unique_ptr<Holder> make(const std::string& path, sluice::ManualClock clock,
                             const ReloadLog& log = {}) {
  Holder::Options options;         // assigned member-wise: GCC 12 -O2 reports a false
  options.backend.store.seed = 1;  // maybe-uninitialized for nested designated initializers
  options.backend.clock = clock;
  options.on_event = log.hook();
  auto holder = Holder::create(path, std::move(options));
  REQUIRE(holder.ok());
  return *std::move(holder);
}

// poll()'s outcome as text: "reloaded", "unchanged" or the error.
std::string poll(Holder& holder) {
  const absl::StatusOr<bool> polled = holder.poll();
  if (!polled.ok()) return polled.status().ToString();
  return *polled ? "reloaded" : "unchanged";
}

int admitted(const Engine& engine, int n) {
  int count = 0;
  for (int i = 0; i < n; ++i) count += engine.evaluate(on_route("203.0.113.7", "public")).allowed;
  return count;
}

}  // namespace

TEST_CASE("a spent budget stays spent after reloading an edited file with the same rule") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  sluice::ManualClock clock;
  ReloadLog log;
  auto holder = make(path, clock, log);
  CHECK(admitted(*holder->current(), 3) == 2);

  // Another bundle is added; `api/per-ip` is unchanged.
  write(path, config_text(2, "public",
                          "  - name: other\n"
                          "    rate_limits: [{ name: per-route, selector: [route], "
                          "requests_per: { minute: 100 } }]\n"));
  REQUIRE(poll(*holder) == "reloaded");
  CHECK(holder->current()->rule_count() == 2);
  CHECK(admitted(*holder->current(), 1) == 0);  // still spent
  CHECK(log.take() == std::vector<std::string>{"OK"});

  write(path, config_text(3));  // a changed rule starts fresh
  REQUIRE(holder->reload().ok());
  CHECK(admitted(*holder->current(), 4) == 3);
  CHECK(holder->current()->engine_stats().reloads == 2);
}

TEST_CASE("a broken file keeps the last good config serving and reports the error once") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  sluice::ManualClock clock;
  ReloadLog log;
  auto holder = make(path, clock, log);
  const std::shared_ptr<const Engine> good = holder->current();

  std::string broken = config_text(2);
  broken.replace(broken.find("s: 2"), 4, "s: 0");
  write(path, broken);
  const absl::StatusOr<bool> polled = holder->poll();
  REQUIRE_FALSE(polled.ok());
  CHECK(polled.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(polled.status().message() ==
        absl::StrCat(path, ":4:60: policies[0].rate_limits[0].requests_per.s: must be > 0"));
  CHECK(holder->current() == good);
  CHECK(admitted(*holder->current(), 3) == 2);  // the last good config still enforces
  CHECK(log.take() ==
        std::vector<std::string>{absl::StrCat("INVALID_ARGUMENT: ", polled.status().message())});

  CHECK(poll(*holder) == "unchanged");  // the same broken content is not reported again
  CHECK(holder->current()->engine_stats().failed_reloads == 1);
  CHECK_FALSE(holder->reload().ok());  // an explicit reload tries (and reports) again
  CHECK(holder->current()->engine_stats().failed_reloads == 2);

  write(path, "policies: [\n");  // not YAML at all
  CHECK(holder->poll().status().code() == absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(path);
  CHECK(holder->poll().status().code() == absl::StatusCode::kNotFound);
  CHECK(holder->current() == good);

  write(path, config_text(2));  // fixed: the same content as the good generation's
  CHECK(poll(*holder) == "reloaded");
  CHECK(holder->current() != good);
  CHECK(admitted(*holder->current(), 1) == 0);  // and its state carried over
}

TEST_CASE("poll reloads nothing while the file's content is unchanged") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  sluice::ManualClock clock;
  auto holder = make(path, clock);
  const std::shared_ptr<const Engine> first = holder->current();
  CHECK(poll(*holder) == "unchanged");
  write(path, config_text(2));  // rewritten (new mtime), same bytes
  CHECK(poll(*holder) == "unchanged");
  CHECK(holder->current() == first);
  CHECK(holder->current()->engine_stats().reloads == 0);
}

TEST_CASE("a view from a held generation stays valid after a reload replaced it") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2, "public"));
  sluice::ManualClock clock;
  auto holder = make(path, clock);
  std::shared_ptr<const Engine> request_engine = holder->current();  // one request's generation
  const auto match = request_engine->match_route("", "/v1/items");
  REQUIRE(match.has_value());

  write(path, config_text(2, "renamed"));
  REQUIRE(holder->reload().ok());
  CHECK(holder->current()->match_route("", "/v1/items")->route == "renamed");
  CHECK(match->route == "public");  // still readable: the request holds its generation (ASan)
}

TEST_CASE("the first load must succeed") {
  TempDir dir;
  CHECK(Holder::create(dir.file("missing.yaml")).status().code() == absl::StatusCode::kNotFound);
  write(dir.file("bad.yaml"), "policies: 3\n");
  CHECK(Holder::create(dir.file("bad.yaml")).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("current() and evaluate run concurrently with reloads") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(1000));
  sluice::ManualClock clock;
  auto holder = make(path, clock);
  std::atomic<bool> done{false};
  std::atomic<int> evaluations{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      for (int i = 0; i < 200'000 && !done.load(); ++i) {
        std::shared_ptr<const Engine> engine = holder->current();
        const auto match = engine->match_route("", "/v1/x");
        engine->evaluate({.client_ip = t == 0 ? "10.0.0.1" : "10.0.0.2",
                          .route = match ? std::optional(match->route) : std::nullopt,
                          .path = "/v1/x",
                          .wall_time = sluice::testing::kWall});
        evaluations.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 40; ++i) {
    write(path, config_text(1000, i % 2 == 0 ? "a" : "b"));
    CHECK(holder->reload().ok());
  }
  done.store(true);
  for (std::thread& reader : readers) reader.join();
  CHECK(evaluations.load() > 0);
  CHECK(holder->current()->engine_stats().reloads == 40);
  CHECK(holder->current()->match_route("", "/v1/x")->route == "b");
}
