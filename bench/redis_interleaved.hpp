// The interleaved comparison of redis_bench (`redis_bench --interleaved`): single-key checks
// through Client::check with coalescing on and off, beside the reference a user would otherwise
// pick (a GCRA script after go-redis/redis_rate, one EVALSHA per check), all against the same
// redis-server, in rounds. Each round runs every case (1, 8 and 32 callers; own keys, 4 shared
// keys, 1M keys) with its subjects in a shuffled order, each for one slice, so that a change in
// the machine's load hits every subject of a case alike; ratios are taken within a round.
//
// Per slice: checks per second (all callers), the redis-server's CPU per check (INFO cpu, user +
// sys, before and after the slice) and INFO commandstats `usec` of evalsha per check (stats reset
// before the slice). The load average is printed with each round and at the end.
//
// Flags (after --interleaved): --rounds=N (5), --slice_ms=N (1000), --callers=1,8,32,
// --keys=own,shared,1m, --subjects=coalesced,uncoalesced,reference,calls:K,batch:B,... where
// calls:K is coalescing with max_coalesced_calls K and batch:B with max_coalesced_checks B (the
// other option at its default); "calls:K/batch:B" sets both.
#ifndef SLUICE_BENCH_REDIS_INTERLEAVED_HPP_
#define SLUICE_BENCH_REDIS_INTERLEAVED_HPP_

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "redis_server.hpp"
#include "sluice/redis.hpp"

namespace interleaved {

namespace sr = sluice::redis;

struct Config {
  int rounds = 5;
  int slice_ms = 1000;
  std::vector<int> callers = {1, 8, 32};
  std::vector<std::string> keys = {"own", "shared", "1m"};
  std::vector<std::string> subjects = {"coalesced", "uncoalesced", "reference"};
};

// One subject: a client (nullptr for the reference, which sends its own EVALSHA on `pool`).
struct Subject {
  std::string name;
  std::shared_ptr<sr::Client> client;
};

struct Sample {
  double checks_per_s = 0;
  double server_cpu_us_per_check = 0;
  double evalsha_us_per_check = 0;
  double checks_per_call = 0;
  double client_cpu_us_per_check = 0;  // this process (every caller), user + sys
};

inline std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const std::size_t comma = s.find(',');
    out.emplace_back(s.substr(0, comma));
    s = comma == std::string_view::npos ? std::string_view() : s.substr(comma + 1);
  }
  return out;
}

inline Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&](std::string_view flag) -> std::optional<std::string_view> {
      if (a.substr(0, flag.size()) != flag) return std::nullopt;
      return a.substr(flag.size());
    };
    if (auto v = value("--rounds=")) c.rounds = std::stoi(std::string(*v));
    if (auto v = value("--slice_ms=")) c.slice_ms = std::stoi(std::string(*v));
    if (auto v = value("--keys=")) c.keys = split(*v);
    if (auto v = value("--subjects=")) c.subjects = split(*v);
    if (auto v = value("--callers=")) {
      c.callers.clear();
      for (const std::string& n : split(*v)) c.callers.push_back(std::stoi(n));
    }
  }
  return c;
}

inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// INFO `section` field `name` as a number; -1 if absent.
inline double info_number(const sluice_test::RedisServer& server, std::string_view section,
                          std::string_view name) {
  sluice_test::Reply info = server.command({"INFO", section});
  if (!info || info->type != REDIS_REPLY_STRING) return -1;
  const std::string_view text(info->str, info->len);
  std::size_t at = 0;
  while ((at = text.find(name, at)) != std::string_view::npos) {
    const bool starts =
        at == 0 || text[at - 1] == '\n' || text[at - 1] == ',' || text[at - 1] == ':';
    const std::size_t end = at + name.size();
    if (starts && end < text.size() && (text[end] == '=' || text[end] == ':')) {
      double v = -1;
      std::from_chars(text.data() + end + 1, text.data() + text.size(), v);
      return v;
    }
    at = end;
  }
  return -1;
}

// INFO commandstats calls and usec of evalsha since the last CONFIG RESETSTAT; 0 if absent.
inline std::pair<double, double> evalsha_stats(const sluice_test::RedisServer& server) {
  sluice_test::Reply info = server.command({"INFO", "commandstats"});
  if (!info || info->type != REDIS_REPLY_STRING) return {0, 0};
  const std::string_view text(info->str, info->len);
  const std::size_t at = text.find("cmdstat_evalsha:");
  if (at == std::string_view::npos) return {0, 0};
  const auto field = [&](std::string_view tag) {
    double v = 0;
    const std::size_t f = text.find(tag, at);
    if (f != std::string_view::npos) {
      std::from_chars(text.data() + f + tag.size(), text.data() + text.size(), v);
    }
    return v;
  };
  return {field("calls="), field(",usec=")};
}

// This process's CPU time so far (user + sys), in seconds.
inline double own_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

inline double server_cpu_s(const sluice_test::RedisServer& server) {
  return info_number(server, "cpu", "used_cpu_user") + info_number(server, "cpu", "used_cpu_sys");
}

// The key a caller checks next: its own 16, 4 shared by all, or one of 1M at random.
class KeyPicker {
 public:
  KeyPicker(std::string_view keys, std::string_view prefix, int thread)
      : mode_(keys == "own"      ? 0
              : keys == "shared" ? 1
                                 : 2),
        prefix_(prefix),
        thread_(thread),
        rng_(static_cast<std::uint64_t>(thread) * 0x9E3779B97F4A7C15ULL + 1) {}

  std::string_view next() {
    const std::uint64_t n = i_++;
    std::uint64_t id = 0;
    if (mode_ == 0) id = static_cast<std::uint64_t>(thread_) * 16 + n % 16;
    if (mode_ == 1) id = (static_cast<std::uint64_t>(thread_) + n) % 4;
    if (mode_ == 2) id = rng_() % 1'000'000;
    key_ = prefix_;
    key_ += std::to_string(id);
    return key_;
  }

 private:
  int mode_;
  std::string prefix_;
  int thread_;
  std::mt19937_64 rng_;
  std::uint64_t i_ = 0;
  std::string key_;
};

struct Env {
  sluice_test::RedisServer* server;
  sr::detail::ConnectionPool* pool;  // for the reference's own EVALSHA
  const sr::Limit* limit;
  std::string reference_sha;
};

// One check by `subject` on `key`; false on an error or a denial (never expected here).
inline bool check_once(const Env& env, const Subject& subject, std::string_view key) {
  if (subject.client) {
    absl::StatusOr<sluice::Decision> d = subject.client->check({.key = key, .limit = env.limit});
    return d.ok() && d->allowed();
  }
  sr::detail::Command c;
  for (std::string_view a :
       {std::string_view("EVALSHA"), std::string_view(env.reference_sha), std::string_view("1"),
        key, std::string_view("1000000000"), std::string_view("1000"), std::string_view("1"),
        std::string_view("1")}) {
    c.add(a);
  }
  auto lease = env.pool->acquire();
  if (!lease.ok()) return false;
  auto replies = sr::detail::exchange(*lease, std::span(&c, 1));
  return replies.ok() && (*replies)[0]->type == REDIS_REPLY_ARRAY;
}

// `callers` threads checking for one slice.
inline Sample run_slice(const Env& env, const Subject& subject, const std::string& keys,
                        int callers, int slice_ms) {
  env.server->command({"CONFIG", "RESETSTAT"});
  const double cpu0 = server_cpu_s(*env.server);
  const double own0 = own_cpu_s();
  std::atomic<bool> go{false}, stop{false};
  std::atomic<std::int64_t> checks{0}, errors{0};
  std::vector<std::thread> threads;
  const std::string prefix = (subject.client ? "s:" : "ref:") + keys + ":";
  for (int t = 0; t < callers; ++t) {
    threads.emplace_back([&, t] {
      KeyPicker picker(keys, prefix, t);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::int64_t n = 0, bad = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        (check_once(env, subject, picker.next()) ? n : bad) += 1;
      }
      checks += n;
      errors += bad;
    });
  }
  const auto start = std::chrono::steady_clock::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(slice_ms));
  stop = true;
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double own = own_cpu_s() - own0;
  const double cpu = server_cpu_s(*env.server) - cpu0;
  const auto [calls, usec] = evalsha_stats(*env.server);
  if (errors.load() > 0)
    std::fprintf(stderr, "%s: %lld errors\n", subject.name.c_str(),
                 static_cast<long long>(errors.load()));
  const auto n = static_cast<double>(std::max<std::int64_t>(checks.load(), 1));
  return {.checks_per_s = n / seconds,
          .server_cpu_us_per_check = cpu * 1e6 / n,
          .evalsha_us_per_check = usec / n,
          .checks_per_call = calls > 0 ? n / calls : 0,
          .client_cpu_us_per_check = own * 1e6 / n};
}

// A subject from its name: coalesced, uncoalesced, reference, or calls:K, batch:B,
// calls:K/batch:B (coalescing with those options).
inline Subject make_subject(const std::string& name, const sr::ClientOptions& base) {
  if (name == "reference") return {.name = name, .client = nullptr};
  sr::ClientOptions options = base;
  options.coalesce = name != "uncoalesced";
  std::string_view rest = name;
  while (!rest.empty()) {
    const std::size_t slash = rest.find('/');
    const std::string_view part = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
    if (part.substr(0, 6) == "calls:") {
      options.max_coalesced_calls = std::stoul(std::string(part.substr(6)));
    } else if (part.substr(0, 6) == "batch:") {
      options.max_coalesced_checks = std::stoul(std::string(part.substr(6)));
    }
  }
  auto client = sr::Client::create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), client.status().ToString().c_str());
    std::exit(1);
  }
  return {.name = name, .client = *std::move(client)};
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

using Results = std::map<std::string, std::vector<Sample>>;  // case/subject -> one per round

inline std::string case_name(int callers, const std::string& keys) {
  return std::to_string(callers) + " callers, " + keys + " keys";
}

// The per-round ratio of `subject` to `against` in one case, as min..max and median.
inline std::string ratios(const Results& r, const std::string& c, const std::string& subject,
                          const std::string& against) {
  const auto a = r.find(c + "|" + subject), b = r.find(c + "|" + against);
  if (a == r.end() || b == r.end() || subject == against) return "-";
  std::vector<double> v;
  for (std::size_t i = 0; i < a->second.size() && i < b->second.size(); ++i) {
    v.push_back(a->second[i].checks_per_s / b->second[i].checks_per_s);
  }
  char out[64];
  std::snprintf(out, sizeof out, "%.2f (%.2f-%.2f)", median(v),
                *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
  return out;
}

inline void print_summary(const Config& config, const Results& r) {
  std::printf(
      "\n| case | subject | checks/s (median) | vs reference | vs uncoalesced | "
      "server CPU us/check | evalsha us/check | checks/call | client CPU us/check |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int callers : config.callers) {
    for (const std::string& keys : config.keys) {
      const std::string c = case_name(callers, keys);
      for (const std::string& s : config.subjects) {
        const auto it = r.find(c + "|" + s);
        if (it == r.end()) continue;
        std::vector<double> tput, cpu, usec, per_call, own;
        for (const Sample& x : it->second) {
          tput.push_back(x.checks_per_s);
          cpu.push_back(x.server_cpu_us_per_check);
          usec.push_back(x.evalsha_us_per_check);
          per_call.push_back(x.checks_per_call);
          own.push_back(x.client_cpu_us_per_check);
        }
        std::printf("| %s | %s | %.1fk | %s | %s | %.2f | %.2f | %.1f | %.1f |\n", c.c_str(),
                    s.c_str(), median(tput) / 1000, ratios(r, c, s, "reference").c_str(),
                    ratios(r, c, s, "uncoalesced").c_str(), median(cpu), median(usec),
                    median(per_call), median(own));
      }
    }
  }
}

// Runs the rounds and prints each slice, then the summary; returns the exit code.
inline int run(int argc, char** argv, Env env, const sr::ClientOptions& base) {
  const Config config = parse(argc, argv);
  std::vector<Subject> subjects;
  for (const std::string& name : config.subjects) subjects.push_back(make_subject(name, base));
  std::printf("interleaved: %d rounds, %d ms slices; load average at start %s\n", config.rounds,
              config.slice_ms, load_average().c_str());
  Results results;
  std::mt19937 shuffle_rng(12345);
  for (int round = 0; round < config.rounds; ++round) {
    for (int callers : config.callers) {
      for (const std::string& keys : config.keys) {
        std::vector<std::size_t> order(subjects.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), shuffle_rng);
        for (std::size_t i : order) {
          const Sample x = run_slice(env, subjects[i], keys, callers, config.slice_ms);
          results[case_name(callers, keys) + "|" + subjects[i].name].push_back(x);
          std::printf(
              "round %d | %s | %s | %.1fk/s | server cpu %.2f us | evalsha %.2f us | %.1f/call | "
              "client cpu %.1f us\n",
              round + 1, case_name(callers, keys).c_str(), subjects[i].name.c_str(),
              x.checks_per_s / 1000, x.server_cpu_us_per_check, x.evalsha_us_per_check,
              x.checks_per_call, x.client_cpu_us_per_check);
        }
      }
    }
    std::printf("round %d done; load average %s\n", round + 1, load_average().c_str());
    std::fflush(stdout);
  }
  print_summary(config, results);
  std::printf("\nload average at end %s\n", load_average().c_str());
  return 0;
}

}  // namespace interleaved

#endif  // SLUICE_BENCH_REDIS_INTERLEAVED_HPP_
