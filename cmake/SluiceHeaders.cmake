# Which public header belongs to which target. Every header under include/sluice/ belongs to
# exactly one part: the optional parts own their umbrella header and their folder, the core owns
# the rest. Found by globbing, so a new header is installed, packaged and compile-checked without
# a list to keep in step (a header missing from such a list used to be left out of the package).
#
# sluice_part_headers(<part> <out-var>): the headers of <part> (core, redis, postgres, yaml, grpc,
# httplib, envoy), as paths relative to the project's source directory.
file(GLOB_RECURSE SLUICE_PUBLIC_HEADERS CONFIGURE_DEPENDS
  RELATIVE "${PROJECT_SOURCE_DIR}" "${PROJECT_SOURCE_DIR}/include/sluice/*.hpp")
list(SORT SLUICE_PUBLIC_HEADERS)
set(SLUICE_OPTIONAL_PARTS redis postgres yaml grpc httplib envoy)

function(sluice_part_headers part out)
  set(headers ${SLUICE_PUBLIC_HEADERS})
  if(part STREQUAL "core")
    foreach(optional IN LISTS SLUICE_OPTIONAL_PARTS)
      list(FILTER headers EXCLUDE REGEX "^include/sluice/${optional}(\\.hpp|/)")
    endforeach()
  else()
    list(FILTER headers INCLUDE REGEX "^include/sluice/${part}(\\.hpp|/)")
  endif()
  set(${out} ${headers} PARENT_SCOPE)
endfunction()
