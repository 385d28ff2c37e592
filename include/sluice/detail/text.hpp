// Internal: text for error messages built from untrusted input (config values, replies), and the
// escaper and hex writer behind every other text sluice writes.
#ifndef SLUICE_DETAIL_TEXT_HPP_
#define SLUICE_DETAIL_TEXT_HPP_

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::detail {

// Appends `text` with `"` and `\` backslash-escaped; `other(out, byte)` writes each byte outside
// printable ASCII (0x20-0x7E). The one escaper behind error messages and RFC 9651 strings.
template <class Other>
void append_escaped(std::string& out, std::string_view text, Other other) {
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (byte >= 0x20 && byte <= 0x7e) {
      out.push_back(c);
    } else {
      other(out, byte);
    }
  }
}

// Appends the `digits` low hex digits of `value` (at most 16), most significant first, lowercase:
// the one hex writer (escaped bytes, key digests, script SHA-1s).
inline void append_hex(std::string& out, std::uint64_t value, int digits) {
  constexpr char kHex[] = "0123456789abcdef";
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) {
    out.push_back(kHex[(value >> shift) & 0xf]);
  }
}

// `text` with `"` and `\` escaped and every byte outside printable ASCII written as \xNN, so that
// untrusted text can neither forge nor break a message.
// (absl::CHexEscape writes \n and \t instead, which error messages here never use: one form.)
inline std::string escaped(std::string_view text) {
  std::string out;
  append_escaped(out, text, [](std::string& to, unsigned char byte) {
    to.append("\\x");
    append_hex(to, byte, 2);
  });
  return out;
}

// `escaped(text)` in double quotes: how a value from untrusted input appears in a message.
inline std::string quoted(std::string_view text) { return '"' + escaped(text) + '"'; }

// True iff every byte of `text` is printable ASCII (0x20-0x7E).
inline bool printable(std::string_view text) {
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte > 0x7e) return false;
  }
  return true;
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_TEXT_HPP_
