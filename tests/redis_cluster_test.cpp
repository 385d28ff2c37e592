// Redis Cluster: routing by slot, all-or-nothing across nodes, a slot moved during traffic, a
// failover. Against a real local cluster (three primaries, three replicas) that this process
// starts once (tests/support/redis_cluster.hpp).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch.hpp"
#include "example_config.hpp"
#include "redis_cluster.hpp"
#include "redis_fixture.hpp"
#include "sluice/attempt.hpp"
#include "sluice/clock.hpp"
#include "sluice/engine.hpp"
#include "sluice/redis.hpp"
#include "sluice/redis/attempt_limiter.hpp"
#include "sluice/redis/detail/cluster.hpp"
#include "sluice/redis/engine_backend.hpp"
#include "sluice/redis/prometheus.hpp"
#include "trickle_peer.hpp"

namespace {

using namespace std::chrono_literals;
using sluice::redis::RedisGcraLimiter;
using sluice_test::RedisCluster;

constexpr std::chrono::nanoseconds kT0{std::int64_t{1'700'000'000} * 1'000'000'000};

RedisCluster& cluster() {
  RedisCluster& c = RedisCluster::shared();
  INFO(c.error());
  REQUIRE(c.error().empty());
  return c;
}

// A client of the cluster whose keys are namespaced by `prefix` (each test its own), deciding at
// `time` (default: kT0) instead of the servers' TIME.
std::shared_ptr<sluice::redis::Client> client(
    std::string prefix, std::function<std::chrono::nanoseconds()> time = [] { return kT0; }) {
  sluice::redis::ClientOptions o;
  o.connection.host = "127.0.0.1";
  o.connection.port = cluster().seed_port();
  o.connection.connect_timeout = 1s;
  o.connection.command_timeout = 1s;
  o.key_prefix = std::move(prefix);
  o.key_seed = 42;
  o.cluster = true;
  o.time_source = std::move(time);
  auto c = sluice::redis::Client::create(o);
  INFO(c.status());
  REQUIRE(c.ok());
  sluice_test::hold_keys(**c);  // the tests decide at hooked times
  return *std::move(c);
}

RedisGcraLimiter limiter(std::shared_ptr<sluice::redis::Client> c,
                         std::vector<sluice::GcraWindow> windows) {
  auto l = RedisGcraLimiter::create(std::move(windows), std::move(c));
  INFO(l.status());
  REQUIRE(l.ok());
  return *std::move(l);
}

int primary_of_key(const RedisGcraLimiter& l, std::string_view key) {
  return cluster().primary_of(sluice::redis::detail::key_slot(l.redis_key(key)));
}

// A primary other than the one serving `slot` (the cluster splits the slots in thirds).
int other_primary(RedisCluster& rc, std::size_t slot) {
  const int from = rc.primary_of(slot);
  const int next = rc.primary_of((slot + 5461) % 16384);
  return next != from ? next : rc.primary_of((slot + 10922) % 16384);
}

int admitted(RedisGcraLimiter& l, std::string_view key, int n) {
  int count = 0;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<sluice::Decision> d = l.check(key);
    INFO(d.status());
    REQUIRE(d.ok());
    count += d->allowed() ? 1 : 0;
  }
  return count;
}

}  // namespace

TEST_CASE("the key slot is the server's, hash tags included") {
  // Values from the Redis Cluster specification's test vectors and CLUSTER KEYSLOT.
  CHECK(sluice::redis::detail::crc16("123456789") == 0x31C3);
  for (std::string_view key :
       {"foo", "{user1000}.following", "a{}b", "{}{x}", "x{y", "sluice:{ab}"}) {
    sluice_test::Reply r = cluster().command(0, {"CLUSTER", "KEYSLOT", key});
    REQUIRE(r);
    REQUIRE(r->type == REDIS_REPLY_INTEGER);
    CHECK(sluice::redis::detail::key_slot(key) == static_cast<std::size_t>(r->integer));
  }
}

TEST_CASE("a single-node client pointed at a Cluster node is refused at creation") {
  sluice::redis::ClientOptions o;
  o.connection.host = "127.0.0.1";
  o.connection.port = cluster().seed_port();
  auto c = sluice::redis::Client::create(o);
  INFO(c.status());
  CHECK(c.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(c.status().message().find("set ClientOptions::cluster = true") != std::string_view::npos);
}

TEST_CASE("in a Cluster, every key's budget holds exactly, keys spread over every primary") {
  RedisGcraLimiter l = limiter(client("spread:"), {{.requests = 5, .period = 1h}});
  std::set<int> primaries;
  for (int k = 0; k < 40; ++k) {
    const std::string key = "client-" + std::to_string(k);
    primaries.insert(primary_of_key(l, key));
    CHECK(admitted(l, key, 7) == 5);
  }
  CHECK(primaries.size() == 3);
}

TEST_CASE("in a Cluster, a batch over several nodes is all-or-nothing: admitted nodes give back") {
  auto c = client("aon:");
  auto wide = sluice::redis::Limit::create({{.requests = 10, .period = 1h}});
  auto narrow = sluice::redis::Limit::create({{.requests = 1, .period = 1h}});
  REQUIRE(wide.ok());
  REQUIRE(narrow.ok());
  // Two keys whose state lives on different primaries.
  RedisGcraLimiter probe = limiter(c, {{.requests = 10, .period = 1h}});
  std::string a = "a", b;
  for (int i = 0; b.empty(); ++i) {
    std::string candidate = "b" + std::to_string(i);
    if (cluster().primary_of(sluice::redis::detail::key_slot(c->redis_key(candidate, *narrow))) !=
        cluster().primary_of(sluice::redis::detail::key_slot(c->redis_key(a, *wide)))) {
      b = candidate;
    }
  }
  const sluice::redis::CheckItem items[] = {{.key = a, .limit = &*wide, .cost = 1},
                                            {.key = b, .limit = &*narrow, .cost = 1}};
  auto first = c->check_all(items);
  REQUIRE(first.ok());
  CHECK((*first)[0].allowed());
  CHECK((*first)[1].allowed());
  for (int i = 0; i < 5; ++i) {
    auto denied = c->check_all(items);
    REQUIRE(denied.ok());
    CHECK((*denied)[1].reason == sluice::Reason::kQuotaExceeded);
  }
  // Only the first batch consumed in the wide limit: each denied batch was given back.
  const sluice::redis::CheckItem peek[] = {{.key = a, .limit = &*wide, .cost = 0}};
  auto state = c->check_all(peek);
  REQUIRE(state.ok());
  CHECK((*state)[0].remaining == 9);
}

namespace {

// The engine over the Cluster against the in-memory engine, 300 random requests: every
// evaluation the same. `prefix` namespaces the keys.
void expect_engine_parity(const sluice::PolicyConfig& config, const std::string& prefix) {
  sluice::ManualClock clock;
  auto memory = sluice::BasicRateLimitEngine<sluice::InMemoryBackend<sluice::ManualClock>>::create(
      config, {.clock = clock});
  REQUIRE(memory.ok());
  auto redis = sluice::redis::RedisRateLimitEngine::create(
      config, {.client = client(prefix, [clock] { return kT0 + clock.now(); })});
  REQUIRE(redis.ok());
  std::mt19937_64 rng(3);
  const sluice::WallTime kWall{std::chrono::seconds(1'700'000'000)};  // the fields' Reset base
  constexpr std::string_view kIps[] = {"198.51.100.1", "198.51.100.2", "198.51.100.3"};
  for (int i = 0; i < 300; ++i) {
    INFO("request " << i);
    if (rng() % 3 == 0) clock.advance(std::chrono::milliseconds(rng() % 900));
    const sluice::RequestContext request{.client_ip = kIps[rng() % 3],
                                         .route = "r",
                                         .path = "/x",
                                         .cost = rng() % 3,
                                         .wall_time = kWall};
    const sluice::Evaluation expected = memory->evaluate(request);
    const sluice::Evaluation actual = redis->evaluate(request);
    REQUIRE(actual.backend_error.ok());
    REQUIRE(actual.allowed == expected.allowed);
    REQUIRE(actual.binding == expected.binding);
    REQUIRE(actual.fields == expected.fields);
  }
}

sluice::PolicyConfig per_ip_and_route() {
  return {.policies = {{.name = "api",
                        .rate_limits = {{.name = "per-ip",
                                         .selector = {sluice::Selector::kIp},
                                         .requests_per = {.s = 2, .minute = 10},
                                         .burst = 3},
                                        {.name = "per-route",
                                         .selector = {sluice::Selector::kRoute},
                                         .requests_per = {.minute = 15}}}}},
          .routes = {{.name = "r", .path_prefix = "/", .policies = {"api"}}}};
}

}  // namespace

TEST_CASE("the engine over a Cluster decides exactly as in memory (random script)") {
  expect_engine_parity(per_ip_and_route(), "engine:");
}

TEST_CASE("fixed windows over a Cluster decide exactly as in memory, given back across slots") {
  // A fixed window per ip beside a GCRA limit per route, then the reverse: their keys live in
  // different slots, so a request that one denies is given back in the other.
  sluice::PolicyConfig fixed_ip = per_ip_and_route();
  fixed_ip.policies[0].rate_limits[0].burst.reset();
  fixed_ip.policies[0].rate_limits[0].algorithm = sluice::Algorithm::kFixedWindow;
  expect_engine_parity(fixed_ip, "fixed-ip:");
  sluice::PolicyConfig fixed_route = per_ip_and_route();
  fixed_route.policies[0].rate_limits[1].algorithm = sluice::Algorithm::kFixedWindow;
  expect_engine_parity(fixed_route, "fixed-route:");
}

TEST_CASE("limits lowered over a Cluster carry each key's spent share across slots, as memory") {
  const auto config = [](std::uint64_t per_ip, std::uint64_t per_route) {
    return sluice::PolicyConfig{
        .policies = {{.name = "api",
                      .rate_limits = {{.name = "per-ip",
                                       .selector = {sluice::Selector::kIp},
                                       .requests_per = {.minute = per_ip}},
                                      {.name = "per-route",
                                       .selector = {sluice::Selector::kRoute},
                                       .requests_per = {.minute = per_route}}}}},
        .routes = {{.name = "r", .path_prefix = "/", .policies = {"api"}}}};
  };
  sluice::ManualClock clock;
  using MemoryEngine = sluice::BasicRateLimitEngine<sluice::InMemoryBackend<sluice::ManualClock>>;
  auto memory = MemoryEngine::create(config(100, 1000), {.clock = clock});
  auto redis = sluice::redis::RedisRateLimitEngine::create(
      config(100, 1000), {.client = client("carry:", [clock] { return kT0 + clock.now(); })});
  REQUIRE(memory.ok());
  REQUIRE(redis.ok());
  const sluice::WallTime kWall{std::chrono::seconds(1'700'000'000)};
  const auto same = [&](const auto& r, const auto& m, int ip, int n) {
    const std::string address = "198.51.100." + std::to_string(ip);
    const sluice::RequestContext request{
        .client_ip = address, .route = "r", .path = "/x", .wall_time = kWall};
    int count = 0;
    for (int i = 0; i < n; ++i) {
      const sluice::Evaluation expected = m.evaluate(request);
      const sluice::Evaluation actual = r.evaluate(request);
      INFO("ip " << ip << ", request " << i << ": " << actual.backend_error);
      REQUIRE(actual.backend_error.ok());
      CHECK(actual.allowed == expected.allowed);
      CHECK(actual.fields == expected.fields);
      count += actual.allowed;
    }
    return count;
  };
  int spent = 0;
  for (int ip = 1; ip <= 12; ++ip) spent += same(*redis, *memory, ip, 30);
  CHECK(spent == 360);
  clock.advance(1ms);
  auto redis2 = redis->reload(config(10, 500));
  auto memory2 = memory->reload(config(10, 500));
  REQUIRE(redis2.ok());
  REQUIRE(memory2.ok());
  int after = 0;
  for (int ip = 1; ip <= 12; ++ip) after += same(*redis2, *memory2, ip, 10);
  CHECK(after == 12 * 7);  // each ip keeps 70 % of its bucket: 7 of the new 10
}

TEST_CASE("a slot moved between primaries keeps every budget, step by step and under traffic") {
  RedisCluster& rc = cluster();
  RedisGcraLimiter l = limiter(client("move:"), {{.requests = 20, .period = 1h}});
  const std::string key = "moving";
  const std::size_t slot = sluice::redis::detail::key_slot(l.redis_key(key));
  const int from = rc.primary_of(slot);
  const int to = other_primary(rc, slot);
  REQUIRE(from >= 0);
  REQUIRE(to >= 0);
  REQUIRE(from != to);
  int total = admitted(l, key, 4);  // state on the source
  REQUIRE(rc.begin_move(slot, to).empty());
  total += admitted(l, key, 4);  // MIGRATING: the source still holds the key and serves it
  REQUIRE(rc.migrate_keys(slot, from, to).empty());
  total += admitted(l, key, 4);  // the key is on the target: ASK, then ASKING there
  REQUIRE(rc.finish_move(slot, from, to).empty());
  total += admitted(l, key, 4);  // MOVED once, then the target directly
  CHECK(total == 16);
  CHECK(rc.primary_of(slot) == to);

  // Under traffic: four threads spend forty keys' budgets while a slot of theirs moves back.
  std::vector<std::string> keys;
  for (int k = 0; k < 40; ++k) keys.push_back("busy-" + std::to_string(k));
  keys.push_back(key);  // already 16 of 20 spent
  std::atomic<int> spent{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 8; ++round) {
        for (std::size_t k = static_cast<std::size_t>(t); k < keys.size(); k += 4) {
          absl::StatusOr<sluice::Decision> d = l.check(keys[k]);
          if (!d.ok()) {
            ++errors;
          } else if (d->allowed()) {
            ++spent;
          }
        }
      }
    });
  }
  const std::string moved = rc.move_slot(slot, from);
  for (std::thread& t : threads) t.join();
  CHECK(moved.empty());
  CHECK(errors.load() == 0);
  // 40 fresh keys × 8 checks against 20 each, plus the old key's last 4 of 20 (8 checks).
  CHECK(spent.load() == 40 * 8 + 4);
  CHECK(admitted(l, key, 1) == 0);
}

TEST_CASE("a failover to a replica keeps every budget and the client finds the new primary") {
  RedisCluster& rc = cluster();
  RedisGcraLimiter l = limiter(client("failover:"), {{.requests = 10, .period = 1h}});
  const std::string key = "tenant";
  const std::size_t slot = sluice::redis::detail::key_slot(l.redis_key(key));
  const int primary = rc.primary_of(slot);
  const int replica = rc.replica_of(primary);
  REQUIRE(replica >= 0);
  CHECK(admitted(l, key, 6) == 6);
  const std::string failed_over = rc.fail_over(replica);
  INFO(failed_over);
  REQUIRE(failed_over.empty());
  CHECK(rc.primary_of(slot) == replica);
  // The old primary now answers MOVED (it is a replica); the client follows and repoints.
  CHECK(admitted(l, key, 6) == 4);
}

TEST_CASE("the attempt limiter over a Cluster throttles every subject, on every primary") {
  const sluice::AttemptPolicy policy{
      .initial_delay = 1min, .delay_cap = 1h, .quiet_period = 24h, .lease = 1min};
  std::set<int> primaries;
  int admitted_first = 0, failed = 0, backed_off = 0;
  for (int p = 0; p < 12; ++p) {
    // Each prefix's hash tag is its own slot: the twelve spread over the primaries.
    sluice::redis::ClientOptions o = client("unused:")->options();
    o.key_prefix = "login{p" + std::to_string(p) + "}:";
    auto limiter = sluice::redis::RedisAttemptLimiter::create(policy, o);
    INFO(limiter.status());
    REQUIRE(limiter.ok());
    for (int s = 0; s < 5; ++s) {
      const std::string subject = "user-" + std::to_string(s);
      primaries.insert(
          cluster().primary_of(sluice::redis::detail::key_slot(limiter->redis_key(subject))));
      absl::StatusOr<sluice::AttemptDecision> first = limiter->begin(subject);
      INFO(first.status());
      REQUIRE(first.ok());
      admitted_first += first->admitted() ? 1 : 0;
      failed += limiter->fail(first->receipt).ok() ? 1 : 0;
      absl::StatusOr<sluice::AttemptDecision> second = limiter->begin(subject);
      INFO(second.status());
      REQUIRE(second.ok());
      backed_off += second->reason == sluice::AttemptReason::kBackoff ? 1 : 0;
    }
  }
  CHECK(primaries.size() == 3);
  CHECK(admitted_first == 60);
  CHECK(failed == 60);
  CHECK(backed_off == 60);
}

namespace {

// A fake Cluster node on 127.0.0.1 for the attack tests: one thread polls the listener and every
// accepted connection, reads whole commands (RESP arrays of bulk strings) and answers each with
// `answer(args)`; with `close_after_reply`, closes the connection after each answer. Stops when
// destroyed.
class ScriptedNode {
 public:
  using Answer = std::function<std::string(const std::vector<std::string>&)>;

  ScriptedNode(Answer answer, bool close_after_reply)
      : answer_(std::move(answer)), close_after_reply_(close_after_reply) {}
  ScriptedNode(const ScriptedNode&) = delete;
  ScriptedNode& operator=(const ScriptedNode&) = delete;
  ~ScriptedNode() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    for (const Conn& c : conns_) close(c.fd);
    if (listener_ >= 0) close(listener_);
  }

  // "" once listening; else why not.
  std::string start() {
    listener_ = sluice_test::listen_on_loopback(128, port_);
    if (listener_ < 0) return "cannot listen on 127.0.0.1";
    thread_ = std::thread([this] { run(); });
    return "";
  }
  int port() const { return port_; }

 private:
  struct Conn {
    int fd;
    std::string in;
  };

  void run() {
    while (!stop_.load()) {
      std::vector<pollfd> fds = {{.fd = listener_, .events = POLLIN, .revents = 0}};
      for (const Conn& c : conns_) fds.push_back({.fd = c.fd, .events = POLLIN, .revents = 0});
      if (poll(fds.data(), fds.size(), 20) <= 0) continue;
      if ((fds[0].revents & POLLIN) != 0) {
        const int fd = accept(listener_, nullptr, nullptr);
        if (fd >= 0) conns_.push_back({fd, {}});
      }
      std::vector<int> closed;
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Conn& c = conns_[i - 1];
        char buf[4096];
        const ssize_t n = read(c.fd, buf, sizeof buf);
        if (n <= 0) {
          closed.push_back(c.fd);
          continue;
        }
        c.in.append(buf, static_cast<std::size_t>(n));
        std::vector<std::string> args;
        bool answered = false;
        while (take_command(c.in, args)) {
          const std::string reply = answer_(args);
          (void)send(c.fd, reply.data(), reply.size(), MSG_NOSIGNAL);
          answered = true;
        }
        if (answered && close_after_reply_) closed.push_back(c.fd);
      }
      for (int fd : closed) {
        close(fd);
        std::erase_if(conns_, [fd](const Conn& c) { return c.fd == fd; });
      }
    }
  }

  // Takes one whole command off the front of `in` into `args`; false if none is complete yet.
  static bool take_command(std::string& in, std::vector<std::string>& args) {
    args.clear();
    std::size_t pos = 0;
    const auto line = [&](char type, long& value) {
      if (pos >= in.size() || in[pos] != type) return false;
      const std::size_t end = in.find("\r\n", pos);
      if (end == std::string::npos) return false;
      value = std::stol(in.substr(pos + 1, end - pos - 1));
      pos = end + 2;
      return true;
    };
    long count = 0;
    if (!line('*', count)) return false;
    for (long i = 0; i < count; ++i) {
      long len = 0;
      if (!line('$', len) || in.size() < pos + static_cast<std::size_t>(len) + 2) return false;
      args.push_back(in.substr(pos, static_cast<std::size_t>(len)));
      pos += static_cast<std::size_t>(len) + 2;
    }
    in.erase(0, pos);
    return true;
  }

  const Answer answer_;
  const bool close_after_reply_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<Conn> conns_;  // the serving thread's
};

// CLUSTER SLOTS naming one primary for every slot.
std::string all_slots_at(const std::string& host, int port) {
  return absl::StrCat("*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$", host.size(), "\r\n", host,
                      "\r\n:", port, "\r\n");
}

// The `i`th spelling of 127.0.0.1 (hexadecimal octets padded with zeros): a distinct node address
// to the client, the same peer to the kernel.
std::string loopback_alias(int i) {
  return absl::StrCat("0x", std::string(static_cast<std::size_t>(i % 40), '0'), "7f.0.0.0x",
                      std::string(static_cast<std::size_t>(i / 40), '0'), "1");
}

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

}  // namespace

TEST_CASE("node addresses a Cluster named once are forgotten: a later primary is still reached",
          "[attack]") {
  // A node that redirects every call to a new address (a hostile peer, or years of failovers on
  // hosts whose addresses change) fills the client's node table; a primary named after that must
  // still be reached, and the connections to the forgotten addresses closed.
  std::atomic<int> next{0};
  std::atomic<bool> redirecting{true};
  ScriptedNode primary(
      [](const std::vector<std::string>& args) -> std::string {
        return args.empty() || args[0] != "EVALSHA" ? "+OK\r\n"
                                                    : "-ERR reached the new primary\r\n";
      },
      /*close_after_reply=*/false);
  REQUIRE(primary.start().empty());
  int port = 0;
  ScriptedNode node(
      [&](const std::vector<std::string>& args) -> std::string {
        if (args.size() >= 2 && args[0] == "CLUSTER" && args[1] == "SLOTS") {
          return redirecting.load() ? all_slots_at("127.0.0.1", port)
                                    : all_slots_at("127.0.0.1", primary.port());
        }
        if (!args.empty() && args[0] == "EVALSHA") {
          if (!redirecting.load()) return "-CLUSTERDOWN the slots moved\r\n";
          return absl::StrCat("-MOVED 0 ", loopback_alias(next.fetch_add(1)), ":", port, "\r\n");
        }
        return "+OK\r\n";
      },
      /*close_after_reply=*/true);
  REQUIRE(node.start().empty());
  port = node.port();

  sluice::redis::ClientOptions o;
  o.connection.host = "127.0.0.1";
  o.connection.port = port;
  o.connection.connect_timeout = 1s;
  o.connection.command_timeout = 1s;
  o.connection.memory_check = sluice::redis::MemoryCheck::kSkip;  // it answers no INFO
  o.cluster = true;
  o.key_seed = 42;
  auto c = sluice::redis::Client::create(o);
  REQUIRE(c.ok());
  RedisGcraLimiter l = limiter(*c, {{.requests = 5, .period = 1h}});
  const std::size_t fds_before = open_fds();

  // Up to five redirections per check: more addresses than the table holds (1024).
  for (int i = 0; i < 800 && next.load() < 1400; ++i) (void)l.check("k");
  REQUIRE(next.load() >= 1400);

  // The slots move to a primary at an address never seen before.
  redirecting.store(false);
  absl::Status last;
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (std::chrono::steady_clock::now() < until) {
    last = l.check("k").status();
    if (last.message().find("reached the new primary") != std::string_view::npos) break;
    std::this_thread::sleep_for(10ms);  // polls for the recovery; measures no rate
  }
  INFO(last);
  CHECK(last.message().find("reached the new primary") != std::string_view::npos);
  CHECK(open_fds() < fds_before + 100);
}

namespace {

// A Cluster client whose seed is the scripted node at `port` (it answers no INFO: no memory
// check), deciding at kT0, every call bounded by `timeout`.
std::shared_ptr<sluice::redis::Client> scripted_client(int port,
                                                       std::chrono::milliseconds timeout = 1s) {
  sluice::redis::ClientOptions o;
  o.connection.host = "127.0.0.1";
  o.connection.port = port;
  o.connection.connect_timeout = timeout;
  o.connection.command_timeout = timeout;
  o.connection.memory_check = sluice::redis::MemoryCheck::kSkip;
  o.cluster = true;
  o.key_seed = 42;
  o.time_source = [] { return kT0; };
  auto c = sluice::redis::Client::create(o);
  INFO(c.status());
  REQUIRE(c.ok());
  return *std::move(c);
}

}  // namespace

TEST_CASE("a redirection to an unknown endpoint goes to the answering node's host, at its port",
          "[attack]") {
  // Redis 7 with cluster-preferred-endpoint-type unknown-endpoint answers "-MOVED <slot> :<port>"
  // and "-ASK <slot> :<port>": the target is on the host of the node that answered. Read as no
  // redirection at all, such a reply was sent again to the same node, like TRYAGAIN, until the
  // redirections ran out, and the check failed.
  std::atomic<int> asking{0};
  ScriptedNode primary(
      [&](const std::vector<std::string>& args) -> std::string {
        if (!args.empty() && args[0] == "ASKING") ++asking;
        return args.empty() || args[0] != "EVALSHA" ? "+OK\r\n"
                                                    : "-ERR reached the new primary\r\n";
      },
      /*close_after_reply=*/false);
  REQUIRE(primary.start().empty());
  int port = 0;
  std::atomic<int> evals{0};
  std::atomic<bool> ask{false};
  std::atomic<std::size_t> slot{0};
  ScriptedNode node(
      [&](const std::vector<std::string>& args) -> std::string {
        if (args.size() >= 2 && args[0] == "CLUSTER" && args[1] == "SLOTS") {
          return all_slots_at("127.0.0.1", port);
        }
        if (args.empty() || args[0] != "EVALSHA") return "+OK\r\n";
        ++evals;
        return absl::StrCat(ask.load() ? "-ASK " : "-MOVED ", slot.load(), " :", primary.port(),
                            "\r\n");
      },
      /*close_after_reply=*/false);
  REQUIRE(node.start().empty());
  port = node.port();

  for (const bool use_ask : {false, true}) {
    INFO((use_ask ? "ASK" : "MOVED"));
    ask.store(use_ask);
    evals.store(0);
    RedisGcraLimiter l = limiter(scripted_client(port), {{.requests = 5, .period = 1h}});
    slot.store(sluice::redis::detail::key_slot(l.redis_key("k")));
    const absl::Status status = l.check("k").status();
    INFO(status);
    CHECK(status.message().find("reached the new primary") != std::string_view::npos);
    CHECK(evals.load() == 1);  // followed at once, not sent again to the node that redirected
  }
  CHECK(asking.load() == 1);
}

TEST_CASE("a malformed redirection is an error at once, neither sent again nor followed",
          "[attack]") {
  // A redirection naming no usable address (no port, port 0 or above 65535, a slot out of range,
  // a host that is no host) is a reply of the wrong shape: the check fails with Internal after
  // one call, and no node is asked again or connected to because of it.
  std::atomic<int> primary_evals{0};
  ScriptedNode primary(
      [&](const std::vector<std::string>& args) -> std::string {
        if (args.empty() || args[0] != "EVALSHA") return "+OK\r\n";
        ++primary_evals;
        return "-ERR reached the new primary\r\n";
      },
      /*close_after_reply=*/false);
  REQUIRE(primary.start().empty());
  int port = 0;
  std::atomic<int> evals{0};
  std::atomic<std::size_t> which{0};
  std::vector<std::string> replies;  // written before the node starts; read by its thread
  ScriptedNode node(
      [&](const std::vector<std::string>& args) -> std::string {
        if (args.size() >= 2 && args[0] == "CLUSTER" && args[1] == "SLOTS") {
          return all_slots_at("127.0.0.1", port);
        }
        if (args.empty() || args[0] != "EVALSHA") return "+OK\r\n";
        ++evals;
        return replies[which.load()];
      },
      /*close_after_reply=*/false);
  const std::string p = std::to_string(primary.port());
  for (std::string_view text :
       {"MOVED 0 127.0.0.1", "MOVED 0 127.0.0.1:", "MOVED 0 :0", "MOVED 0 127.0.0.1:65536",
        "MOVED 0 :-1", "MOVED 0 :99999999999999999999", "MOVED 0 127.0.0.1:12ab", "MOVED  :P",
        "MOVED 16384 :P", "MOVED -1 :P", "MOVED 0 ?:P", "ASK 0 a b:P",
        "ASK 0 ::P:", "MOVED garbage", "MOVED", "ASK"}) {
    std::string reply = "-" + std::string(text) + "\r\n";
    for (std::size_t at = reply.find(":P"); at != std::string::npos; at = reply.find(":P")) {
      reply.replace(at + 1, 1, p);
    }
    replies.push_back(std::move(reply));
  }
  REQUIRE(node.start().empty());
  port = node.port();
  RedisGcraLimiter l = limiter(scripted_client(port), {{.requests = 5, .period = 1h}});

  for (std::size_t i = 0; i < replies.size(); ++i) {
    INFO(replies[i]);
    which.store(i);
    evals.store(0);
    const absl::Status status = l.check("k").status();
    INFO(status);
    CHECK(status.code() == absl::StatusCode::kInternal);
    CHECK(evals.load() == 1);
  }
  CHECK(primary_evals.load() == 0);
}

namespace {

// A script reply as RESP: one bulk string of `doubles` (little-endian, as the script packs them)
// with `middle` written after the first three.
std::string script_reply(std::initializer_list<std::uint64_t> head, std::string_view middle,
                         std::initializer_list<std::uint64_t> tail) {
  std::string body;
  for (std::uint64_t v : head) sluice::redis::detail::append_double(body, v);
  body.append(middle);
  for (std::uint64_t v : tail) sluice::redis::detail::append_double(body, v);
  return absl::StrCat("$", body.size(), "\r\n", body, "\r\n");
}

// CLUSTER SLOTS: slots 0..8191 at 127.0.0.1:`low`, the rest at 127.0.0.1:`high`.
std::string halves_at(int low, int high) {
  return absl::StrCat("*2\r\n*3\r\n:0\r\n:8191\r\n*2\r\n$9\r\n127.0.0.1\r\n:", low,
                      "\r\n*3\r\n:8192\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:", high, "\r\n");
}

}  // namespace

TEST_CASE("a check over two nodes gives back by its one deadline when the other node is slow",
          "[attack]") {
  // The first node admits its item at once and then never answers the give-back; the second
  // node answers its item late (a denial at 80 % of the timeout) or never. The give-back had a
  // fresh command_timeout of its own, so the call took the second node's time plus a whole
  // timeout more: up to twice the one timeout the docs promise per call.
  constexpr auto kTimeout = 300ms;
  const std::uint64_t now_s = static_cast<std::uint64_t>(kT0.count()) / 1'000'000'000;
  const std::string check_sha = sluice::redis::detail::sha1_hex(sluice::redis::kGcraScript);
  // Admitted, decided at kT0: a key with no state ('0'), then its reset count.
  const std::string admitted = script_reply({1, now_s, 0}, "0", {0});
  // Denied: a key of 1 request per hour written at kT0 with a whole period of debt left.
  std::string spent = "1";
  for (std::uint64_t v :
       {now_s, std::uint64_t{0}, std::uint64_t{3'600'000'000'000}, std::uint64_t{0}}) {
    sluice::redis::detail::append_double(spent, v);
  }
  const std::string denied = script_reply({0, now_s, 0}, spent, {0});

  std::atomic<int> low_port{0}, high_port{0};
  std::atomic<int> give_backs{0};
  ScriptedNode low(
      [&](const std::vector<std::string>& args) -> std::string {
        if (args.size() >= 2 && args[0] == "CLUSTER" && args[1] == "SLOTS") {
          return halves_at(low_port.load(), high_port.load());
        }
        if (args.empty() || args[0] != "EVALSHA") return "+OK\r\n";
        if (args.size() > 1 && args[1] == check_sha) return admitted;
        ++give_backs;
        return "";  // the give-back: never answered
      },
      /*close_after_reply=*/false);
  std::atomic<bool> answer_late{false};
  ScriptedNode high(
      [&](const std::vector<std::string>& args) -> std::string {
        if (args.size() >= 2 && args[0] == "CLUSTER" && args[1] == "SLOTS") {
          return halves_at(low_port.load(), high_port.load());
        }
        if (args.empty() || args[0] != "EVALSHA") return "+OK\r\n";
        if (!answer_late.load()) return "";              // never answered
        std::this_thread::sleep_for(kTimeout * 8 / 10);  // a slow peer, not a rate
        return denied;
      },
      /*close_after_reply=*/false);
  REQUIRE(low.start().empty());
  REQUIRE(high.start().empty());
  low_port.store(low.port());
  high_port.store(high.port());

  auto c = scripted_client(low.port(), kTimeout);
  auto limit = sluice::redis::Limit::create({{.requests = 1, .period = 1h}});
  REQUIRE(limit.ok());
  std::string a, b;
  for (int i = 0; a.empty() || b.empty(); ++i) {
    const std::string key = "k" + std::to_string(i);
    (sluice::redis::detail::key_slot(c->redis_key(key, *limit)) < 8192 ? a : b) = key;
  }
  const sluice::redis::CheckItem items[] = {{.key = a, .limit = &*limit, .cost = 1},
                                            {.key = b, .limit = &*limit, .cost = 1}};

  for (const bool late : {false, true}) {
    INFO((late ? "the second node denies late" : "the second node never answers"));
    answer_late.store(late);
    give_backs.store(0);
    const auto start = std::chrono::steady_clock::now();
    const absl::StatusOr<std::vector<sluice::Decision>> d = c->check_all(items);
    const auto took = std::chrono::steady_clock::now() - start;
    INFO(d.status());
    INFO(std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
    CHECK(took < kTimeout * 16 / 10);
    if (late) {
      REQUIRE(d.ok());
      CHECK((*d)[0].allowed());
      CHECK((*d)[1].reason == sluice::Reason::kQuotaExceeded);
      CHECK(give_backs.load() == 1);  // sent, with the time that was left
    } else {
      CHECK(d.status().code() == absl::StatusCode::kDeadlineExceeded);
    }
  }
  // Neither give-back ended by the deadline: each item's cost stays taken, counted and exported.
  CHECK(c->give_backs_lost() == 2);
  std::string metrics;
  sluice::redis::append_prometheus_text(metrics, *c);
  CHECK(absl::StrContains(metrics, "\nsluice_redis_give_backs_lost_total 2\n"));
}

TEST_CASE("a Cluster announcing unknown endpoints is served: null map endpoints, ':port' redirects",
          "[attack]") {
  // With cluster-preferred-endpoint-type unknown-endpoint (Redis 7, nodes behind an address they
  // do not know), CLUSTER SLOTS names each node by a null endpoint and its port, and redirections
  // read "MOVED <slot> :<port>": both mean the host the client asked. The client refused such a
  // map as malformed, so no check reached any node.
  RedisCluster& rc = cluster();
  const auto announce = [&rc](std::string_view type) {
    for (int node = 0; node < RedisCluster::kNodes; ++node) {
      sluice_test::Reply r =
          rc.command(node, {"CONFIG", "SET", "cluster-preferred-endpoint-type", type});
      if (!r || r->type != REDIS_REPLY_STATUS) return false;
    }
    return true;
  };
  struct Restore {
    std::function<bool(std::string_view)> announce;
    ~Restore() { (void)announce("ip"); }
  } restore{announce};
  REQUIRE(announce("unknown-endpoint"));
  sluice_test::Reply slots = rc.command(0, {"CLUSTER", "SLOTS"});
  REQUIRE(slots);
  REQUIRE(slots->type == REDIS_REPLY_ARRAY);
  REQUIRE(slots->elements > 0);
  CHECK(slots->element[0]->element[2]->element[0]->type == REDIS_REPLY_NIL);

  RedisGcraLimiter l = limiter(client("unknown-endpoint:"), {{.requests = 20, .period = 1h}});
  const std::string key = "moving";
  const std::size_t slot = sluice::redis::detail::key_slot(l.redis_key(key));
  const int from = rc.primary_of(slot);
  const int to = other_primary(rc, slot);
  REQUIRE(from >= 0);
  REQUIRE(to >= 0);
  REQUIRE(from != to);
  int total = admitted(l, key, 4);  // routed by the map
  REQUIRE(rc.begin_move(slot, to).empty());
  REQUIRE(rc.migrate_keys(slot, from, to).empty());
  total += admitted(l, key, 4);  // "ASK <slot> :<port>", then ASKING there
  REQUIRE(rc.finish_move(slot, from, to).empty());
  total += admitted(l, key, 4);  // "MOVED <slot> :<port>", then the target directly
  CHECK(total == 12);
  CHECK(admitted(l, key, 10) == 8);
  CHECK(rc.primary_of(slot) == to);
}

TEST_CASE(
    "over a Cluster, a denied batch reports its keys as they stand, as a peek after it would") {
  // Keys spread over the slots: a slot that admitted gives back what it booked, and reports its
  // keys from the state before it booked, as a peek after the give-back reads them.
  sluice::ManualClock clock;
  const auto backend = [&](const char* prefix) {
    auto b = sluice::redis::RedisEngineBackend::create(
        sluice::testing::standing_rules(), nullptr,
        {.client = client(prefix, [clock] { return kT0 + clock.now(); })});
    INFO(b.status());
    REQUIRE(b.ok());
    return *std::move(b);
  };
  sluice::redis::RedisEngineBackend one = backend("standing-one:");
  sluice::redis::RedisEngineBackend two = backend("standing-two:");
  const std::vector<std::vector<sluice::RuleKey>> requests = sluice::testing::standing_requests();
  int denied_across_slots = 0;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    INFO("request " << r);
    clock.advance(111ms);
    std::vector<sluice::Decision> a(requests[r].size());
    std::vector<sluice::Decision> b(requests[r].size());
    REQUIRE(one.check_rules_as_they_stand(requests[r], a).ok());
    REQUIRE(sluice::testing::decide_then_peek(two, requests[r], b));
    CHECK(a == b);
    std::set<int> primaries;
    for (const sluice::RuleKey& k : requests[r]) {
      primaries.insert(
          cluster().primary_of(sluice::redis::detail::key_slot(one.redis_key(k.rule, k.key))));
    }
    denied_across_slots +=
        primaries.size() > 1 &&
        std::any_of(a.begin(), a.end(), [](const sluice::Decision& d) { return !d.allowed(); });
  }
  CHECK(denied_across_slots >= 1);
  CHECK(one.client()->give_backs_lost() == 0);
}
