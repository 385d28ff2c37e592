// Internal to sluice::yaml: the message for an unknown key, with a "did you mean" where one key
// is close enough. Thread-safety: stateless functions.
#ifndef SLUICE_YAML_DETAIL_SUGGESTION_HPP_
#define SLUICE_YAML_DETAIL_SUGGESTION_HPP_

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "sluice/yaml/detail/error.hpp"

namespace sluice::yaml::detail {

// The keys a mapping may hold, in the order an error lists them.
using Keys = std::initializer_list<absl::string_view>;

// Levenshtein distance; inputs over 64 bytes are not worth comparing (the maximum is returned).
// O(|a|·|b|) time, no allocation.
inline std::size_t edit_distance(absl::string_view a, absl::string_view b) {
  if (a.size() > 64 || b.size() > 64) return std::numeric_limits<std::size_t>::max();
  std::array<std::size_t, 65> row{};
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The allowed key closest to `key`: within 2 edits and less than half the word, or empty.
inline absl::string_view closest_key(absl::string_view key, Keys allowed) {
  absl::string_view best;
  std::size_t best_distance = 3;
  for (absl::string_view candidate : allowed) {
    const std::size_t d = edit_distance(key, candidate);
    if (d < best_distance && 2 * d < candidate.size()) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

inline std::string unknown_key_message(const std::string& key, Keys allowed) {
  if (absl::string_view best = closest_key(key, allowed); !best.empty()) {
    return absl::StrCat("unknown key ", echo(key), " (did you mean \"", best, "\"?)");
  }
  return absl::StrCat("unknown key ", echo(key), " (expected one of ", absl::StrJoin(allowed, ", "),
                      ")");
}

}  // namespace sluice::yaml::detail

#endif  // SLUICE_YAML_DETAIL_SUGGESTION_HPP_
