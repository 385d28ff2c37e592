// A private Redis Cluster for one test process: three primaries and three replicas.
//
// Starts six redis-server processes (tests/support/redis_server.hpp: each in its own temporary
// directory, on 127.0.0.1, persistence off, bounded memory) with Cluster mode on and a short
// node timeout, joins them with `redis-cli --cluster create ... --cluster-replicas 1`, and waits
// until every node reports the cluster ok and every replica is in sync. Each server is stopped
// by process id when the cluster is destroyed (and dies with the test process).
//
//   sluice_test::RedisCluster& cluster = sluice_test::RedisCluster::shared();  // once per process
//   REQUIRE(cluster.error().empty());
//   options.connection.port = cluster.seed_port();
//   options.cluster = true;
//
// Thread-safety: use from one thread; the servers themselves take any client.
#ifndef SLUICE_TESTS_SUPPORT_REDIS_CLUSTER_HPP_
#define SLUICE_TESTS_SUPPORT_REDIS_CLUSTER_HPP_

#include <hiredis/hiredis.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "redis_server.hpp"

namespace sluice_test {

class RedisCluster {
 public:
  static constexpr int kNodes = 6;

  // The process's cluster, started on first use.
  static RedisCluster& shared() {
    static RedisCluster cluster;
    return cluster;
  }

  // "" once started; else why not.
  const std::string& error() const { return error_; }
  int seed_port() const { return servers_[0].port(); }

  // The node (index into the servers) that serves `slot` as primary now, or -1.
  int primary_of(std::size_t slot) const {
    Reply r = servers_[0].command({"CLUSTER", "SLOTS"});
    if (!r || r->type != REDIS_REPLY_ARRAY) return -1;
    for (std::size_t i = 0; i < r->elements; ++i) {
      const redisReply& range = *r->element[i];
      if (static_cast<std::size_t>(range.element[0]->integer) <= slot &&
          slot <= static_cast<std::size_t>(range.element[1]->integer)) {
        return index_of_port(static_cast<int>(range.element[2]->element[1]->integer));
      }
    }
    return -1;
  }
  // The node that replicates `primary`, or -1.
  int replica_of(int primary) const {
    for (int i = 0; i < kNodes; ++i) {
      if (i == primary) continue;
      Reply info = servers_[i].command({"INFO", "replication"});
      if (info && std::string_view(info->str, info->len)
                          .find("master_port:" + std::to_string(servers_[primary].port())) !=
                      std::string_view::npos) {
        return i;
      }
    }
    return -1;
  }
  std::string node_id(int node) const {
    Reply r = servers_[node].command({"CLUSTER", "MYID"});
    return r && r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : "";
  }
  Reply command(int node, std::initializer_list<std::string_view> args) const {
    return servers_[node].command(args);
  }
  int port(int node) const { return servers_[node].port(); }

  // Moves `slot` (with its keys) from its primary to primary `to`, the way redis-cli's reshard
  // does, in three steps a test can interleave with traffic: begin_move (IMPORTING on the target,
  // MIGRATING on the source), migrate_keys (MIGRATE every key), finish_move (NODE everywhere).
  // Each returns "" or what failed.
  std::string move_slot(std::size_t slot, int to) {
    const int from = primary_of(slot);
    std::string e = begin_move(slot, to);
    if (e.empty()) e = migrate_keys(slot, from, to);
    if (e.empty()) e = finish_move(slot, from, to);
    return e;
  }
  std::string begin_move(std::size_t slot, int to) {
    const int from = primary_of(slot);
    if (from < 0) return "no primary for the slot";
    if (from == to) return "the slot is already there";
    const std::string s = std::to_string(slot);
    if (!ok(command(to, {"CLUSTER", "SETSLOT", s, "IMPORTING", node_id(from)}))) {
      return "IMPORTING";
    }
    if (!ok(command(from, {"CLUSTER", "SETSLOT", s, "MIGRATING", node_id(to)}))) {
      return "MIGRATING";
    }
    return "";
  }
  std::string migrate_keys(std::size_t slot, int from, int to) {
    const std::string s = std::to_string(slot);
    for (;;) {
      Reply keys = command(from, {"CLUSTER", "GETKEYSINSLOT", s, "100"});
      if (!keys || keys->type != REDIS_REPLY_ARRAY) return "GETKEYSINSLOT";
      if (keys->elements == 0) break;
      for (std::size_t i = 0; i < keys->elements; ++i) {
        const std::string key(keys->element[i]->str, keys->element[i]->len);
        Reply m = command(
            from, {"MIGRATE", "127.0.0.1", std::to_string(port(to)), key, "0", "5000", "REPLACE"});
        if (!ok(m)) return "MIGRATE " + key + ": " + (m ? std::string(m->str, m->len) : "");
      }
    }
    return "";
  }
  std::string finish_move(std::size_t slot, int from, int to) {
    const std::string s = std::to_string(slot);
    const std::string to_id = node_id(to);
    for (int node : {to, from}) {
      if (!ok(command(node, {"CLUSTER", "SETSLOT", s, "NODE", to_id}))) return "SETSLOT NODE";
    }
    for (int node = 0; node < kNodes; ++node) {  // every other primary learns it at once
      Reply role = command(node, {"ROLE"});
      const bool primary =
          role && role->type == REDIS_REPLY_ARRAY && role->elements > 0 &&
          std::string_view(role->element[0]->str, role->element[0]->len) == "master";
      if (primary && node != to && node != from) {
        (void)command(node, {"CLUSTER", "SETSLOT", s, "NODE", to_id});
      }
    }
    return "";
  }

  // A manual failover: `replica` takes over from its primary once it has every write (CLUSTER
  // FAILOVER without FORCE), so nothing is lost. Waits until it reports itself primary.
  std::string fail_over(int replica) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    auto asked = std::chrono::steady_clock::time_point{};
    while (std::chrono::steady_clock::now() < deadline) {
      // A manual failover the primary does not complete within 5 s is abandoned: ask again.
      if (std::chrono::steady_clock::now() - asked > std::chrono::seconds(6)) {
        if (!ok(command(replica, {"CLUSTER", "FAILOVER"}))) return "CLUSTER FAILOVER refused";
        asked = std::chrono::steady_clock::now();
      }
      Reply info = command(replica, {"INFO", "replication"});
      if (info &&
          std::string_view(info->str, info->len).find("role:master") != std::string_view::npos &&
          all_see_primary(replica)) {
        return wait_ok();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::string views;
    for (int i = 0; i < kNodes; ++i) {
      Reply nodes = command(i, {"CLUSTER", "NODES"});
      views += "\nnode " + std::to_string(i) + ": " +
               (nodes && nodes->type == REDIS_REPLY_STRING ? std::string(nodes->str, nodes->len)
                                                           : std::string("(no reply)"));
    }
    return "node " + std::to_string(replica) + " (" + node_id(replica) +
           ") did not become primary everywhere within 30 s:" + views;
  }

  ~RedisCluster() = default;

 private:
  RedisCluster() { error_ = start(); }

  static bool ok(const Reply& r) { return r && r->type != REDIS_REPLY_ERROR; }

  // Whether every node's CLUSTER NODES lists `node` as a primary.
  bool all_see_primary(int node) const {
    const std::string id = node_id(node);
    for (int i = 0; i < kNodes; ++i) {
      Reply r = command(i, {"CLUSTER", "NODES"});
      if (!r || r->type != REDIS_REPLY_STRING) return false;
      const std::string_view nodes(r->str, r->len);
      // The node's own line starts with its id (other lines may name it as their primary).
      std::size_t line = nodes.starts_with(id) ? 0 : nodes.find("\n" + id);
      if (line == std::string_view::npos) return false;
      if (line != 0) ++line;  // past the newline
      const std::string_view entry = nodes.substr(line, nodes.find('\n', line) - line);
      if (entry.find("master") == std::string_view::npos) return false;
    }
    return true;
  }

  int index_of_port(int port) const {
    for (int i = 0; i < kNodes; ++i) {
      if (servers_[i].port() == port) return i;
    }
    return -1;
  }

  std::string start() {
    for (RedisServer& server : servers_) {
      // The bus port would be port + 10000 by default, which may not exist: pick one.
      const int bus = RedisServer::free_port();
      if (bus == 0) return "no free TCP port for the cluster bus";
      server.set_extra_args({"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                             "--cluster-node-timeout", "1000", "--cluster-port",
                             std::to_string(bus), "--cluster-require-full-coverage", "no"});
      if (std::string e = server.start(); !e.empty()) return e;
    }
    std::string command = "redis-cli --cluster create";
    for (const RedisServer& server : servers_) {
      command += " 127.0.0.1:" + std::to_string(server.port());
    }
    command += " --cluster-replicas 1 --cluster-yes >/dev/null 2>&1";
    if (std::system(command.c_str()) != 0) {
      return "redis-cli --cluster create failed (is redis-tools installed?): " + command;
    }
    return wait_ok();
  }

  // Waits (≤ 30 s) until every node says cluster_state:ok and sees all slots, and every replica's
  // link to its primary is up.
  std::string wait_ok() const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      bool all = true;
      for (const RedisServer& server : servers_) {
        Reply info = server.command({"CLUSTER", "INFO"});
        Reply replication = server.command({"INFO", "replication"});
        if (!info || !replication) {
          all = false;
          break;
        }
        const std::string_view i(info->str, info->len);
        const std::string_view r(replication->str, replication->len);
        if (i.find("cluster_state:ok") == std::string_view::npos ||
            i.find("cluster_slots_ok:16384") == std::string_view::npos ||
            (r.find("role:slave") != std::string_view::npos &&
             r.find("master_link_status:up") == std::string_view::npos)) {
          all = false;
          break;
        }
      }
      if (all) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return "the cluster did not become ok within 30 s";
  }

  std::array<RedisServer, kNodes> servers_;
  std::string error_;
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_REDIS_CLUSTER_HPP_
