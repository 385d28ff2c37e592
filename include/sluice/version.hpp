// sluice/version.hpp — the library version, for diagnostics and feature checks.
#ifndef SLUICE_VERSION_HPP_
#define SLUICE_VERSION_HPP_

namespace sluice {

inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 2;
inline constexpr int kVersionPatch = 0;
inline constexpr const char* kVersionString = "0.2.0";

}  // namespace sluice

#endif  // SLUICE_VERSION_HPP_
