// sluice/redis/detail/server_check.hpp — refuse a server that cannot hold limits as configured:
// one too old for the bundled scripts, one in the other Cluster mode than ClientOptions::cluster
// says, a replica (outside a Cluster), or one whose memory settings let limiter state grow without
// bound or be evicted (memory_check.hpp). Internal: every connection pool runs it on each new
// connection, and the factories (Client::create, the limiters' and the engine backend's create) ask
// the pool for its verdict once, so that a misconfigured server is refused at creation.
//
//   absl::Status ok = sluice::redis::detail::check_server(
//       context, deadline, {.memory = sluice::redis::MemoryCheck::kRequireBounded});
//   // FailedPrecondition naming the fix: "... run CONFIG SET maxmemory-policy volatile-ttl ..."
//
// One round trip: INFO server, INFO cluster, CONFIG GET maxmemory and maxmemory-policy, INFO
// replication (outside a Cluster, a replica is refused), and, with `probe_scripts` (a pool's
// first connection), a one-line script loaded and run by its hash (a server whose ACL denies
// scripts, or with EVALSHA renamed, would fail every check), pipelined. MemoryCheck::kSkip sends
// nothing and accepts the server.
// Thread-safety: uses one connection, which one thread holds at a time; the rest are pure.
#ifndef SLUICE_REDIS_DETAIL_SERVER_CHECK_HPP_
#define SLUICE_REDIS_DETAIL_SERVER_CHECK_HPP_

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/detail/text.hpp"
#include "sluice/redis/detail/io.hpp"
#include "sluice/redis/detail/memory_check.hpp"
#include "sluice/redis/options.hpp"

namespace sluice::redis::detail {

// What a pool requires of its server.
struct ServerRequirements {
  MemoryCheck memory = MemoryCheck::kRequireBounded;
  bool cluster = false;  // a Cluster node (ClientOptions::cluster), else a standalone server
};

// The scripts call TIME and then write, which needs script effects replication: the default
// from Redis 5.0 (before it, such a script fails on every call).
inline constexpr int kMinServerMajorVersion = 5;

// The verdict on INFO's `redis_version` ("7.0.15").
inline absl::Status server_version_status(std::string_view version) {
  int major = 0;
  const char* const end = version.data() + version.size();
  const auto [parsed_to, error] = std::from_chars(version.data(), end, major);
  const std::string shown = sluice::detail::escaped(version.substr(0, 32));  // the server's text
  if (error != std::errc() || parsed_to == end || *parsed_to != '.') {
    return absl::FailedPreconditionError(absl::StrCat(
        "sluice::redis: cannot tell the server's version (INFO redis_version \"", shown,
        "\"); the scripts need Redis 5.0 or later: if the server is, check its memory "
        "settings yourself and set memory_check = MemoryCheck::kSkip"));
  }
  if (major < kMinServerMajorVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sluice::redis: the server is Redis ", shown,
        "; the scripts call TIME before they write, which needs Redis 5.0 or later (script "
        "effects replication by default): upgrade the server"));
  }
  return absl::OkStatus();
}

// The verdict on INFO's `cluster_enabled` against ClientOptions::cluster.
inline absl::Status cluster_mode_status(bool enabled, bool expected) {
  if (enabled == expected) return absl::OkStatus();
  if (expected) {
    return absl::FailedPreconditionError(
        "sluice::redis: ClientOptions::cluster is set but the server is not a Cluster node "
        "(cluster_enabled:0), so the slot map cannot be read; set ClientOptions::cluster = false, "
        "or point connection at a node of the Cluster");
  }
  return absl::FailedPreconditionError(
      "sluice::redis: the server is a Redis Cluster node (cluster_enabled:1), which answers only "
      "for the keys of its own slots; set ClientOptions::cluster = true");
}

// The value of `name` in an INFO reply ("name:value\r\n" lines), if present.
inline std::optional<std::string_view> info_field(std::string_view info, std::string_view name) {
  for (std::size_t at = 0; at < info.size();) {
    std::size_t end = info.find('\n', at);
    if (end == std::string_view::npos) end = info.size();
    std::string_view line = info.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > name.size() && line.starts_with(name) && line[name.size()] == ':') {
      return line.substr(name.size() + 1);
    }
    at = end + 1;
  }
  return std::nullopt;
}

// The text of an INFO reply; FailedPrecondition if the server refused it.
inline absl::StatusOr<std::string_view> info_text(const redisReply& reply) {
  if (reply.type == REDIS_REPLY_ERROR) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sluice::redis: cannot read the server's INFO (",
        sluice::detail::escaped(std::string_view(reply.str, reply.len).substr(0, 200)),
        "); where INFO or CONFIG is renamed or denied, check the server's version (5.0 or "
        "later), Cluster mode and memory settings yourself and set memory_check = "
        "MemoryCheck::kSkip"));
  }
  if (reply.type != REDIS_REPLY_STRING) {
    return absl::InternalError("sluice::redis: INFO returned an unexpected reply");
  }
  return std::string_view(reply.str, reply.len);
}

// The script the check runs by its hash, and that hash (SHA-1 of the text).
inline constexpr std::string_view kProbeScript = "return 1";
inline constexpr std::string_view kProbeScriptSha1 = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db";

// The verdict on SCRIPT LOAD of kProbeScript and EVALSHA of its hash: every check runs its script
// that way, so a server that refuses either (an ACL, a renamed command) would fail them all.
inline absl::Status scripting_status(const redisReply& load, const redisReply& run) {
  for (const redisReply* reply : {&load, &run}) {
    if (reply->type == REDIS_REPLY_ERROR) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sluice::redis: the server refuses to run scripts (",
          sluice::detail::escaped(std::string_view(reply->str, reply->len).substr(0, 200)),
          "), so every check would fail; allow SCRIPT and EVALSHA (ACL: +@scripting) for this "
          "client"));
    }
  }
  if (run.type != REDIS_REPLY_INTEGER || run.integer != 1) {
    return absl::InternalError("sluice::redis: a test script returned an unexpected reply");
  }
  return absl::OkStatus();
}

// Reads the settings (one round trip, by `end`) and judges them: version, then Cluster mode,
// then scripting (with `probe_scripts`), then memory.
inline absl::Status check_server(redisContext* context, Deadline end,
                                 const ServerRequirements& required, bool probe_scripts = true) {
  if (required.memory == MemoryCheck::kSkip) return absl::OkStatus();
  std::vector<Command> commands(probe_scripts ? 7 : 5);
  for (std::string_view arg : {"INFO", "server"}) commands[0].add(arg);
  for (std::string_view arg : {"INFO", "cluster"}) commands[1].add(arg);
  for (std::string_view arg : {"CONFIG", "GET", "maxmemory"}) commands[2].add(arg);
  for (std::string_view arg : {"CONFIG", "GET", "maxmemory-policy"}) commands[3].add(arg);
  for (std::string_view arg : {"INFO", "replication"}) commands[4].add(arg);
  if (probe_scripts) {
    for (std::string_view arg :
         {std::string_view("SCRIPT"), std::string_view("LOAD"), kProbeScript}) {
      commands[5].add(arg);
    }
    for (std::string_view arg :
         {std::string_view("EVALSHA"), kProbeScriptSha1, std::string_view("0")}) {
      commands[6].add(arg);
    }
  }
  absl::StatusOr<std::vector<ReplyPtr>> replies = exchange_on(context, end, commands);
  if (!replies.ok()) return replies.status();
  absl::StatusOr<std::string_view> server = info_text(*(*replies)[0]);
  if (!server.ok()) return server.status();
  absl::StatusOr<std::string_view> cluster = info_text(*(*replies)[1]);
  if (!cluster.ok()) return cluster.status();
  if (absl::Status s = server_version_status(info_field(*server, "redis_version").value_or(""));
      !s.ok()) {
    return s;
  }
  const bool cluster_enabled = info_field(*cluster, "cluster_enabled").value_or("0") == "1";
  if (absl::Status s = cluster_mode_status(cluster_enabled, required.cluster); !s.ok()) return s;
  // A replica refuses writes (or, writable, loses them at its next sync): every check would fail,
  // and under fail-open admit. In a Cluster, slots route writes to primaries by themselves.
  if (!required.cluster) {
    absl::StatusOr<std::string_view> replication = info_text(*(*replies)[4]);
    if (!replication.ok()) return replication.status();
    if (info_field(*replication, "role").value_or("master") != "master") {
      return absl::FailedPreconditionError(
          "sluice::redis: the server is a replica (INFO replication: role:slave), which refuses "
          "writes or loses them; point the client at the primary");
    }
  }
  if (probe_scripts) {
    if (absl::Status s = scripting_status(*(*replies)[5], *(*replies)[6]); !s.ok()) return s;
  }
  absl::StatusOr<std::string_view> bytes = config_value(*(*replies)[2]);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::string_view> policy = config_value(*(*replies)[3]);
  if (!policy.ok()) return policy.status();
  std::uint64_t maxmemory = 0;
  if (!absl::SimpleAtoi(absl::string_view(bytes->data(), bytes->size()), &maxmemory)) {
    return absl::InternalError("sluice::redis: CONFIG GET maxmemory is not a number");
  }
  return memory_settings_status(maxmemory, *policy, required.memory);
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_SERVER_CHECK_HPP_
