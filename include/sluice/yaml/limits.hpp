// sluice/yaml/limits.hpp — how much untrusted config text the YAML loader reads.
//
// A config is at most kMaxConfigBytes; it has at most kMaxConfigNodes nodes (counted as it is
// parsed, before any is built, and again as it is read, where each use of an alias counts, so an
// alias bomb is rejected early); its scalars read hold at most kMaxScalarBytes (each use of an
// alias counts again, so an alias of a long scalar cannot multiply it); and it nests at most
// kMaxNestingDepth levels (checked on the text before parsing, and again as the parser opens each
// collection, before it descends into it, so that no parser recursion runs deep). Thread-safety:
// constants only.
#ifndef SLUICE_YAML_LIMITS_HPP_
#define SLUICE_YAML_LIMITS_HPP_

#include <cstddef>

namespace sluice::yaml {

// The largest config accepted, in bytes.
inline constexpr std::size_t kMaxConfigBytes = std::size_t{2} << 20;  // 2 MiB
// The most YAML nodes the loader parses, builds or reads from one config (each use of an alias
// counts where it is read).
inline constexpr std::size_t kMaxConfigNodes = 250'000;
// The most scalar text the loader reads from one config, in bytes, where each use of an alias
// counts again. Twice kMaxConfigBytes: a config without aliases holds less (an escape such as
// `\P` writes at most 1.5 bytes per byte of text).
inline constexpr std::size_t kMaxScalarBytes = 2 * kMaxConfigBytes;  // 4 MiB
// The deepest nesting accepted: block indentation steps, `- ` sequence entries and open `[` / `{`
// together. A gateway config nests about 6 levels.
inline constexpr std::size_t kMaxNestingDepth = 64;

}  // namespace sluice::yaml

#endif  // SLUICE_YAML_LIMITS_HPP_
