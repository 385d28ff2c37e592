# Builds and runs tests/consumer the ways README.md documents: add_subdirectory, FetchContent from
# a local tarball (FetchContent from git at the README's tag is the readme_recipe test), and
# find_package after `cmake --install` into a temporary prefix (a full install, and one of the
# core only, as on a machine without hiredis and yaml-cpp; the full one links sluice::envoy too
# where it was installed). Fails on the first failure.
# Inputs: SLUICE_SOURCE_DIR, WORK_DIR, GENERATOR.
cmake_minimum_required(VERSION 3.25)
set(consumer_src "${SLUICE_SOURCE_DIR}/tests/consumer")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
endfunction()

# build_and_run(<case> <SLUICE_MODE> <build type> [cmake args...]): configures, builds and runs
# the consumer. Release (-O3 -DNDEBUG, with the consumer's -Werror) once, for what assertions
# compiled out might break; the other cases at -O0 without debug information, since they check
# how sluice is found and linked, and compile in 55-70% of the time.
function(build_and_run case mode build_type)
  set(dir "${WORK_DIR}/${case}")
  run(${CMAKE_COMMAND} -S "${consumer_src}" -B "${dir}" -G "${GENERATOR}"
      -DCMAKE_BUILD_TYPE=${build_type} -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DSLUICE_MODE=${mode} ${ARGN})
  run(${CMAKE_COMMAND} --build "${dir}")
  execute_process(COMMAND "${dir}/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer built by ${case} exited ${rc}")
  endif()
  message(STATUS "${case}: ${out}")
  if(EXISTS "${dir}/consumer_envoy")
    execute_process(COMMAND "${dir}/consumer_envoy" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "consumer_envoy built by ${case} exited ${rc}")
    endif()
    message(STATUS "${case}: ${out}")
  endif()
endfunction()

# 1. add_subdirectory of the checkout.
build_and_run(subdirectory subdirectory Release -DSLUICE_SOURCE_DIR=${SLUICE_SOURCE_DIR})

# 2. FetchContent from a tarball of the working tree (what a release archive holds).
set(tarball "${WORK_DIR}/sluice-src.tar.gz")
execute_process(
  COMMAND ${CMAKE_COMMAND} -E tar czf "${tarball}" CMakeLists.txt LICENSE cmake include proto
  WORKING_DIRECTORY "${SLUICE_SOURCE_DIR}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not pack the source tree")
endif()
build_and_run(fetchcontent fetchcontent Debug -DSLUICE_URL=file://${tarball})

# 3. FetchContent from git at the tag the README pins: the readme_recipe test
#    (readme_recipe_test.sh) builds the README's recipe as written.

# 4. find_package after the README's install recipe into a temporary prefix; <case> names it.
function(install_and_use case)
  set(prefix "${WORK_DIR}/${case}-prefix")
  run(${CMAKE_COMMAND} -S "${SLUICE_SOURCE_DIR}" -B "${WORK_DIR}/${case}-build" -G "${GENERATOR}"
      -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCHMARKS=OFF
      -DSLUICE_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX=${prefix} ${ARGN})
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/${case}-build")
  # Where the envoy component was installed (gRPC, protoc and yaml-cpp found), link it too.
  set(envoy)
  if(EXISTS "${prefix}/share/cmake/sluice/sluiceEnvoyTargets.cmake")
    set(envoy -DSLUICE_CONSUMER_ENVOY=ON)
  endif()
  build_and_run(${case} package Debug -DCMAKE_PREFIX_PATH=${prefix} ${envoy})
endfunction()
install_and_use(package)

# 5. The same with the core only: what a machine with Abseil and xxHash alone installs.
install_and_use(package-core -DSLUICE_REDIS=OFF -DSLUICE_YAML=OFF -DSLUICE_GRPC=OFF)
