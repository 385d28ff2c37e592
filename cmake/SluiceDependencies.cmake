# Finds sluice's dependencies. Each is looked up with find_package first (Debian's -dev packages
# satisfy every one); where that fails, FetchContent downloads a pinned release (machines with
# internet only). FetchContent_Declare(... FIND_PACKAGE_ARGS) makes MakeAvailable try
# find_package before it downloads.
include(FetchContent)

# Abseil: Status/StatusOr, int128, thread annotations.
FetchContent_Declare(absl
  GIT_REPOSITORY https://github.com/abseil/abseil-cpp.git
  GIT_TAG 20240722.0
  GIT_SHALLOW TRUE
  FIND_PACKAGE_ARGS CONFIG)
set(ABSL_PROPAGATE_CXX_STD ON)
set(ABSL_ENABLE_INSTALL ON)
FetchContent_MakeAvailable(absl)

# xxHash, used header-only (XXH_INLINE_ALL) so that consumers link nothing for it.
find_path(SLUICE_XXHASH_INCLUDE_DIR NAMES xxhash.h)
if(NOT SLUICE_XXHASH_INCLUDE_DIR)
  FetchContent_Declare(xxhash
    GIT_REPOSITORY https://github.com/Cyan4973/xxHash.git
    GIT_TAG v0.8.2
    GIT_SHALLOW TRUE)
  FetchContent_GetProperties(xxhash)
  if(NOT xxhash_POPULATED)
    FetchContent_Populate(xxhash)
  endif()
  set(SLUICE_XXHASH_INCLUDE_DIR "${xxhash_SOURCE_DIR}" CACHE PATH "xxhash.h directory" FORCE)
endif()
add_library(sluice_xxhash INTERFACE)
target_include_directories(sluice_xxhash SYSTEM INTERFACE "$<BUILD_INTERFACE:${SLUICE_XXHASH_INCLUDE_DIR}>")

# Catch2 (tests). No version is requested: Debian ships v2, the fallback is v3; the tests build
# with both through tests/catch.hpp.
if(SLUICE_BUILD_TESTS)
  FetchContent_Declare(Catch2
    GIT_REPOSITORY https://github.com/catchorg/Catch2.git
    GIT_TAG v3.5.2
    GIT_SHALLOW TRUE
    FIND_PACKAGE_ARGS)
  FetchContent_MakeAvailable(Catch2)
endif()

# Google Benchmark (bench/).
if(SLUICE_BUILD_BENCHMARKS)
  set(BENCHMARK_ENABLE_TESTING OFF)
  set(BENCHMARK_ENABLE_INSTALL OFF)
  FetchContent_Declare(benchmark
    GIT_REPOSITORY https://github.com/google/benchmark.git
    GIT_TAG v1.8.3
    GIT_SHALLOW TRUE
    FIND_PACKAGE_ARGS)
  FetchContent_MakeAvailable(benchmark)
endif()
