// `promtool check metrics` over a Prometheus text body, for the tests that export metrics. The
// Debian package `prometheus` provides promtool; scripts/lib.sh installs it.
#ifndef SLUICE_TESTS_SUPPORT_PROMTOOL_HPP_
#define SLUICE_TESTS_SUPPORT_PROMTOOL_HPP_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "catch.hpp"

namespace sluice_test {

// The output of `promtool check metrics < text`, and its exit status.
struct PromtoolResult {
  int status = -1;
  std::string output;
};

// promtool's path, or empty when it is not installed.
inline std::string find_promtool() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
    std::string path = absl::StrCat(dir, "/promtool");
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return {};
}

inline PromtoolResult promtool_check(const std::string& promtool, const std::string& text) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / absl::StrCat("sluice_promtool_", ::getpid(), ".txt");
  std::ofstream(file, std::ios::binary) << text;
  PromtoolResult result;
  FILE* pipe =
      ::popen(absl::StrCat(promtool, " check metrics < ", file.string(), " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) {
    result.output.append(buffer, n);
  }
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::filesystem::remove(file);
  return result;
}

// Checks that promtool accepts `text` with no findings; warns and checks nothing when promtool
// is not installed.
inline void check_promtool_accepts(const std::string& text) {
  const std::string promtool = find_promtool();
  if (promtool.empty()) {
    WARN("SKIPPED: promtool not found (Debian package `prometheus`); the exposition is unchecked");
    return;
  }
  const PromtoolResult result = promtool_check(promtool, text);
  INFO(result.output);
  CHECK(result.status == 0);
  CHECK(result.output.empty());  // no lint findings either
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_PROMTOOL_HPP_
