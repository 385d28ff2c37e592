// Internal: resolves a backend's host name within a call's deadline (the Redis and PostgreSQL
// connection pools).
//
// getaddrinfo(3) blocks with no timeout of its own: with the resolver down it can take the
// resolver configuration's timeout times its attempts times its name servers (10 s and more), and
// every check opening a connection meanwhile would wait that long. So a name that is not a numeric
// address is looked up on a thread of its own, and the caller waits for the answer only until its
// deadline. One lookup per host is in flight at a time: callers arriving meanwhile wait for the
// same answer, so a resolver outage costs at most one thread per host. A lookup that outlives its
// callers finishes on its own and is forgotten; the next call starts a fresh one (answers are not
// cached: addresses change, and connections open rarely).
//
// Thread-safety: thread-safe. Complexity: a numeric address costs one inet_pton per call.
#ifndef SLUICE_DETAIL_HOST_RESOLVER_HPP_
#define SLUICE_DETAIL_HOST_RESOLVER_HPP_

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/text.hpp"

namespace sluice::detail {

// A host's addresses as numeric text ("10.0.0.5", "::1"), in the order to try them.
using HostAddresses = std::vector<std::string>;
// Looks a host name up, blocking as long as it must (the system's: getaddrinfo).
using HostLookup = std::function<absl::StatusOr<HostAddresses>(const std::string& host)>;

// `host` as the messages here show it: quoted, every byte outside printable ASCII as \xNN, at most
// 255 bytes of it (a DNS name has at most 253). A host comes from a config file or from a Redis
// Cluster node's reply, and these messages reach logs through backend error events: a line feed
// or a terminal escape in a host must neither forge nor hide a log line.
inline std::string shown_host(std::string_view host) { return quoted_prefix(host, 255); }

// True iff `host` is a numeric IPv4 or IPv6 address: nothing to look up.
inline bool is_numeric_address(const std::string& host) {
  std::array<unsigned char, sizeof(in6_addr)> buffer{};
  return inet_pton(AF_INET, host.c_str(), buffer.data()) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buffer.data()) == 1;
}

// getaddrinfo for stream sockets, every family, in the order it returns them (each address once).
inline absl::StatusOr<HostAddresses> system_host_lookup(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), nullptr, &hints, &found); error != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve host ", shown_host(host), ": ", gai_strerror(error)));
  }
  const std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owned(found, &freeaddrinfo);
  HostAddresses out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    std::array<char, NI_MAXHOST> text{};
    if (getnameinfo(a->ai_addr, a->ai_addrlen, text.data(), text.size(), nullptr, 0,
                    NI_NUMERICHOST) != 0) {
      continue;
    }
    std::string address(text.data());
    if (std::find(out.begin(), out.end(), address) == out.end()) out.push_back(std::move(address));
  }
  if (out.empty()) {
    return absl::UnavailableError(
        absl::StrCat("host ", shown_host(host), " has no IPv4 or IPv6 address"));
  }
  return out;
}

class HostResolver {
 public:
  explicit HostResolver(std::string host, HostLookup lookup = system_host_lookup)
      : host_(std::move(host)), numeric_(is_numeric_address(host_)), lookup_(std::move(lookup)) {}

  // The host's addresses: the host itself if numeric, else the answer of a lookup, waited for
  // until `deadline`. DeadlineExceeded if none came by then (the lookup goes on for the next
  // caller); the lookup's own error (Unavailable: no such host, resolver failure) otherwise.
  absl::StatusOr<HostAddresses> resolve(std::chrono::steady_clock::time_point deadline) {
    if (numeric_) return HostAddresses{host_};
    absl::StatusOr<std::shared_ptr<Flight>> flight = join_or_start();
    if (!flight.ok()) return flight.status();
    Flight& f = **flight;
    std::unique_lock lock(f.mu);
    if (!f.done.wait_until(lock, deadline, [&] { return f.answer.has_value(); })) {
      return absl::DeadlineExceededError(
          absl::StrCat("host ", shown_host(host_), " was not resolved within the timeout"));
    }
    return *f.answer;
  }

  // Starts a lookup unless one is in flight (nothing for a numeric address), for a later
  // `resolve` to wait on: lookups of several hosts then run at the same time. A lookup that
  // cannot start is reported by that `resolve`.
  void start() {
    if (!numeric_) (void)join_or_start();
  }

 private:
  // One lookup and its answer, shared by its waiters and its thread.
  struct Flight {
    std::mutex mu;
    std::condition_variable done;
    std::optional<absl::StatusOr<HostAddresses>> answer;  // guarded by mu
  };

  // The lookup in flight, or a new one started on a thread of its own.
  absl::StatusOr<std::shared_ptr<Flight>> join_or_start() {
    std::lock_guard lock(mu_);
    if (flight_ != nullptr) {
      std::lock_guard answered(flight_->mu);
      if (!flight_->answer.has_value()) return flight_;
    }
    auto flight = std::make_shared<Flight>();
    try {
      std::thread([flight, host = host_, lookup = lookup_] {
        absl::StatusOr<HostAddresses> answer = lookup(host);
        {
          std::lock_guard answered(flight->mu);
          flight->answer = std::move(answer);
        }
        flight->done.notify_all();
      }).detach();
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot start a lookup of host ", shown_host(host_), ": ", e.what()));
    }
    flight_ = flight;
    return flight;
  }

  const std::string host_;
  const bool numeric_;
  const HostLookup lookup_;
  std::mutex mu_;
  std::shared_ptr<Flight> flight_;  // guarded by mu_: the latest lookup
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_HOST_RESOLVER_HPP_
