// sluice/redis/attempt_limiter.hpp — the attempt limiter with its state in Redis (target
// sluice::redis), so every replica of a login service throttles a subject together.
//
// `RedisAttemptLimiter` answers exactly as the in-memory sluice::AttemptLimiter
// (sluice/attempt.hpp: one attempt in flight per subject, failures double the wait up to a cap,
// success clears, an unfinished attempt fails at its lease deadline, fenced receipts), with each
// subject's record in one Redis hash. Every operation is one round trip: one EVALSHA of a bundled
// Lua script (reloaded after NOSCRIPT) that reads the server's clock (TIME), so the fleet shares
// one clock (or ClientOptions::time_source's, when set: tests drive a sluice::ManualClock).
//
//   auto limiter = sluice::redis::RedisAttemptLimiter::create(
//       {.initial_delay = 1s, .delay_cap = 15min, .quiet_period = 24h, .lease = 30s},
//       {.connection = {.unix_socket = "/run/redis/redis.sock"},
//        .key_prefix = "login:", .key_seed = kFleetSecretSeed});
//   absl::StatusOr<sluice::AttemptDecision> d = limiter->begin(normalized_user_name);
//   if (!d.ok()) { /* Unavailable / DeadlineExceeded: fail closed for logins */ }
//
// Units: the policy must be whole microseconds (Redis TIME's resolution), each duration at most
// kMaxAttemptDuration, so the script's doubles stay exact integers. Decisions report
// nanoseconds. Keys: prefix + "{attempts}:" + 32 hex digits — a seeded XXH3-128 digest of the
// subject bound to the policy's fingerprint; Redis never sees the subject.
// Storage: failure state is never evicted to make room. Records carry no Redis TTL, so no
// volatile-* maxmemory policy (the rate limiters' volatile-ttl included) can evict them; the
// limiter expires them itself through an index (prefix + "{attempts}:index", a sorted set of
// when each record goes idle: just after its quiet period ends, never while an attempt is
// leased): every writing operation deletes up to 16 idle records. At most
// AttemptStoreOptions::max_records records exist per key prefix; a new subject beyond that is
// denied with kStoreFull (as the in-memory limiter's full store), subjects already tracked keep
// working. A server whose memory is full answers OOM: Unavailable, never an admission. A record
// that an earlier version kept at prefix + "{" + 32 hex + "}" (with a TTL) is read while the
// subject has no record and moved by its next write, so upgrading forgets no failure.
// Errors: Unavailable (connection refused or lost, server busy, loading, read-only),
// DeadlineExceeded (no reply within the command timeout, or no free connection), Internal (a
// reply of the wrong shape), FailedPrecondition (stale receipt), InvalidArgument. No retries.
// Operators: `inspect` reports what `begin` would answer without writing anything; `reset` forgets
// a subject (its attempt in flight, if any, ends and its receipt is stale).
// Thread-safety: thread-safe; copies share one client (its connection pools).
// Cluster: with ClientOptions::cluster every operation goes to the node of its subject's slot
// (all of a prefix's keys share the "{attempts}" hash tag, or the prefix's own), following
// redirections as every other Redis limiter does. Complexity: one round trip and
// O(log n) work on the server per operation (n records under the prefix).
#ifndef SLUICE_REDIS_ATTEMPT_LIMITER_HPP_
#define SLUICE_REDIS_ATTEMPT_LIMITER_HPP_

#include <hiredis/hiredis.h>

#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/attempt.hpp"
#include "sluice/key.hpp"
#include "sluice/redis/client.hpp"
#include "sluice/redis/detail/attempt_script.hpp"
#include "sluice/redis/detail/key_scheme.hpp"
#include "sluice/redis/detail/script_sha1.hpp"
#include "sluice/redis/detail/status.hpp"
#include "sluice/redis/detail/transport.hpp"
#include "sluice/redis/options.hpp"

namespace sluice::redis {

// The longest policy duration the Redis attempt limiter takes: 2^50 µs (about 35.7 years).
inline constexpr std::chrono::microseconds kMaxAttemptDuration{std::int64_t{1} << 50};

// The bound on the records one key prefix holds in Redis. Plain value.
struct AttemptStoreOptions {
  // Subjects with a record at once, over every attempt limiter sharing the key prefix; in
  // [1, 2^32]. A new subject beyond it is denied with kStoreFull. Size it for the subjects that
  // can be failing within one quiet period, and `maxmemory` for it (docs/attempts.md).
  std::uint64_t max_records = 100'000;
};

class RedisAttemptLimiter {
 public:
  // InvalidArgument for an invalid policy, a duration that is not whole microseconds or above
  // kMaxAttemptDuration, max_records outside [1, 2^32], a key prefix whose first '{' is directly
  // followed by '}' (an empty hash tag: the records would not share one slot), or invalid
  // connection options; FailedPrecondition, naming the fix, for a server that fails the server
  // check (as Client::verify_server). Creation succeeds while Redis cannot be reached (operations
  // then report Unavailable); the server is checked when a connection first opens.
  static absl::StatusOr<RedisAttemptLimiter> create(AttemptPolicy policy,
                                                    ClientOptions options = {},
                                                    AttemptStoreOptions store = {}) {
    if (absl::Status s = policy.validate(); !s.ok()) return s;
    for (auto [name, d] :
         {std::pair{"initial_delay", policy.initial_delay},
          std::pair{"delay_cap", policy.delay_cap}, std::pair{"quiet_period", policy.quiet_period},
          std::pair{"lease", policy.lease}}) {
      if (d.count() % 1000 != 0 || d > kMaxAttemptDuration) {
        return absl::InvalidArgumentError(
            absl::StrCat("sluice::redis: attempt policy ", name,
                         " must be whole microseconds and at most 2^50 us, got ", d.count(), "ns"));
      }
    }
    if (absl::Status s = validate(options.key_prefix, store); !s.ok()) return s;
    // The client: the options validated and the server checked exactly as for every other Redis
    // limiter, and the one call path (a lone server or a Cluster) every operation goes through.
    absl::StatusOr<std::shared_ptr<Client>> client = Client::create(std::move(options));
    if (!client.ok()) return client.status();
    return RedisAttemptLimiter(policy, *std::move(client), store);
  }

  // As AttemptLimiter::begin; errors as in the file comment.
  absl::StatusOr<AttemptDecision> begin(std::string_view subject) {
    return begin_at(subject, now());
  }
  // As AttemptLimiter::succeed / fail / abandon: OK, FailedPrecondition for a stale receipt,
  // InvalidArgument for an invalid one, or the backend's error.
  absl::Status succeed(const AttemptReceipt& receipt) { return complete(receipt, "s", now()); }
  absl::Status fail(const AttemptReceipt& receipt) { return complete(receipt, "f", now()); }
  absl::Status abandon(const AttemptReceipt& receipt) { return complete(receipt, "f", now()); }

  // --- Operators: inspect and reset one subject; errors as in the file comment.

  // As AttemptLimiter::inspect: what `begin` would answer now (reason, retry_after, failures;
  // an invalid receipt), decided at the server's TIME (clamped like begin's), without writing:
  // no attempt, no lease, no key created, no expiry extended. Never kStoreFull.
  absl::StatusOr<AttemptDecision> inspect(std::string_view subject) {
    return inspect_at(subject, now());
  }
  // As AttemptLimiter::reset: the next `begin` is decided as for a subject never seen; a receipt
  // of the attempt in flight is stale from now on. The record is rewritten as after a success and
  // expires within a millisecond; an absent key stays absent.
  absl::Status reset(std::string_view subject) { return reset_at(subject, now()); }

  // The Redis key holding `subject`'s record (for operators and tests; no raw subject bytes).
  std::string redis_key(std::string_view subject) const { return key_of(digest(subject)); }
  // Where versions before the index kept `subject`'s record, with a TTL: prefix + "{" + 32 hex
  // digits + "}". A record found there is adopted (moved to redis_key) by its next write.
  std::string legacy_redis_key(std::string_view subject) const {
    return legacy_key_of(digest(subject));
  }
  // The sorted set indexing every record under the key prefix by when it goes idle; ZCARD of it
  // is the number of records the bound counts.
  std::string index_key() const { return absl::StrCat(prefix(), kTag, "index"); }
  const AttemptStoreOptions& store_options() const noexcept { return shared_->store; }
  const AttemptPolicy& policy() const noexcept { return shared_->policy; }
  // SHA-1 of the script body, as EVALSHA names it.
  const std::string& script_sha() const noexcept { return shared_->sha; }

 private:
  // Every key of the limiter carries this hash tag after the prefix: a record, the index, and the
  // records a sweep deletes all live in one Cluster slot.
  static constexpr char kTag[] = "{attempts}:";

  static absl::Status validate(std::string_view prefix, const AttemptStoreOptions& store) {
    if (store.max_records < 1 || store.max_records > (std::uint64_t{1} << 32)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sluice::redis: attempt max_records must be in [1, 2^32], got ", store.max_records));
    }
    if (const std::size_t open = prefix.find('{');
        open != std::string_view::npos && prefix.substr(open, 2) == "{}") {
      return absl::InvalidArgumentError(
          "sluice::redis: the attempt limiter's key_prefix holds an empty hash tag '{}', which "
          "would spread its keys over Cluster slots; remove the braces or put a name in them");
    }
    return absl::OkStatus();
  }

  struct Shared {
    Shared(const AttemptPolicy& p, std::shared_ptr<Client> c, const AttemptStoreOptions& s)
        : policy(p),
          client(std::move(c)),
          store(s),
          sha(detail::sha1_hex(detail::kAttemptScript)),
          seed(detail::bound_seed(p.fingerprint(), client->options().key_seed)) {}
    const AttemptPolicy policy;
    const std::shared_ptr<Client> client;
    const AttemptStoreOptions store;
    const std::string sha;
    const std::uint64_t seed;  // the key seed bound to the policy's fingerprint
  };

  RedisAttemptLimiter(const AttemptPolicy& policy, std::shared_ptr<Client> client,
                      const AttemptStoreOptions& store)
      : shared_(std::make_shared<Shared>(policy, std::move(client), store)) {}

  const std::string& prefix() const noexcept { return shared_->client->options().key_prefix; }

  // The client's time (ClientOptions::time_source) in the script's whole microseconds, or
  // nullopt for the server's TIME.
  std::optional<std::chrono::microseconds> now() const {
    const std::optional<std::chrono::nanoseconds> t = shared_->client->now();
    if (!t) return std::nullopt;
    return std::chrono::floor<std::chrono::microseconds>(*t);
  }

  KeyDigest digest(std::string_view subject) const {
    return detail::key_digest(subject, shared_->seed);
  }
  std::string key_of(const KeyDigest& d) const {
    return detail::tagged_key_name(prefix(), kTag, d);
  }
  // Where earlier versions kept the record (with a TTL); the script adopts what it finds there.
  std::string legacy_key_of(const KeyDigest& d) const { return detail::slot_key_name(prefix(), d); }

  static std::string micros(std::int64_t ns) { return absl::StrCat(ns / 1000); }

  // One EVALSHA through the client's call path (sluice/redis/detail/transport.hpp: NOSCRIPT
  // repaired, Cluster routing and redirections, connection health). Returns the reply or the
  // transport / server error.
  absl::StatusOr<detail::ReplyPtr> call(const KeyDigest& d, std::string_view op,
                                        std::uint64_t token, std::int64_t started_ns,
                                        std::optional<std::chrono::microseconds> time) {
    const AttemptPolicy& p = shared_->policy;
    detail::Transport& transport = shared_->client->transport();
    const std::string record = key_of(d);
    std::string legacy = legacy_key_of(d);
    // Versions that kept legacy records never ran on a Cluster: when the legacy key is in
    // another slot (no hash tag in the prefix), name an absent key of the record's slot instead.
    if (transport.cluster() && detail::key_slot(legacy) != detail::key_slot(record)) {
      legacy = absl::StrCat(prefix(), kTag, "no-legacy-record");
    }
    // EVALSHA sha 3 record index legacy op token started initial cap quiet lease time
    // max_records sweep (see attempt_script.hpp).
    const std::array<std::string, 16> args = {"EVALSHA",
                                              shared_->sha,
                                              "3",
                                              record,
                                              index_key(),
                                              legacy,
                                              std::string(op),
                                              absl::StrCat(token),
                                              micros(started_ns),
                                              micros(p.initial_delay.count()),
                                              micros(p.delay_cap.count()),
                                              micros(p.quiet_period.count()),
                                              micros(p.lease.count()),
                                              time ? absl::StrCat(time->count()) : std::string(),
                                              absl::StrCat(shared_->store.max_records),
                                              absl::StrCat(detail::kAttemptSweep)};
    detail::Transport::Call c{
        .slot = transport.slot_of(record), .script = detail::kAttemptScript, .sha = shared_->sha};
    for (const std::string& arg : args) c.command.add(arg);
    transport.call(std::span(&c, 1), std::chrono::steady_clock::now() +
                                         shared_->client->options().connection.command_timeout);
    if (!c.reply.ok()) return c.reply.status();
    const redisReply& reply = **c.reply;
    if (reply.type == REDIS_REPLY_ERROR) {
      return detail::server_error_status(std::string_view(reply.str, reply.len));
    }
    return std::move(c.reply);
  }

  // The reply's integers when it is an array of `n` integers, each ≥ 0; else nullopt.
  template <std::size_t N>
  static std::optional<std::array<std::int64_t, N>> integers(const redisReply& reply) {
    if (reply.type != REDIS_REPLY_ARRAY || reply.elements != N) return std::nullopt;
    std::array<std::int64_t, N> out{};
    for (std::size_t i = 0; i < N; ++i) {
      const redisReply& e = *reply.element[i];
      if (e.type != REDIS_REPLY_INTEGER || e.integer < 0) return std::nullopt;
      out[i] = e.integer;
    }
    return out;
  }

  static absl::Status malformed() {
    return absl::InternalError("sluice::redis: attempt script reply of unexpected shape");
  }

  // Every time and wait in a reply is below 2^53 µs.
  static constexpr std::int64_t kMaxMicros = std::int64_t{1} << 53;

  // A {code, wait, failures} reply: 1 another attempt is active, 2 backoff, 3 the store is full
  // (with 0 failures), each with a wait ≥ 1 µs; from inspect also 0, where begin would admit,
  // with wait 0.
  static absl::StatusOr<AttemptDecision> state_of(const redisReply& reply) {
    auto state = integers<3>(reply);
    if (!state) return malformed();
    const auto [code, wait, failures] = *state;
    if (code > 3 || (code == 0) != (wait == 0) || wait >= kMaxMicros ||
        static_cast<std::uint64_t>(failures) > kMaxAttemptFailures ||
        (code == 3 && failures != 0)) {
      return malformed();
    }
    constexpr AttemptReason kReasons[] = {AttemptReason::kAdmitted, AttemptReason::kAttemptActive,
                                          AttemptReason::kBackoff, AttemptReason::kStoreFull};
    return AttemptDecision{.reason = kReasons[code],
                           .retry_after = std::chrono::microseconds{wait},
                           .failures = static_cast<std::uint64_t>(failures)};
  }

  absl::StatusOr<AttemptDecision> begin_at(std::string_view subject,
                                           std::optional<std::chrono::microseconds> time) {
    const KeyDigest d = digest(subject);
    absl::StatusOr<detail::ReplyPtr> reply = call(d, "b", 0, 0, time);
    if (!reply.ok()) return reply.status();
    if (auto admitted = integers<4>(**reply)) {
      const auto [code, token, started, failures] = *admitted;
      if (code != 0 || token < 1 || started >= kMaxMicros ||
          static_cast<std::uint64_t>(failures) > kMaxAttemptFailures) {
        return malformed();
      }
      return AttemptDecision{
          .reason = AttemptReason::kAdmitted,
          .receipt = AttemptReceipt(d, static_cast<std::uint64_t>(token), started * 1000),
          .failures = static_cast<std::uint64_t>(failures)};
    }
    absl::StatusOr<AttemptDecision> denied = state_of(**reply);
    if (denied.ok() && denied->admitted()) return malformed();  // begin admits with a receipt
    return denied;
  }

  absl::StatusOr<AttemptDecision> inspect_at(std::string_view subject,
                                             std::optional<std::chrono::microseconds> time) {
    absl::StatusOr<detail::ReplyPtr> reply = call(digest(subject), "i", 0, 0, time);
    if (!reply.ok()) return reply.status();
    absl::StatusOr<AttemptDecision> state = state_of(**reply);
    if (state.ok() && state->reason == AttemptReason::kStoreFull) return malformed();
    return state;
  }

  absl::Status reset_at(std::string_view subject, std::optional<std::chrono::microseconds> time) {
    absl::StatusOr<detail::ReplyPtr> reply = call(digest(subject), "r", 0, 0, time);
    if (!reply.ok()) return reply.status();
    const auto result = integers<1>(**reply);
    if (!result || (*result)[0] != 0) return malformed();
    return absl::OkStatus();
  }

  absl::Status complete(const AttemptReceipt& receipt, std::string_view op,
                        std::optional<std::chrono::microseconds> time) {
    if (!receipt.valid()) return absl::InvalidArgumentError("attempt receipt is not valid");
    absl::StatusOr<detail::ReplyPtr> reply =
        call(receipt.subject_, op, receipt.token_, receipt.started_, time);
    if (!reply.ok()) return reply.status();
    const auto result = integers<1>(**reply);
    if (!result || ((*result)[0] != 0 && (*result)[0] != 3)) return malformed();
    if ((*result)[0] == 3) {
      return sluice::detail::stale_attempt_receipt();
    }
    return absl::OkStatus();
  }

  std::shared_ptr<Shared> shared_;
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_ATTEMPT_LIMITER_HPP_
