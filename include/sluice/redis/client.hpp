// sluice/redis/client.hpp — the connection to one Redis deployment that every check goes through.
//
// A `Client` owns the connection pool, the bundled script and the key scheme, and evaluates
// checks: one script call decides many (key, limit, cost) items at once. Create one per Redis
// deployment and share it (`std::shared_ptr`) between limiters and engine generations.
//
//   auto client = sluice::redis::Client::create({.connection = {.unix_socket = "/run/redis.sock"},
//                                                 .key_prefix = "rl:api:", .key_seed = kSeed});
//   if (!client.ok()) return client.status();  // InvalidArgument: bad options
//   const sluice::redis::CheckItem items[] = {{.key = ip, .limit = &per_ip},
//                                             {.key = user, .limit = &per_user}};
//   absl::StatusOr<std::vector<sluice::Decision>> d = (*client)->check_all(items);  // atomic
//
// Units: durations are integer nanoseconds; the clock is the Redis server's `TIME` (one clock
// for the whole fleet). Keys are bytes; Redis only ever sees prefix + "{" + 32 hex digits of a
// seeded XXH3-128 digest + "}" (a Cluster hash tag), never the key itself.
// Errors: InvalidArgument (bad cost), Unavailable (connection refused or lost, server busy,
// loading or read-only), DeadlineExceeded (no reply within the command timeout, or no free
// connection), Internal (a reply of the wrong shape). Never a silent allow; a command that may
// have reached the server is never sent again.
// Thread-safety: thread-safe, except `replace_script_for_testing`.
#ifndef SLUICE_REDIS_CLIENT_HPP_
#define SLUICE_REDIS_CLIENT_HPP_

#include <hiredis/hiredis.h>

#include <chrono>
#include <cstddef>
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
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/decision.hpp"
#include "sluice/detail/xxhash.hpp"
#include "sluice/redis/detail/booking_script.hpp"
#include "sluice/redis/detail/command.hpp"
#include "sluice/redis/detail/connection_pool.hpp"
#include "sluice/redis/detail/script_call.hpp"
#include "sluice/redis/detail/script_reply.hpp"
#include "sluice/redis/detail/script_sha1.hpp"
#include "sluice/redis/detail/status.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/redis/options.hpp"
#include "sluice/redis/script.hpp"

namespace sluice::redis {

class Client {
 public:
  // InvalidArgument for max_connections 0, a timeout ≤ 0, or a TCP port outside 1..65535.
  // Connects lazily: creation succeeds while Redis is down.
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

  // Booking checks (for settling a cost later, as RedisRateLimitEngine's settlements do): as
  // check_all and check_pipelined at the server's TIME (or at `time`, ns since the Unix epoch,
  // for tests), and each also fills `bookings` with one entry per item: the TATs the item left
  // and its key's reset count. An entry is meaningful only for an item that was admitted.
  absl::StatusOr<std::vector<Decision>> check_all_booking(
      std::span<const CheckItem> items, std::optional<std::chrono::nanoseconds> time,
      std::vector<detail::ItemBooking>& bookings) {
    bookings.clear();
    return run(items, time, &bookings);
  }
  std::vector<absl::StatusOr<Decision>> check_pipelined_booking(
      std::span<const CheckItem> items, std::optional<std::chrono::nanoseconds> time,
      std::vector<detail::ItemBooking>& bookings) {
    bookings.assign(items.size(), {});
    return run_pipelined(items, time, &bookings);
  }

  // Deletes `key`'s state under `limit` (one script call, one round trip): its next check sees
  // every window full, as for a key never seen. If the state held bookings, a marker key beside
  // it (`redis_key(...) + ":reset"`, same hash slot) records the reset until they would all have
  // been paid off, so that reservations and receipts from before it give nothing back. OK
  // whether or not the key had state; Unavailable or DeadlineExceeded as a check; a server error
  // reply becomes its status.
  absl::Status reset(std::string_view key, const Limit& limit,
                     std::optional<std::chrono::nanoseconds> time = std::nullopt) {
    const std::string name = redis_key(key, limit);
    std::vector<std::string> args = {name, absl::StrCat(name, ":reset"), "x", "", "", "", ""};
    if (time) set_time_args(*time, args[4], args[5]);
    absl::StatusOr<detail::ReplyPtr> reply = run_booking(args);
    if (!reply.ok()) {
      return reply.status();
    }
    if ((*reply)->type != REDIS_REPLY_ARRAY) {
      return absl::InternalError("sluice::redis: reset returned an unexpected reply");
    }
    return absl::OkStatus();
  }

  // One call of the booking script (sluice/redis/detail/booking_script.hpp) with `args` after
  // its key count: loads the script after a NOSCRIPT and closes a connection whose reply says it
  // is the wrong server. A server error reply becomes its status. For RedisGcraLimiter.
  absl::StatusOr<detail::ReplyPtr> run_booking(std::span<const std::string> args) {
    detail::Command command;
    command.add("EVALSHA");
    command.add(booking_sha_);
    command.add("2");
    for (const std::string& arg : args) command.add(arg);
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
      detail::Command load;
      load.add("SCRIPT");
      load.add("LOAD");
      load.add(detail::kBookingScript);
      const detail::Command both[] = {load, command};
      replies = detail::exchange(*lease, both);
      if (!replies.ok()) {
        return replies.status();
      }
      reply = std::move((*replies)[1]);
    }
    if (needs_new_connection(*reply)) {
      lease->mark_broken();
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      return detail::server_error_status(std::string_view(reply->str, reply->len));
    }
    return reply;
  }

  // A test-only time (ns since the Unix epoch, ≥ 0) as the scripts' (seconds, ns) arguments.
  static void set_time_args(std::chrono::nanoseconds time, std::string& s, std::string& ns) {
    const auto t = static_cast<std::uint64_t>(time.count());
    s = absl::StrCat(t / detail::kNanosPerSecond);
    ns = absl::StrCat(t % detail::kNanosPerSecond);
  }

  // The Redis key holding `key`'s state under `limit` (for operators; contains no raw key bytes).
  std::string redis_key(std::string_view key, const Limit& limit) const {
    unsigned char fingerprint[8];  // little-endian: seeds the digest with the limit's windows
    for (int i = 0; i < 8; ++i) {
      fingerprint[i] = static_cast<unsigned char>(limit.fingerprint_ >> (8 * i));
    }
    const XXH64_hash_t seed =
        XXH3_64bits_withSeed(fingerprint, sizeof fingerprint, options_.key_seed);
    XXH128_canonical_t digest;  // big-endian: high half first
    XXH128_canonicalFromHash(&digest, XXH3_128bits_withSeed(key.data(), key.size(), seed));
    const absl::string_view bytes(reinterpret_cast<const char*>(digest.digest),
                                  sizeof digest.digest);
    return absl::StrCat(options_.key_prefix, "{", absl::BytesToHexString(bytes), "}");
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
    script_sha_ = detail::sha1_hex(script_);
  }
  detail::ConnectionPool& pool_for_testing() noexcept { return pool_; }

 private:
  explicit Client(ClientOptions options)
      : options_(std::move(options)),
        pool_(options_.connection),
        script_(kGcraScript),
        script_sha_(detail::sha1_hex(script_)),
        booking_sha_(detail::sha1_hex(detail::kBookingScript)) {}

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

  // The script call for `items`; a booking check (`marked`) also names each key's reset marker.
  detail::ScriptCall make_call(std::span<const CheckItem> items,
                               std::optional<std::chrono::nanoseconds> time, bool marked) const {
    std::vector<std::string> keys;
    keys.reserve(marked ? 2 * items.size() : items.size());
    for (const CheckItem& item : items) {
      keys.push_back(redis_key(item.key, *item.limit));
    }
    if (marked) {
      for (std::size_t i = 0; i < items.size(); ++i)
        keys.push_back(absl::StrCat(keys[i], ":reset"));
    }
    return detail::ScriptCall::create(items, std::move(keys), time);
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

  // The reply to `command` once the server has the script: a NOSCRIPT is repaired on the same
  // connection (load, then retry). Closes the connection when the reply says the server is the
  // wrong one; the reply itself still becomes the caller's status.
  absl::StatusOr<detail::ReplyPtr> settle(detail::ConnectionPool::Lease& lease,
                                          detail::ReplyPtr reply, const detail::Command& command) {
    if (is_noscript(*reply)) {
      if (lease.get() == nullptr) {  // closed after an earlier reply of the same pipeline
        return absl::UnavailableError("sluice::redis: connection lost");
      }
      absl::StatusOr<detail::ReplyPtr> retried = reload_and_retry(lease, command);
      if (!retried.ok()) {
        return retried.status();
      }
      reply = std::move(*retried);
    }
    if (needs_new_connection(*reply)) {
      lease.mark_broken();
    }
    return reply;
  }

  absl::StatusOr<std::vector<Decision>> run(std::span<const CheckItem> items,
                                            std::optional<std::chrono::nanoseconds> time,
                                            std::vector<detail::ItemBooking>* bookings = nullptr) {
    if (absl::Status status = validate(items); !status.ok()) {
      return status;
    }
    const detail::ScriptCall call = make_call(items, time, bookings != nullptr);
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
    absl::StatusOr<detail::ReplyPtr> reply = settle(*lease, std::move((*replies)[0]), command);
    if (!reply.ok()) {
      return reply.status();
    }
    return detail::decode_reply(items, **reply, bookings);
  }

  // `bookings`, when set, has one entry per item, filled for each item decided.
  std::vector<absl::StatusOr<Decision>> run_pipelined(
      std::span<const CheckItem> items, std::optional<std::chrono::nanoseconds> time,
      std::vector<detail::ItemBooking>* bookings = nullptr) {
    std::vector<absl::StatusOr<Decision>> results(items.size(),
                                                  absl::UnknownError("sluice::redis: not run"));
    std::vector<detail::ScriptCall> calls;
    std::vector<std::size_t> sent;  // index into items of each call
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (absl::Status status = validate(items.subspan(i, 1)); !status.ok()) {
        results[i] = status;
        continue;
      }
      calls.push_back(make_call(items.subspan(i, 1), time, bookings != nullptr));
      sent.push_back(i);
    }
    if (calls.empty()) {
      return results;
    }
    std::vector<detail::Command> commands;
    commands.reserve(calls.size());
    for (const detail::ScriptCall& call : calls) {
      commands.push_back(call.evalsha(script_sha_));
    }
    absl::StatusOr<detail::ConnectionPool::Lease> lease = pool_.acquire();
    absl::StatusOr<std::vector<detail::ReplyPtr>> replies =
        lease.ok() ? detail::exchange(*lease, commands) : lease.status();
    if (!replies.ok()) {
      for (std::size_t i : sent) {
        results[i] = replies.status();
      }
      return results;
    }
    decode_each(*lease, items, sent, commands, *replies, results, bookings);
    return results;
  }

  // Decodes the pipelined reply k (to commands[k], for items[sent[k]]) into results[sent[k]].
  // Replies lost with the connection (a failed reload) become Unavailable.
  void decode_each(detail::ConnectionPool::Lease& lease, std::span<const CheckItem> items,
                   std::span<const std::size_t> sent, std::span<const detail::Command> commands,
                   std::vector<detail::ReplyPtr>& replies,
                   std::vector<absl::StatusOr<Decision>>& results,
                   std::vector<detail::ItemBooking>* bookings) {
    for (std::size_t k = 0; k < sent.size(); ++k) {
      absl::StatusOr<detail::ReplyPtr> reply = settle(lease, std::move(replies[k]), commands[k]);
      if (!reply.ok()) {
        results[sent[k]] = reply.status();
        if (lease.get() == nullptr) {
          break;  // connection lost: the rest stay unknown, reported below
        }
        continue;
      }
      std::vector<detail::ItemBooking> booked;
      absl::StatusOr<std::vector<Decision>> one = detail::decode_reply(
          items.subspan(sent[k], 1), **reply, bookings != nullptr ? &booked : nullptr);
      if (one.ok() && bookings != nullptr) (*bookings)[sent[k]] = std::move(booked[0]);
      results[sent[k]] =
          one.ok() ? absl::StatusOr<Decision>((*one)[0]) : absl::StatusOr<Decision>(one.status());
    }
    for (std::size_t i : sent) {
      if (results[i].status().code() == absl::StatusCode::kUnknown) {
        results[i] = absl::UnavailableError("sluice::redis: connection lost");
      }
    }
  }

  const ClientOptions options_;
  detail::ConnectionPool pool_;
  std::string script_;
  std::string script_sha_;
  std::string booking_sha_;
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_CLIENT_HPP_
