// Internal to sluice::yaml: reads a config file, at most kMaxConfigBytes of it.
// Thread-safety: reentrant (reads errno of the calling thread). O(file size), bounded.
#ifndef SLUICE_YAML_DETAIL_CONFIG_FILE_HPP_
#define SLUICE_YAML_DETAIL_CONFIG_FILE_HPP_

#include <array>
#include <cerrno>
#include <cstddef>
#include <fstream>
#include <new>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/yaml/detail/error.hpp"
#include "sluice/yaml/limits.hpp"

namespace sluice::yaml::detail {

// `what` failed on `path` with the current errno: NotFound, PermissionDenied or Unavailable.
inline absl::Status file_error(const std::string& path, absl::string_view what) {
  const int error = errno;
  std::string message = absl::StrCat(path, ": ", what, ": ",
                                     std::error_code(error, std::generic_category()).message());
  if (error == ENOENT) return absl::NotFoundError(message);
  if (error == EACCES) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

// The whole file at `path`; InvalidArgument "<path>:1:1: (root): ..." when it holds more than
// kMaxConfigBytes (reading stops soon after that many bytes).
inline absl::StatusOr<std::string> read_config_file(const std::string& path) {
  std::string text;
  try {
    errno = 0;
    std::ifstream in(path, std::ios::binary);
    if (!in) return file_error(path, "cannot open the config file");
    std::array<char, 16384> chunk{};
    while (in && text.size() <= kMaxConfigBytes) {
      in.read(chunk.data(), chunk.size());
      text.append(chunk.data(), static_cast<std::size_t>(in.gcount()));
    }
    if (in.bad()) return file_error(path, "cannot read the config file");
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": out of memory while reading the config file"));
  } catch (...) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot read the config file"));
  }
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ":",
        format_error({}, "", absl::StrCat("the config is more than ", kMaxConfigBytes, " bytes"))));
  }
  return text;
}

}  // namespace sluice::yaml::detail

#endif  // SLUICE_YAML_DETAIL_CONFIG_FILE_HPP_
