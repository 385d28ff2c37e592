# Provides the imported target hiredis::hiredis when hiredis is installed; leaves it undefined
# otherwise. Used by sluice's own build and by the installed sluiceConfig.cmake.
#   1. find_package(hiredis CONFIG): upstream hiredis >= 1.0 exports hiredis::hiredis.
#   2. find_path/find_library, hinted by pkg-config: Debian's hiredis 0.14 ships a CMake config
#      without a target (HiredisConfig.cmake), so the header and library are looked up directly.
# sluice includes <hiredis/hiredis.h>, so the include directory is the one above hiredis/.
if(NOT TARGET hiredis::hiredis)
  find_package(hiredis CONFIG QUIET)
endif()
if(NOT TARGET hiredis::hiredis)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(SLUICE_HIREDIS_PC QUIET hiredis)
  endif()
  find_path(SLUICE_HIREDIS_INCLUDE_DIR NAMES hiredis/hiredis.h
    HINTS "${SLUICE_HIREDIS_PC_INCLUDEDIR}/.." ${SLUICE_HIREDIS_PC_INCLUDE_DIRS})
  find_library(SLUICE_HIREDIS_LIBRARY NAMES hiredis HINTS ${SLUICE_HIREDIS_PC_LIBRARY_DIRS})
  if(SLUICE_HIREDIS_INCLUDE_DIR AND SLUICE_HIREDIS_LIBRARY)
    add_library(hiredis::hiredis UNKNOWN IMPORTED)
    set_target_properties(hiredis::hiredis PROPERTIES
      IMPORTED_LOCATION "${SLUICE_HIREDIS_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${SLUICE_HIREDIS_INCLUDE_DIR}")
  endif()
endif()
