// sluice/yaml/limits.hpp — how much untrusted config text the YAML loader reads.
//
// A config is at most kMaxConfigBytes, and at most kMaxConfigNodes nodes are read from it (each
// use of an alias counts, so an alias bomb is rejected early). yaml-cpp itself rejects nesting
// deeper than its DepthGuard limit (2000) with a syntax error.
// Thread-safety: constants only.
#ifndef SLUICE_YAML_LIMITS_HPP_
#define SLUICE_YAML_LIMITS_HPP_

#include <cstddef>

namespace sluice::yaml {

// The largest config accepted, in bytes.
inline constexpr std::size_t kMaxConfigBytes = std::size_t{2} << 20;  // 2 MiB
// The most YAML nodes the loader reads from one config (each use of an alias counts).
inline constexpr std::size_t kMaxConfigNodes = 250'000;

}  // namespace sluice::yaml

#endif  // SLUICE_YAML_LIMITS_HPP_
