# Provides the imported target httplib::httplib when cpp-httplib is installed; leaves it undefined
# otherwise. Used by sluice's own build and by the installed sluiceConfig.cmake.
#   1. find_package(httplib CONFIG): upstream's httplib::httplib.
#   2. pkg-config cpp-httplib: Debian's build, a shared library whose header must be compiled with
#      the feature macros of the .pc file's cflags (CPPHTTPLIB_OPENSSL_SUPPORT, ...); wrapped under
#      upstream's name so that sluice::httplib links one name everywhere.
#   3. httplib.h alone (SLUICE_HTTPLIB_INCLUDE_DIR): the upstream single header, header-only.
# cpp-httplib runs its server on threads, so Threads::Threads is found too.
find_package(Threads QUIET)
if(NOT TARGET httplib::httplib)
  find_package(httplib CONFIG QUIET)
endif()
if(NOT TARGET httplib::httplib)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(SLUICE_HTTPLIB_PC QUIET IMPORTED_TARGET cpp-httplib)
  endif()
  if(TARGET PkgConfig::SLUICE_HTTPLIB_PC)
    add_library(httplib::httplib INTERFACE IMPORTED)
    set_target_properties(httplib::httplib PROPERTIES
      INTERFACE_LINK_LIBRARIES "PkgConfig::SLUICE_HTTPLIB_PC;Threads::Threads")
  else()
    find_path(SLUICE_HTTPLIB_INCLUDE_DIR NAMES httplib.h)
    if(SLUICE_HTTPLIB_INCLUDE_DIR AND TARGET Threads::Threads)
      add_library(httplib::httplib INTERFACE IMPORTED)
      set_target_properties(httplib::httplib PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${SLUICE_HTTPLIB_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES Threads::Threads)
    endif()
  endif()
endif()
