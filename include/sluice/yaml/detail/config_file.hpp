// Internal to sluice::yaml: reads a config file (a regular file only), at most kMaxConfigBytes of
// it, and what stat(2) says of it around the read. POSIX only. Messages name the file by its path,
// quoted and escaped unless it is printable ASCII (a directory's files are named by whoever writes
// into it).
// Thread-safety: reentrant (reads errno of the calling thread). O(file size), bounded.
#ifndef SLUICE_YAML_DETAIL_CONFIG_FILE_HPP_
#define SLUICE_YAML_DETAIL_CONFIG_FILE_HPP_

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "sluice/detail/text.hpp"
#include "sluice/yaml/detail/error.hpp"
#include "sluice/yaml/limits.hpp"

namespace sluice::yaml::detail {

// `what` failed on `path` with the current errno: NotFound, PermissionDenied or Unavailable.
inline absl::Status file_error(const std::string& path, absl::string_view what) {
  const int error = errno;
  std::string message = absl::StrCat(sluice::detail::plain_or_quoted(path), ": ", what, ": ",
                                     std::error_code(error, std::generic_category()).message());
  if (error == ENOENT) return absl::NotFoundError(message);
  if (error == EACCES) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

// What a file that is not a regular file is, for the error that refuses it.
inline const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a file";
}

// Closes a file descriptor when it goes out of scope.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// The whole file at `path`; InvalidArgument "<path>:1:1: (root): ..." when it holds more than
// kMaxConfigBytes (reading stops soon after that many bytes); FailedPrecondition when `path` (after
// symlinks) is not a regular file. It is opened without blocking and checked before it is read, so
// that a FIFO, which would wait for a writer forever, or a device is refused at once.
inline absl::StatusOr<std::string> read_config_file(const std::string& path) {
  errno = 0;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg): open(2) has no fixed-argument form
  const FileDescriptor file(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (file.get() < 0) return file_error(path, "cannot open the config file");
  struct stat info {};
  if (::fstat(file.get(), &info) != 0) return file_error(path, "cannot stat the config file");
  if (!S_ISREG(info.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(sluice::detail::plain_or_quoted(path),
                                                      ": the config file is not a regular file (",
                                                      file_kind(info.st_mode), ")"));
  }
  std::string text;
  try {
    std::array<char, 16384> chunk{};
    while (text.size() <= kMaxConfigBytes) {
      const ssize_t got = ::read(file.get(), chunk.data(), chunk.size());
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return file_error(path, "cannot read the config file");
      if (got == 0) break;
      text.append(chunk.data(), static_cast<std::size_t>(got));
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        sluice::detail::plain_or_quoted(path), ": out of memory while reading the config file"));
  }
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        sluice::detail::plain_or_quoted(path), ":",
        format_error({}, "", absl::StrCat("the config is more than ", kMaxConfigBytes, " bytes"))));
  }
  return text;
}

// What stat(2) says of a file (through symlinks): its size and modification time.
struct FileStamp {
  std::int64_t size = 0;
  std::int64_t modified_s = 0;   // seconds since the Unix epoch
  std::int64_t modified_ns = 0;  // and nanoseconds within that second
  friend bool operator==(const FileStamp&, const FileStamp&) = default;
};

inline absl::StatusOr<FileStamp> stamp_of(const std::string& path) {
  struct stat info {};
  errno = 0;
  if (::stat(path.c_str(), &info) != 0) return file_error(path, "cannot stat the config file");
  return FileStamp{.size = static_cast<std::int64_t>(info.st_size),
                   .modified_s = static_cast<std::int64_t>(info.st_mtim.tv_sec),
                   .modified_ns = static_cast<std::int64_t>(info.st_mtim.tv_nsec)};
}

// The file's content and stamp. `steady` is false when the file changed while it was read (its
// stamp before and after differ, or its size is not the bytes read): a writer is at work.
struct ConfigSnapshot {
  std::string text;
  FileStamp stamp;
  bool steady = false;
};

inline absl::StatusOr<ConfigSnapshot> read_config_snapshot(const std::string& path) {
  absl::StatusOr<FileStamp> before = stamp_of(path);
  if (!before.ok()) return before.status();
  absl::StatusOr<std::string> text = read_config_file(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<FileStamp> after = stamp_of(path);
  if (!after.ok()) return after.status();
  const bool steady = *before == *after && after->size == static_cast<std::int64_t>(text->size());
  return ConfigSnapshot{.text = *std::move(text), .stamp = *after, .steady = steady};
}

}  // namespace sluice::yaml::detail

#endif  // SLUICE_YAML_DETAIL_CONFIG_FILE_HPP_
