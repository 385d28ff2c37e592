# Provides the imported target yaml-cpp::yaml-cpp when yaml-cpp is installed; leaves it undefined
# otherwise. Used by sluice's own build and by the installed sluiceConfig.cmake.
# yaml-cpp 0.8 exports yaml-cpp::yaml-cpp; 0.7 (Debian 12) exports a plain `yaml-cpp` target,
# which is wrapped here under the 0.8 name so that sluice::yaml links one name everywhere.
if(NOT TARGET yaml-cpp::yaml-cpp)
  find_package(yaml-cpp CONFIG QUIET)
  if(NOT TARGET yaml-cpp::yaml-cpp AND TARGET yaml-cpp)
    add_library(yaml-cpp::yaml-cpp INTERFACE IMPORTED)
    set_target_properties(yaml-cpp::yaml-cpp PROPERTIES INTERFACE_LINK_LIBRARIES yaml-cpp)
  endif()
endif()
