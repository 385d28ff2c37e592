// Shared by the benchmarks: key generation that stays in cache, the S14 reference limiters, and
// the physical limit (a dependent random memory access).
#ifndef SLUICE_BENCH_SUPPORT_HPP_
#define SLUICE_BENCH_SUPPORT_HPP_

#include <benchmark/benchmark.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/numeric/int128.h"

namespace bench {

// A clock read as a plain integer: the limiter's own cost without the ~26 ns steady_clock read
// of this VM. Each benchmark thread advances its own tick.
inline thread_local std::int64_t tick = 0;
struct TickClock {
  std::chrono::nanoseconds now() const noexcept { return std::chrono::nanoseconds{tick}; }
};

// Builds "10.a.b.c:port"-shaped keys from an index in a caller-owned buffer, as a gateway builds
// a key from the request it holds: the key bytes are in cache.
class KeyMaker {
 public:
  std::string_view operator()(std::uint64_t index) noexcept {
    char* p = buffer_;
    *p++ = 'k';
    *p++ = ':';
    p = std::to_chars(p, buffer_ + sizeof(buffer_), index).ptr;
    return {buffer_, static_cast<std::size_t>(p - buffer_)};
  }

 private:
  // Keys are at most 22 bytes; the buffer is as large as XXH3's 17-128 byte path could read, so
  // GCC's -Warray-bounds (which cannot see the length bound) has nothing to report at -O3.
  char buffer_[128];
};

// xorshift64*: a cheap uniform index source.
class Uniform {
 public:
  explicit Uniform(std::uint64_t seed) : state_(seed | 1) {}
  std::uint64_t operator()(std::uint64_t n) noexcept {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    const std::uint64_t r = state_ * 0x2545F4914F6CDD1DULL;
    return absl::Uint128High64(absl::uint128(r) * n);
  }

 private:
  std::uint64_t state_;
};

// `count` indices in [0, n) drawn from Zipf(s); read sequentially by the benchmark loop.
inline std::vector<std::uint32_t> zipf_sequence(std::uint32_t n, double s, std::size_t count) {
  std::vector<double> cdf(n);
  double sum = 0;
  for (std::uint32_t i = 0; i < n; ++i) cdf[i] = (sum += 1.0 / std::pow(i + 1.0, s));
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, sum);
  std::vector<std::uint32_t> out(count);
  for (auto& x : out) {
    x = static_cast<std::uint32_t>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
  }
  return out;
}

// The physical limit: one dependent random access per step over `bytes` of memory (a random
// cyclic permutation of cache lines, so the hardware prefetcher cannot help).
class PointerChase {
 public:
  explicit PointerChase(std::size_t bytes) : lines_(std::max<std::size_t>(bytes / 64, 2)) {
    std::vector<std::uint32_t> order(lines_.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin() + 1, order.end(), std::mt19937_64(3));
    for (std::size_t i = 0; i < order.size(); ++i) {
      lines_[order[i]].next = order[(i + 1) % order.size()];
    }
  }
  std::uint32_t step(std::uint32_t at) const noexcept { return lines_[at].next; }

 private:
  struct alignas(64) Line {
    std::uint32_t next;
  };
  std::vector<Line> lines_;
};

// Resident set size in bytes, from /proc/self/statm.
inline std::size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  int read = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return read == 2 ? resident * 4096 : 0;
}

// --- the S14 references: what services hand-roll --------------------------------------------

// GCRA with integer ns TATs (one window, burst = requests, period/requests rounded down).
struct GcraState {
  std::int64_t tat = 0;
};
inline bool gcra_step(GcraState& s, std::int64_t now, std::int64_t interval,
                      std::int64_t tolerance) {
  const std::int64_t next = std::max(s.tat, now) + interval;
  if (next - now > tolerance) return false;
  s.tat = next;
  return true;
}

// std::mutex + std::unordered_map<std::string, …>.
class MutexUnorderedMapLimiter {
 public:
  MutexUnorderedMapLimiter(std::int64_t interval, std::int64_t tolerance)
      : interval_(interval), tolerance_(tolerance) {}
  bool check(std::string_view key, std::int64_t now) {
    std::lock_guard<std::mutex> lock(mu_);
    return gcra_step(map_[std::string(key)], now, interval_, tolerance_);
  }
  std::size_t size() const { return map_.size(); }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, GcraState> map_;
  std::int64_t interval_, tolerance_;
};

// One std::mutex + absl::flat_hash_map<std::string, …>.
class MutexFlatHashMapLimiter {
 public:
  MutexFlatHashMapLimiter(std::int64_t interval, std::int64_t tolerance)
      : interval_(interval), tolerance_(tolerance) {}
  bool check(std::string_view key, std::int64_t now) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(absl::string_view(key.data(), key.size()));
    if (it == map_.end()) it = map_.emplace(std::string(key), GcraState{}).first;
    return gcra_step(it->second, now, interval_, tolerance_);
  }

 private:
  std::mutex mu_;
  absl::flat_hash_map<std::string, GcraState> map_;
  std::int64_t interval_, tolerance_;
};

// The naive floating-point token bucket (refill = elapsed · rate), on a mutex + unordered_map.
class FloatTokenBucketLimiter {
 public:
  FloatTokenBucketLimiter(double rate_per_ns, double capacity)
      : rate_(rate_per_ns), capacity_(capacity) {}
  bool check(std::string_view key, std::int64_t now) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = map_.try_emplace(std::string(key), Bucket{capacity_, now});
    Bucket& b = it->second;
    b.tokens = std::min(capacity_, b.tokens + static_cast<double>(now - b.last) * rate_);
    b.last = now;
    if (b.tokens < 1.0) return false;
    b.tokens -= 1.0;
    return true;
  }

 private:
  struct Bucket {
    double tokens;
    std::int64_t last;
  };
  std::mutex mu_;
  std::unordered_map<std::string, Bucket> map_;
  double rate_, capacity_;
};

}  // namespace bench

#endif  // SLUICE_BENCH_SUPPORT_HPP_
