// sluice/request_path.hpp — the path of an HTTP request as routes are matched against it.
//
// A route is picked by the prefix of the request's path, and an upstream serves the path it
// resolves: if the two read the path differently, a request can be limited by one route and
// served by another. `/v1/items/../../login` starts with `/v1/items`, and an upstream that removes
// dot segments (nginx, most frameworks) serves `/login`. So an adapter normalizes the path once,
// matches routes on the result, and forwards exactly that result:
//
//   absl::StatusOr<std::string> path = sluice::normalize_request_path(raw_path);  // before '?'
//   if (!path.ok()) return respond(400);   // ambiguous: refused, never guessed
//   auto route = engine.match_route(listener, *path);
//   forward(*path);
//
// Normalization (RFC 3986 sections 6.2.2 and 5.2.4, applied to the path component as sent):
// - percent-encodings of unreserved characters (letters, digits, '-', '.', '_', '~') are decoded,
//   so `%2e` is '.'; every other percent-encoding is kept, with upper-case hex digits;
// - repeated '/' are merged, as nginx does by default;
// - "." segments are removed and ".." removes the segment before it; a path that ends in a dot
//   segment keeps its trailing '/'.
// Refused (InvalidArgument), because upstreams disagree about what they mean: a path that does
// not start with '/', climbs above the root, encodes '/', '\' or NUL (%2F, %5C, %00), contains
// '\' or a control character, has a malformed percent-encoding, has a dot segment with
// parameters ("..;", which Java servlet containers read as ".."), or has a ';' in any segment but
// the last: servlet containers drop each segment's ";parameters" and serve /api;v=1/login as
// /api/login, which a route matched on the path as written would not limit. On the last segment
// (/login;jsessionid=1) dropping them only shortens the path: a prefix that starts what is served
// starts the path too.
//
// Thread-safety: a pure function. Complexity: linear in the path; the result is never longer.
#ifndef SLUICE_REQUEST_PATH_HPP_
#define SLUICE_REQUEST_PATH_HPP_

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice {
namespace detail {
absl::Status append_path_segment(std::string_view raw, std::string& segment);
}  // namespace detail

// `raw` is the path component of the request target, still percent-encoded (everything before
// '?'); the result is the normalized path, or InvalidArgument naming what made it ambiguous.
inline absl::StatusOr<std::string> normalize_request_path(std::string_view raw) {
  if (raw.empty() || raw.front() != '/') {
    return absl::InvalidArgumentError("the path must start with '/'");
  }
  std::string out;  // "/segment" per kept segment; never ends with '/'
  out.reserve(raw.size());
  std::string segment;
  bool trailing_slash = false;
  for (std::size_t start = 1; start <= raw.size();) {
    const std::size_t end = std::min(raw.find('/', start), raw.size());
    segment.clear();
    if (absl::Status s = detail::append_path_segment(raw.substr(start, end - start), segment);
        !s.ok()) {
      return s;
    }
    trailing_slash = true;
    if (segment == "..") {
      if (out.empty()) return absl::InvalidArgumentError("the path climbs above the root");
      out.resize(out.rfind('/'));
    } else if (segment.starts_with("..;") || segment.starts_with(".;")) {
      return absl::InvalidArgumentError("the path has a dot segment with parameters");
    } else if (!segment.empty() && segment != ".") {
      out.push_back('/');
      out.append(segment);
      trailing_slash = false;
    }
    start = end + 1;
  }
  if (out.empty() || trailing_slash) out.push_back('/');
  if (const std::size_t semicolon = out.find(';');
      semicolon != std::string::npos && out.find('/', semicolon) != std::string::npos) {
    return absl::InvalidArgumentError("the path has parameters (';') before its last segment");
  }
  return out;
}

namespace detail {

inline std::optional<int> hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return std::nullopt;
}

inline bool is_unreserved(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

// Appends one raw segment (no '/') to `segment`: unreserved characters decoded, other
// percent-encodings kept with upper-case hex digits.
inline absl::Status append_path_segment(std::string_view raw, std::string& segment) {
  constexpr std::string_view kHex = "0123456789ABCDEF";
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      return absl::InvalidArgumentError("the path contains a control character");
    }
    if (c == '\\') return absl::InvalidArgumentError("the path contains '\\'");
    if (c != '%') {
      segment.push_back(c);
      continue;
    }
    const std::optional<int> high = i + 2 < raw.size() ? hex_value(raw[i + 1]) : std::nullopt;
    const std::optional<int> low = i + 2 < raw.size() ? hex_value(raw[i + 2]) : std::nullopt;
    if (!high || !low) {
      return absl::InvalidArgumentError("the path has a malformed percent-encoding");
    }
    const auto decoded = static_cast<char>(*high * 16 + *low);
    if (decoded == '/' || decoded == '\\' || decoded == '\0') {
      return absl::InvalidArgumentError("the path encodes '/', '\\' or NUL (%2F, %5C, %00)");
    }
    if (is_unreserved(decoded)) {
      segment.push_back(decoded);
    } else {
      segment.push_back('%');
      segment.push_back(kHex[static_cast<std::size_t>(*high)]);
      segment.push_back(kHex[static_cast<std::size_t>(*low)]);
    }
    i += 2;
  }
  return absl::OkStatus();
}

}  // namespace detail
}  // namespace sluice

#endif  // SLUICE_REQUEST_PATH_HPP_
