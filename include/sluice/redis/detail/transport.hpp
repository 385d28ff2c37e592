// sluice/redis/detail/transport.hpp — the one call path of every Redis limiter. Internal.
//
// A `Transport` sends script calls (EVALSHA) to one Redis server, or to the nodes of a Redis
// Cluster, and hands back their replies. It is the only code that talks to Redis for a check:
//   - routing: on a Cluster each call goes to the node serving its slot (a pool per node, the
//     slot map in ClusterRouter); the calls of one node are one pipelined write, all nodes are
//     written before any is read, so they work in parallel;
//   - NOSCRIPT: the script is loaded and the call sent again on the same connection;
//   - MOVED, ASK, TRYAGAIN (replies after which the call did not run): the call is sent again
//     where the reply says (an empty host: the answering node's), by the same deadline, at most
//     kMaxRedirects times; a redirection that names no usable address is Internal at once;
//   - connection health: a connection whose reply says it reaches the wrong server (READONLY,
//     MASTERDOWN, LOADING, CLUSTERDOWN, a redirection on a lone server) is closed, and on a
//     Cluster the slot map is read again.
// Nothing else is ever sent twice: a call that may have run is never retried.
//
//   detail::Transport transport(options.connection, options.cluster);
//   detail::Transport::Call call{.slot = detail::key_slot(key), .command = evalsha,
//                                .script = kGcraScript, .sha = sha};
//   transport.call(std::span(&call, 1), deadline);  // call.reply: the reply or the error
//
// Thread-safety: thread-safe.
#ifndef SLUICE_REDIS_DETAIL_TRANSPORT_HPP_
#define SLUICE_REDIS_DETAIL_TRANSPORT_HPP_

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>  // TRYAGAIN's pause
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/redis/detail/cluster.hpp"
#include "sluice/redis/detail/command.hpp"
#include "sluice/redis/detail/connection_pool.hpp"
#include "sluice/redis/detail/status.hpp"
#include "sluice/redis/options.hpp"

namespace sluice::redis::detail {

class Transport {
 public:
  // One script call: the slot of its keys (ignored on a lone server), the command, the script
  // to load if the server answers NOSCRIPT (and its SHA-1), and, once answered, its reply (a
  // server error reply is a reply) or why there is none.
  struct Call {
    std::size_t slot = 0;
    Command command{};
    std::string_view script;
    std::string_view sha;
    absl::StatusOr<ReplyPtr> reply = absl::UnknownError("sluice::redis: not sent");
  };

  // Redirections followed per call at most (a slot moved twice during one check is rare).
  static constexpr int kMaxRedirects = 5;

  Transport(const ConnectionOptions& options, bool cluster)
      : pool_(std::make_shared<ConnectionPool>(options)),
        cluster_(cluster ? std::make_unique<ClusterRouter>(options) : nullptr) {}

  bool cluster() const noexcept { return cluster_ != nullptr; }

  // The slot of `key` on a Cluster; 0 on a lone server (where slots do not matter).
  std::size_t slot_of(std::string_view key) const { return cluster_ ? key_slot(key) : 0; }

  // Sends every call and fills in its reply, all by `deadline`.
  void call(std::span<Call> calls, Deadline deadline) {
    if (cluster_ == nullptr) {
      NodeBatch all{.pool = pool_};
      for (std::size_t i = 0; i < calls.size(); ++i) all.which.push_back(i);
      write_batch(calls, all, deadline);
      read_batch(calls, all);
      return;
    }
    std::vector<NodeBatch> batches;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      absl::StatusOr<std::shared_ptr<ConnectionPool>> pool =
          cluster_->pool_for_slot(calls[i].slot, deadline);
      if (!pool.ok()) {
        calls[i].reply = pool.status();
        continue;
      }
      auto batch = std::find_if(batches.begin(), batches.end(),
                                [&](const NodeBatch& b) { return b.pool == *pool; });
      if (batch == batches.end()) {
        batches.push_back({.pool = *pool, .which = {i}});
      } else {
        batch->which.push_back(i);
      }
    }
    for (NodeBatch& b : batches) write_batch(calls, b, deadline);
    for (NodeBatch& b : batches) read_batch(calls, b);
    for (const NodeBatch& b : batches) {
      for (std::size_t i : b.which) follow_redirects(calls[i], b.pool, deadline);
    }
  }

  // SET key value PX ttl NX for each key (ttl in ms), one round trip, by `deadline`: OK whether
  // or not each key was absent (a key written meanwhile keeps its value).
  absl::Status set_if_absent(std::span<const std::string> keys, std::span<const std::string> values,
                             std::span<const std::string> ttls_ms, Deadline deadline) {
    std::vector<Call> writes;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      Call& w = writes.emplace_back();
      w.slot = slot_of(keys[i]);
      for (std::string_view arg :
           {std::string_view("SET"), std::string_view(keys[i]), std::string_view(values[i]),
            std::string_view("PX"), std::string_view(ttls_ms[i]), std::string_view("NX")}) {
        w.command.add(arg);
      }
    }
    if (writes.empty()) return absl::OkStatus();
    call(writes, deadline);
    for (const Call& w : writes) {
      if (!w.reply.ok()) return w.reply.status();
      if ((*w.reply)->type == REDIS_REPLY_ERROR) {
        return server_error_status(std::string_view((*w.reply)->str, (*w.reply)->len));
      }
    }
    return absl::OkStatus();
  }

  // Checks the server the options name (ConnectionPool::verify_server), by `deadline`.
  absl::Status verify_server(const ConnectionOptions& options, Deadline deadline) {
    const std::shared_ptr<ConnectionPool> pool =
        cluster_ != nullptr ? cluster_->pool_for_address(options.host, options.port) : pool_;
    if (pool == nullptr) return absl::OkStatus();  // never: the seed is the first node known
    return pool->verify_server(deadline);
  }

  // The lone server's pool (unused on a Cluster).
  ConnectionPool& pool() noexcept { return *pool_; }

 private:
  // Calls for one node: written together, then read together.
  struct NodeBatch {
    std::shared_ptr<ConnectionPool> pool{};  // held until its lease has ended
    std::vector<std::size_t> which{};        // indices into the calls
    bool asking = false;                     // ASKING first (one call after an ASK redirection)
    std::unique_ptr<ConnectionPool::Lease> lease{};  // set while its replies are due
    std::size_t reply_budget = 0;                    // of the commands sent (io.hpp)
  };

  void write_batch(std::span<Call> calls, NodeBatch& b, Deadline deadline) {
    absl::StatusOr<ConnectionPool::Lease> lease = b.pool->acquire(deadline);
    if (!lease.ok()) {
      for (std::size_t i : b.which) calls[i].reply = lease.status();
      mark_stale();  // a node that cannot be reached may have failed over
      return;
    }
    b.lease = std::make_unique<ConnectionPool::Lease>(*std::move(lease));
    std::vector<Command> commands;
    commands.reserve(b.which.size() + 1);
    if (b.asking) commands.push_back(one_word("ASKING"));
    for (std::size_t i : b.which) commands.push_back(calls[i].command);
    b.reply_budget = reply_budget(commands);
    if (absl::Status sent = detail::send(*b.lease, commands); !sent.ok()) {
      for (std::size_t i : b.which) calls[i].reply = sent;
      mark_stale();
      b.lease.reset();
    }
  }

  void read_batch(std::span<Call> calls, NodeBatch& b) {
    if (!b.lease) return;
    ConnectionPool::Lease& lease = *b.lease;
    const std::size_t offset = b.asking ? 1 : 0;
    absl::StatusOr<std::vector<ReplyPtr>> replies =
        detail::receive(lease, b.which.size() + offset, b.reply_budget);
    if (!replies.ok()) {
      for (std::size_t i : b.which) calls[i].reply = replies.status();
      mark_stale();
      b.lease.reset();
      return;
    }
    for (std::size_t k = 0; k < b.which.size(); ++k) {
      Call& call = calls[b.which[k]];
      call.reply = settle(lease, std::move((*replies)[k + offset]), call, b.asking);
    }
    b.lease.reset();  // back to the pool, unless a reply closed it
  }

  // The reply once the server has the script (a NOSCRIPT is repaired on the same connection);
  // closes the connection when the reply says the server is the wrong one.
  absl::StatusOr<ReplyPtr> settle(ConnectionPool::Lease& lease, ReplyPtr reply, const Call& call,
                                  bool asking) {
    if (is_error(*reply, "NOSCRIPT")) {
      if (lease.get() == nullptr) {  // closed after an earlier reply of the same pipeline
        return absl::UnavailableError("sluice::redis: connection lost");
      }
      absl::StatusOr<ReplyPtr> retried = load_and_retry(lease, call, asking);
      if (!retried.ok()) return retried.status();
      reply = std::move(*retried);
    }
    bool wrong = wrong_server(*reply);
    for (std::size_t i = 0; reply->type == REDIS_REPLY_ARRAY && i < reply->elements; ++i) {
      wrong = wrong || wrong_server(*reply->element[i]);  // an independent item's own error
    }
    if (wrong) {
      lease.mark_broken();
      mark_stale();
    }
    return reply;
  }

  // Loads the call's script and sends the call again, pipelined on the same connection (after
  // ASKING when `asking`); returns the call's reply.
  static absl::StatusOr<ReplyPtr> load_and_retry(ConnectionPool::Lease& lease, const Call& call,
                                                 bool asking) {
    Command load;
    load.add("SCRIPT");
    load.add("LOAD");
    load.add(call.script);
    std::vector<Command> commands = {load};
    if (asking) commands.push_back(one_word("ASKING"));
    commands.push_back(call.command);
    absl::StatusOr<std::vector<ReplyPtr>> replies = detail::exchange(lease, commands);
    if (!replies.ok()) return replies.status();
    const redisReply& loaded = *(*replies)[0];
    if (loaded.type == REDIS_REPLY_ERROR) {
      return server_error_status(std::string_view(loaded.str, loaded.len));
    }
    if (loaded.type != REDIS_REPLY_STRING || std::string_view(loaded.str, loaded.len) != call.sha) {
      return absl::InternalError("sluice::redis: SCRIPT LOAD returned an unexpected SHA-1");
    }
    return std::move(replies->back());
  }

  // While `call`'s reply is MOVED, ASK or TRYAGAIN: sends it again where the reply says (MOVED
  // also repoints the slot; TRYAGAIN, a multi-key command meeting a slot in migration, waits a
  // millisecond), by the same deadline, at most kMaxRedirects times. `from`: the node whose reply
  // it is (a redirection to an unknown endpoint names its host). A redirection that names no
  // usable address ends it with Internal.
  void follow_redirects(Call& call, std::shared_ptr<ConnectionPool> from, Deadline deadline) {
    for (int hop = 0; hop < kMaxRedirects && call.reply.ok() && is_redirect_or_retry(**call.reply);
         ++hop) {
      std::shared_ptr<ConnectionPool> pool;
      bool asking = false;
      if (is_redirect(**call.reply)) {
        absl::StatusOr<Redirect> to = parse_redirect(**call.reply, from->options().host);
        if (!to.ok()) {
          call.reply = to.status();
          mark_stale();
          return;
        }
        if (!to->ask) cluster_->moved(*to);
        pool = cluster_->pool_for_address(to->host, to->port);
        if (pool == nullptr) {
          call.reply = absl::UnavailableError("sluice::redis: too many Cluster node addresses");
          return;
        }
        asking = to->ask;
      } else {
        if (time_left(deadline) <= std::chrono::milliseconds(2)) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        absl::StatusOr<std::shared_ptr<ConnectionPool>> p =
            cluster_->pool_for_slot(call.slot, deadline);
        if (!p.ok()) {
          call.reply = p.status();
          return;
        }
        pool = *p;
      }
      NodeBatch b{.pool = pool, .which = {0}, .asking = asking};
      write_batch(std::span(&call, 1), b, deadline);
      read_batch(std::span(&call, 1), b);
      from = std::move(pool);
    }
  }

  // A reply from a server that cannot serve this call now: READONLY (a replica after a
  // failover), MASTERDOWN, LOADING, CLUSTERDOWN; on a lone server also a redirection (it joined
  // a Cluster). On a Cluster a redirection is followed instead, on the same connection.
  bool wrong_server(const redisReply& reply) const {
    if (reply.type != REDIS_REPLY_ERROR) return false;
    for (std::string_view code : {"READONLY", "MASTERDOWN", "LOADING", "CLUSTERDOWN"}) {
      if (is_error(reply, code)) return true;
    }
    return cluster_ == nullptr && (is_error(reply, "MOVED") || is_error(reply, "ASK"));
  }

  static bool is_error(const redisReply& reply, std::string_view code) {
    if (reply.type != REDIS_REPLY_ERROR || reply.str == nullptr) return false;
    const std::string_view text(reply.str, reply.len);
    return text.substr(0, text.find(' ')) == code;
  }

  static Command one_word(std::string_view word) {
    Command c;
    c.add(word);
    return c;
  }

  void mark_stale() {
    if (cluster_ != nullptr) cluster_->mark_stale();
  }

  std::shared_ptr<ConnectionPool> pool_;    // a lone server (unused on a Cluster)
  std::unique_ptr<ClusterRouter> cluster_;  // a Cluster: a pool per node
};

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_TRANSPORT_HPP_
