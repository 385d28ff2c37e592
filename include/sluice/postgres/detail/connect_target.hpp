// Internal: where sluice::postgres::ConnectionPool connects — the connection string, parsed once,
// with the host names in it resolved at each connect within the connect deadline.
//
// libpq resolves a `host` name with getaddrinfo inside PQconnectPoll, which blocks with no
// timeout (libpq's own documentation says to give `hostaddr` to avoid it). So each named host
// is resolved here (sluice/detail/host_resolver.hpp) and passed to libpq as `hostaddr`, one
// entry per address, beside its name (still used for authentication and TLS verification); libpq
// then tries them in order. A string that gives `hostaddr` itself is left as it is. A string
// that names no host takes libpq's defaults for it (PGHOST, PGHOSTADDR and PGPORT, or the service
// file PGSERVICE names), read once when the target is parsed; only a host named by a service file
// that the string itself names (`service=...`) is resolved by libpq.
//
// Thread-safety: thread-safe.
#ifndef SLUICE_POSTGRES_DETAIL_CONNECT_TARGET_HPP_
#define SLUICE_POSTGRES_DETAIL_CONNECT_TARGET_HPP_

#include <libpq-fe.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "sluice/detail/host_resolver.hpp"
#include "sluice/postgres/detail/libpq.hpp"

namespace sluice::postgres::detail {

// Keyword and value pairs for PQconnectStartParams (with expand_dbname 0).
using ConnectParams = std::vector<std::pair<std::string, std::string>>;

class ConnectTarget {
 public:
  // InvalidArgument if libpq cannot parse `conninfo` (its message), or if it names a number of
  // ports that matches neither one nor its number of hosts.
  static absl::StatusOr<std::unique_ptr<ConnectTarget>> parse(const std::string& conninfo) {
    const bool uri = conninfo.starts_with("postgresql://") || conninfo.starts_with("postgres://");
    if (!uri && conninfo.find('=') == std::string::npos && !conninfo.empty()) {
      // As libpq reads a dbname that is neither: the database's name alone.
      auto target = std::unique_ptr<ConnectTarget>(new ConnectTarget());
      target->params_.emplace_back("dbname", conninfo);
      return target;
    }
    char* error = nullptr;
    PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
    if (options == nullptr) {
      std::string message = error != nullptr ? error : "out of memory";
      PQfreemem(error);
      return absl::InvalidArgumentError(
          absl::StrCat("sluice::postgres: the connection string: ", message));
    }
    auto target = std::unique_ptr<ConnectTarget>(new ConnectTarget());
    std::string host, port, hostaddr;
    bool service = false;
    consume(options, host, port, hostaddr, [&](std::string_view keyword, const char* value) {
      if (keyword != "application_name") {
        service = service || keyword == "service";
        target->params_.emplace_back(keyword, value);
      }
    });
    if (host.empty() && hostaddr.empty() && !service) take_default_host(host, port, hostaddr);
    if (absl::Status s = target->set_hosts(host, port, hostaddr); !s.ok()) return s;
    return target;
  }

  // The parameters to connect with: every named host resolved by `deadline` (its lookups run at
  // once). A host that cannot be resolved is left out while another remains; with none left, the
  // first host's error (Unavailable, or DeadlineExceeded when no answer came in time).
  absl::StatusOr<ConnectParams> resolve(Deadline deadline) const {
    ConnectParams out = params_;
    out.emplace_back("application_name", "sluice");
    if (!named_) {
      for (const auto& [keyword, value] : given_) out.emplace_back(keyword, value);
      return out;
    }
    for (const auto& resolver : resolvers_) {
      if (resolver != nullptr) resolver->start();
    }
    std::vector<std::string> hosts, hostaddrs, ports;
    absl::Status first_error;
    for (std::size_t i = 0; i < hosts_.size(); ++i) {
      const std::string port = ports_.size() > 1 ? ports_[i] : "";
      sluice::detail::HostAddresses addresses{""};  // a socket directory: nothing to resolve
      if (resolvers_[i] != nullptr) {
        absl::StatusOr<sluice::detail::HostAddresses> found = resolvers_[i]->resolve(deadline);
        if (!found.ok()) {
          if (first_error.ok()) first_error = found.status();
          continue;
        }
        addresses = *std::move(found);
      }
      for (std::string& address : addresses) {
        hosts.push_back(hosts_[i]);
        hostaddrs.push_back(std::move(address));
        ports.push_back(port);
      }
    }
    if (hosts.empty()) {
      return absl::Status(first_error.code(),
                          absl::StrCat("sluice::postgres: connect: ", first_error.message()));
    }
    out.emplace_back("host", absl::StrJoin(hosts, ","));
    out.emplace_back("hostaddr", absl::StrJoin(hostaddrs, ","));
    if (ports_.size() == 1) out.emplace_back("port", ports_[0]);
    if (ports_.size() > 1) out.emplace_back("port", absl::StrJoin(ports, ","));
    return out;
  }

 private:
  ConnectTarget() = default;

  // The host, host address and (unless given) port libpq would take for a string that names no
  // host: the environment's, or those of the service file PGSERVICE names.
  static void take_default_host(std::string& host, std::string& port, std::string& hostaddr) {
    PQconninfoOption* defaults = PQconndefaults();
    if (defaults == nullptr) return;  // out of memory: libpq's to decide
    std::string default_port;
    consume(defaults, host, default_port, hostaddr, [](std::string_view, const char*) {});
    if (port.empty() && (!host.empty() || !hostaddr.empty())) port = default_port;
  }

  // Reads the host, port and hostaddr of `options` into those strings and passes every other
  // option that has a value to `other(keyword, value)`; then frees `options`.
  template <class Other>
  static void consume(PQconninfoOption* options, std::string& host, std::string& port,
                      std::string& hostaddr, Other other) {
    for (const PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
      if (o->val == nullptr) continue;
      const std::string_view keyword = o->keyword;
      if (keyword == "host") {
        host = o->val;
      } else if (keyword == "port") {
        port = o->val;
      } else if (keyword == "hostaddr") {
        hostaddr = o->val;
      } else {
        other(keyword, o->val);
      }
    }
    PQconninfoFree(options);
  }

  absl::Status set_hosts(const std::string& host, const std::string& port,
                         const std::string& hostaddr) {
    for (const auto& [keyword, value] :
         {std::pair{"host", &host}, {"port", &port}, {"hostaddr", &hostaddr}}) {
      if (!value->empty()) given_.emplace_back(keyword, *value);
    }
    if (host.empty() || !hostaddr.empty()) return absl::OkStatus();  // libpq's to decide
    hosts_ = std::vector<std::string>(absl::StrSplit(host, ','));
    if (!port.empty()) ports_ = std::vector<std::string>(absl::StrSplit(port, ','));
    if (ports_.size() > 1 && ports_.size() != hosts_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sluice::postgres: the connection string names ", ports_.size(),
                       " ports for ", hosts_.size(), " hosts: give one port, or one per host"));
    }
    for (const std::string& h : hosts_) {
      // A socket directory (an absolute path, or an abstract socket's @name) is not looked up.
      const bool socket = !h.empty() && (h.front() == '/' || h.front() == '@');
      named_ = named_ || (!socket && !h.empty());
      resolvers_.push_back(socket || h.empty() ? nullptr
                                               : std::make_unique<sluice::detail::HostResolver>(h));
    }
    return absl::OkStatus();
  }

  ConnectParams params_;  // everything set but the host, hostaddr, port and application_name
  ConnectParams given_;   // the host, hostaddr and port as written
  bool named_ = false;    // some host is a name (or a numeric address) to resolve here
  std::vector<std::string> hosts_, ports_;
  std::vector<std::unique_ptr<sluice::detail::HostResolver>> resolvers_;  // null: a socket
};

}  // namespace sluice::postgres::detail

#endif  // SLUICE_POSTGRES_DETAIL_CONNECT_TARGET_HPP_
