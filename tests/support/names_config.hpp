// Test support: a YAML config whose only rules are one listener's and one consumer's, for the
// tests of adapters over a reloading holder that must keep the names they were given.
#ifndef SLUICE_TESTS_SUPPORT_NAMES_CONFIG_HPP_
#define SLUICE_TESTS_SUPPORT_NAMES_CONFIG_HPP_

#include <fstream>
#include <ios>
#include <string>

#include "absl/strings/str_cat.h"

// Writes to `path` a config with listener `listener` and consumer `consumer`, each limited to 2
// requests per minute per address (the consumer's for the unknown credentials of an adapter that
// names it). Every request is on a listener or a credential's consumer, so the only rules are
// theirs.
inline void write_names_yaml(const std::string& path, const std::string& listener,
                             const std::string& consumer) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << absl::StrCat(
      "policies:\n"
      "  - name: two-per-minute\n"
      "    rate_limits:\n"
      "      - { name: per-ip, selector: [ip], requests_per: { minute: 2 } }\n"
      "listeners:\n"
      "  - { name: ",
      listener,
      ", policies: [two-per-minute] }\n"
      "consumers:\n"
      "  - { name: ",
      consumer, ", policies: [two-per-minute] }\n");
}

#endif  // SLUICE_TESTS_SUPPORT_NAMES_CONFIG_HPP_
