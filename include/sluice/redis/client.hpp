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
// connection), Internal (a reply of the wrong shape), FailedPrecondition (a server that fails the
// server check — too old, the other Cluster mode, unsafe memory settings — found at creation, or
// on a connection opened later). Never a silent allow; a command that may have reached the server
// is never sent again.
// Cluster: with ClientOptions::cluster, the client reads the slot map from the node it is given,
// keeps one pool per primary, sends each key's calls to its slot's node, and follows MOVED, ASK
// and TRYAGAIN (replies after which the command did not run) by the same deadline.
// Coalescing: concurrent single-key checks (`check`, what RedisGcraLimiter::check runs) to one
// node share script calls while max_coalesced_calls are in flight (ClientOptions::coalesce),
// each still decided on its own.
// Thread-safety: thread-safe, except the `replace_*_for_testing` hooks.
#ifndef SLUICE_REDIS_CLIENT_HPP_
#define SLUICE_REDIS_CLIENT_HPP_

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
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
#include "absl/strings/str_cat.h"
#include "sluice/decision.hpp"
#include "sluice/redis/detail/booking_args.hpp"
#include "sluice/redis/detail/booking_script.hpp"
#include "sluice/redis/detail/carry.hpp"
#include "sluice/redis/detail/cluster.hpp"
#include "sluice/redis/detail/coalescer.hpp"
#include "sluice/redis/detail/command.hpp"
#include "sluice/redis/detail/connection_pool.hpp"
#include "sluice/redis/detail/key_scheme.hpp"
#include "sluice/redis/detail/script_call.hpp"
#include "sluice/redis/detail/script_reply.hpp"
#include "sluice/redis/detail/script_sha1.hpp"
#include "sluice/redis/detail/status.hpp"
#include "sluice/redis/detail/transport.hpp"
#include "sluice/redis/limit.hpp"
#include "sluice/redis/options.hpp"
#include "sluice/redis/script.hpp"

namespace sluice::redis {

class Client {
 public:
  // InvalidArgument for max_connections 0, a timeout ≤ 0, a TCP port outside 1..65535, or
  // max_coalesced_checks or max_coalesced_calls outside 1..1000. FailedPrecondition, naming the
  // fix, for a server that cannot hold the limits (verify_server). Creation succeeds while Redis
  // cannot be reached: the server is then checked when a connection first opens.
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
    if (options.cluster && !c.unix_socket.empty()) {
      return absl::InvalidArgumentError(
          "sluice::redis: a Cluster is reached over TCP: set connection.host and port, not "
          "unix_socket");
    }
    if (options.max_coalesced_checks == 0 || options.max_coalesced_checks > 1000) {
      return absl::InvalidArgumentError("sluice::redis: max_coalesced_checks must be in 1..1000");
    }
    if (options.max_coalesced_calls == 0 || options.max_coalesced_calls > 1000) {
      return absl::InvalidArgumentError("sluice::redis: max_coalesced_calls must be in 1..1000");
    }
    std::shared_ptr<Client> client(new Client(std::move(options)));
    if (absl::Status verdict = client->verify_server(); !verdict.ok()) return verdict;
    return client;
  }

  // Checks the server (its version, Cluster mode against ClientOptions::cluster, and memory
  // settings against ConnectionOptions::memory_check; see docs/redis.md) on one connection, by
  // command_timeout: FailedPrecondition, naming the fix, when it fails. OK when it passed, and OK
  // when the server cannot be reached now (it is then checked on the first connection that
  // opens, and every check fails until it passes). After a pass it returns at once. In a Cluster
  // the node `connection` names is checked here, every other node when first connected.
  absl::Status verify_server() { return transport_.verify_server(options_.connection, deadline()); }

  // Evaluates every item in one script call: if every item is admitted, every item's cost is
  // reserved; if any is denied, nothing changes anywhere. Returns one decision per item: what a
  // lone check of that item would have answered (an item repeated in the batch sees the
  // earlier occurrences' reservation). In a Cluster (ClientOptions::cluster), items of several
  // slots are decided per slot, the nodes in parallel, and the costs the admitting slots booked
  // are given back when another slot denies, by the same one deadline (docs/redis.md, "Redis
  // Cluster"; a give-back it leaves no time for keeps its cost: give_backs_lost()).
  // InvalidArgument when a cost exceeds its limit's max_cost().
  absl::StatusOr<std::vector<Decision>> check_all(std::span<const CheckItem> items) {
    return run(items, now(), deadline());
  }

  // check_all, except that when any item is denied (so nothing was reserved), each admitted
  // item's Decision is what a cost-0 check of it would answer from the same state at the same
  // time (its limit as it stands), recomputed here from the reply: still one script call, and no
  // extra work on the server. An item whose key an earlier item of the batch names reports the
  // key's state before the call. In a Cluster, a slot that admitted reports its state before it
  // booked (what its give-back restores), at its node's time.
  absl::StatusOr<std::vector<Decision>> check_all_as_they_stand(std::span<const CheckItem> items) {
    std::vector<Decision> standing;
    absl::StatusOr<std::vector<Decision>> d = run(items, now(), deadline(), nullptr, &standing);
    if (!d.ok() ||
        std::all_of(d->begin(), d->end(), [](const Decision& x) { return x.allowed(); })) {
      return d;
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (!(*d)[i].allowed()) continue;
      std::size_t first = 0;  // the item that read the key's state before the call
      while (items[first].key != items[i].key ||
             items[first].limit->fingerprint_ != items[i].limit->fingerprint_) {
        ++first;
      }
      (*d)[i] = standing[first];
    }
    return d;
  }

  // Independent checks, pipelined on one connection: one write, one reply per item, not atomic
  // as a group. For callers with many unrelated keys at once.
  std::vector<absl::StatusOr<Decision>> check_pipelined(std::span<const CheckItem> items) {
    return run_pipelined(items, now(), deadline());
  }

  // One single-key check, decided exactly as check_all of the one item. With options().coalesce
  // (on one node), checks that start while options().max_coalesced_calls calls are in flight
  // queue and share one script call (sluice/redis/detail/coalescer.hpp); a check that finds fewer
  // in flight is sent at once. One deadline from its start (command_timeout) covers the queue
  // too: a check still queued at its deadline is DeadlineExceeded and consumed nothing; one whose
  // call was sent but whose reply was lost may have been counted, as any check whose reply is
  // lost.
  absl::StatusOr<Decision> check(const CheckItem& item) { return check_one(item, now()); }
  // Checks that went out in one script call together with at least one other check.
  std::uint64_t coalesced_checks() const { return coalescer_.coalesced_checks(); }
  // The most coalescing script calls that were in flight at once (≤ max_coalesced_calls).
  std::size_t peak_coalesced_calls() const { return coalescer_.peak_in_flight(); }
  // Cluster: items whose cost an admitting slot booked and check_all could not give back when
  // another slot denied or failed — the check's deadline passed first, or the give-back failed.
  // Each stays taken until its windows drain (the limit is never exceeded for it).
  std::uint64_t give_backs_lost() const { return give_backs_lost_.load(std::memory_order_relaxed); }

  // Booking checks (for settling a cost later, as RedisRateLimitEngine's settlements do): as
  // check_all and check_pipelined, and each also fills `bookings` with one entry per item: the
  // TATs the item left and its key's reset count. An entry is meaningful only for an item that
  // was admitted.
  absl::StatusOr<std::vector<Decision>> check_all_booking(
      std::span<const CheckItem> items, std::vector<detail::ItemBooking>& bookings) {
    bookings.clear();
    return run(items, now(), deadline(), &bookings);
  }
  std::vector<absl::StatusOr<Decision>> check_pipelined_booking(
      std::span<const CheckItem> items, std::vector<detail::ItemBooking>& bookings) {
    bookings.assign(items.size(), {});
    return run_pipelined(items, now(), deadline(), &bookings);
  }

  // Deletes `key`'s state under `limit` (one script call, one round trip): its next check sees
  // every window full, as for a key never seen. If the state held bookings, a marker key beside
  // it (`redis_key(...) + ":reset"`, same hash slot) records the reset until they would all have
  // been paid off, so that reservations and receipts from before it give nothing back. OK
  // whether or not the key had state; Unavailable or DeadlineExceeded as a check; a server error
  // reply becomes its status.
  absl::Status reset(std::string_view key, const Limit& limit) {
    const std::string name = redis_key(key, limit);
    std::vector<std::string> args = {name, absl::StrCat(name, ":reset"), "x", "", "", "", ""};
    if (const auto time = now()) set_time_args(*time, args[3], args[4]);
    absl::StatusOr<detail::ReplyPtr> reply = run_booking(std::move(args));
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
  absl::StatusOr<detail::ReplyPtr> run_booking(std::vector<std::string> args) {
    return std::move(run_bookings(std::span(&args, 1), deadline())[0]);
  }
  // run_booking for every element of `each`, sent together (pipelined, the nodes of a Cluster in
  // parallel) and all answered by `deadline`: each reply or its error, in order. For the bookings
  // of one settlement, which one deadline bounds.
  std::vector<absl::StatusOr<detail::ReplyPtr>> run_bookings(
      std::span<const std::vector<std::string>> each, detail::Deadline deadline) {
    std::vector<Call> calls;
    calls.reserve(each.size());
    for (const std::vector<std::string>& args : each) {
      Call& call = calls.emplace_back(Call{
          .slot = transport_.slot_of(args[0]), .script = booking_script_, .sha = booking_sha_});
      call.command.add("EVALSHA");
      call.command.add(booking_sha_);
      call.command.add("2");
      for (const std::string& arg : args) call.command.add(arg);
    }
    transport_.call(std::span(calls), deadline);
    std::vector<absl::StatusOr<detail::ReplyPtr>> replies;
    for (Call& call : calls) {  // a server error reply as its status
      const redisReply* r = call.reply.ok() ? call.reply->get() : nullptr;
      replies.push_back(r != nullptr && r->type == REDIS_REPLY_ERROR
                            ? detail::server_error_status(std::string_view(r->str, r->len))
                            : std::move(call.reply));
    }
    return replies;
  }

  // The time the scripts decide at: nullopt for the server's TIME, else the reading of
  // ClientOptions::time_source (ns since the Unix epoch; a reading before it is read as 0).
  std::optional<std::chrono::nanoseconds> now() const {
    if (!options_.time_source) return std::nullopt;
    return std::max(options_.time_source(), std::chrono::nanoseconds::zero());
  }

  // A time source's reading (ns since the Unix epoch, ≥ 0) as the scripts' (seconds, ns)
  // arguments.
  static void set_time_args(std::chrono::nanoseconds time, std::string& s, std::string& ns) {
    const auto t = static_cast<std::uint64_t>(time.count());
    s = absl::StrCat(t / detail::kNanosPerSecond);
    ns = absl::StrCat(t % detail::kNanosPerSecond);
  }

  // The Redis key holding `key`'s state under `limit` (for operators; contains no raw key bytes).
  std::string redis_key(std::string_view key, const Limit& limit) const {
    return detail::slot_key_name(
        options_.key_prefix,
        detail::key_digest(key, detail::bound_seed(limit.fingerprint_, options_.key_seed)));
  }

  const ClientOptions& options() const noexcept { return options_; }
  // SHA-1 of the script body, as EVALSHA names it.
  const std::string& script_sha() const noexcept { return script_sha_; }

  // Testing hook: `items` as the one script call that concurrent check()s of them, queued in
  // this order, would share; one result per item.
  std::vector<absl::StatusOr<Decision>> check_coalesced_for_testing(
      std::span<const CheckItem> items) {
    std::vector<absl::StatusOr<Decision>> results(items.size(),
                                                  absl::UnknownError("sluice::redis: not run"));
    if (absl::Status status = validate(items); !status.ok()) {
      std::fill(results.begin(), results.end(), status);
      return results;
    }
    run_each(items, now(), deadline(), results);
    return results;
  }
  // Testing hook: run `body` instead of the bundled script (to prove that wrong replies become
  // errors). Not thread-safe: call before any concurrent check.
  void replace_script_for_testing(std::string body) {
    script_ = std::move(body);
    script_sha_ = detail::sha1_hex(script_);
  }
  // Testing hook: the same for the booking script (sluice/redis/detail/booking_script.hpp).
  void replace_booking_script_for_testing(std::string body) {
    booking_script_ = std::move(body);
    booking_sha_ = detail::sha1_hex(booking_script_);
  }
  const std::string& script_for_testing() const noexcept { return script_; }
  const std::string& booking_script_for_testing() const noexcept { return booking_script_; }
  detail::ConnectionPool& pool_for_testing() noexcept { return transport_.pool(); }
  // The call path every limiter over this client uses (sluice/redis/detail/transport.hpp).
  detail::Transport& transport() noexcept { return transport_; }

 private:
  using Call = detail::Transport::Call;

  explicit Client(ClientOptions options)
      : options_(std::move(options)),
        transport_(options_.connection, options_.cluster),
        script_(kGcraScript),
        script_sha_(detail::sha1_hex(script_)),
        booking_script_(detail::kBookingScript),
        booking_sha_(detail::sha1_hex(booking_script_)),
        carry_read_sha_(detail::sha1_hex(detail::kCarryReadScript)),
        fixed_give_back_sha_(detail::sha1_hex(kFixedGiveBackScript)) {}

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

  // The script call for `items`; a booking check (`marked`) also names each key's reset marker;
  // `flag`: with the carry mask of items that have `carried_from`.
  detail::ScriptCall make_call(std::span<const CheckItem> items,
                               std::optional<std::chrono::nanoseconds> time, bool marked,
                               bool flag = false) const {
    std::vector<std::string> keys;
    keys.reserve(marked ? 2 * items.size() : items.size());
    for (const CheckItem& item : items) {
      keys.push_back(redis_key(item.key, *item.limit));
    }
    if (marked) {
      for (std::size_t i = 0; i < items.size(); ++i) {
        keys.push_back(absl::StrCat(keys[i], ":reset"));
      }
    }
    detail::ScriptCall call = detail::ScriptCall::create(items, std::move(keys), time);
    if (!flag) call.carry_mask.clear();
    return call;
  }

  // One atomic check of `items`, by `by`; when a key with `carried_from` holds no state, its
  // state is carried over first (carry), then the check is made again: on such a miss only, a
  // round trip for the reads, one for the writes (if any) and the second check, all by `by`.
  // `standing`, when set, receives each item's standing decision (detail::decode_reply).
  absl::StatusOr<std::vector<Decision>> run(std::span<const CheckItem> items,
                                            std::optional<std::chrono::nanoseconds> time,
                                            detail::Deadline by,
                                            std::vector<detail::ItemBooking>* bookings = nullptr,
                                            std::vector<Decision>* standing = nullptr) {
    const detail::ItemExtras extras{.bookings = bookings, .standing = standing};
    absl::StatusOr<std::vector<Decision>> d = run_once(items, time, extras, /*flag=*/true, by);
    if (d.ok() || !detail::is_carry_needed(d.status())) return d;
    if (absl::Status carried = carry(items, time, by); !carried.ok()) return carried;
    return detail::carried_once(run_once(items, time, extras, /*flag=*/false, by));
  }

  // Carries the state of every item with `carried_from` whose key holds none (detail/carry.hpp):
  // reads each earlier key with its node's time (one round trip, nodes in parallel), then writes
  // the carried state with SET NX (one more), so a key written meanwhile keeps its state.
  absl::Status carry(std::span<const CheckItem> items, std::optional<std::chrono::nanoseconds> time,
                     detail::Deadline by) {
    std::vector<std::string> old_keys;
    std::vector<Call> reads;
    for (const CheckItem& item : items) {
      for (const CarriedFrom& from : item.carried_from) {
        old_keys.push_back(redis_key(from.key, *from.limit));
        reads.push_back({.slot = transport_.slot_of(old_keys.back()),
                         .script = detail::kCarryReadScript,
                         .sha = carry_read_sha_});
      }
    }
    for (std::size_t k = 0; k < reads.size(); ++k) {  // old_keys no longer moves
      for (std::string_view arg : {std::string_view("EVALSHA"), std::string_view(carry_read_sha_),
                                   std::string_view("1"), std::string_view(old_keys[k])}) {
        reads[k].command.add(arg);
      }
    }
    if (!reads.empty()) transport_.call(reads, by);
    std::vector<std::string> new_keys, values, ttls;
    std::size_t k = 0;
    for (const CheckItem& item : items) {
      std::vector<detail::CarryRead> read;
      for (const CarriedFrom& from : item.carried_from) {
        if (!reads[k].reply.ok()) return reads[k].reply.status();
        const redisReply& reply = **reads[k++].reply;
        if (reply.type == REDIS_REPLY_ERROR) {
          return detail::server_error_status(std::string_view(reply.str, reply.len));
        }
        absl::StatusOr<detail::CarryRead> r = detail::parse_carry_read(reply, *from.limit);
        if (!r.ok()) return r.status();
        if (time) r->now = static_cast<std::uint64_t>(time->count());
        read.push_back(*std::move(r));
      }
      absl::StatusOr<std::optional<detail::CarriedState>> state =
          detail::carried_state(*item.limit, read);
      if (!state.ok()) return state.status();
      if (!*state) continue;
      new_keys.push_back(redis_key(item.key, *item.limit));
      values.push_back(std::move((*state)->value));
      ttls.push_back(absl::StrCat((*state)->ttl_ms));
    }
    return transport_.set_if_absent(new_keys, values, ttls, by);
  }

  absl::StatusOr<std::vector<Decision>> run_once(std::span<const CheckItem> items,
                                                 std::optional<std::chrono::nanoseconds> time,
                                                 detail::ItemExtras extras, bool flag,
                                                 detail::Deadline by) {
    if (absl::Status status = validate(items); !status.ok()) {
      return status;
    }
    if (transport_.cluster()) return run_cluster(items, time, extras, flag, by);
    const detail::ScriptCall script = make_call(items, time, extras.bookings != nullptr, flag);
    Call call{.command = script.evalsha(script_sha_), .script = script_, .sha = script_sha_};
    transport_.call(std::span(&call, 1), by);
    if (!call.reply.ok()) return call.reply.status();
    return detail::decode_reply(items, **call.reply, extras.bookings, extras.standing);
  }

  absl::StatusOr<Decision> check_one(const CheckItem& item,
                                     std::optional<std::chrono::nanoseconds> time) {
    const detail::Deadline deadline =
        std::chrono::steady_clock::now() + options_.connection.command_timeout;
    if (!options_.coalesce || transport_.cluster() || !item.carried_from.empty()) {
      absl::StatusOr<std::vector<Decision>> d = run(std::span(&item, 1), time, deadline);
      if (!d.ok()) return d.status();
      return (*d)[0];
    }
    if (absl::Status status = validate(std::span(&item, 1)); !status.ok()) return status;
    return coalescer_.check(
        item, time, deadline,
        [this](std::span<const CheckItem> items, std::optional<std::chrono::nanoseconds> at,
               detail::Deadline by,
               std::span<absl::StatusOr<Decision>> results) { run_each(items, at, by, results); });
  }

  // One script call, by `deadline`, for single-key checks that coalesced: a lone check's call for
  // one item, the independent-items mode (sluice/redis/script.hpp) for several. Never resent.
  void run_each(std::span<const CheckItem> items, std::optional<std::chrono::nanoseconds> time,
                detail::Deadline deadline, std::span<absl::StatusOr<Decision>> results) {
    const detail::ScriptCall script = make_call(items, time, /*marked=*/false);
    Call call{.command = script.evalsha(script_sha_), .script = script_, .sha = script_sha_};
    if (items.size() > 1) {
      call.command.add(script.keys_distinct() ? kDistinctIndependentItems : kIndependentItems);
    }
    transport_.call(std::span(&call, 1), deadline);
    if (!call.reply.ok()) {
      std::fill(results.begin(), results.end(), call.reply.status());
      return;
    }
    detail::decode_independent_replies(items, **call.reply, results);
  }

  // `bookings`, when set, has one entry per item, filled for each item decided. Items whose
  // state had to be carried first (see run) are carried, then checked again, pipelined.
  std::vector<absl::StatusOr<Decision>> run_pipelined(
      std::span<const CheckItem> items, std::optional<std::chrono::nanoseconds> time,
      detail::Deadline by, std::vector<detail::ItemBooking>* bookings = nullptr) {
    std::vector<absl::StatusOr<Decision>> results =
        run_pipelined_once(items, time, bookings, true, by);
    std::vector<CheckItem> again;
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (results[i].ok() || !detail::is_carry_needed(results[i].status())) continue;
      again.push_back(items[i]);
      where.push_back(i);
    }
    if (again.empty()) return results;
    const absl::Status carried = carry(again, time, by);
    std::vector<detail::ItemBooking> booked(again.size());
    std::vector<absl::StatusOr<Decision>> retried =
        carried.ok() ? run_pipelined_once(again, time, bookings ? &booked : nullptr, false, by)
                     : std::vector<absl::StatusOr<Decision>>(again.size(), carried);
    for (std::size_t k = 0; k < where.size(); ++k) {
      results[where[k]] = detail::carried_once(std::move(retried[k]));
      if (bookings != nullptr) (*bookings)[where[k]] = std::move(booked[k]);
    }
    return results;
  }

  std::vector<absl::StatusOr<Decision>> run_pipelined_once(
      std::span<const CheckItem> items, std::optional<std::chrono::nanoseconds> time,
      std::vector<detail::ItemBooking>* bookings, bool flag, detail::Deadline by) {
    std::vector<absl::StatusOr<Decision>> results(items.size(),
                                                  absl::UnknownError("sluice::redis: not run"));
    std::vector<detail::ScriptCall> calls;
    std::vector<std::size_t> sent;  // index into items of each call
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (absl::Status status = validate(items.subspan(i, 1)); !status.ok()) {
        results[i] = status;
        continue;
      }
      calls.push_back(make_call(items.subspan(i, 1), time, bookings != nullptr, flag));
      sent.push_back(i);
    }
    if (calls.empty()) {
      return results;
    }
    std::vector<Call> routed;
    routed.reserve(calls.size());
    for (const detail::ScriptCall& call : calls) {
      routed.push_back({.slot = transport_.slot_of(call.keys[0]),
                        .command = call.evalsha(script_sha_),
                        .script = script_,
                        .sha = script_sha_});
    }
    transport_.call(routed, by);
    for (std::size_t k = 0; k < sent.size(); ++k) {
      if (!routed[k].reply.ok()) {
        results[sent[k]] = routed[k].reply.status();
        continue;
      }
      std::vector<detail::ItemBooking> booked;
      absl::StatusOr<std::vector<Decision>> one = detail::decode_reply(
          items.subspan(sent[k], 1), **routed[k].reply, bookings != nullptr ? &booked : nullptr);
      if (one.ok() && bookings != nullptr) (*bookings)[sent[k]] = std::move(booked[0]);
      results[sent[k]] =
          one.ok() ? absl::StatusOr<Decision>((*one)[0]) : absl::StatusOr<Decision>(one.status());
    }
    return results;
  }

  detail::Deadline deadline() const {
    return std::chrono::steady_clock::now() + options_.connection.command_timeout;
  }

  // --- Redis Cluster ---------------------------------------------------------------------------

  // check_all in a Cluster. Items of one slot are one script call, as on one node. Items of
  // several slots are one booking check per slot, sent to their nodes in parallel; if any slot
  // denies (or fails), what the admitting slots booked is given back by the booking script
  // (all-or-nothing, except for a slot whose reply was lost: whether it booked is unknown).
  absl::StatusOr<std::vector<Decision>> run_cluster(std::span<const CheckItem> items,
                                                    std::optional<std::chrono::nanoseconds> time,
                                                    detail::ItemExtras extras, bool flag,
                                                    detail::Deadline by) {
    std::vector<detail::ItemBooking>* bookings = extras.bookings;
    const std::vector<SlotGroup> groups = slot_groups(items);
    const bool several = groups.size() > 1;
    const bool marked = bookings != nullptr || several;
    std::vector<std::vector<CheckItem>> group_items(groups.size());
    std::vector<detail::ScriptCall> scripts;
    std::vector<Call> routed;
    scripts.reserve(groups.size());
    routed.reserve(groups.size());
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (std::size_t i : groups[g].second) group_items[g].push_back(items[i]);
      scripts.push_back(make_call(group_items[g], time, marked, flag));
      routed.push_back({.slot = groups[g].first,
                        .command = scripts.back().evalsha(script_sha_),
                        .script = script_,
                        .sha = script_sha_});
    }
    transport_.call(routed, by);
    std::vector<Decision> decisions(items.size());
    std::vector<detail::ItemBooking> booked(items.size());
    std::vector<bool> admitted(groups.size(), false);
    if (extras.standing != nullptr) extras.standing->assign(items.size(), Decision{});
    absl::Status error;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      absl::StatusOr<std::vector<Decision>> d =
          routed[g].reply.ok() ? absl::StatusOr<std::vector<Decision>>(absl::UnknownError(""))
                               : routed[g].reply.status();
      std::vector<detail::ItemBooking> b;
      std::vector<Decision> standing;
      if (routed[g].reply.ok()) {
        d = detail::decode_reply(group_items[g], **routed[g].reply, marked ? &b : nullptr,
                                 extras.standing != nullptr ? &standing : nullptr);
      }
      if (!d.ok()) {
        if (error.ok()) error = d.status();
        continue;
      }
      admitted[g] =
          std::all_of(d->begin(), d->end(), [](const Decision& x) { return x.allowed(); });
      for (std::size_t k = 0; k < groups[g].second.size(); ++k) {
        decisions[groups[g].second[k]] = (*d)[k];
        if (marked) booked[groups[g].second[k]] = std::move(b[k]);
        if (extras.standing != nullptr) (*extras.standing)[groups[g].second[k]] = standing[k];
      }
    }
    const bool all =
        error.ok() && std::all_of(admitted.begin(), admitted.end(), [](bool a) { return a; });
    if (several && !all) {
      give_back(items, groups, admitted, booked, time, by);
    }
    if (!error.ok()) return error;
    if (bookings != nullptr) *bookings = std::move(booked);
    return decisions;
  }

  // Items of one slot: the slot, and the items' indexes in order.
  using SlotGroup = std::pair<std::size_t, std::vector<std::size_t>>;

  // `items` by slot, the slots in the order of their first item.
  std::vector<SlotGroup> slot_groups(std::span<const CheckItem> items) const {
    std::vector<SlotGroup> groups;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const std::size_t slot = detail::key_slot(redis_key(items[i].key, *items[i].limit));
      auto group = std::find_if(groups.begin(), groups.end(),
                                [&](const auto& g) { return g.first == slot; });
      if (group == groups.end()) {
        groups.push_back({slot, {i}});
      } else {
        group->second.push_back(i);
      }
    }
    return groups;
  }

  // Gives back, with the booking script, every cost the admitted groups booked, by the check's
  // own deadline `by` (the call then ends by it, as it promises). Best effort: a give-back that
  // fails, or that the deadline leaves no time to send, leaves its cost taken (never more
  // admitted than the limit) and counts in give_backs_lost().
  void give_back(std::span<const CheckItem> items, std::span<const SlotGroup> groups,
                 const std::vector<bool>& admitted, std::span<const detail::ItemBooking> booked,
                 std::optional<std::chrono::nanoseconds> time, detail::Deadline by) {
    std::vector<std::vector<std::string>> args;
    std::vector<std::size_t> slots;
    std::vector<bool> fixed;  // per call: a fixed-window key (kFixedGiveBackScript)
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (!admitted[g]) continue;
      for (std::size_t i : groups[g].second) {
        if (items[i].cost == 0) continue;
        const std::string key = redis_key(items[i].key, *items[i].limit);
        std::vector<std::string>& a = args.emplace_back();
        slots.push_back(groups[g].first);
        fixed.push_back(items[i].limit->algorithm() == Algorithm::kFixedWindow);
        if (fixed.back()) {
          a = fixed_give_back_args(key, items[i].cost, booked[i].tats, time);
          continue;
        }
        a = {key,
             absl::StrCat(key, ":reset"),
             "g",
             "",
             "",
             detail::booking_params(*items[i].limit, items[i].cost),
             detail::give_back_extra(*items[i].limit, booked[i].serial, detail::kNeverPasses,
                                     booked[i].tats)};
        if (time) set_time_args(*time, a[3], a[4]);
      }
    }
    std::vector<Call> calls;
    calls.reserve(args.size());
    for (std::size_t k = 0; k < args.size(); ++k) {
      const std::string_view script = fixed[k] ? kFixedGiveBackScript : booking_script_;
      const std::string_view sha = fixed[k] ? fixed_give_back_sha_ : booking_sha_;
      detail::Command command;
      command.add("EVALSHA");
      command.add(sha);
      command.add(fixed[k] ? "1" : "2");
      for (const std::string& arg : args[k]) command.add(arg);
      calls.push_back(
          {.slot = slots[k], .command = std::move(command), .script = script, .sha = sha});
    }
    if (calls.empty()) return;
    if (detail::time_left(by) > std::chrono::microseconds::zero()) transport_.call(calls, by);
    for (const Call& call : calls) {  // one not sent keeps its "not sent" error
      if (!call.reply.ok() || (*call.reply)->type == REDIS_REPLY_ERROR) {
        give_backs_lost_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }

  // kFixedGiveBackScript's arguments after its key count: the key, the time, the cost, then
  // each window's booked end as (s, ns).
  static std::vector<std::string> fixed_give_back_args(
      const std::string& key, std::uint64_t cost, std::span<const absl::uint128> ends,
      std::optional<std::chrono::nanoseconds> time) {
    std::vector<std::string> a = {key, "", "", absl::StrCat(cost)};
    if (time) set_time_args(*time, a[1], a[2]);
    for (const absl::uint128 end : ends) {
      a.push_back(absl::StrCat(absl::Uint128Low64(end / detail::kNanosPerSecond)));
      a.push_back(absl::StrCat(absl::Uint128Low64(end % detail::kNanosPerSecond)));
    }
    return a;
  }

  const ClientOptions options_;
  detail::Transport transport_;  // every call goes through it
  std::string script_;
  std::string script_sha_;
  std::string booking_script_;
  std::string booking_sha_;
  std::string carry_read_sha_;                                 // of detail::kCarryReadScript
  std::string fixed_give_back_sha_;                            // of kFixedGiveBackScript
  detail::Coalescer coalescer_{options_.max_coalesced_checks,  // single-key checks, one node
                               options_.max_coalesced_calls};
  std::atomic<std::uint64_t> give_backs_lost_{0};
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_CLIENT_HPP_
