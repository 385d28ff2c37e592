// sluice/version.hpp — the library version, for diagnostics and feature checks.
#ifndef SLUICE_VERSION_HPP_
#define SLUICE_VERSION_HPP_

namespace sluice {

inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 1;
inline constexpr int kVersionPatch = 0;
inline constexpr const char* kVersionString = "0.1.0";

}  // namespace sluice

#endif  // SLUICE_VERSION_HPP_
