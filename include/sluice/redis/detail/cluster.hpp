// sluice/redis/detail/cluster.hpp — Redis Cluster routing: key slots, the slot map, one
// connection pool per node, redirections. Internal: `Client` owns one in Cluster mode.
//
// A key's slot is CRC16 (XMODEM) of its hash tag (the text between the first '{' and the next
// '}', when not empty) or of the whole key, modulo 16384: the same function as the server's.
// The slot map comes from CLUSTER SLOTS, asked of any node this router knows (the seed first);
// each node that owns slots gets a ConnectionPool of its own, opened lazily, with the seed's
// options (timeouts, max_connections, server check, which requires a Cluster node) and the
// node's address (a null, empty or "?" endpoint: the host of the node that answered, which is
// also what an empty host in a redirection means). A MOVED reply repoints that one slot at once
// and makes the next call refresh the whole map (at most one refresh at a time, and at most one
// per kMinRefreshInterval unless a slot is unknown); a node that cannot be reached makes the next
// call refresh too, which is how a failover is found.
//
// Bounds: at most kMaxNodes node addresses at once (an address a reply names beyond that is
// refused, never connected to, and makes the next call refresh); each refresh forgets the nodes
// the new map does not name (the seed stays), closing their idle connections, so addresses named
// once — by a redirection, or by a map since replaced — never fill the table for good. 16384 slot
// entries; a refresh reads at most one reply.
//
//   sluice::redis::detail::ClusterRouter router(connection_options);  // the seed node
//   absl::StatusOr<std::shared_ptr<sluice::redis::detail::ConnectionPool>> pool =
//       router.pool_for_slot(sluice::redis::detail::key_slot(key), deadline);
//
// Thread-safety: thread-safe. A pool lives while the router's table or a caller holds it: a
// caller keeps the pointer it was given until its leases of that pool have ended.
#ifndef SLUICE_REDIS_DETAIL_CLUSTER_HPP_
#define SLUICE_REDIS_DETAIL_CLUSTER_HPP_

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/detail/mutex.hpp"
#include "sluice/detail/text.hpp"
#include "sluice/redis/detail/command.hpp"
#include "sluice/redis/detail/connection_pool.hpp"
#include "sluice/redis/detail/io.hpp"
#include "sluice/redis/options.hpp"

namespace sluice::redis::detail {

inline constexpr std::size_t kClusterSlots = 16384;

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), the checksum Redis Cluster hashes keys
// with. Neither hiredis nor Abseil exposes it, so it is written here, table-driven.
inline constexpr std::array<std::uint16_t, 256> kCrc16Table = [] {
  std::array<std::uint16_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i << 8;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1;
    table[i] = static_cast<std::uint16_t>(crc);
  }
  return table;
}();

inline std::uint16_t crc16(std::string_view data) noexcept {
  std::uint16_t crc = 0;
  for (const char c : data) {
    crc = static_cast<std::uint16_t>(
        (crc << 8) ^ kCrc16Table[((crc >> 8) ^ static_cast<unsigned char>(c)) & 0xff]);
  }
  return crc;
}

// The Cluster slot of `key`, as the server computes it.
inline std::size_t key_slot(std::string_view key) noexcept {
  const std::size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close != open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return crc16(key) & (kClusterSlots - 1);
}

// A redirection reply: "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>".
struct Redirect {
  bool ask = false;  // ASK: this one command goes to the target, after ASKING
  std::size_t slot = 0;
  std::string host;
  int port = 0;
};

// True for a MOVED or ASK reply, well-formed or not.
inline bool is_redirect(const redisReply& reply) {
  if (reply.type != REDIS_REPLY_ERROR || reply.str == nullptr) return false;
  const std::string_view text(reply.str, reply.len);
  const std::string_view code = text.substr(0, text.find(' '));
  return code == "MOVED" || code == "ASK";
}

// Whether a host a node names (in a redirection or the slot map) can be connected to and shown
// in an error: not empty, not "?" (a node told to announce a hostname it lacks), no longer than
// a DNS name, without spaces or control bytes.
inline bool usable_host(std::string_view host) {
  return !host.empty() && host != "?" && host.size() <= 255 &&
         std::all_of(host.begin(), host.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

// The redirection a MOVED or ASK reply names. An empty host (Redis 7's unknown endpoint,
// cluster-preferred-endpoint-type unknown-endpoint: "MOVED 3999 :6381") means the host of the
// node that answered, `answered_by`. Internal for one that names no usable address — a slot
// outside 0..16383, a port outside 1..65535 or none, the host "?" (a node told to announce a
// hostname it lacks), a host with spaces or control bytes or longer than a DNS name — so that
// it is neither sent again nor followed anywhere.
inline absl::StatusOr<Redirect> parse_redirect(const redisReply& reply,
                                               std::string_view answered_by) {
  const std::string_view text(reply.str, reply.len);
  const auto malformed = [&] {
    return absl::InternalError(absl::StrCat(
        "sluice::redis: a Cluster redirection that names no usable address: ",
        absl::CHexEscape(absl::string_view(text.data(), std::min<std::size_t>(text.size(), 100)))));
  };
  const auto number = [](std::string_view digits, auto& out) {
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
    return ec == std::errc() && end == digits.data() + digits.size();
  };
  const std::size_t code_end = text.find(' ');
  if (code_end == std::string_view::npos) return malformed();
  Redirect r;
  r.ask = text.substr(0, code_end) == "ASK";
  const std::string_view rest = text.substr(code_end + 1);
  const std::size_t space = rest.find(' ');
  if (space == std::string_view::npos) return malformed();
  const std::string_view slot = rest.substr(0, space);
  const std::string_view address = rest.substr(space + 1);
  const std::size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return malformed();
  const std::string_view host = colon == 0 ? answered_by : address.substr(0, colon);
  if (!number(slot, r.slot) || r.slot >= kClusterSlots ||
      !number(address.substr(colon + 1), r.port) || r.port <= 0 || r.port > 65535 ||
      !usable_host(host)) {
    return malformed();
  }
  r.host = std::string(host);
  return r;
}

// True for the replies after which a command was not executed and may be sent again: a
// redirection, or TRYAGAIN (a multi-key command during a slot migration).
inline bool is_redirect_or_retry(const redisReply& reply) {
  if (reply.type != REDIS_REPLY_ERROR) return false;
  const std::string_view text(reply.str, reply.len);
  return is_redirect(reply) || text.starts_with("TRYAGAIN");
}

class ClusterRouter {
 public:
  static constexpr std::size_t kMaxNodes = 1024;
  static constexpr std::chrono::milliseconds kMinRefreshInterval{100};

  // `seed`: the first node to ask for the slot map (host and port; a unix socket is not a
  // Cluster address); every node's pool takes its other options.
  explicit ClusterRouter(ConnectionOptions seed) : seed_(std::move(seed)) {
    seed_.unix_socket.clear();
    sluice::detail::MutexLock lock(mu_);
    slot_node_.fill(kUnknown);
    (void)node_locked(seed_.host, seed_.port);
  }
  ClusterRouter(const ClusterRouter&) = delete;
  ClusterRouter& operator=(const ClusterRouter&) = delete;

  // The pool of the node serving `slot`; refreshes the map first when it is stale or does not
  // know the slot. Unavailable when no node answers with a map that covers the slot.
  absl::StatusOr<std::shared_ptr<ConnectionPool>> pool_for_slot(std::size_t slot,
                                                                Deadline deadline) {
    bool known = false;
    bool stale = false;
    {
      sluice::detail::MutexLock lock(mu_);
      known = slot_node_[slot] != kUnknown;
      stale = stale_;
    }
    if (!known || stale) {
      absl::Status refreshed = refresh(deadline, /*force=*/!known);
      if (!refreshed.ok() && !known) return refreshed;
    }
    sluice::detail::MutexLock lock(mu_);
    const std::uint16_t node = slot_node_[slot];
    if (node == kUnknown) {
      return absl::UnavailableError(
          absl::StrCat("sluice::redis: no Cluster node serves slot ", slot));
    }
    return nodes_[node].pool;
  }

  // The pool of the node at host:port (created if new); nullptr past kMaxNodes (the map is then
  // stale: the next refresh forgets the nodes it does not name).
  std::shared_ptr<ConnectionPool> pool_for_address(const std::string& host, int port) {
    sluice::detail::MutexLock lock(mu_);
    const std::optional<std::uint16_t> node = node_locked(host, port);
    if (!node) {
      stale_ = true;
      return nullptr;
    }
    return nodes_[*node].pool;
  }

  // A MOVED reply: `slot` is now served at host:port. Repoints it and marks the map stale.
  // False if the address cannot be added (kMaxNodes).
  bool moved(const Redirect& r) {
    sluice::detail::MutexLock lock(mu_);
    stale_ = true;
    const std::optional<std::uint16_t> node = node_locked(r.host, r.port);
    if (!node) return false;
    slot_node_[r.slot] = *node;
    return true;
  }

  // A node failed to answer: the next call refreshes the map (a failover may have moved slots).
  void mark_stale() {
    sluice::detail::MutexLock lock(mu_);
    stale_ = true;
  }

  // Asks the known nodes, seed first, for CLUSTER SLOTS until one answers, and replaces the map
  // and the node table: the seed and the nodes the map names (their pools kept). Unless `force`,
  // does nothing within kMinRefreshInterval of the last refresh. One refresh at a time: a caller
  // that finds one running returns at once and uses the current map.
  absl::Status refresh(Deadline deadline, bool force) {
    std::vector<std::shared_ptr<ConnectionPool>> pools;
    {
      sluice::detail::MutexLock lock(mu_);
      if (refreshing_) {
        // Another caller is refreshing: one that needs the map waits for it, by its deadline.
        if (force) {
          mu_.wait_for(deadline - std::chrono::steady_clock::now(),
                       [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !refreshing_; });
        }
        return absl::OkStatus();
      }
      const auto now = std::chrono::steady_clock::now();
      if (!force && now - last_refresh_ < kMinRefreshInterval) return absl::OkStatus();
      refreshing_ = true;
      last_refresh_ = now;
      for (const Node& n : nodes_) pools.push_back(n.pool);
    }
    absl::Status last = absl::UnavailableError("sluice::redis: no Cluster node to ask");
    bool done = false;
    for (const std::shared_ptr<ConnectionPool>& pool : pools) {
      absl::StatusOr<std::vector<std::pair<std::size_t, std::pair<std::string, int>>>> ranges =
          ask_slots(*pool, deadline);
      if (!ranges.ok()) {
        last = ranges.status();
        if (time_left(deadline) <= std::chrono::microseconds::zero()) break;
        continue;
      }
      sluice::detail::MutexLock lock(mu_);
      std::array<std::uint16_t, kClusterSlots> map{};
      map.fill(kUnknown);
      bool complete = true;
      std::vector<Node> table;
      table.push_back(nodes_[0]);  // the seed
      for (const auto& [packed, address] : *ranges) {
        const std::size_t first = packed >> 16;
        const std::size_t last_slot = packed & 0xffff;
        const std::optional<std::uint16_t> node = node_in(table, address.first, address.second);
        if (!node) {
          complete = false;
          continue;
        }
        for (std::size_t s = first; s <= last_slot; ++s) map[s] = *node;
      }
      nodes_ = std::move(table);  // a pool no longer named closes when its last user is done
      slot_node_ = map;
      stale_ = !complete;
      done = true;
      break;
    }
    sluice::detail::MutexLock lock(mu_);
    refreshing_ = false;
    mu_.notify_all();
    return done ? absl::OkStatus() : last;
  }

  // Known node addresses (for tests and operators).
  std::vector<std::string> node_addresses() const {
    sluice::detail::MutexLock lock(mu_);
    std::vector<std::string> out;
    for (const Node& n : nodes_) out.push_back(absl::StrCat(n.host, ":", n.port));
    return out;
  }

 private:
  static constexpr std::uint16_t kUnknown = 0xffff;

  struct Node {
    std::string host;
    int port = 0;
    std::shared_ptr<ConnectionPool> pool;
  };

  // The index of host:port in the node table, added if new (with the pool it has in the current
  // table, if any, else a new one); nullopt past kMaxNodes.
  std::optional<std::uint16_t> node_in(std::vector<Node>& table, const std::string& host, int port)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (std::size_t i = 0; i < table.size(); ++i) {
      if (table[i].port == port && table[i].host == host) return static_cast<std::uint16_t>(i);
    }
    if (table.size() >= kMaxNodes) return std::nullopt;
    std::shared_ptr<ConnectionPool> pool;
    for (const Node& n : nodes_) {
      if (n.port == port && n.host == host) pool = n.pool;
    }
    if (pool == nullptr) {
      ConnectionOptions options = seed_;
      options.host = host;
      options.port = port;
      pool = std::make_shared<ConnectionPool>(std::move(options), /*cluster=*/true);
    }
    table.push_back({host, port, std::move(pool)});
    return static_cast<std::uint16_t>(table.size() - 1);
  }
  std::optional<std::uint16_t> node_locked(const std::string& host, int port)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return node_in(nodes_, host, port);
  }

  // CLUSTER SLOTS of one node: per range, (first << 16 | last) and its primary's address.
  // Internal for a host no redirection could name either (usable_host): never resolved, never
  // shown.
  static absl::StatusOr<std::vector<std::pair<std::size_t, std::pair<std::string, int>>>> ask_slots(
      ConnectionPool& pool, Deadline deadline) {
    absl::StatusOr<ConnectionPool::Lease> lease = pool.acquire(deadline);
    if (!lease.ok()) return lease.status();
    Command command;
    command.add("CLUSTER");
    command.add("SLOTS");
    absl::StatusOr<std::vector<ReplyPtr>> replies =
        exchange(*lease, std::span<const Command>(&command, 1));
    if (!replies.ok()) return replies.status();
    const redisReply& r = *(*replies)[0];
    const auto malformed = [] {
      return absl::InternalError("sluice::redis: CLUSTER SLOTS reply of unexpected shape");
    };
    if (r.type == REDIS_REPLY_ERROR) {
      return absl::UnavailableError(
          absl::StrCat("sluice::redis: CLUSTER SLOTS: ",
                       sluice::detail::escaped(std::string_view(r.str, r.len).substr(0, 200))));
    }
    if (r.type != REDIS_REPLY_ARRAY || r.elements > kClusterSlots) return malformed();
    std::vector<std::pair<std::size_t, std::pair<std::string, int>>> out;
    for (std::size_t i = 0; i < r.elements; ++i) {
      const redisReply& range = *r.element[i];
      if (range.type != REDIS_REPLY_ARRAY || range.elements < 3) return malformed();
      const redisReply& first = *range.element[0];
      const redisReply& last = *range.element[1];
      const redisReply& primary = *range.element[2];
      if (first.type != REDIS_REPLY_INTEGER || last.type != REDIS_REPLY_INTEGER ||
          first.integer < 0 || last.integer < first.integer ||
          last.integer >= static_cast<long long>(kClusterSlots) ||
          primary.type != REDIS_REPLY_ARRAY || primary.elements < 2 ||
          (primary.element[0]->type != REDIS_REPLY_STRING &&
           primary.element[0]->type != REDIS_REPLY_NIL) ||
          primary.element[1]->type != REDIS_REPLY_INTEGER || primary.element[1]->integer <= 0 ||
          primary.element[1]->integer > 65535) {
        return malformed();
      }
      // A null endpoint (cluster-preferred-endpoint-type unknown-endpoint), an empty one or "?"
      // means: the address this reply came from.
      std::string host = primary.element[0]->type == REDIS_REPLY_NIL
                             ? std::string()
                             : std::string(primary.element[0]->str, primary.element[0]->len);
      if (host.empty() || host == "?") host = pool.options().host;
      if (!usable_host(host)) return malformed();  // as a redirection naming it would be
      out.push_back(
          {static_cast<std::size_t>(first.integer) << 16 | static_cast<std::size_t>(last.integer),
           {std::move(host), static_cast<int>(primary.element[1]->integer)}});
    }
    return out;
  }

  ConnectionOptions seed_;
  mutable sluice::detail::Mutex mu_;
  std::vector<Node> nodes_ ABSL_GUARDED_BY(mu_);
  std::array<std::uint16_t, kClusterSlots> slot_node_ ABSL_GUARDED_BY(mu_){};
  bool stale_ ABSL_GUARDED_BY(mu_) = false;
  bool refreshing_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point last_refresh_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_CLUSTER_HPP_
