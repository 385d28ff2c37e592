// sluice/redis.hpp — fleet-wide GCRA limits with their state in Redis (target sluice::redis).
//
// `RedisGcraLimiter` gives exactly the decisions of the in-memory GCRA limiter (SPEC S5) while
// keeping each key's state in one Redis key, so every replica of a service shares one budget.
// A check is one round trip: one EVALSHA of a bundled Lua script that reads the server's clock
// (Redis `TIME`), decides for every window of the key and reserves the cost atomically.
//
//   auto limiter = sluice::redis::RedisGcraLimiter::create(
//       {{.requests = 10, .period = std::chrono::seconds(1)},
//        {.requests = 600, .period = std::chrono::minutes(1)}},
//       {.connection = {.unix_socket = "/run/redis/redis.sock"},
//        .key_prefix = "rl:login:", .key_seed = kFleetSecretSeed});
//   if (!limiter.ok()) return limiter.status();          // invalid windows or options
//   absl::StatusOr<sluice::Decision> d = limiter->check(client_ip);
//   if (!d.ok()) { /* Unavailable / DeadlineExceeded: the caller fails open or closed */ }
//   else if (!d->allowed()) { respond_429(d->retry_after); }
//
// Several limits in one round trip (the policy engine's path): `Client::check_all` evaluates
// many (key, limit, cost) items in one script call, all-or-nothing. The policy engine over Redis
// is `RedisRateLimitEngine` (= BasicRateLimitEngine<RedisEngineBackend>): a request's live rules
// in one round trip.
//
// Units: durations are integer nanoseconds; the clock is the Redis server's `TIME` (one clock
// for the whole fleet). Keys are bytes; Redis only ever sees prefix + "{" + 32 hex digits of a
// seeded XXH3-128 digest + "}" (a Cluster hash tag), never the key itself.
// Errors: InvalidArgument (bad cost), Unavailable (connection refused or lost, server busy,
// loading or read-only), DeadlineExceeded (no reply within the command timeout, or no free
// connection), Internal (a reply of the wrong shape). Never a silent allow; no retries.
// Thread-safety: `Client`, `RedisGcraLimiter` and `RedisEngineBackend` are thread-safe; share one
// `Client` (it owns the connection pool) between many limiters and engine generations. See
// docs/redis.md for deployment and failure policy.
#ifndef SLUICE_REDIS_HPP_
#define SLUICE_REDIS_HPP_

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/decision.hpp"
#include "sluice/detail/redis_gcra_script.hpp"
#include "sluice/detail/sha1.hpp"
#include "sluice/engine.hpp"
#include "sluice/policy.hpp"
#include "sluice/rate_limiter.hpp"

namespace sluice::redis {

// `requests` per `period` with a bucket of `burst` (0 = requests), as sluice::GcraWindow.
struct Window {
  std::uint64_t requests;
  std::chrono::nanoseconds period;
  std::uint64_t burst = 0;
};

// The script keeps every value an exact double (below 2^53), which bounds the windows it takes:
inline constexpr std::uint64_t kMaxRequests = (std::uint64_t{1} << 52) - 1;
// ...and the time a window takes to refill completely, burst × period / requests (≈ 52.1 days).
inline constexpr std::chrono::nanoseconds kMaxRefill{std::int64_t{1} << 52};

// Where and how to connect. Use an IP address or a unix socket: host names are resolved by
// getaddrinfo, which no timeout bounds.
struct ConnectionOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string unix_socket;                         // non-empty: connect here, not to host:port
  std::chrono::milliseconds connect_timeout{200};  // per new connection
  std::chrono::milliseconds command_timeout{200};  // per reply; also the wait for a free connection
  std::size_t max_connections = 16;                // open at once, idle or in use
};

struct ClientOptions {
  ConnectionOptions connection;
  std::string key_prefix = "sluice:";  // namespaces the Redis keys; may name the service
  // Seeds the key digest. Every replica sharing limits must use the same seed; keep it secret so
  // clients cannot aim their keys at one Cluster slot.
  std::uint64_t key_seed = 0;
};

// A validated set of stacked windows: sorted shortest period first (stable), burst filled in.
// Immutable; copy freely.
class Limit {
 public:
  static absl::StatusOr<Limit> create(std::vector<Window> windows);

  const std::vector<Window>& windows() const noexcept { return windows_; }
  // The largest cost that can ever pass: the smallest burst.
  std::uint64_t max_cost() const noexcept { return max_cost_; }

 private:
  friend class Client;
  Limit() = default;

  std::vector<Window> windows_;
  std::uint64_t max_cost_ = 0;
  std::uint64_t fingerprint_ = 0;  // XXH3-64 of the windows: a changed limit uses fresh keys
};

// One request against one limit, for `Client::check_all`. `limit` must outlive the call.
struct CheckItem {
  std::string_view key;
  const Limit* limit = nullptr;
  std::uint64_t cost = 1;
};

namespace detail {

struct ReplyDeleter {
  void operator()(redisReply* reply) const noexcept { freeReplyObject(reply); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

inline timeval to_timeval(std::chrono::milliseconds d) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

// The status for a context whose last call failed; `saved_errno` is errno right after it.
inline absl::Status io_status(const redisContext& context, int saved_errno, std::string_view what) {
  bool timed_out =
      context.err == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
                                      saved_errno == ETIMEDOUT || saved_errno == EINPROGRESS);
#ifdef REDIS_ERR_TIMEOUT  // hiredis >= 1.0
  timed_out = timed_out || context.err == REDIS_ERR_TIMEOUT;
#endif
  std::string message = "sluice::redis: ";
  message.append(what).append(": ").append(context.errstr);
  if (timed_out) {
    return absl::DeadlineExceededError(message);
  }
  if (context.err == REDIS_ERR_PROTOCOL) {
    return absl::InternalError(message);
  }
  return absl::UnavailableError(message);
}

// Maps an error reply from the server. Server states that pass (busy, loading, read-only after
// a failover, out of memory, cluster redirections, auth) are Unavailable; anything else means
// the reply was not what the script returns: Internal.
inline absl::Status server_error_status(std::string_view error) {
  static constexpr std::array<std::string_view, 15> kUnavailable = {
      "BUSY", "LOADING", "READONLY",  "MASTERDOWN", "OOM",     "TRYAGAIN",   "CLUSTERDOWN", "MOVED",
      "ASK",  "NOAUTH",  "WRONGPASS", "NOPERM",     "MISCONF", "NOREPLICAS", "UNBLOCKED"};
  const std::string_view code = error.substr(0, error.find(' '));
  std::string message = "sluice::redis: server replied: ";
  message.append(error.substr(0, 200));
  for (std::string_view known : kUnavailable) {
    if (code == known) {
      return absl::UnavailableError(message);
    }
  }
  return absl::InternalError(message);
}

// Blocks SIGPIPE on this thread while it talks to Redis (hiredis writes with write(2), and a
// write to a closed socket raises SIGPIPE, whose default action ends the process). A SIGPIPE
// raised meanwhile is consumed before the old mask returns. No process-wide state changes.
class SigpipeGuard {
 public:
  SigpipeGuard() noexcept {
    sigemptyset(&sigpipe_);
    sigaddset(&sigpipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe_, &old_mask_);
  }
  ~SigpipeGuard() {
    if (failed_ && sigismember(&old_mask_, SIGPIPE) == 0) {
      sigset_t pending;
      if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&sigpipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

  void note_failure() noexcept { failed_ = true; }

 private:
  sigset_t sigpipe_{};
  sigset_t old_mask_{};
  bool failed_ = false;
};

// A bounded pool of blocking hiredis connections. A connection that failed is closed, never
// reused; the next acquire opens a fresh one (that is the reconnect).
// Thread-safety: thread-safe. Leases must not outlive the pool.
class ConnectionPool {
 public:
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)),
          context_(std::exchange(other.context_, nullptr)) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr) {
        pool_->release(context_);
      }
    }

    redisContext* get() const noexcept { return context_; }
    // The connection failed: close it instead of returning it to the pool.
    void mark_broken() noexcept {
      if (context_ != nullptr) {
        redisFree(context_);
      }
      context_ = nullptr;
    }

   private:
    friend class ConnectionPool;
    Lease(ConnectionPool* pool, redisContext* context) : pool_(pool), context_(context) {}

    ConnectionPool* pool_;
    redisContext* context_;
  };

  explicit ConnectionPool(ConnectionOptions options) : options_(std::move(options)) {}
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;
  ~ConnectionPool() {
    for (redisContext* context : idle_) {
      redisFree(context);
    }
  }

  const ConnectionOptions& options() const noexcept { return options_; }

  // An idle connection, or a new one while fewer than max_connections are open; waits at most
  // command_timeout for one to come back.
  absl::StatusOr<Lease> acquire() {
    {
      std::unique_lock lock(mu_);
      const bool ready = available_.wait_for(lock, options_.command_timeout, [this] {
        return !idle_.empty() || open_ < options_.max_connections;
      });
      if (!ready) {
        return absl::DeadlineExceededError(
            "sluice::redis: no free connection within the command timeout");
      }
      if (!idle_.empty()) {
        redisContext* context = idle_.back();
        idle_.pop_back();
        return Lease(this, context);
      }
      ++open_;
    }
    absl::StatusOr<redisContext*> context = connect();
    if (!context.ok()) {
      release(nullptr);
      return context.status();
    }
    return Lease(this, *context);
  }

  std::size_t open_connections() const {
    std::lock_guard lock(mu_);
    return open_;
  }

 private:
  // Returns a healthy connection to the free list, or (nullptr) gives up a closed one's slot.
  void release(redisContext* context) {
    {
      std::lock_guard lock(mu_);
      if (context != nullptr) {
        idle_.push_back(context);
      } else {
        --open_;
      }
    }
    available_.notify_one();
  }

  absl::StatusOr<redisContext*> connect() const {
    const timeval connect_timeout = to_timeval(options_.connect_timeout);
    redisContext* context =
        options_.unix_socket.empty()
            ? redisConnectWithTimeout(options_.host.c_str(), options_.port, connect_timeout)
            : redisConnectUnixWithTimeout(options_.unix_socket.c_str(), connect_timeout);
    const int saved_errno = errno;
    if (context == nullptr) {
      return absl::ResourceExhaustedError("sluice::redis: cannot allocate a connection");
    }
    if (context->err != 0) {
      absl::Status status = io_status(*context, saved_errno, "connect");
      redisFree(context);
      return status;
    }
    if (redisSetTimeout(context, to_timeval(options_.command_timeout)) != REDIS_OK) {
      absl::Status status = io_status(*context, errno, "set timeout");
      redisFree(context);
      return status;
    }
    return context;
  }

  const ConnectionOptions options_;
  mutable std::mutex mu_;
  std::condition_variable available_;  // signalled when a connection or a slot is released
  // Guarded by mu_ (std::mutex carries no thread-safety annotations in libstdc++, so the
  // guard is stated here rather than with ABSL_GUARDED_BY).
  std::vector<redisContext*> idle_;
  std::size_t open_ = 0;  // idle + leased
};

// One command's arguments, as hiredis takes them.
struct Command {
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;

  void add(std::string_view arg) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
};

// Sends `commands` in one write (pipelined) and reads one reply per command. On an I/O error
// the connection is closed and every reply is lost.
inline absl::StatusOr<std::vector<ReplyPtr>> exchange(ConnectionPool::Lease& lease,
                                                      std::span<const Command> commands) {
  redisContext* context = lease.get();
  SigpipeGuard guard;
  for (const Command& command : commands) {
    if (redisAppendCommandArgv(context, static_cast<int>(command.argv.size()),
                               const_cast<const char**>(command.argv.data()),
                               command.lengths.data()) != REDIS_OK) {
      absl::Status status = io_status(*context, errno, "append command");
      lease.mark_broken();
      return status;
    }
  }
  std::vector<ReplyPtr> replies;
  replies.reserve(commands.size());
  for (std::size_t i = 0; i < commands.size(); ++i) {
    void* reply = nullptr;
    if (redisGetReply(context, &reply) != REDIS_OK || reply == nullptr) {
      const int saved_errno = errno;
      guard.note_failure();
      absl::Status status = io_status(*context, saved_errno, "command");
      lease.mark_broken();
      return status;
    }
    replies.emplace_back(static_cast<redisReply*>(reply));
  }
  return replies;
}

// IEEE-754 binary64 <-> integers below 2^53, with integer operations only, so no floating-point
// rounding can enter a decision. The script packs exactly these bit patterns.
inline std::uint64_t integer_to_double_bits(std::uint64_t value) noexcept {
  if (value == 0) {
    return 0;
  }
  const int top = static_cast<int>(std::bit_width(value)) - 1;  // < 53
  const std::uint64_t mantissa = (value << (52 - top)) & ((std::uint64_t{1} << 52) - 1);
  return (static_cast<std::uint64_t>(top + 1023) << 52) | mantissa;
}
inline std::optional<std::uint64_t> double_bits_to_integer(std::uint64_t bits) noexcept {
  if (bits == 0) {
    return 0;
  }
  const int exponent = static_cast<int>((bits >> 52) & 0x7ff);
  if ((bits >> 63) != 0 || exponent == 0 || exponent == 0x7ff) {
    return std::nullopt;
  }
  const std::uint64_t significand =
      (bits & ((std::uint64_t{1} << 52) - 1)) | (std::uint64_t{1} << 52);
  const int shift = exponent - 1075;  // value = significand * 2^shift
  if (shift >= 0) {
    if (shift > 10) {
      return std::nullopt;  // >= 2^63: never a value the script stores
    }
    return significand << shift;
  }
  if (shift < -52) {
    return std::nullopt;
  }
  if ((significand & ((std::uint64_t{1} << -shift) - 1)) != 0) {
    return std::nullopt;  // fraction
  }
  return significand >> -shift;
}

inline void append_double(std::string& out, std::uint64_t integer) {
  const std::uint64_t bits = integer_to_double_bits(integer);
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  }
}
// Reads a little-endian double at `pos` as an integer ≤ `max`; advances `pos`.
inline std::optional<std::uint64_t> read_double(std::string_view in, std::size_t& pos,
                                                std::uint64_t max) {
  if (pos > in.size() || in.size() - pos < 8) {
    return std::nullopt;
  }
  std::uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) {
    bits |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  }
  pos += 8;
  std::optional<std::uint64_t> value = double_bits_to_integer(bits);
  if (!value || *value > max) {
    return std::nullopt;
  }
  return value;
}

inline absl::uint128 ceil_div(absl::uint128 a, absl::uint128 b) { return (a + b - 1) / b; }

inline constexpr std::uint64_t kNanosPerSecond = 1'000'000'000;

}  // namespace detail

// Owns the connection pool, the script and the key scheme; evaluates checks. Create once per
// Redis deployment and share (`std::shared_ptr`) between limiters.
// Thread-safety: thread-safe, except the *_for_testing hooks noted below.
class Client {
 public:
  static absl::StatusOr<std::shared_ptr<Client>> create(ClientOptions options = {}) {
    const ConnectionOptions& c = options.connection;
    if (c.max_connections == 0) {
      return absl::InvalidArgumentError("sluice::redis: max_connections must be >= 1");
    }
    if (c.connect_timeout <= std::chrono::milliseconds::zero() ||
        c.command_timeout <= std::chrono::milliseconds::zero()) {
      return absl::InvalidArgumentError("sluice::redis: timeouts must be > 0");
    }
    if (c.unix_socket.empty() && (c.port <= 0 || c.port > 65535)) {
      return absl::InvalidArgumentError("sluice::redis: port must be in 1..65535");
    }
    return std::shared_ptr<Client>(new Client(std::move(options)));
  }

  // Evaluates every item in one script call: if every item is admitted, every item's cost is
  // reserved; if any is denied, nothing changes anywhere. Returns one decision per item: what a
  // lone check of that item would have answered (an item repeated in the batch sees the
  // earlier occurrences' reservation). On one Redis node only: in a Cluster every key must hash
  // to one slot. InvalidArgument when a cost exceeds its limit's max_cost().
  absl::StatusOr<std::vector<Decision>> check_all(std::span<const CheckItem> items) {
    return run(items, std::nullopt);
  }

  // Independent checks, pipelined on one connection: one write, one reply per item, not atomic
  // as a group. For callers with many unrelated keys at once.
  std::vector<absl::StatusOr<Decision>> check_pipelined(std::span<const CheckItem> items) {
    return run_pipelined(items, std::nullopt);
  }

  // The Redis key holding `key`'s state under `limit` (for operators; contains no raw key bytes).
  std::string redis_key(std::string_view key, const Limit& limit) const {
    const std::uint64_t fingerprint = limit.fingerprint_;
    unsigned char fp_bytes[8];
    for (int i = 0; i < 8; ++i) {
      fp_bytes[i] = static_cast<unsigned char>(fingerprint >> (8 * i));
    }
    const XXH64_hash_t seed = XXH3_64bits_withSeed(fp_bytes, sizeof fp_bytes, options_.key_seed);
    const XXH128_hash_t digest = XXH3_128bits_withSeed(key.data(), key.size(), seed);
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(options_.key_prefix.size() + 34);
    out.append(options_.key_prefix).push_back('{');
    for (std::uint64_t half : {digest.high64, digest.low64}) {
      for (int shift = 60; shift >= 0; shift -= 4) {
        out.push_back(kHex[(half >> shift) & 0xf]);
      }
    }
    out.push_back('}');
    return out;
  }

  const ClientOptions& options() const noexcept { return options_; }
  // SHA-1 of the script body, as EVALSHA names it.
  const std::string& script_sha() const noexcept { return script_sha_; }

  // Testing hook: decide as if the Redis server's clock read `unix_time` (ns since the Unix
  // epoch, ≥ 0) instead of calling TIME. Production code never calls it.
  absl::StatusOr<std::vector<Decision>> check_all_at_for_testing(
      std::span<const CheckItem> items, std::chrono::nanoseconds unix_time) {
    if (unix_time < std::chrono::nanoseconds::zero()) {
      return absl::InvalidArgumentError("sluice::redis: testing time must be >= 0");
    }
    return run(items, unix_time);
  }
  // Testing hook: as check_pipelined(), with every item decided at `unix_time` (as above).
  std::vector<absl::StatusOr<Decision>> check_pipelined_at_for_testing(
      std::span<const CheckItem> items, std::chrono::nanoseconds unix_time) {
    if (unix_time < std::chrono::nanoseconds::zero()) {
      return std::vector<absl::StatusOr<Decision>>(
          items.size(), absl::InvalidArgumentError("sluice::redis: testing time must be >= 0"));
    }
    return run_pipelined(items, unix_time);
  }
  // Testing hook: run `body` instead of the bundled script (to prove that wrong replies become
  // errors). Not thread-safe: call before any concurrent check.
  void replace_script_for_testing(std::string body) {
    script_ = std::move(body);
    script_sha_ = sluice::detail::sha1_hex(script_);
  }
  detail::ConnectionPool& pool_for_testing() noexcept { return pool_; }

 private:
  explicit Client(ClientOptions options)
      : options_(std::move(options)),
        pool_(options_.connection),
        script_(sluice::detail::kRedisGcraScript),
        script_sha_(sluice::detail::sha1_hex(script_)) {}

  // Everything one script call needs, owning its strings.
  struct Call {
    std::vector<std::string> keys;
    std::vector<std::string> params;
    std::string time_s, time_ns;
    std::string num_keys;

    detail::Command evalsha(const std::string& sha) const {
      detail::Command command;
      command.add("EVALSHA");
      command.add(sha);
      command.add(num_keys);
      for (const std::string& key : keys) {
        command.add(key);
      }
      command.add(time_s);
      command.add(time_ns);
      for (const std::string& p : params) {
        command.add(p);
      }
      return command;
    }
  };

  static absl::Status validate(std::span<const CheckItem> items) {
    if (items.empty()) {
      return absl::InvalidArgumentError("sluice::redis: no items to check");
    }
    for (const CheckItem& item : items) {
      if (item.limit == nullptr) {
        return absl::InvalidArgumentError("sluice::redis: item without limit");
      }
      if (item.cost > item.limit->max_cost()) {
        return absl::InvalidArgumentError(
            "sluice::redis: cost exceeds the smallest burst of the limit and can never pass");
      }
    }
    return absl::OkStatus();
  }

  Call build(std::span<const CheckItem> items, std::optional<std::chrono::nanoseconds> time) const {
    Call call;
    call.keys.reserve(items.size());
    call.params.reserve(items.size());
    for (const CheckItem& item : items) {
      call.keys.push_back(redis_key(item.key, *item.limit));
      std::string& p = call.params.emplace_back();
      p.reserve(40 * item.limit->windows().size());
      for (const Window& w : item.limit->windows()) {
        const absl::uint128 r = w.requests;
        const absl::uint128 period = static_cast<std::uint64_t>(w.period.count());
        const absl::uint128 cost_scaled = absl::uint128(item.cost) * period;  // cost·T·r
        const absl::uint128 burst_scaled = absl::uint128(w.burst) * period;   // burst·T·r
        detail::append_double(p, absl::Uint128Low64(cost_scaled / r));
        detail::append_double(p, absl::Uint128Low64(cost_scaled % r));
        detail::append_double(p, absl::Uint128Low64(burst_scaled / r));
        detail::append_double(p, absl::Uint128Low64(burst_scaled % r));
        detail::append_double(p, w.requests);
      }
    }
    char buffer[24];
    call.num_keys.assign(buffer, std::to_chars(buffer, buffer + sizeof buffer, items.size()).ptr);
    if (time) {
      const auto ns = static_cast<std::uint64_t>(time->count());
      call.time_s.assign(
          buffer, std::to_chars(buffer, buffer + sizeof buffer, ns / detail::kNanosPerSecond).ptr);
      call.time_ns.assign(
          buffer, std::to_chars(buffer, buffer + sizeof buffer, ns % detail::kNanosPerSecond).ptr);
    }
    return call;
  }

  // A server that answers READONLY (a replica after a failover), MASTERDOWN, LOADING or a Cluster
  // redirection is the wrong one to keep talking to: the connection is closed, so the next check
  // reconnects and, behind a failover-aware address, reaches the new primary.
  static bool needs_new_connection(const redisReply& reply) {
    if (reply.type != REDIS_REPLY_ERROR) {
      return false;
    }
    const std::string_view error(reply.str, reply.len);
    const std::string_view code = error.substr(0, error.find(' '));
    return code == "READONLY" || code == "MASTERDOWN" || code == "LOADING" || code == "MOVED" ||
           code == "ASK" || code == "CLUSTERDOWN";
  }

  static bool is_noscript(const redisReply& reply) {
    return reply.type == REDIS_REPLY_ERROR &&
           std::string_view(reply.str, reply.len).substr(0, 8) == "NOSCRIPT";
  }

  // Loads the script (pipelined with `retry`) after a NOSCRIPT; returns retry's reply.
  absl::StatusOr<detail::ReplyPtr> reload_and_retry(detail::ConnectionPool::Lease& lease,
                                                    const detail::Command& retry) {
    detail::Command load;
    load.add("SCRIPT");
    load.add("LOAD");
    load.add(script_);
    const detail::Command commands[] = {load, retry};
    absl::StatusOr<std::vector<detail::ReplyPtr>> replies = detail::exchange(lease, commands);
    if (!replies.ok()) {
      return replies.status();
    }
    const redisReply& loaded = *(*replies)[0];
    if (loaded.type == REDIS_REPLY_ERROR) {
      return detail::server_error_status(std::string_view(loaded.str, loaded.len));
    }
    if (loaded.type != REDIS_REPLY_STRING ||
        std::string_view(loaded.str, loaded.len) != script_sha_) {
      return absl::InternalError("sluice::redis: SCRIPT LOAD returned an unexpected SHA-1");
    }
    return std::move((*replies)[1]);
  }

  absl::StatusOr<std::vector<Decision>> run(std::span<const CheckItem> items,
                                            std::optional<std::chrono::nanoseconds> time) {
    if (absl::Status status = validate(items); !status.ok()) {
      return status;
    }
    const Call call = build(items, time);
    const detail::Command command = call.evalsha(script_sha_);
    absl::StatusOr<detail::ConnectionPool::Lease> lease = pool_.acquire();
    if (!lease.ok()) {
      return lease.status();
    }
    absl::StatusOr<std::vector<detail::ReplyPtr>> replies =
        detail::exchange(*lease, std::span<const detail::Command>(&command, 1));
    if (!replies.ok()) {
      return replies.status();
    }
    detail::ReplyPtr reply = std::move((*replies)[0]);
    if (is_noscript(*reply)) {
      absl::StatusOr<detail::ReplyPtr> retried = reload_and_retry(*lease, command);
      if (!retried.ok()) {
        return retried.status();
      }
      reply = std::move(*retried);
    }
    if (needs_new_connection(*reply)) {
      lease->mark_broken();
    }
    return decide(items, *reply);
  }

  std::vector<absl::StatusOr<Decision>> run_pipelined(
      std::span<const CheckItem> items, std::optional<std::chrono::nanoseconds> time) {
    std::vector<absl::StatusOr<Decision>> results(items.size(),
                                                  absl::UnknownError("sluice::redis: not run"));
    std::vector<Call> calls;
    std::vector<detail::Command> commands;
    std::vector<std::size_t> sent;  // index into items of each command
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (absl::Status status = validate(items.subspan(i, 1)); !status.ok()) {
        results[i] = status;
        continue;
      }
      calls.push_back(build(items.subspan(i, 1), time));
      sent.push_back(i);
    }
    commands.reserve(calls.size());
    for (const Call& call : calls) {
      commands.push_back(call.evalsha(script_sha_));
    }
    if (commands.empty()) {
      return results;
    }
    absl::StatusOr<detail::ConnectionPool::Lease> lease = pool_.acquire();
    if (!lease.ok()) {
      for (std::size_t i : sent) {
        results[i] = lease.status();
      }
      return results;
    }
    absl::StatusOr<std::vector<detail::ReplyPtr>> replies = detail::exchange(*lease, commands);
    if (!replies.ok()) {
      for (std::size_t i : sent) {
        results[i] = replies.status();
      }
      return results;
    }
    for (std::size_t k = 0; k < sent.size(); ++k) {
      detail::ReplyPtr reply = std::move((*replies)[k]);
      if (is_noscript(*reply)) {
        absl::StatusOr<detail::ReplyPtr> retried = reload_and_retry(*lease, commands[k]);
        if (!retried.ok()) {
          results[sent[k]] = retried.status();
          if (lease->get() == nullptr) {
            break;  // connection lost: the rest stay errors below
          }
          continue;
        }
        reply = std::move(*retried);
      }
      if (needs_new_connection(*reply)) {
        lease->mark_broken();  // the replies already read stay valid
      }
      absl::StatusOr<std::vector<Decision>> one = decide(items.subspan(sent[k], 1), *reply);
      results[sent[k]] =
          one.ok() ? absl::StatusOr<Decision>((*one)[0]) : absl::StatusOr<Decision>(one.status());
    }
    for (std::size_t k = 0; k < sent.size(); ++k) {
      if (results[sent[k]].status().code() == absl::StatusCode::kUnknown) {
        results[sent[k]] = absl::UnavailableError("sluice::redis: connection lost");
      }
    }
    return results;
  }

  // Recomputes every decision from the state the script decided on, exactly, and checks that
  // the script's verdict agrees. The reply is untrusted: any deviation is Internal.
  static absl::StatusOr<std::vector<Decision>> decide(std::span<const CheckItem> items,
                                                      const redisReply& reply) {
    if (reply.type == REDIS_REPLY_ERROR) {
      return detail::server_error_status(std::string_view(reply.str, reply.len));
    }
    const auto malformed = [] {
      return absl::InternalError("sluice::redis: script reply of unexpected shape");
    };
    if (reply.type != REDIS_REPLY_STRING) {
      return malformed();
    }
    const std::string_view in(reply.str, reply.len);
    std::size_t pos = 0;
    const auto all_admitted = detail::read_double(in, pos, 1);
    const auto now_s = detail::read_double(in, pos, 10'000'000'000);
    const auto now_ns = detail::read_double(in, pos, detail::kNanosPerSecond - 1);
    if (!all_admitted || !now_s || !now_ns) {
      return malformed();
    }
    const absl::uint128 now = absl::uint128(*now_s) * detail::kNanosPerSecond + *now_ns;

    std::vector<Decision> decisions;
    decisions.reserve(items.size());
    bool every_item_admitted = true;
    for (const CheckItem& item : items) {
      const std::vector<Window>& windows = item.limit->windows();
      if (pos >= in.size()) {
        return malformed();
      }
      const char marker = in[pos++];
      if (marker != '0' && marker != '1') {
        return malformed();
      }
      const bool has_state = marker == '1';
      absl::uint128 elapsed = 0;  // ns since the state's write; 0 if the clock went back
      if (has_state) {
        const auto w_s = detail::read_double(in, pos, 10'000'000'000);
        const auto w_ns = detail::read_double(in, pos, detail::kNanosPerSecond - 1);
        if (!w_s || !w_ns) {
          return malformed();
        }
        const absl::uint128 written = absl::uint128(*w_s) * detail::kNanosPerSecond + *w_ns;
        if (now > written) {
          elapsed = now - written;
        }
      }
      // Per window, in units of 1/requests ns ("scaled"): debt before and after this cost.
      struct Scaled {
        absl::uint128 before, after, burst;
      };
      std::vector<Scaled> scaled(windows.size());
      bool admitted = true;
      for (std::size_t i = 0; i < windows.size(); ++i) {
        const Window& w = windows[i];
        const absl::uint128 r = w.requests;
        const absl::uint128 period = static_cast<std::uint64_t>(w.period.count());
        absl::uint128 debt = 0;
        if (has_state) {
          const auto debt_ns = detail::read_double(in, pos, std::uint64_t{1} << 52);
          const auto debt_frac = detail::read_double(in, pos, w.requests - 1);
          if (!debt_ns || !debt_frac) {
            return malformed();
          }
          if (absl::uint128(*debt_ns) >= elapsed) {
            debt = (absl::uint128(*debt_ns) - elapsed) * r + *debt_frac;
          }
        }
        scaled[i].burst = absl::uint128(w.burst) * period;
        if (debt > scaled[i].burst) {
          return malformed();
        }
        scaled[i].before = debt;
        scaled[i].after = debt + absl::uint128(item.cost) * period;
        if (scaled[i].after > scaled[i].burst) {
          admitted = false;
        }
      }
      every_item_admitted = every_item_admitted && admitted;

      Decision d;
      if (admitted) {
        // Binding: the least remaining after this request; ties go to the shorter period.
        std::optional<std::uint64_t> least;
        for (std::size_t i = 0; i < windows.size(); ++i) {
          const absl::uint128 period = static_cast<std::uint64_t>(windows[i].period.count());
          const auto remaining = absl::Uint128Low64((scaled[i].burst - scaled[i].after) / period);
          if (!least || remaining < *least) {
            least = remaining;
            d.binding_window = i;
          }
        }
        const std::size_t b = d.binding_window;
        d.reason = Reason::kAllowed;
        d.limit = windows[b].burst;
        d.remaining = *least;
        d.reset_after = std::chrono::nanoseconds(static_cast<std::int64_t>(
            absl::Uint128Low64(detail::ceil_div(scaled[b].after, windows[b].requests))));
      } else {
        // Binding: the first denying window; retry_after: the longest wait of any denying one.
        std::optional<std::size_t> binding;
        absl::uint128 retry = 0;
        for (std::size_t i = 0; i < windows.size(); ++i) {
          if (scaled[i].after <= scaled[i].burst) {
            continue;
          }
          if (!binding) {
            binding = i;
          }
          retry = std::max(
              retry, detail::ceil_div(scaled[i].after - scaled[i].burst, windows[i].requests));
        }
        const std::size_t b = *binding;
        const absl::uint128 period = static_cast<std::uint64_t>(windows[b].period.count());
        d.reason = Reason::kQuotaExceeded;
        d.binding_window = b;
        d.limit = windows[b].burst;
        d.remaining = absl::Uint128Low64((scaled[b].burst - scaled[b].before) / period);
        d.retry_after =
            std::chrono::nanoseconds(static_cast<std::int64_t>(absl::Uint128Low64(retry)));
        d.reset_after = std::chrono::nanoseconds(static_cast<std::int64_t>(
            absl::Uint128Low64(detail::ceil_div(scaled[b].before, windows[b].requests))));
      }
      decisions.push_back(d);
    }
    if (pos != in.size() || every_item_admitted != (*all_admitted == 1)) {
      return malformed();
    }
    return decisions;
  }

  const ClientOptions options_;
  detail::ConnectionPool pool_;
  std::string script_;
  std::string script_sha_;
};

inline absl::StatusOr<Limit> Limit::create(std::vector<Window> windows) {
  if (windows.empty()) {
    return absl::InvalidArgumentError("sluice::redis: a limit needs a window");
  }
  std::stable_sort(windows.begin(), windows.end(),
                   [](const Window& a, const Window& b) { return a.period < b.period; });
  std::string bytes;
  Limit limit;
  limit.max_cost_ = UINT64_MAX;
  for (Window& w : windows) {
    if (w.burst == 0) {
      w.burst = w.requests;
    }
    if (w.requests == 0 || w.requests > kMaxRequests) {
      return absl::InvalidArgumentError("sluice::redis: requests must be in 1..2^52-1");
    }
    if (w.period <= std::chrono::nanoseconds::zero()) {
      return absl::InvalidArgumentError("sluice::redis: period must be > 0");
    }
    const absl::uint128 refill = detail::ceil_div(
        absl::uint128(w.burst) * static_cast<std::uint64_t>(w.period.count()), w.requests);
    if (refill > static_cast<std::uint64_t>(kMaxRefill.count())) {
      return absl::InvalidArgumentError(
          "sluice::redis: burst * period / requests must be <= 2^52 ns (about 52 days)");
    }
    limit.max_cost_ = std::min(limit.max_cost_, w.burst);
    for (std::uint64_t v : {w.requests, static_cast<std::uint64_t>(w.period.count()), w.burst}) {
      for (int i = 0; i < 8; ++i) {
        bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
      }
    }
  }
  limit.fingerprint_ = XXH3_64bits(bytes.data(), bytes.size());
  limit.windows_ = std::move(windows);
  return limit;
}

// GCRA with stacked windows (SPEC S5) whose state lives in Redis; models sluice::RateLimiter.
// Copies share the client. Thread-safety: thread-safe.
class RedisGcraLimiter {
 public:
  // Connects lazily: creation succeeds while Redis is down; checks then report Unavailable.
  static absl::StatusOr<RedisGcraLimiter> create(std::vector<Window> windows,
                                                 ClientOptions options = {}) {
    absl::StatusOr<std::shared_ptr<Client>> client = Client::create(std::move(options));
    if (!client.ok()) {
      return client.status();
    }
    return create(std::move(windows), *std::move(client));
  }
  static absl::StatusOr<RedisGcraLimiter> create(std::vector<Window> windows,
                                                 std::shared_ptr<Client> client) {
    if (client == nullptr) {
      return absl::InvalidArgumentError("sluice::redis: null client");
    }
    absl::StatusOr<Limit> limit = Limit::create(std::move(windows));
    if (!limit.ok()) {
      return limit.status();
    }
    return RedisGcraLimiter(*std::move(limit), std::move(client));
  }

  // cost 0 peeks (reports availability, changes nothing); a cost above the smallest burst is
  // InvalidArgument. One round trip, bounded by the client's timeouts.
  absl::StatusOr<Decision> check(std::string_view key, std::uint64_t cost = 1) {
    const CheckItem item{.key = key, .limit = &limit_, .cost = cost};
    absl::StatusOr<std::vector<Decision>> d = client_->check_all(std::span(&item, 1));
    if (!d.ok()) {
      return d.status();
    }
    return (*d)[0];
  }

  // Testing hook: as check(), with the server's clock replaced by `unix_time` (ns since the
  // Unix epoch). Production code never calls it.
  absl::StatusOr<Decision> check_at_for_testing(std::string_view key, std::uint64_t cost,
                                                std::chrono::nanoseconds unix_time) {
    const CheckItem item{.key = key, .limit = &limit_, .cost = cost};
    absl::StatusOr<std::vector<Decision>> d =
        client_->check_all_at_for_testing(std::span(&item, 1), unix_time);
    if (!d.ok()) {
      return d.status();
    }
    return (*d)[0];
  }

  // Sorted shortest period first; Decision::binding_window indexes this.
  const std::vector<Window>& windows() const noexcept { return limit_.windows(); }
  const Limit& limit() const noexcept { return limit_; }
  const std::shared_ptr<Client>& client() const noexcept { return client_; }
  std::string redis_key(std::string_view key) const { return client_->redis_key(key, limit_); }

 private:
  RedisGcraLimiter(Limit limit, std::shared_ptr<Client> client)
      : limit_(std::move(limit)), client_(std::move(client)) {}

  Limit limit_;
  std::shared_ptr<Client> client_;
};

static_assert(sluice::RateLimiter<RedisGcraLimiter>);

// The policy engine's backend over Redis (models sluice::EngineBackend): one `Limit` per compiled
// rule, state in Redis, so every replica running the same config shares each rule's budget.
//
//   auto client = sluice::redis::Client::create({.connection = {.unix_socket = "/run/redis.sock"},
//                                                 .key_prefix = "rl:gw:", .key_seed = kSeed});
//   if (!client.ok()) return client.status();
//   auto engine = sluice::redis::RedisRateLimitEngine::create(config, {.client = *client});
//   sluice::Evaluation e = engine->evaluate(request);  // one round trip for the live rules
//
// A request's live rules cost one round trip: kAllOrNothing is one `Client::check_all` (one
// script call, atomic on a single node: a denied request consumes nothing in any rule);
// kEveryRule is one pipelined write of one script call per rule, each deciding alone. Dry-run
// rules, when a request has any, are a second round trip. Errors come back as the client's
// absl::Status (Unavailable, DeadlineExceeded, Internal); the engine then fails open or closed.
// An error in kEveryRule may come after some rules consumed (their replies were lost).
//
// Keys: the engine's key for a rule starts with a hash of the rule's fingerprint, and the Redis
// key is the client's digest of it under the rule's windows (`Client::redis_key`). So an
// unchanged rule maps to the same Redis key across a reload (its state simply stays in Redis;
// nothing is transferred) and a changed rule to a fresh one; old keys expire by themselves.
//
// Stats: `rule_store_stats` is all zeros: Redis holds the keys (count them there); the engine's
// per-rule allowed/denied counters work as with the in-memory backend.
// Thread-safety: `check_rules` may be called concurrently (the client is thread-safe), provided
// Options::time_for_testing, if set, is too.
class RedisEngineBackend {
 public:
  struct Options {
    std::shared_ptr<Client> client{};  // required; shared by every generation of the engine
    // Testing hook: when set, every script call decides at the returned time (ns since the Unix
    // epoch) instead of the server's TIME. Production code leaves it empty.
    std::function<std::chrono::nanoseconds()> time_for_testing{};
  };

  // InvalidArgument naming the rule's label when its windows are outside the script's exact
  // range (kMaxRequests, kMaxRefill), or when `options.client` is null. Connects lazily.
  static absl::StatusOr<RedisEngineBackend> create(std::span<const CompiledRule> rules,
                                                   const RedisEngineBackend* /*previous*/,
                                                   const Options& options) {
    if (options.client == nullptr) {
      return absl::InvalidArgumentError("sluice::redis: RedisEngineBackend needs a client");
    }
    RedisEngineBackend backend(options);
    backend.limits_.reserve(rules.size());
    for (const CompiledRule& rule : rules) {
      std::vector<Window> windows;
      windows.reserve(rule.windows.size());
      for (const GcraWindow& w : rule.windows) {
        windows.push_back({.requests = w.requests, .period = w.period, .burst = w.burst});
      }
      absl::StatusOr<Limit> limit = Limit::create(std::move(windows));
      if (!limit.ok()) {
        return absl::InvalidArgumentError(rule.label + ": " +
                                          std::string(limit.status().message()));
      }
      backend.limits_.push_back(*std::move(limit));
      backend.labels_.push_back(rule.label);
    }
    return backend;
  }

  absl::Status check_rules(std::span<const RuleKey> keys, std::uint64_t cost, ConsumptionMode mode,
                           std::span<Decision> out) {
    if (keys.empty()) {
      return absl::OkStatus();
    }
    absl::InlinedVector<CheckItem, 8> items;
    for (const RuleKey& k : keys) {
      const Limit& limit = limits_[k.rule];
      if (cost > limit.max_cost()) {  // before anything is sent: no rule consumes
        return absl::InvalidArgumentError(labels_[k.rule] +
                                          ": cost exceeds the smallest burst and can never pass");
      }
      items.push_back({.key = k.key, .limit = &limit, .cost = cost});
    }
    const std::optional<std::chrono::nanoseconds> time =
        options_.time_for_testing ? std::optional(options_.time_for_testing()) : std::nullopt;
    if (mode == ConsumptionMode::kEveryRule) {
      std::vector<absl::StatusOr<Decision>> decisions =
          time ? options_.client->check_pipelined_at_for_testing(items, *time)
               : options_.client->check_pipelined(items);
      for (std::size_t i = 0; i < decisions.size(); ++i) {
        if (!decisions[i].ok()) {
          return decisions[i].status();
        }
        out[i] = *decisions[i];
      }
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<Decision>> decisions =
        time ? options_.client->check_all_at_for_testing(items, *time)
             : options_.client->check_all(items);
    if (!decisions.ok()) {
      return decisions.status();
    }
    std::copy(decisions->begin(), decisions->end(), out.begin());
    return absl::OkStatus();
  }

  // Zeros: the keys live in Redis (see the class comment).
  StoreStats rule_store_stats(std::size_t /*rule*/) const { return {}; }

  // Rule `rule`'s limit (windows as compiled, shortest first).
  const Limit& limit(std::size_t rule) const { return limits_[rule]; }
  // The Redis key holding rule `rule`'s state for the engine key `key` (for operators and tests).
  std::string redis_key(std::size_t rule, std::string_view key) const {
    return options_.client->redis_key(key, limits_[rule]);
  }
  const std::shared_ptr<Client>& client() const noexcept { return options_.client; }

 private:
  explicit RedisEngineBackend(Options options) : options_(std::move(options)) {}

  Options options_;
  std::vector<Limit> limits_;        // per compiled rule
  std::vector<std::string> labels_;  // per compiled rule, for errors
};

static_assert(sluice::EngineBackend<RedisEngineBackend>);

// The policy engine with every rule's state in Redis (fleet-wide limits).
using RedisRateLimitEngine = sluice::BasicRateLimitEngine<RedisEngineBackend>;

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_HPP_
