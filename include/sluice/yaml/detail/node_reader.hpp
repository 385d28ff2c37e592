// Internal to sluice::yaml: reads typed values (mappings, lists, strings, counts, booleans, enum
// spellings) out of yaml-cpp nodes, with the error messages and the node budget of the loader.
// Not thread-safe: one reader per load.
#ifndef SLUICE_YAML_DETAIL_NODE_READER_HPP_
#define SLUICE_YAML_DETAIL_NODE_READER_HPP_

#include <algorithm>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "sluice/yaml/detail/error.hpp"
#include "sluice/yaml/detail/suggestion.hpp"
#include "sluice/yaml/limits.hpp"
#include "yaml-cpp/yaml.h"

namespace sluice::yaml::detail {

// One key of a mapping, already checked against the allowed keys.
struct Field {
  std::string key;
  std::string path;  // the value's path
  YAML::Node value;
};

// Every node read goes through visit(): it is counted against kMaxConfigNodes, a scalar's text
// against kMaxScalarBytes (an alias shares its anchor's node, so each use counts again, and each
// read_* copies or scans the text once), and its position is remembered under its value path, so
// that relocate() can put a line and column in front of validate()'s messages. Each read_* fails
// with LoadError at the offending node.
class NodeReader {
 public:
  // validate()'s message ("<path> must ..." or "<path>: ...") with the position of the deepest
  // value on that path that was read. O(path length) lookups.
  std::string relocate(absl::string_view message) const {
    std::size_t n = 0;
    while (n < message.size() && is_path_char(message[n])) ++n;
    std::string path(message.substr(0, n));
    absl::string_view what = message.substr(n);
    if (!absl::ConsumePrefix(&what, ": ")) absl::ConsumePrefix(&what, " ");
    return format_error(locate(path), path, what);
  }

 protected:
  void visit(const YAML::Node& node, const std::string& path) {
    if (++nodes_ > kMaxConfigNodes) {
      fail(node.Mark(), path, too_many_nodes_message());
    }
    if (node.IsScalar()) {
      // Each addition is at most one config's text, so the sum cannot wrap before it fails.
      scalar_bytes_ += node.Scalar().size();
      if (scalar_bytes_ > kMaxScalarBytes) fail(node.Mark(), path, too_much_text_message());
    }
    marks_.emplace(path, node.Mark());
  }

  // Where the reader should look for the value at `path` (the first position remembered wins).
  void remember(const std::string& path, const YAML::Mark& mark) { marks_.emplace(path, mark); }

  YAML::Mark mark_of(const std::string& path) const {
    auto it = marks_.find(path);
    return it == marks_.end() ? YAML::Mark() : it->second;
  }

  // The keys of the mapping `node`, each one of `allowed` and none twice.
  std::vector<Field> fields(const YAML::Node& node, const std::string& path, Keys allowed) {
    visit(node, path);
    if (!node.IsMap()) {
      fail(mark_of(path), path, absl::StrCat("expected a mapping, got ", describe(node, false)));
    }
    std::vector<Field> out;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const YAML::Node key = it->first;
      check_key(key, path, allowed, out);
      Field field{key.Scalar(), member(path, key.Scalar()), it->second};
      // yaml-cpp places an empty value at the next token; the key is where the reader looks.
      if (field.value.IsNull()) remember(field.path, key.Mark());
      out.push_back(std::move(field));
    }
    return out;
  }

  static void require(const YAML::Node& node, const std::string& path,
                      const std::vector<Field>& fields, absl::string_view key) {
    for (const Field& f : fields) {
      if (f.key == key) return;
    }
    fail(node.Mark(), path, absl::StrCat("missing required key \"", key, "\""));
  }

  // The sequence `node`, each element read by `read` (a member of this reader or of a class
  // derived from it).
  template <class T, std::derived_from<NodeReader> Reader>
  std::vector<T> read_list(const YAML::Node& node, const std::string& path,
                           T (Reader::*read)(const YAML::Node&, const std::string&)) {
    visit(node, path);
    if (!node.IsSequence()) {
      fail(mark_of(path), path, absl::StrCat("expected a sequence, got ", describe(node, false)));
    }
    std::vector<T> out;
    std::size_t i = 0;
    for (auto it = node.begin(); it != node.end(); ++it, ++i) {
      out.push_back((static_cast<Reader*>(this)->*read)(*it, element(path, i)));
    }
    return out;
  }

  std::string read_string(const YAML::Node& node, const std::string& path) {
    visit(node, path);
    if (!node.IsScalar()) {
      fail(mark_of(path), path, absl::StrCat("expected a string, got ", describe(node, false)));
    }
    return node.Scalar();
  }

  std::vector<std::string> read_strings(const YAML::Node& node, const std::string& path) {
    return read_list<std::string>(node, path, &NodeReader::read_string);
  }

  // A plain (unquoted) decimal integer in 0 ... 2^64-1; the ranges are validate()'s business.
  std::uint64_t read_count(const YAML::Node& node, const std::string& path) {
    visit(node, path);
    constexpr char kExpected[] = "expected a non-negative integer, got ";
    if (!node.IsScalar()) fail(mark_of(path), path, absl::StrCat(kExpected, describe(node, false)));
    if (node.Tag() != "?" && node.Tag() != "tag:yaml.org,2002:int") {
      fail(mark_of(path), path, absl::StrCat(kExpected, describe(node, true)));
    }
    const std::string& text = node.Scalar();
    const char* const end = text.data() + text.size();
    std::uint64_t value = 0;
    const auto [parsed_to, error] = std::from_chars(text.data(), end, value);
    if (error == std::errc::result_out_of_range) {
      fail(mark_of(path), path,
           absl::StrCat(echo(text), " is out of range (at most ",
                        std::numeric_limits<std::uint64_t>::max(), ")"));
    }
    if (error != std::errc() || parsed_to != end) {
      fail(mark_of(path), path, absl::StrCat(kExpected, echo(text)));
    }
    return value;
  }

  bool read_bool(const YAML::Node& node, const std::string& path) {
    visit(node, path);
    constexpr char kExpected[] = "expected true or false, got ";
    if (!node.IsScalar() || node.Tag() != "?") {
      fail(mark_of(path), path, absl::StrCat(kExpected, describe(node, true)));
    }
    const std::string& text = node.Scalar();
    if (text == "true" || text == "True" || text == "TRUE") return true;
    if (text == "false" || text == "False" || text == "FALSE") return false;
    fail(mark_of(path), path, absl::StrCat(kExpected, echo(text)));
  }

  // A scalar that `parse` turns into an enum value (an optional); `expected` lists the spellings.
  template <class Parse>
  auto read_enum(const YAML::Node& node, const std::string& path, absl::string_view noun,
                 absl::string_view expected, Parse parse) {
    visit(node, path);
    if (!node.IsScalar()) {
      fail(mark_of(path), path,
           absl::StrCat("expected ", noun, " (", expected, "), got ", describe(node, false)));
    }
    auto value = parse(node.Scalar());
    if (!value.has_value()) {
      fail(mark_of(path), path,
           absl::StrCat("unknown ", noun, " ", echo(node.Scalar()), " (expected ", expected, ")"));
    }
    return *value;
  }

 private:
  // A mapping key: a scalar, allowed, and not already among `seen`.
  void check_key(const YAML::Node& key, const std::string& path, Keys allowed,
                 const std::vector<Field>& seen) {
    visit(key, path);
    if (!key.IsScalar()) {
      fail(key.Mark(), path, absl::StrCat("expected a string key, got ", describe(key, false)));
    }
    const std::string& name = key.Scalar();
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      fail(key.Mark(), path, unknown_key_message(name, allowed));
    }
    for (const Field& f : seen) {
      if (f.key == name) fail(key.Mark(), path, absl::StrCat("duplicate key ", echo(name)));
    }
  }

  static bool is_path_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '[' || c == ']';
  }

  // The position of the deepest remembered value on `path`.
  Position locate(std::string path) const {
    while (true) {
      if (auto it = marks_.find(path); it != marks_.end()) return position_of(it->second);
      if (path.empty()) return {};
      if (path.back() == ']') {
        path.erase(path.rfind('['));
      } else {
        const std::size_t dot = path.rfind('.');
        path.erase(dot == std::string::npos ? 0 : dot);
      }
    }
  }

  std::size_t nodes_ = 0;
  std::size_t scalar_bytes_ = 0;  // text of the scalars visited, each use of an alias again
  std::unordered_map<std::string, YAML::Mark> marks_;  // value path -> where it starts
};

}  // namespace sluice::yaml::detail

#endif  // SLUICE_YAML_DETAIL_NODE_READER_HPP_
