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
// - each character is written one way, as upstreams read it after decoding the path: the
//   characters a path may carry as they are (RFC 3986 pchar: unreserved characters, the
//   sub-delims "!$&'()*+,=", ':' and '@') are decoded, so `%2e` is '.' and `%3A` is ':'; every
//   other byte is percent-encoded with upper-case hex digits, whether it came encoded or raw
//   (`%3b` is `%3B`; UTF-8 `/café` is `/caf%C3%A9`). ';' is the one pchar kept as it came: a raw
//   one starts a segment's parameters for servlet containers, where `%3B` is a character;
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
// A normalized path is matched against a normalized prefix byte for byte, or, for an upstream
// that ignores case, with `path_starts_with_ignoring_case`: ASCII letters in either case, and the
// four letters outside ASCII whose Unicode case mapping is an ASCII letter (dotless i and dotted
// I as i, long s as s, the Kelvin sign as k) read as that letter, as Java's equalsIgnoreCase and
// Spring's case-insensitive path patterns read them: such an upstream serves /log%C4%B1n from its
// /login handler.
//
// Thread-safety: pure functions. Complexity: linear in the path; the result is at most three
// times as long (a raw byte written as %XX).
#ifndef SLUICE_REQUEST_PATH_HPP_
#define SLUICE_REQUEST_PATH_HPP_

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"

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
std::size_t folded_letter_size(std::string_view path, char lower) noexcept;
}  // namespace detail

// Whether `prefix` starts `path`, both normalized, as an upstream that ignores case reads them
// (see the file comment): ASCII letters in either case, and a letter outside ASCII that folds to
// an ASCII letter of `prefix` as that letter; every other byte as it is. Both sides spell a
// percent-encoding with upper-case hex digits, so escapes compare alike. O(prefix size); no
// allocation.
inline bool path_starts_with_ignoring_case(std::string_view path,
                                           std::string_view prefix) noexcept {
  std::size_t at = 0;  // into path; never past its end
  for (const char c : prefix) {
    const char lower = absl::ascii_tolower(static_cast<unsigned char>(c));
    if (at < path.size() && absl::ascii_tolower(static_cast<unsigned char>(path[at])) == lower) {
      ++at;
      continue;
    }
    const std::size_t folded = detail::folded_letter_size(path.substr(at), lower);
    if (folded == 0) return false;
    at += folded;
  }
  return true;
}

namespace detail {

// The size of the percent-encoded UTF-8 letter at the start of `path` whose Unicode case mapping
// is the ASCII letter `lower` (lower case), or 0 when there is none.
inline std::size_t folded_letter_size(std::string_view path, char lower) noexcept {
  switch (lower) {
    case 'i':  // U+0130 (dotted capital I: lower case i), U+0131 (dotless i: upper case I)
      return path.starts_with("%C4%B0") || path.starts_with("%C4%B1") ? 6 : 0;
    case 's':  // U+017F (long s: upper case S)
      return path.starts_with("%C5%BF") ? 6 : 0;
    case 'k':  // U+212A (Kelvin sign: lower case k)
      return path.starts_with("%E2%84%AA") ? 9 : 0;
    default:
      return 0;
  }
}

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

// The characters a normalized path holds decoded: RFC 3986 pchar but ';' (see the file comment).
inline bool is_plain_path_char(char c) {
  return is_unreserved(c) || std::string_view("!$&'()*+,=:@").find(c) != std::string_view::npos;
}

// Appends `byte` as %XX, upper-case hex digits.
inline void append_percent_encoded(std::string& out, unsigned char byte) {
  constexpr std::string_view kHex = "0123456789ABCDEF";
  out.push_back('%');
  out.push_back(kHex[byte >> 4]);
  out.push_back(kHex[byte & 0xf]);
}

// Appends one raw segment (no '/') to `segment`: plain path characters decoded, every other byte
// percent-encoded with upper-case hex digits, ';' as it came.
inline absl::Status append_path_segment(std::string_view raw, std::string& segment) {
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      return absl::InvalidArgumentError("the path contains a control character");
    }
    if (c == '\\') return absl::InvalidArgumentError("the path contains '\\'");
    if (c != '%') {
      if (c == ';' || is_plain_path_char(c)) {
        segment.push_back(c);
      } else {
        append_percent_encoded(segment, byte);
      }
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
    if (is_plain_path_char(decoded)) {
      segment.push_back(decoded);
    } else {
      append_percent_encoded(segment, static_cast<unsigned char>(decoded));
    }
    i += 2;
  }
  return absl::OkStatus();
}

}  // namespace detail
}  // namespace sluice

#endif  // SLUICE_REQUEST_PATH_HPP_
