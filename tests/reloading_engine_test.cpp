#include "sluice/yaml/reloading_engine.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "example_config.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"
#include "sluice/runtime_engine.hpp"
#include "sluice/yaml/load_config.hpp"

using Engine = sluice::BasicRateLimitEngine<sluice::InMemoryBackend<sluice::ManualClock>>;
using Holder = sluice::yaml::ReloadingEngine<Engine, sluice::ManualClock>;
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

constexpr std::chrono::seconds kSettle{1};

// The holder's two time sources: its limiters' clock, and the one that times a changed file's
// settling.
struct Clocks {
  sluice::ManualClock limiters;
  sluice::ManualClock settle;
};

absl::StatusOr<std::unique_ptr<Holder>> try_make(const std::string& path, const Clocks& clocks,
                                                 const ReloadLog& log = {}) {
  Holder::Options options;         // assigned member-wise: GCC 12 -O2 reports a false
  options.backend.store.seed = 1;  // maybe-uninitialized for nested designated initializers
  options.backend.clock = clocks.limiters;
  options.on_event = log.hook();
  options.clock = clocks.settle;
  options.settle = kSettle;
  return Holder::create(path, std::move(options));
}

std::unique_ptr<Holder> make(const std::string& path, const Clocks& clocks,
                             const ReloadLog& log = {}) {
  auto holder = try_make(path, clocks, log);
  REQUIRE(holder.ok());
  return *std::move(holder);
}

// poll()'s outcome as text: "reloaded", "unchanged" or the error.
std::string poll_now(Holder& holder) {
  const absl::StatusOr<bool> polled = holder.poll();
  if (!polled.ok()) return polled.status().ToString();
  return *polled ? "reloaded" : "unchanged";
}

// What a poller sees of a file that then stays as it is: a poll now, and when that one found
// nothing to load, another one settle interval later.
std::string poll(Holder& holder, Clocks& clocks) {
  const std::string first = poll_now(holder);
  if (first != "unchanged") return first;
  clocks.settle.advance(kSettle);
  return poll_now(holder);
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
  Clocks clocks;
  ReloadLog log;
  auto holder = make(path, clocks, log);
  CHECK(admitted(*holder->current(), 3) == 2);

  // Another bundle is added; `api/per-ip` is unchanged.
  write(path, config_text(2, "public",
                          "  - name: other\n"
                          "    rate_limits: [{ name: per-route, selector: [route], "
                          "requests_per: { minute: 100 } }]\n"));
  REQUIRE(poll(*holder, clocks) == "reloaded");
  CHECK(holder->current()->rule_count() == 2);
  CHECK(admitted(*holder->current(), 1) == 0);  // still spent
  CHECK(log.take() == std::vector<std::string>{"OK"});

  write(path, config_text(3));  // a changed rate: the spent bucket stays spent
  REQUIRE(holder->reload().ok());
  CHECK(admitted(*holder->current(), 4) == 0);
  clocks.limiters.advance(std::chrono::seconds(1));
  CHECK(admitted(*holder->current(), 4) == 3);
  CHECK(holder->current()->engine_stats().reloads == 2);
}

TEST_CASE("lowering a rate in the file mid-burst leaves a client its unspent share, no more") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(10));
  Clocks clocks;
  auto holder = make(path, clocks);
  REQUIRE(admitted(*holder->current(), 6) == 6);  // 60% of the bucket
  write(path, config_text(5));
  REQUIRE(poll(*holder, clocks) == "reloaded");
  CHECK(admitted(*holder->current(), 10) == 2);  // 40% of 5, not a fresh 5
}

TEST_CASE("a broken file keeps the last good config serving and reports the error once") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  Clocks clocks;
  ReloadLog log;
  auto holder = make(path, clocks, log);
  const std::shared_ptr<const Engine> good = holder->current();

  std::string broken = config_text(2);
  broken.replace(broken.find("s: 2"), 4, "s: 0");
  write(path, broken);
  CHECK(poll_now(*holder) == "unchanged");  // settling
  clocks.settle.advance(kSettle);
  const absl::StatusOr<bool> polled = holder->poll();
  REQUIRE_FALSE(polled.ok());
  CHECK(polled.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(polled.status().message() ==
        absl::StrCat(path, ":4:60: policies[0].rate_limits[0].requests_per.s: must be > 0"));
  CHECK(holder->current() == good);
  CHECK(admitted(*holder->current(), 3) == 2);  // the last good config still enforces
  CHECK(log.take() ==
        std::vector<std::string>{absl::StrCat("INVALID_ARGUMENT: ", polled.status().message())});

  CHECK(poll(*holder, clocks) == "unchanged");  // the same broken content is not reported again
  CHECK(holder->current()->engine_stats().failed_reloads == 1);
  CHECK_FALSE(holder->reload().ok());  // an explicit reload tries (and reports) again
  CHECK(holder->current()->engine_stats().failed_reloads == 2);

  write(path, "policies: [\n");  // not YAML at all
  CHECK(poll(*holder, clocks).starts_with("INVALID_ARGUMENT: "));
  std::filesystem::remove(path);
  CHECK(holder->poll().status().code() == absl::StatusCode::kNotFound);
  CHECK(holder->current() == good);

  write(path, config_text(2));  // fixed: the same content as the good generation's
  CHECK(poll(*holder, clocks) == "reloaded");
  CHECK(holder->current() != good);
  CHECK(admitted(*holder->current(), 1) == 0);  // and its state carried over
}

namespace {

// Whether `call` returns within a few seconds while nothing writes to the FIFO at `fifo`. If it
// does not (it waits in open(2) for a writer), a writer opens and closes the FIFO so that the call
// reads end of file and returns before this does.
bool returns_without_a_writer(const std::string& fifo, const std::function<void()>& call) {
  std::future<void> done = std::async(std::launch::async, call);
  if (done.wait_for(std::chrono::seconds(5)) == std::future_status::ready) return true;
  const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
  done.wait();
  return false;
}

}  // namespace

TEST_CASE("a config path that is a FIFO is refused at once, not read until a writer comes",
          "[attack]") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  Clocks clocks;
  auto holder = make(path, clocks);
  const std::string fifo = dir.file("fifo.yaml");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);

  absl::Status created;
  CHECK(returns_without_a_writer(fifo, [&] { created = try_make(fifo, clocks).status(); }));
  CHECK(created.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(created.message() == fifo + ": the config file is not a regular file (a FIFO)");

  std::filesystem::rename(fifo, path);  // the holder's own path, now a FIFO
  absl::Status reloaded;
  CHECK(returns_without_a_writer(path, [&] { reloaded = holder->reload(); }));
  CHECK(reloaded.code() == absl::StatusCode::kFailedPrecondition);
  absl::Status polled;
  CHECK(returns_without_a_writer(path, [&] { polled = holder->poll().status(); }));
  CHECK(polled.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(admitted(*holder->current(), 3) == 2);  // the last good config still enforces
}

TEST_CASE("poll reloads nothing while the file's content is unchanged") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  Clocks clocks;
  auto holder = make(path, clocks);
  const std::shared_ptr<const Engine> first = holder->current();
  CHECK(poll(*holder, clocks) == "unchanged");
  write(path, config_text(2));  // rewritten (new mtime), same bytes
  CHECK(poll(*holder, clocks) == "unchanged");
  CHECK(holder->current() == first);
  CHECK(holder->current()->engine_stats().reloads == 0);
}

TEST_CASE("a view from a held generation stays valid after a reload replaced it") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2, "public"));
  Clocks clocks;
  auto holder = make(path, clocks);
  std::shared_ptr<const Engine> request_engine = holder->current();  // one request's generation
  const auto match = request_engine->match_route("", "/v1/items");
  REQUIRE(match.has_value());

  write(path, config_text(2, "renamed"));
  REQUIRE(holder->reload().ok());
  CHECK(holder->current()->match_route("", "/v1/items")->route == "renamed");
  CHECK(match->route == "public");  // still readable: the request holds its generation (ASan)
}

namespace {

// The test's engine, which records the thread each generation is destroyed on (a holder takes
// any engine type, so this observes it from outside). A moved-from engine records nothing.
class TracedEngine : public Engine {
 public:
  static absl::StatusOr<TracedEngine> create(const sluice::PolicyConfig& config,
                                             BackendOptions options, const Observer& observer,
                                             const sluice::EngineEventHook& on_event) {
    absl::StatusOr<Engine> engine = Engine::create(config, std::move(options), observer, on_event);
    if (!engine.ok()) return engine.status();
    return TracedEngine(*std::move(engine));
  }
  absl::StatusOr<TracedEngine> reload(const sluice::PolicyConfig& config) const {
    absl::StatusOr<Engine> engine = Engine::reload(config);
    if (!engine.ok()) return engine.status();
    return TracedEngine(*std::move(engine));
  }

  TracedEngine(TracedEngine&& other)
      : Engine(std::move(other)), traced_(std::exchange(other.traced_, false)) {}
  TracedEngine& operator=(TracedEngine&&) = delete;
  ~TracedEngine() {
    if (!traced_) return;
    std::lock_guard lock(log().mutex);
    log().threads.push_back(std::this_thread::get_id());
  }

  // The threads that destroyed a generation, in order.
  static std::vector<std::thread::id> destroyed_on() {
    std::lock_guard lock(log().mutex);
    return log().threads;
  }
  static void clear() {
    std::lock_guard lock(log().mutex);
    log().threads.clear();
  }

 private:
  struct Log {
    std::mutex mutex;
    std::vector<std::thread::id> threads;
  };
  static Log& log() {
    static Log log;
    return log;
  }

  explicit TracedEngine(Engine engine) : Engine(std::move(engine)) {}

  bool traced_ = true;
};

using TracedHolder = sluice::yaml::ReloadingEngine<TracedEngine, sluice::ManualClock>;

std::unique_ptr<TracedHolder> make_traced(const std::string& path,
                                          std::chrono::milliseconds interval = {},
                                          int reload_signal = 0) {
  TracedHolder::Options options;
  options.backend.store.seed = 1;
  options.poll_interval = interval;
  options.reload_signal = reload_signal;
  absl::StatusOr<std::unique_ptr<TracedHolder>> holder =
      TracedHolder::create(path, std::move(options));
  REQUIRE(holder.ok());
  TracedEngine::clear();
  return *std::move(holder);
}

// Waits (at most 10 s) until `holder` serves a generation other than `old`: the engine reports a
// reload's ReloadEvent while compiling the new generation, a moment before the holder publishes
// it, so a ReloadEvent alone does not mean current() has changed yet.
template <class AnyHolder, class Generation>
bool replaced(const AnyHolder& holder, const Generation& old) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (holder.current() == old) {
    if (std::chrono::steady_clock::now() > deadline) {
      return false;
    }
    std::this_thread::yield();
  }
  return true;
}

// Lets go of `generation` on a thread of its own, as a request's last reference would; that
// thread's id.
std::thread::id let_go_on_a_request_thread(std::shared_ptr<const TracedEngine> generation) {
  std::thread request([held = std::move(generation)]() mutable { held.reset(); });
  const std::thread::id id = request.get_id();
  request.join();
  return id;
}

// Waits (at most 10 s) until `n` generations were destroyed, for a holder's thread.
bool destroyed(std::size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (TracedEngine::destroyed_on().size() < n) {
    if (std::chrono::steady_clock::now() > deadline) {
      return false;
    }
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

TEST_CASE("a request that lets go of a replaced generation last leaves freeing it to the reload",
          "[attack]") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  auto holder = make_traced(path);

  std::shared_ptr<const TracedEngine> request = holder->current();
  write(path, config_text(3));
  REQUIRE(holder->reload().ok());  // returns at once: nothing waits for the request
  CHECK(TracedEngine::destroyed_on().empty());

  const std::thread::id request_thread = let_go_on_a_request_thread(std::move(request));
  CHECK(TracedEngine::destroyed_on().empty());  // the request only handed it back
  CHECK(holder->poll().value() == false);       // nothing to reload; frees what was handed back
  CHECK(TracedEngine::destroyed_on() == std::vector<std::thread::id>{std::this_thread::get_id()});
  CHECK(TracedEngine::destroyed_on() != std::vector<std::thread::id>{request_thread});
}

TEST_CASE("a reload frees the generation it replaced at once when no request holds it") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  auto holder = make_traced(path);
  write(path, config_text(3));
  REQUIRE(holder->reload().ok());
  CHECK(TracedEngine::destroyed_on() == std::vector<std::thread::id>{std::this_thread::get_id()});
}

TEST_CASE(
    "a generation held across several reloads is freed by the first reload after it is "
    "let go, the others at once") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  auto holder = make_traced(path);
  std::shared_ptr<const TracedEngine> request = holder->current();
  for (int n = 3; n <= 5; ++n) {
    write(path, config_text(n));
    REQUIRE(holder->reload().ok());  // this thread holds a generation and reloads, as it may
  }
  CHECK(TracedEngine::destroyed_on().size() == 2);  // the ones no request held

  let_go_on_a_request_thread(std::move(request));
  CHECK(TracedEngine::destroyed_on().size() == 2);
  write(path, config_text(6));
  REQUIRE(holder->reload().ok());  // frees the handed-back one, then the one it replaced
  CHECK(TracedEngine::destroyed_on() ==
        std::vector<std::thread::id>(4, std::this_thread::get_id()));
}

TEST_CASE("the holder's thread frees a replaced generation on its next poll after it is let go") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  auto holder = make_traced(path, std::chrono::milliseconds(5));
  std::shared_ptr<const TracedEngine> request = holder->current();
  write(path, config_text(3));
  holder->request_reload();
  REQUIRE(replaced(*holder, request));

  const std::thread::id request_thread = let_go_on_a_request_thread(std::move(request));
  REQUIRE(destroyed(1));
  const std::vector<std::thread::id> destroyed_on = TracedEngine::destroyed_on();
  CHECK(destroyed_on.size() == 1);
  CHECK(destroyed_on.front() != request_thread);
  CHECK(destroyed_on.front() != std::this_thread::get_id());  // the holder's thread
}

TEST_CASE("with only a reload signal, the holder's thread still frees a let-go generation") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  auto holder = make_traced(path, std::chrono::milliseconds(0), SIGUSR2);
  std::shared_ptr<const TracedEngine> request = holder->current();
  write(path, config_text(3));
  holder->request_reload();
  REQUIRE(replaced(*holder, request));

  const std::thread::id request_thread = let_go_on_a_request_thread(std::move(request));
  REQUIRE(destroyed(1));  // within a second: the thread wakes to free it while it is held
  const std::vector<std::thread::id> destroyed_on = TracedEngine::destroyed_on();
  CHECK(destroyed_on.size() == 1);
  CHECK(destroyed_on.front() != request_thread);
  CHECK(destroyed_on.front() != std::this_thread::get_id());  // the holder's thread
}

TEST_CASE("destroying the holder frees what was handed back and leaves the rest to its holders") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  auto holder = make_traced(path);
  std::shared_ptr<const TracedEngine> handed_back = holder->current();
  write(path, config_text(3));
  REQUIRE(holder->reload().ok());
  std::shared_ptr<const TracedEngine> still_held = holder->current();
  write(path, config_text(4));
  REQUIRE(holder->reload().ok());
  let_go_on_a_request_thread(std::move(handed_back));
  CHECK(TracedEngine::destroyed_on().empty());

  holder.reset();  // frees the first generation and the current one; abandons the second
  CHECK(TracedEngine::destroyed_on() ==
        std::vector<std::thread::id>(2, std::this_thread::get_id()));
  const std::thread::id request_thread = let_go_on_a_request_thread(std::move(still_held));
  CHECK(TracedEngine::destroyed_on().size() == 3);
  CHECK(TracedEngine::destroyed_on().back() == request_thread);  // its last holder, as documented
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
  Clocks clocks;
  auto holder = make(path, clocks);
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

TEST_CASE("a changed file is loaded only once it has stayed the same for the settle interval") {
  using std::chrono::nanoseconds;
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  Clocks clocks;
  auto holder = make(path, clocks);
  const std::shared_ptr<const Engine> first = holder->current();

  write(path, config_text(3));
  CHECK(poll_now(*holder) == "unchanged");  // just changed: the writer may not be done
  clocks.settle.advance(kSettle - nanoseconds(1));
  CHECK(poll_now(*holder) == "unchanged");
  write(path, config_text(4));  // changed again: the interval starts over
  clocks.settle.advance(nanoseconds(1));
  CHECK(poll_now(*holder) == "unchanged");
  clocks.settle.advance(kSettle - nanoseconds(1));
  CHECK(poll_now(*holder) == "unchanged");
  // The same bytes written again (a new modification time): the interval starts over too.
  std::filesystem::last_write_time(
      path, std::filesystem::last_write_time(path) + std::chrono::seconds(1));
  clocks.settle.advance(nanoseconds(1));
  CHECK(poll_now(*holder) == "unchanged");
  clocks.settle.advance(kSettle - nanoseconds(1));
  CHECK(poll_now(*holder) == "unchanged");
  CHECK(holder->current() == first);

  clocks.settle.advance(nanoseconds(1));
  CHECK(poll_now(*holder) == "reloaded");
  CHECK(admitted(*holder->current(), 5) == 4);
}

namespace {

// examples/gateway/gateway.yaml, found from this file's place in the source tree.
std::string example_gateway_yaml() {
  const std::filesystem::path source = std::filesystem::path(__FILE__).parent_path().parent_path();
  std::ifstream in(source / "examples" / "gateway" / "gateway.yaml", std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Where a writer of `text` could stall: every byte of the `listeners:` section (its prefixes
// that end there are valid configs without a rule), and the middle and end of every other line.
std::vector<std::size_t> pieces_of(const std::string& text) {
  const std::size_t listeners = text.find("\nlisteners:");
  const std::size_t after = text.find("\n\n", listeners + 1);
  REQUIRE(after != std::string::npos);
  std::vector<std::size_t> ends;
  for (std::size_t end = listeners; end <= after; ++end) ends.push_back(end);
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t line_end = std::min(text.find('\n', start), text.size() - 1);
    ends.push_back(start + (line_end - start) / 2);
    ends.push_back(line_end);
    start = line_end + 1;
  }
  return ends;
}

}  // namespace

TEST_CASE("a config file written in pieces never replaces the running config with fewer rules") {
  const std::string full = example_gateway_yaml();
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, full);
  Clocks clocks;
  auto holder = make(path, clocks);
  const std::size_t rules = holder->current()->rule_count();
  REQUIRE(rules == 8);

  std::size_t refused_for_dropping_every_rule = 0;
  for (const std::size_t written : pieces_of(full)) {
    write(path, full.substr(0, written));  // the writer has got this far...
    REQUIRE(poll_now(*holder) == "unchanged");
    clocks.settle.advance(kSettle);  // ...and stalls there, so the prefix is stable
    const absl::StatusOr<bool> polled = holder->poll();
    if (polled.status().code() == absl::StatusCode::kFailedPrecondition) {
      ++refused_for_dropping_every_rule;
    }
    INFO("the first " << written << " bytes");
    REQUIRE(holder->current()->rule_count() == rules);
  }
  // Prefixes that end inside `listeners:` are valid configs without a rule.
  CHECK(refused_for_dropping_every_rule > 0);
  write(path, full);
  CHECK(poll(*holder, clocks) == "reloaded");
  CHECK(holder->current()->rule_count() == rules);
}

TEST_CASE("a Kubernetes ConfigMap update, a rename of the ..data symlink, is picked up") {
  namespace fs = std::filesystem;
  TempDir dir;
  // The kubelet's layout: gateway.yaml -> ..data/gateway.yaml, ..data -> a timestamped directory.
  const std::string old_version = "..2026_01_01_00_00_00.000000001";
  const std::string new_version = "..2026_01_01_00_01_00.000000002";
  fs::create_directory(dir.file(old_version));
  write(dir.file(old_version + "/gateway.yaml"), config_text(2, "public"));
  fs::create_directory_symlink(old_version, dir.file("..data"));
  fs::create_symlink("..data/gateway.yaml", dir.file("gateway.yaml"));
  Clocks clocks;
  auto holder = make(dir.file("gateway.yaml"), clocks);
  REQUIRE(holder->current()->match_route("", "/v1/x")->route == "public");

  // An update: the new version in a new directory, a new link to it renamed over ..data (one
  // atomic step), the old directory removed.
  fs::create_directory(dir.file(new_version));
  write(dir.file(new_version + "/gateway.yaml"), config_text(2, "renamed"));
  fs::create_directory_symlink(new_version, dir.file("..data_tmp"));
  fs::rename(dir.file("..data_tmp"), dir.file("..data"));
  fs::remove_all(dir.file(old_version));

  CHECK(poll(*holder, clocks) == "reloaded");
  CHECK(holder->current()->match_route("", "/v1/x")->route == "renamed");
}

TEST_CASE("a config that drops every rule is refused unless it says limits_nothing") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  Clocks clocks;
  ReloadLog log;
  auto holder = make(path, clocks, log);

  write(path, "listeners:\n  - name: public\n");
  const std::string refused = poll(*holder, clocks);
  CHECK(refused ==
        absl::StrCat("FAILED_PRECONDITION: ", path,
                     ": this config attaches no rule, where the running one enforces 1, so it "
                     "would limit nothing; if the file is still being written, replace it "
                     "atomically instead (write a temporary file, then rename it over this one); "
                     "to remove every rule on purpose, add `limits_nothing: true`"));
  CHECK(log.take() == std::vector<std::string>{refused});
  CHECK(holder->current()->engine_stats().failed_reloads == 1);
  CHECK(admitted(*holder->current(), 3) == 2);  // the running config still limits

  write(path, "limits_nothing: true\nlisteners:\n  - name: public\n");
  CHECK(poll(*holder, clocks) == "reloaded");
  CHECK(holder->current()->rule_count() == 0);
  CHECK(admitted(*holder->current(), 3) == 3);
  CHECK(log.take() == std::vector<std::string>{"OK"});
}

TEST_CASE("a config left with only dry-run rules enforces nothing and is refused") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  // A writer that is not atomic, caught after the dry-run bundle's attachment.
  const std::string full =
      "policies:\n"
      "  - name: shadow\n"
      "    dry_run: true\n"
      "    rate_limits:\n"
      "      - { name: new-limit, selector: [ip], requests_per: { s: 1 } }\n"
      "  - name: live\n"
      "    rate_limits:\n"
      "      - { name: per-ip, selector: [ip], requests_per: { s: 2 } }\n"
      "gateway:\n"
      "  global_policies:\n"
      "    - shadow\n"
      "    - live\n";
  write(path, full);
  Clocks clocks;
  ReloadLog log;
  auto holder = make(path, clocks, log);
  CHECK(admitted(*holder->current(), 3) == 2);

  write(path, full.substr(0, full.find("    - live")));
  const absl::Status refused = holder->reload();
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.message(),
                          "this config attaches no rule that is enforced (only 1 dry-run), where "
                          "the running one enforces 1, so it would limit nothing"));
  CHECK(admitted(*holder->current(), 1) == 0);  // the running config still limits

  // Said on purpose, a dry-run-only config loads (and limits_nothing is no error on it).
  write(path, "limits_nothing: true\n" + full.substr(0, full.find("    - live")));
  CHECK(holder->reload().ok());
  CHECK(admitted(*holder->current(), 3) == 3);
}

TEST_CASE("the first load must attach a rule unless the config says limits_nothing") {
  TempDir dir;
  Clocks clocks;
  write(dir.file("empty.yaml"), "listeners: [{ name: public }]\n");
  CHECK(try_make(dir.file("empty.yaml"), clocks).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  write(dir.file("none.yaml"), "limits_nothing: true\n");
  auto holder = try_make(dir.file("none.yaml"), clocks);
  REQUIRE(holder.ok());
  CHECK((*holder)->current()->rule_count() == 0);
}

namespace {

// Counts ReloadEvents from the holder's thread; `wait_for(n)` waits (at most 10 s: the thread
// is woken at once, so only a broken wakeup comes near it) until n have arrived.
struct ReloadCounter {
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    int reloads = 0;
    int failed = 0;
  };
  std::shared_ptr<State> state = std::make_shared<State>();
  sluice::EngineEventHook hook() const {
    return [state = state](const sluice::EngineEvent& event) {
      if (const auto* reload = std::get_if<sluice::ReloadEvent>(&event)) {
        std::lock_guard lock(state->mutex);
        ++(reload->status.ok() ? state->reloads : state->failed);
        state->changed.notify_all();
      }
    };
  }
  bool wait_for(int reloads) const {
    std::unique_lock lock(state->mutex);
    return state->changed.wait_for(lock, std::chrono::seconds(10),
                                   [&] { return state->reloads >= reloads; });
  }
};

absl::StatusOr<std::unique_ptr<Holder>> make_threaded(const std::string& path,
                                                      const ReloadCounter& counter,
                                                      std::chrono::milliseconds interval,
                                                      int signal) {
  Holder::Options options;
  options.on_event = counter.hook();
  options.settle = std::chrono::nanoseconds(0);
  options.poll_interval = interval;
  options.reload_signal = signal;
  return Holder::create(path, std::move(options));
}

}  // namespace

TEST_CASE("request_reload wakes the holder's thread, which reloads, and the destructor joins it") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  ReloadCounter counter;
  auto holder = make_threaded(path, counter, std::chrono::hours(1), 0);
  REQUIRE(holder.ok());
  const auto old = (*holder)->current();
  write(path, config_text(3));
  (*holder)->request_reload();  // not the hour-long interval: the request wakes the thread
  REQUIRE(counter.wait_for(1));
  REQUIRE(replaced(**holder, old));
  CHECK(admitted(*(*holder)->current(), 4) == 3);
  holder->reset();  // returns: the thread was woken to stop and joined
}

TEST_CASE("the holder's thread polls its file on its interval") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  ReloadCounter counter;
  auto holder = make_threaded(path, counter, std::chrono::milliseconds(5), 0);
  REQUIRE(holder.ok());
  const auto old = (*holder)->current();
  write(path, config_text(5));
  REQUIRE(counter.wait_for(1));
  REQUIRE(replaced(**holder, old));
  CHECK(admitted(*(*holder)->current(), 6) == 5);
  CHECK(counter.state->failed == 0);
}

TEST_CASE(
    "the reload signal makes the holder's thread reload, and one holder per process takes it") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2));
  ReloadCounter counter;
  auto holder = make_threaded(path, counter, std::chrono::milliseconds(0), SIGUSR2);
  REQUIRE(holder.ok());
  auto second = make_threaded(path, counter, std::chrono::milliseconds(0), SIGUSR2);
  CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);

  const auto old = (*holder)->current();
  write(path, config_text(4));
  REQUIRE(std::raise(SIGUSR2) == 0);  // the handler only writes to the holder's pipe
  REQUIRE(counter.wait_for(1));
  REQUIRE(replaced(**holder, old));
  CHECK(admitted(*(*holder)->current(), 5) == 4);

  holder->reset();  // gives the signal back: its default handling, and free for another holder
  struct sigaction now {};
  REQUIRE(::sigaction(SIGUSR2, nullptr, &now) == 0);
  CHECK(now.sa_handler == SIG_DFL);
  CHECK(make_threaded(path, counter, std::chrono::milliseconds(0), SIGUSR2).ok());
}

TEST_CASE("a file naming a backend this build does not include is refused at the first load") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, config_text(2) + "backend: { type: postgres, conninfo: \"dbname=app\" }\n");
  const auto holder = sluice::yaml::ReloadingEngine<sluice::RuntimeRateLimitEngine>::create(path);
  CHECK(holder.status().code() == absl::StatusCode::kInvalidArgument);
#ifndef SLUICE_WITH_POSTGRES
  CHECK(holder.status().message() ==
        path +
            ": backend.type: postgres is not in this build of sluice (link sluice::postgres, "
            "built where libpq is found)");
#endif
}

namespace {

// config_text(2) with listener `listener` and consumer `consumer`.
std::string names_text(const std::string& listener, const std::string& consumer) {
  return config_text(
      2, "public",
      absl::StrCat("listeners:\n  - name: ", listener, "\nconsumers:\n  - name: ", consumer, "\n"));
}

}  // namespace

TEST_CASE("require refuses a name the serving config lacks, and registers nothing") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, names_text("public", "unknown"));
  Clocks clocks;
  auto holder = make(path, clocks);

  const auto refused = holder->require({.listener = "pubilc"});
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  const auto unknown = holder->require({.unknown_consumer = "unknwon"});
  CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);

  write(path, names_text("other", "anonymous"));
  CHECK(holder->reload().ok());
}

TEST_CASE(
    "a reload or poll lacking a required name is refused, counted and reported, and the running "
    "generation keeps serving") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, names_text("public", "unknown"));
  Clocks clocks;
  ReloadLog log;
  auto holder = make(path, clocks, log);
  const auto required = holder->require({.listener = "public", .unknown_consumer = "unknown"});
  REQUIRE(required.ok());
  CHECK(admitted(*holder->current(), 1) == 1);

  write(path, names_text("public", "anonymous"));
  const absl::Status reloaded = holder->reload();
  CHECK(reloaded.ToString() ==
        absl::StrCat("FAILED_PRECONDITION: ", path,
                     ": the config has no consumer \"unknown\", which a running adapter gives "
                     "unknown credentials (its unknown_consumer setting): every unknown "
                     "credential would be refused instead of limited; keep a consumer named "
                     "\"unknown\" in consumers[], or give the adapter another unknown_consumer "
                     "(recreate it) before removing this one"));
  CHECK(log.take() == std::vector<std::string>{reloaded.ToString()});
  CHECK(holder->current()->engine_stats().failed_reloads == 1);
  CHECK(holder->current()->consumer_named("unknown").has_value());
  CHECK(admitted(*holder->current(), 2) == 1);  // the running generation keeps its state

  write(path, names_text("external", "unknown"));
  const std::string polled = poll(*holder, clocks);
  CHECK(absl::StartsWith(polled, absl::StrCat("FAILED_PRECONDITION: ", path,
                                              ": the config has no listener \"public\"")));
  CHECK(poll(*holder, clocks) == "unchanged");  // reported once per content
  CHECK(log.take() == std::vector<std::string>{polled});
  CHECK(holder->current()->engine_stats().failed_reloads == 2);

  write(path, names_text("public", "unknown\n  - name: partner"));  // one more consumer
  CHECK(poll(*holder, clocks) == "reloaded");
  CHECK(admitted(*holder->current(), 1) == 0);  // an unchanged rule keeps its spent budget
}

TEST_CASE("a requirement binds only while its handle or a copy of it is held") {
  TempDir dir;
  const std::string path = dir.file("gateway.yaml");
  write(path, names_text("public", "unknown"));
  Clocks clocks;
  auto holder = make(path, clocks);
  auto required = holder->require({.listener = "public"});
  REQUIRE(required.ok());
  sluice::RequirementHandle copy = *required;
  required = absl::UnknownError("let go");

  write(path, names_text("external", "unknown"));
  CHECK(holder->reload().code() == absl::StatusCode::kFailedPrecondition);
  copy.reset();
  CHECK(holder->reload().ok());
}

TEST_CASE("a config file's name reaches every reload error quoted and escaped", "[attack]") {
  // Whoever may name the file (a directory others write to, a ConfigMap key) may put a line feed
  // or a terminal escape in its name; the holder's errors are logged from its reload events.
  TempDir dir;
  const std::string path =
      dir.file("gateway\n2026-12-07T00:00:00Z sluice_gateway: config reloaded\x1b[2J.yaml");
  write(path, config_text(2));
  Clocks clocks;
  ReloadLog log;
  auto holder = make(path, clocks, log);
  const auto has_control_byte = [](const std::string& text) {
    return std::any_of(text.begin(), text.end(), [](char c) {
      const auto byte = static_cast<unsigned char>(c);
      return byte < 0x20 || byte == 0x7f;
    });
  };

  std::string broken = config_text(2);
  broken.replace(broken.find("s: 2"), 4, "s: 0");
  write(path, broken);
  const std::string invalid = poll(*holder, clocks);
  const absl::StatusOr<sluice::PolicyConfig> loaded = sluice::yaml::load_config_file(path);
  REQUIRE_FALSE(loaded.ok());
  CHECK(invalid == loaded.status().ToString());  // as load_config_file names the file

  write(path, "listeners:\n  - name: public\n");
  const std::string no_rule = poll(*holder, clocks);
  CHECK(no_rule.starts_with("FAILED_PRECONDITION: \"" + dir.file("gateway\\x0a2026")));

  for (const std::string& line : log.take()) {
    INFO(line);
    CHECK_FALSE(has_control_byte(line));
  }
}
