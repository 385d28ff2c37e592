# Builds and runs tests/consumer three ways: add_subdirectory, FetchContent from a local tarball,
# and find_package after `cmake --install` into a temporary prefix. Fails on the first failure.
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

function(build_and_run mode)
  set(dir "${WORK_DIR}/${mode}")
  run(${CMAKE_COMMAND} -S "${consumer_src}" -B "${dir}" -G "${GENERATOR}"
      -DCMAKE_BUILD_TYPE=Release -DSLUICE_MODE=${mode} ${ARGN})
  run(${CMAKE_COMMAND} --build "${dir}")
  execute_process(COMMAND "${dir}/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer built by ${mode} exited ${rc}")
  endif()
  message(STATUS "${mode}: ${out}")
endfunction()

# 1. add_subdirectory of the checkout.
build_and_run(subdirectory -DSLUICE_SOURCE_DIR=${SLUICE_SOURCE_DIR})

# 2. FetchContent from a tarball of the working tree (what a release archive holds).
set(tarball "${WORK_DIR}/sluice-src.tar.gz")
execute_process(
  COMMAND ${CMAKE_COMMAND} -E tar czf "${tarball}" CMakeLists.txt LICENSE cmake include
  WORKING_DIRECTORY "${SLUICE_SOURCE_DIR}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not pack the source tree")
endif()
build_and_run(fetchcontent -DSLUICE_URL=file://${tarball})

# 3. find_package after an install into a temporary prefix.
set(prefix "${WORK_DIR}/prefix")
run(${CMAKE_COMMAND} -S "${SLUICE_SOURCE_DIR}" -B "${WORK_DIR}/sluice-build" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_BENCHMARKS=OFF
    -DSLUICE_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX=${prefix})
run(${CMAKE_COMMAND} --install "${WORK_DIR}/sluice-build")
build_and_run(package -DCMAKE_PREFIX_PATH=${prefix})
