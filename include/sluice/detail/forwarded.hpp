// Internal: the hop lists of the `Forwarded` (RFC 7239) and `X-Forwarded-For` request headers,
// read from the right.
//
// Each proxy appends the address it received a connection from, so the rightmost elements were
// written by the proxies nearest to us and the leftmost by whoever sent the request. Reading from
// the right means the elements that decide the result are those a trusted proxy wrote: anything a
// client wrote lies further left, and a malformed client part cannot hide a well-formed proxy
// element to its right (a left-to-right parser would lose it inside an unterminated quote).
//
// Work is bounded: only the last kMaxHeaderBytes bytes of a header are read, each at most once;
// an element cut by that bound is malformed.
#ifndef SLUICE_DETAIL_FORWARDED_HPP_
#define SLUICE_DETAIL_FORWARDED_HPP_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace sluice::detail {

// How many bytes at the right end of a header are read (the rest is never looked at).
inline constexpr std::size_t kMaxHeaderBytes = 8192;

// One element of a hop list. `node` is the address text as written (for `Forwarded`, the `for`
// value without quotes; quoted-pairs are left escaped, so a value with one is no address).
struct Hop {
  bool well_formed = false;  // false: the element breaks the header's grammar
  bool has_node = false;     // false: a Forwarded element without a `for` parameter
  std::string_view node{};
};

inline bool optional_whitespace(char c) noexcept { return c == ' ' || c == '\t'; }

// RFC 9110 tchar.
inline bool token_char(char c) noexcept {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// The second byte of an RFC 9110 quoted-pair: HTAB, SP, VCHAR or obs-text.
inline bool escapable_char(char c) noexcept {
  const auto byte = static_cast<unsigned char>(c);
  return c == '\t' || (byte >= 0x20 && byte != 0x7f);
}

// RFC 9110 qdtext.
inline bool quoted_text_char(char c) noexcept { return escapable_char(c) && c != '"' && c != '\\'; }

// The window of `header` that is read, and whether bytes were cut off at its left.
class HeaderWindow {
 public:
  explicit HeaderWindow(std::string_view header) noexcept
      : text_(header.size() > kMaxHeaderBytes ? header.substr(header.size() - kMaxHeaderBytes)
                                              : header),
        truncated_(header.size() > kMaxHeaderBytes) {}

 protected:
  std::string_view text_;  // the unread part: elements are taken off its right end
  bool truncated_;

  void trim_right_whitespace() noexcept {
    while (!text_.empty() && optional_whitespace(text_.back())) text_.remove_suffix(1);
  }
  // Removes the trailing element separator(s) and whitespace; true if an element remains.
  bool skip_empty_elements() noexcept {
    trim_right_whitespace();
    while (!text_.empty() && text_.back() == ',') {
      text_.remove_suffix(1);
      trim_right_whitespace();
    }
    return !text_.empty();
  }
  // The element is broken or cut: nothing to its left can be read reliably, so the list ends.
  Hop malformed() noexcept {
    text_ = {};
    truncated_ = false;
    return Hop{};
  }
  // At the left end of the window: the list ends, unless bytes were cut off there.
  std::optional<Hop> end_of_list() noexcept {
    if (truncated_) return malformed();
    return std::nullopt;
  }
};

// `X-Forwarded-For: client, proxy1, proxy2`: comma-separated addresses; empty elements skipped.
class XForwardedForHops : HeaderWindow {
 public:
  using HeaderWindow::HeaderWindow;

  // The next element from the right; nullopt after the leftmost.
  std::optional<Hop> next() noexcept {
    if (!skip_empty_elements()) return end_of_list();
    const std::size_t comma = text_.rfind(',');
    if (comma == std::string_view::npos && truncated_) return malformed();
    const std::size_t start = comma == std::string_view::npos ? 0 : comma + 1;
    std::string_view element = text_.substr(start);
    text_ = text_.substr(0, start);
    while (optional_whitespace(element.front())) element.remove_prefix(1);
    return Hop{.well_formed = true, .has_node = true, .node = element};
  }
};

// `Forwarded: for=client;proto=https, for="[2001:db8::1]:4711"`: comma-separated elements of
// `;`-separated name=value pairs (names case-insensitive, values a token or a quoted-string).
// Beyond RFC 7239 it accepts whitespace around ';' (some proxies write it); an element that
// repeats `for`, `by`, `host` or `proto` is malformed.
class ForwardedHops : HeaderWindow {
 public:
  using HeaderWindow::HeaderWindow;

  std::optional<Hop> next() noexcept {
    if (!skip_empty_elements()) return end_of_list();
    Hop hop{.well_formed = true};
    unsigned seen = 0;  // bit per known parameter
    while (true) {
      trim_right_whitespace();
      if (text_.empty() || text_.back() == ',') break;
      if (text_.back() == ';') {  // an empty pair
        text_.remove_suffix(1);
        continue;
      }
      std::string_view name, value;
      if (!take_pair(name, value) || !record(name, value, seen, hop)) return malformed();
      trim_right_whitespace();
      if (!text_.empty() && text_.back() == ';') {
        text_.remove_suffix(1);
      } else if (!text_.empty() && text_.back() != ',') {
        return malformed();
      }
    }
    if (text_.empty() && truncated_) return malformed();
    return hop;
  }

 private:
  // Takes `name=value` off the right end of text_.
  bool take_pair(std::string_view& name, std::string_view& value) noexcept {
    if (text_.back() == '"') {
      if (!take_quoted(value)) return false;
    } else {
      value = take_token();
      if (value.empty()) return false;
    }
    if (text_.empty() || text_.back() != '=') return false;
    text_.remove_suffix(1);
    name = take_token();
    return !name.empty();
  }

  std::string_view take_token() noexcept {
    std::size_t start = text_.size();
    while (start > 0 && token_char(text_[start - 1])) --start;
    std::string_view token = text_.substr(start);
    text_ = text_.substr(0, start);
    return token;
  }

  // A quoted-string ending text_: its opening quote is the nearest '"' to the left preceded by
  // an even number of backslashes. Returns the content between the quotes.
  bool take_quoted(std::string_view& content) noexcept {
    const std::size_t close = text_.size() - 1;
    if (backslashes_before(close) % 2 != 0) return false;  // the last quote is escaped
    std::size_t open = close;
    do {
      if (open == 0) return false;
      --open;
    } while (text_[open] != '"' || backslashes_before(open) % 2 != 0);
    content = text_.substr(open + 1, close - open - 1);
    for (std::size_t i = 0; i < content.size(); ++i) {
      if (content[i] != '\\') {
        if (!quoted_text_char(content[i])) return false;
      } else if (++i == content.size() || !escapable_char(content[i])) {
        return false;
      }
    }
    text_ = text_.substr(0, open);
    return true;
  }

  std::size_t backslashes_before(std::size_t index) const noexcept {
    std::size_t n = 0;
    while (n < index && text_[index - n - 1] == '\\') ++n;
    return n;
  }

  static bool equals_ignoring_case(std::string_view a, std::string_view b) noexcept {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const char c = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
      if (c != b[i]) return false;
    }
    return true;
  }

  // Notes a pair in `hop`; false if it repeats a parameter RFC 7239 allows once per element.
  static bool record(std::string_view name, std::string_view value, unsigned& seen,
                     Hop& hop) noexcept {
    constexpr std::string_view kOnce[] = {"for", "by", "host", "proto"};
    for (unsigned i = 0; i < 4; ++i) {
      if (!equals_ignoring_case(name, kOnce[i])) continue;
      if ((seen & (1u << i)) != 0) return false;
      seen |= 1u << i;
      if (i == 0) {
        hop.has_node = true;
        hop.node = value;
      }
    }
    return true;
  }
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_FORWARDED_HPP_
