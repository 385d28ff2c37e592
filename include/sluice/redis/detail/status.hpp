// sluice/redis/detail/status.hpp — how Redis failures become absl::Status codes. Internal.
//
// The client reports every failure as one of a few codes so that callers can apply one policy:
// DeadlineExceeded for a timeout, Unavailable for a server or connection that is down or in a
// passing state, Internal for a reply the script would never give.
//
//   if (redisGetReply(context, &reply) != REDIS_OK) {
//     return sluice::redis::detail::io_status(*context, errno, "command");
//   }
//
// Thread-safety: pure functions.
#ifndef SLUICE_REDIS_DETAIL_STATUS_HPP_
#define SLUICE_REDIS_DETAIL_STATUS_HPP_

#include <errno.h>
#include <hiredis/hiredis.h>

#include <array>
#include <string>
#include <string_view>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/detail/text.hpp"

namespace sluice::redis::detail {

// The status for a context whose last call failed; `saved_errno` is errno right after it.
inline absl::Status io_status(const redisContext& context, int saved_errno, std::string_view what) {
  bool timed_out =
      context.err == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
                                      saved_errno == ETIMEDOUT || saved_errno == EINPROGRESS);
#ifdef REDIS_ERR_TIMEOUT  // hiredis >= 1.0
  timed_out = timed_out || context.err == REDIS_ERR_TIMEOUT;
#endif
  const std::string message = absl::StrCat(
      "sluice::redis: ", absl::string_view(what.data(), what.size()), ": ", context.errstr);
  if (timed_out) {
    return absl::DeadlineExceededError(message);
  }
  if (context.err == REDIS_ERR_PROTOCOL) {
    return absl::InternalError(message);
  }
  return absl::UnavailableError(message);
}

// The status for a failed send, recv or ppoll on a connection's socket (`error`: its errno):
// the connection is lost (reset, closed, or unusable).
inline absl::Status socket_status(int error, std::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("sluice::redis: ", absl::string_view(what.data(), what.size()), ": ",
                   std::generic_category().message(error)));
}

// Maps an error reply from the server. Server states that pass (busy, loading, read-only after
// a failover, out of memory, cluster redirections, auth) are Unavailable; anything else means
// the reply was not what the script returns: Internal.
inline absl::Status server_error_status(std::string_view error) {
  static constexpr std::array<std::string_view, 15> kUnavailable = {
      "BUSY", "LOADING", "READONLY",  "MASTERDOWN", "OOM",     "TRYAGAIN",   "CLUSTERDOWN", "MOVED",
      "ASK",  "NOAUTH",  "WRONGPASS", "NOPERM",     "MISCONF", "NOREPLICAS", "UNBLOCKED"};
  const std::string_view code = error.substr(0, error.find(' '));
  // Escaped: the text is the server's (or whatever answers for it), and a newline or a terminal
  // escape in it would forge lines of the log the status ends up in.
  const std::string message = absl::StrCat("sluice::redis: server replied: ",
                                           sluice::detail::escaped(error.substr(0, 200)));
  for (std::string_view known : kUnavailable) {
    if (code == known) {
      return absl::UnavailableError(message);
    }
  }
  return absl::InternalError(message);
}

}  // namespace sluice::redis::detail

#endif  // SLUICE_REDIS_DETAIL_STATUS_HPP_
