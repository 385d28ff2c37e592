// sluice/postgres/connection_pool.hpp — a bounded pool of libpq connections with deadlines.
//
// Every limiter, migration and cleanup call borrows a connection from a `ConnectionPool` for one
// request. A borrow waits at most `acquire_timeout` for a free connection; a request waits at
// most `statement_timeout` (enforced by the server, which then rolls the statement back) plus
// `reply_grace` for its reply. A check's borrow, connect and request all end by its one deadline,
// and a request is never sent after it. A connection that failed is closed, never reused; the
// next borrow opens a fresh one (that is the reconnect).
//
//   auto pool = sluice::postgres::ConnectionPool::create(
//       {.conninfo = "host=/run/postgresql dbname=app user=app",
//        .statement_timeout = std::chrono::milliseconds(100)});
//   if (!pool.ok()) return pool.status();  // InvalidArgument: bad options; nothing connects yet
//
// `conninfo` is a libpq connection string or URI, parsed at creation (InvalidArgument with libpq's
// message if it cannot be). Host names in it are resolved at each new connection within
// connect_timeout, and every address found is tried in turn.
// Thread-safety: thread-safe; leases must not outlive the pool. Share one pool (through
// std::shared_ptr) between the limiters, the engine backend and the maintenance calls.
#ifndef SLUICE_POSTGRES_CONNECTION_POOL_HPP_
#define SLUICE_POSTGRES_CONNECTION_POOL_HPP_

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/postgres/detail/connect_target.hpp"
#include "sluice/postgres/detail/libpq.hpp"

namespace sluice::postgres {

struct ConnectionOptions {
  std::string conninfo;                             // libpq connection string or URI
  std::chrono::milliseconds connect_timeout{1000};  // per new connection (and its session setup)
  std::chrono::milliseconds acquire_timeout{200};   // wait for a free connection
  // The server cancels a statement running longer (SQLSTATE 57014: rolled back, DeadlineExceeded).
  std::chrono::milliseconds statement_timeout{200};
  // Extra wait for a reply beyond statement_timeout (network, scheduling). A reply later still is
  // an unknown outcome for a check: it may have committed.
  std::chrono::milliseconds reply_grace{200};
  std::size_t max_connections = 16;  // open at once, idle or leased
};

// Where calls take their time, in ns since the Unix epoch (≥ 0). Empty, the default: the
// database's clock_timestamp(), one clock for the whole fleet. Set it to decide at chosen times
// (tests driving a sluice::ManualClock, replays); it is called once per call, from any thread.
using TimeSource = std::function<std::chrono::nanoseconds()>;

// One statement parameter: text (or raw bytes where `binary`), or SQL NULL.
struct Param {
  std::string value;
  bool binary = false;
  bool null = false;
};

class ConnectionPool {
 public:
  // One pooled connection: the libpq handle and the statements prepared on it.
  struct Connection {
    PGconn* conn = nullptr;
    std::vector<std::string> prepared;
    bool terminated = false;  // the server announced (FATAL) that it is closing the connection
  };

  // A borrowed connection, returned to the pool on destruction unless marked broken.
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : pool_(std::exchange(other.pool_, nullptr)),
          connection_(std::exchange(other.connection_, nullptr)) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr) pool_->release(connection_);
    }

    PGconn* get() const noexcept { return connection_->conn; }

    // Runs `sql` with parameters $1..$n as the prepared statement `name`, preparing it on this
    // connection first if needed (one extra round trip, once per connection), sending and
    // reading by `deadline` (default: the pool's call_deadline() from now). One round trip; see
    // detail::read_results for the error mapping.
    absl::StatusOr<detail::ResultPtr> run(const char* name, const char* sql,
                                          std::span<const Param> params, detail::Effect effect) {
      return run(name, sql, params, effect, pool_->call_deadline());
    }
    absl::StatusOr<detail::ResultPtr> run(const char* name, const char* sql,
                                          std::span<const Param> params, detail::Effect effect,
                                          detail::Deadline deadline);

    // Runs `sql` (one or more statements, no parameters) with the simple query protocol, waiting
    // at most `timeout` for the reply.
    absl::StatusOr<detail::ResultPtr> run_simple(const std::string& sql,
                                                 std::chrono::milliseconds timeout,
                                                 detail::Effect effect);

   private:
    friend class ConnectionPool;
    Lease(ConnectionPool* pool, Connection* connection) : pool_(pool), connection_(connection) {}
    // Sends what the PQsend* call that returned `queued` queued, by `deadline`; closes the
    // connection when it cannot (Unavailable, or DeadlineExceeded: nothing ran either way).
    absl::Status flush(int queued, detail::Deadline deadline);
    // Reads the request's results (detail::read_results); closes the connection if it was lost.
    absl::StatusOr<detail::ResultPtr> finish(detail::Deadline deadline, detail::Effect effect);
    void mark_broken() noexcept;

    ConnectionPool* pool_;
    Connection* connection_;
  };

  static absl::StatusOr<std::shared_ptr<ConnectionPool>> create(ConnectionOptions options) {
    if (options.max_connections == 0) {
      return absl::InvalidArgumentError("sluice::postgres: max_connections must be >= 1");
    }
    for (auto [name, value] : {std::pair{"connect_timeout", options.connect_timeout},
                               {"acquire_timeout", options.acquire_timeout},
                               {"statement_timeout", options.statement_timeout}}) {
      if (value.count() <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("sluice::postgres: ", name, " must be > 0"));
      }
    }
    if (options.reply_grace.count() < 0) {
      return absl::InvalidArgumentError("sluice::postgres: reply_grace must be >= 0");
    }
    absl::StatusOr<std::unique_ptr<detail::ConnectTarget>> target =
        detail::ConnectTarget::parse(options.conninfo);
    if (!target.ok()) return target.status();
    return std::shared_ptr<ConnectionPool>(
        new ConnectionPool(std::move(options), *std::move(target)));
  }

  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;
  ~ConnectionPool() {
    for (Connection* c : idle_) close(c);
  }

  const ConnectionOptions& options() const noexcept { return options_; }

  // The one deadline of a call starting now, for its sends and its reads: statement_timeout +
  // reply_grace from now.
  detail::Deadline call_deadline() const {
    return std::chrono::steady_clock::now() + options_.statement_timeout + options_.reply_grace;
  }

  // An idle connection, or a new one while fewer than max_connections are open; waits at most
  // acquire_timeout for one to come back (then DeadlineExceeded). A new connection that cannot
  // be opened within connect_timeout is Unavailable (or DeadlineExceeded on timeout).
  absl::StatusOr<Lease> acquire() { return acquire(detail::Deadline::max()); }
  // The same for a call that must end by `deadline`: the wait and the connect end by it too
  // (DeadlineExceeded), so that a call never starts what it has no time left to finish.
  absl::StatusOr<Lease> acquire(detail::Deadline deadline) {
    {
      std::unique_lock lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(
            "sluice::postgres: the call's deadline passed before it took a connection; nothing "
            "ran");
      }
      const bool ready = available_.wait_until(
          lock, std::min(deadline, now + options_.acquire_timeout),
          [this] { return !idle_.empty() || open_ < options_.max_connections; });
      if (!ready) {
        return absl::DeadlineExceededError(
            "sluice::postgres: no free connection within the acquire timeout or before the "
            "call's deadline");
      }
      if (!idle_.empty()) {
        Connection* c = idle_.back();
        idle_.pop_back();
        if (alive(c)) return Lease(this, c);
        close(c);  // the server closed it while idle; its slot goes to a fresh connection
      } else {
        ++open_;
      }
    }
    absl::StatusOr<Connection*> c = connect(deadline);
    if (!c.ok()) {
      release(nullptr);
      return c.status();
    }
    return Lease(this, *c);
  }

  std::size_t open_connections() const {
    std::lock_guard lock(mu_);
    return open_;
  }

  // Closes every idle connection (leased ones close when they fail or on destruction).
  void close_idle() {
    std::vector<Connection*> idle;
    {
      std::lock_guard lock(mu_);
      idle.swap(idle_);
      open_ -= idle.size();
    }
    for (Connection* c : idle) close(c);
    available_.notify_all();
  }

 private:
  ConnectionPool(ConnectionOptions options, std::unique_ptr<detail::ConnectTarget> target)
      : options_(std::move(options)), target_(std::move(target)) {}

  // Reads whatever the server sent while the connection was idle, without blocking: a closed
  // socket or a termination notice (e.g. after pg_terminate_backend or a server shutdown) shows
  // up here, before a statement is sent on a connection that cannot carry it.
  static bool alive(Connection* c) noexcept {
    return PQconsumeInput(c->conn) != 0 && PQstatus(c->conn) == CONNECTION_OK &&
           PQisBusy(c->conn) == 0 && !c->terminated;
  }

  // libpq hands a message that arrives outside a request to the notice receiver; a FATAL one
  // means the server is closing this connection.
  static void on_notice(void* connection, const PGresult* notice) noexcept {
    const char* severity = PQresultErrorField(notice, PG_DIAG_SEVERITY_NONLOCALIZED);
    if (severity != nullptr && std::string_view(severity) == "FATAL") {
      static_cast<Connection*>(connection)->terminated = true;
    }
  }

  static void close(Connection* c) noexcept {
    if (c == nullptr) return;
    PQfinish(c->conn);
    delete c;
  }

  // Returns a healthy connection to the idle list, or gives up the slot of a closed one (nullptr)
  // or of one not idle after its call — inside a transaction, a failed one, or with a request in
  // flight — which it closes: no later call inherits another's transaction state.
  void release(Connection* c) {
    if (c != nullptr && PQtransactionStatus(c->conn) != PQTRANS_IDLE) {
      close(c);
      c = nullptr;
    }
    {
      std::lock_guard lock(mu_);
      if (c != nullptr) {
        idle_.push_back(c);
      } else {
        --open_;
      }
    }
    available_.notify_one();
  }

  // The session's settings: the timeouts, and generic plans. sluice's prepared statements are
  // planned once per connection: left to choose, the server plans the coalesced checks'
  // statement anew at every execution (its parameters make each custom plan look cheaper),
  // which costs about as much as executing it.
  std::string session_setup() const {
    return absl::StrCat("SET statement_timeout = ", options_.statement_timeout.count(),
                        "; SET lock_timeout = ", options_.statement_timeout.count(),
                        "; SET plan_cache_mode = force_generic_plan");
  }

  // Opens a connection without blocking past connect_timeout or the call's `by`, then sets the
  // session's statement_timeout in the same budget.
  absl::StatusOr<Connection*> connect(detail::Deadline by) const {
    const detail::Deadline deadline =
        std::min(by, std::chrono::steady_clock::now() + options_.connect_timeout);
    absl::StatusOr<detail::ConnectParams> params = target_->resolve(deadline);
    if (!params.ok()) return params.status();
    std::vector<const char*> keys, values;
    for (const auto& [keyword, value] : *params) {
      keys.push_back(keyword.c_str());
      values.push_back(value.c_str());
    }
    keys.push_back(nullptr);
    values.push_back(nullptr);
    auto c = std::make_unique<Connection>();
    c->conn = PQconnectStartParams(keys.data(), values.data(), /*expand_dbname=*/0);
    if (c->conn == nullptr) {
      return absl::ResourceExhaustedError("sluice::postgres: cannot allocate a connection");
    }
    auto fail = [&](absl::Status status) {
      PQfinish(c->conn);
      return status;
    };
    PQsetNoticeReceiver(c->conn, &ConnectionPool::on_notice, c.get());  // never to stderr
    if (PQstatus(c->conn) == CONNECTION_BAD) {
      return fail(absl::UnavailableError(
          absl::StrCat("sluice::postgres: connect: ", detail::connection_message(c->conn))));
    }
    for (PostgresPollingStatusType state = PGRES_POLLING_WRITING; state != PGRES_POLLING_OK;) {
      if (state == PGRES_POLLING_FAILED) {
        return fail(absl::UnavailableError(
            absl::StrCat("sluice::postgres: connect: ", detail::connection_message(c->conn))));
      }
      const short events = state == PGRES_POLLING_READING ? POLLIN : POLLOUT;
      if (!detail::wait_fd(PQsocket(c->conn), events, deadline)) {
        return fail(absl::DeadlineExceededError(
            "sluice::postgres: connect: no connection within the connect timeout or before "
            "the call's deadline"));
      }
      state = PQconnectPoll(c->conn);
    }
    // Non-blocking from here on: every send is flushed against its call's deadline.
    if (PQsetnonblocking(c->conn, 1) != 0 || PQsendQuery(c->conn, session_setup().c_str()) == 0) {
      return fail(absl::UnavailableError(
          absl::StrCat("sluice::postgres: connect: ", detail::connection_message(c->conn))));
    }
    if (const detail::Flush sent = detail::flush(c->conn, deadline); sent != detail::Flush::kSent) {
      return fail(sent == detail::Flush::kTimedOut
                      ? absl::DeadlineExceededError(
                            "sluice::postgres: connect: no session within the connect timeout")
                      : absl::UnavailableError(absl::StrCat("sluice::postgres: connect: ",
                                                            detail::connection_message(c->conn))));
    }
    bool lost = false;
    absl::StatusOr<detail::ResultPtr> r =
        detail::read_results(c->conn, deadline, detail::Effect::kReadOnly, lost);
    if (!r.ok()) return fail(r.status());
    return c.release();
  }

  const ConnectionOptions options_;
  const std::unique_ptr<detail::ConnectTarget> target_;  // the parsed conninfo
  mutable std::mutex mu_;
  std::condition_variable available_;  // signalled when a connection or a slot is released
  // Guarded by mu_. std::mutex, not absl::Mutex: Debian's libabsl is not built with TSan, which
  // then cannot see absl::Mutex's synchronization and reports false races (libstdc++'s std::mutex
  // is intercepted). std::mutex carries no thread-safety annotations in libstdc++.
  std::vector<Connection*> idle_;
  std::size_t open_ = 0;  // idle + leased
};

inline void ConnectionPool::Lease::mark_broken() noexcept {
  ConnectionPool::close(connection_);
  connection_ = nullptr;
}

inline absl::Status ConnectionPool::Lease::flush(int queued, detail::Deadline deadline) {
  const detail::Flush flushed =
      queued == 0 ? detail::Flush::kConnectionLost : detail::flush(get(), deadline);
  if (flushed == detail::Flush::kSent) return absl::OkStatus();
  absl::Status status =
      flushed == detail::Flush::kTimedOut
          ? absl::DeadlineExceededError(
                "sluice::postgres: the request was not sent whole before the deadline; nothing ran")
          : absl::UnavailableError(
                absl::StrCat("sluice::postgres: send: ", detail::connection_message(get())));
  mark_broken();
  return status;
}

inline absl::StatusOr<detail::ResultPtr> ConnectionPool::Lease::finish(detail::Deadline deadline,
                                                                       detail::Effect effect) {
  bool lost = false;
  absl::StatusOr<detail::ResultPtr> r = detail::read_results(get(), deadline, effect, lost);
  if (lost || PQstatus(get()) != CONNECTION_OK) mark_broken();
  return r;
}

inline absl::StatusOr<detail::ResultPtr> ConnectionPool::Lease::run(const char* name,
                                                                    const char* sql,
                                                                    std::span<const Param> params,
                                                                    detail::Effect effect,
                                                                    detail::Deadline deadline) {
  // A request sent after its deadline could commit with no time left to tell its caller: it is
  // not sent at all (DeadlineExceeded, nothing ran), and the connection stays as it was.
  const auto too_late = [deadline] { return std::chrono::steady_clock::now() >= deadline; };
  const auto not_sent = [] {
    return absl::DeadlineExceededError(
        "sluice::postgres: the call's deadline passed before its request was sent; nothing ran");
  };
  std::vector<std::string>& prepared = connection_->prepared;
  if (std::find(prepared.begin(), prepared.end(), name) == prepared.end()) {
    if (too_late()) return not_sent();
    if (absl::Status sent = flush(PQsendPrepare(get(), name, sql, 0, nullptr), deadline);
        !sent.ok()) {
      return sent;
    }
    absl::StatusOr<detail::ResultPtr> r = finish(deadline, detail::Effect::kReadOnly);
    if (!r.ok()) return r.status();
    prepared.emplace_back(name);
  }
  std::vector<const char*> values;
  std::vector<int> lengths, formats;
  for (const Param& p : params) {
    values.push_back(p.null ? nullptr : p.value.c_str());
    lengths.push_back(static_cast<int>(p.value.size()));
    formats.push_back(p.binary ? 1 : 0);
  }
  if (too_late()) return not_sent();
  const int queued = PQsendQueryPrepared(get(), name, static_cast<int>(params.size()),
                                         values.data(), lengths.data(), formats.data(),
                                         /*resultFormat=*/0);
  if (absl::Status sent = flush(queued, deadline); !sent.ok()) return sent;
  return finish(deadline, effect);
}

inline absl::StatusOr<detail::ResultPtr> ConnectionPool::Lease::run_simple(
    const std::string& sql, std::chrono::milliseconds timeout, detail::Effect effect) {
  const detail::Deadline deadline = std::chrono::steady_clock::now() + timeout;
  if (absl::Status sent = flush(PQsendQuery(get(), sql.c_str()), deadline); !sent.ok()) {
    return sent;
  }
  return finish(deadline, effect);
}

}  // namespace sluice::postgres

#endif  // SLUICE_POSTGRES_CONNECTION_POOL_HPP_
