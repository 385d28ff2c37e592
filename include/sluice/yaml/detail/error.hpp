// Internal to sluice::yaml: where an error is (line, column, value path) and how it is written.
// Every message has the form `<line>:<column>: <where>: <what>`; values from the config appear
// only through echo(), quoted and escaped. Thread-safety: stateless functions.
#ifndef SLUICE_YAML_DETAIL_ERROR_HPP_
#define SLUICE_YAML_DETAIL_ERROR_HPP_

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/detail/text.hpp"
#include "sluice/yaml/limits.hpp"
#include "yaml-cpp/yaml.h"

namespace sluice::yaml::detail {

// 1-based, as editors count.
struct Position {
  int line = 1;
  int column = 1;
};

inline Position position_of(const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0 || mark.column < 0) return {};
  return {mark.line + 1, mark.column + 1};
}

// `where` is a value path (`policies[0].name`), empty for the document itself. (absl::string_view
// because absl::StrCat takes it, and it is not std::string_view in every Abseil build.)
inline std::string format_error(Position at, absl::string_view where, absl::string_view what) {
  return absl::StrCat(at.line, ":", at.column, ": ", where.empty() ? "(root)" : where, ": ", what);
}

// Thrown by the readers only; load_config turns it into a Status.
struct LoadError {
  Position at;
  std::string where;
  std::string what;
};

[[noreturn]] inline void fail(const YAML::Mark& mark, std::string where, std::string what) {
  throw LoadError{position_of(mark), std::move(where), std::move(what)};
}

// The error for a config of more than kMaxConfigNodes nodes, whether the parser or a reader
// counted past it.
inline std::string too_many_nodes_message() {
  return absl::StrCat("the config has more than ", kMaxConfigNodes,
                      " nodes (each use of an alias counts)");
}

// The error for a config whose scalars, each use of an alias counted, pass kMaxScalarBytes.
inline std::string too_much_text_message() {
  return absl::StrCat("the config's scalars hold more than ", kMaxScalarBytes,
                      " bytes (each use of an alias counts)");
}

// The error for a config that nests deeper than kMaxNestingDepth, whether the text check or the
// parser found it.
inline std::string nests_too_deep_message() {
  return absl::StrCat("the config nests deeper than ", kMaxNestingDepth, " levels");
}

// A scalar's text for an error message: quoted, escaped, at most 40 bytes of it.
inline std::string echo(std::string_view text) {
  constexpr std::size_t kMaxEcho = 40;
  if (text.size() <= kMaxEcho) return sluice::detail::quoted(text);
  return absl::StrCat(sluice::detail::quoted(text.substr(0, kMaxEcho)), "...");
}

// What a node is, for "expected ..., got <what>". Scalars are echoed only when `echo_scalar`.
inline std::string describe(const YAML::Node& node, bool echo_scalar) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      if (!echo_scalar) return "a scalar";
      return node.Tag() == "!" ? absl::StrCat("the string ", echo(node.Scalar()))
                               : echo(node.Scalar());
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

// Value paths as validate() spells them: `policies[0].rate_limits[1].burst`.
inline std::string member(const std::string& path, const std::string& name) {
  if (path.empty()) return name;
  return absl::StrCat(path, ".", name);
}

inline std::string element(const std::string& path, std::size_t i) {
  return absl::StrCat(path, "[", i, "]");
}

}  // namespace sluice::yaml::detail

#endif  // SLUICE_YAML_DETAIL_ERROR_HPP_
