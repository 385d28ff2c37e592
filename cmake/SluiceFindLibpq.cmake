# Provides the imported target PostgreSQL::PostgreSQL (libpq) when libpq is installed; leaves it
# undefined otherwise. Used by sluice's own build and by the installed sluiceConfig.cmake.
#   1. CMake's FindPostgreSQL (finds libpq-fe.h and libpq; Debian: libpq-dev).
#   2. pkg-config's libpq module, for installations FindPostgreSQL does not know.
if(NOT TARGET PostgreSQL::PostgreSQL)
  find_package(PostgreSQL QUIET)
endif()
if(NOT TARGET PostgreSQL::PostgreSQL)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(SLUICE_LIBPQ_PC QUIET IMPORTED_TARGET libpq)
    if(TARGET PkgConfig::SLUICE_LIBPQ_PC)
      add_library(PostgreSQL::PostgreSQL INTERFACE IMPORTED)
      set_target_properties(PostgreSQL::PostgreSQL PROPERTIES
        INTERFACE_LINK_LIBRARIES PkgConfig::SLUICE_LIBPQ_PC)
    endif()
  endif()
endif()
