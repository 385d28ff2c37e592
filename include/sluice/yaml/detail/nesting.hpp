// Internal: the nesting limit of a config, checked on the text before yaml-cpp parses it.
#ifndef SLUICE_YAML_DETAIL_NESTING_HPP_
#define SLUICE_YAML_DETAIL_NESTING_HPP_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sluice/yaml/detail/error.hpp"
#include "sluice/yaml/limits.hpp"

namespace sluice::yaml::detail {

// Throws LoadError at the first place where `text` nests deeper than kMaxNestingDepth. A level is
// an indentation step of block content, a `- ` that opens a sequence entry, or an open `[` / `{`
// (outside quotes and comments). A heuristic that names the place of an ordinary deep config
// before anything is parsed; it can be misled (a quote or a `[` inside a plain scalar is no quote
// and opens nothing), so the parser's own nesting is bounded as it descends (one_document.hpp).
// O(text size).
inline void check_nesting(const std::string& text) {
  std::vector<std::size_t> indents;  // open block indentation columns
  std::size_t flow = 0;              // open [ and {
  int line = 1;
  std::size_t i = 0;
  auto fail_at = [&](std::size_t column) {
    throw LoadError{{line, static_cast<int>(column) + 1}, "", nests_too_deep_message()};
  };
  while (i < text.size()) {
    const std::size_t line_start = i;
    while (i < text.size() && text[i] == ' ') ++i;
    const std::size_t indent = i - line_start;
    const bool blank = i == text.size() || text[i] == '\n' || text[i] == '#';
    if (!blank && flow == 0) {
      while (!indents.empty() && indents.back() >= indent) indents.pop_back();
      indents.push_back(indent);
    }
    std::size_t dashes = 0;
    char quote = 0;
    for (; i < text.size() && text[i] != '\n'; ++i) {
      const char c = text[i];
      if (quote != 0) {
        if (c == quote) quote = 0;
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '#' && (i == line_start || text[i - 1] == ' ')) {
        while (i < text.size() && text[i] != '\n') ++i;
        break;
      } else if (c == '[' || c == '{') {
        ++flow;
      } else if ((c == ']' || c == '}') && flow > 0) {
        --flow;
      } else if (c == '-' && flow == 0 && i + 1 < text.size() && text[i + 1] == ' ') {
        ++dashes;
      }
      if (indents.size() + dashes + flow > kMaxNestingDepth) fail_at(i - line_start);
    }
    ++line;
    ++i;
  }
}

}  // namespace sluice::yaml::detail

#endif  // SLUICE_YAML_DETAIL_NESTING_HPP_
