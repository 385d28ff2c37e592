// Internal: libpq with deadlines — waiting on a connection's socket, reading every result of one
// request, and mapping failures to absl::Status. Used by sluice::postgres::ConnectionPool.
#ifndef SLUICE_POSTGRES_DETAIL_LIBPQ_HPP_
#define SLUICE_POSTGRES_DETAIL_LIBPQ_HPP_

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sluice/detail/text.hpp"

namespace sluice::postgres::detail {

using Deadline = std::chrono::steady_clock::time_point;

struct ResultDeleter {
  void operator()(PGresult* result) const noexcept { PQclear(result); }
};
using ResultPtr = std::unique_ptr<PGresult, ResultDeleter>;

// Waits until `fd` is ready for `events` (POLLIN / POLLOUT) or `deadline` passes; false on the
// latter. Retries on EINTR.
inline bool wait_fd(int fd, short events, Deadline deadline) {
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 60'000)));
    if (ready > 0) return true;  // readable, writable, or an error the next libpq call reports
    if (ready < 0 && errno != EINTR) return true;
  }
}

// Hands the server what libpq holds for it (the connection is non-blocking: a send only queues),
// waiting at most until `deadline`. A request not flushed whole by then never ran: the server
// runs nothing of a simple query before its end, and commits nothing before an extended query's
// final Sync.
enum class Flush { kSent, kTimedOut, kConnectionLost };
inline Flush flush(PGconn* conn, Deadline deadline) {
  for (;;) {
    const int pending = PQflush(conn);
    if (pending == 0) return Flush::kSent;
    if (pending < 0) return Flush::kConnectionLost;
    // libpq's protocol: read what the server sent meanwhile (it may wait for us to), then retry.
    if (!wait_fd(PQsocket(conn), POLLIN | POLLOUT, deadline)) return Flush::kTimedOut;
    if (PQconsumeInput(conn) == 0) return Flush::kConnectionLost;
  }
}

// libpq's message for a connection, trimmed to one line without the trailing newline.
inline std::string connection_message(const PGconn* conn) {
  std::string_view text = conn != nullptr ? PQerrorMessage(conn) : "out of memory";
  text = text.substr(0, text.find('\n'));
  return sluice::detail::escaped(text.substr(0, 300));  // may hold the server's text
}

// The status for an error the server reported with `sqlstate` (it ended the statement: its
// transaction did not commit).
inline absl::Status server_error_status(std::string_view sqlstate, std::string_view message) {
  // Escaped: a function of the database (or whatever answers for it) chooses the text, and a
  // carriage return or a terminal escape in it would forge the log the status ends up in.
  const std::string text = absl::StrCat(
      "sluice::postgres: server error ", sluice::detail::escaped(sqlstate.substr(0, 5)), ": ",
      sluice::detail::escaped(message.substr(0, message.find('\n')).substr(0, 300)));
  if (sqlstate == "57014" || sqlstate == "55P03") {  // statement or lock timeout
    return absl::DeadlineExceededError(text);
  }
  if (sqlstate == "42883" || sqlstate == "3F000" || sqlstate == "42P01") {
    return absl::FailedPreconditionError(
        absl::StrCat(text, " (is the schema installed? call sluice::postgres::migrate)"));
  }
  const std::string_view sqlclass = sqlstate.substr(0, 2);
  if (sqlclass == "08" || sqlclass == "57" || sqlclass == "53" || sqlclass == "58" ||
      sqlclass == "40" || sqlstate == "25006" || sqlstate == "28000" || sqlstate == "28P01") {
    return absl::UnavailableError(text);  // connection, shutdown, resources, retryable aborts
  }
  return absl::InternalError(text);
}

// Whether a lost reply can hide a committed write.
enum class Effect {
  kReadOnly,  // nothing commits: a lost reply is plain Unavailable / DeadlineExceeded
  kWrites,    // the statement commits: a lost reply leaves the outcome unknown
  // Several statements in one implicit transaction (a simple query without BEGIN): as kWrites,
  // except that a server error anywhere means that none of them committed.
  kOneTransaction,
};

// How one request over a connection ended, when it did not end in results.
struct Failure {
  absl::Status status;
  bool connection_lost;  // the connection is unusable and must be closed
};

inline absl::Status unknown_outcome(std::string_view why) {
  return absl::UnknownError(
      absl::StrCat("sluice::postgres: outcome unknown (", std::string(why),
                   "): the statement may or may not have committed; it was not retried"));
}

// Waits until libpq can hand out the request's next result without blocking.
enum class Wait { kReady, kTimedOut, kConnectionLost };
inline Wait wait_result(PGconn* conn, Deadline deadline) {
  while (PQisBusy(conn) != 0) {
    if (!wait_fd(PQsocket(conn), POLLIN, deadline)) return Wait::kTimedOut;
    if (PQconsumeInput(conn) == 0) return Wait::kConnectionLost;
  }
  return Wait::kReady;
}

// The status of a result that carries neither data nor a completion: the server's error (by its
// SQLSTATE) or Internal. nullopt for an error libpq raised itself: the connection is gone.
inline std::optional<absl::Status> error_result_status(const PGresult* result) {
  const ExecStatusType status = PQresultStatus(result);
  if (status != PGRES_FATAL_ERROR && status != PGRES_NONFATAL_ERROR) {
    return absl::InternalError(
        absl::StrCat("sluice::postgres: unexpected result status ", PQresStatus(status)));
  }
  const char* sqlstate = PQresultErrorField(result, PG_DIAG_SQLSTATE);
  if (sqlstate == nullptr) return std::nullopt;
  return server_error_status(sqlstate, PQresultErrorMessage(result));
}

// Reads every result of the request just sent on `conn` (until libpq's terminating null),
// waiting at most until `deadline`. Returns the one data or command result, or how it failed:
//   - the server reported an error before any data: that statement did not commit;
//   - the connection broke or the deadline passed before the request's end: with Effect::kWrites
//     the commit may have happened without its acknowledgement, so the outcome is unknown
//     (absl::StatusCode::kUnknown); a data row followed by an error is unknown likewise.
// Sets `connection_lost` when the connection must be closed.
inline absl::StatusOr<ResultPtr> read_results(PGconn* conn, Deadline deadline, Effect effect,
                                              bool& connection_lost) {
  ResultPtr data;
  absl::Status error;
  auto lost = [&](std::string_view why, bool timed_out = false) {
    connection_lost = true;
    if (effect != Effect::kReadOnly) return unknown_outcome(why);
    const std::string text = absl::StrCat("sluice::postgres: ", std::string(why));
    return timed_out ? absl::DeadlineExceededError(text) : absl::UnavailableError(text);
  };
  for (;;) {
    const Wait wait = wait_result(conn, deadline);
    if (wait == Wait::kTimedOut) return lost("no reply before the deadline", /*timed_out=*/true);
    if (wait == Wait::kConnectionLost) {
      return lost(absl::StrCat("connection lost: ", connection_message(conn)));
    }
    ResultPtr result(PQgetResult(conn));
    if (result == nullptr) break;
    const ExecStatusType status = PQresultStatus(result.get());
    if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK) {
      if (error.ok()) data = std::move(result);
    } else {
      std::optional<absl::Status> s = error_result_status(result.get());
      if (!s) return lost(absl::StrCat("connection lost: ", connection_message(conn)));
      if (data != nullptr && effect == Effect::kWrites) {  // e.g. the commit itself failed
        connection_lost = PQstatus(conn) != CONNECTION_OK;
        return unknown_outcome("an error followed the reply");
      }
      if (error.ok()) error = *std::move(s);
    }
    if (PQstatus(conn) != CONNECTION_OK) {
      connection_lost = true;
      // An error the server sent before dying (e.g. 57P01 from pg_terminate_backend) ended the
      // statement before its commit; anything else is unknown.
      if (!error.ok() && data == nullptr) return error;
      return lost("connection lost before the end of the reply");
    }
  }
  if (!error.ok()) return error;
  if (data == nullptr) return absl::InternalError("sluice::postgres: no result");
  return data;
}

}  // namespace sluice::postgres::detail

#endif  // SLUICE_POSTGRES_DETAIL_LIBPQ_HPP_
