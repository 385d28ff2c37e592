# Provides the imported target gRPC::grpc++ when gRPC C++ is installed; leaves it undefined
# otherwise. Used by sluice's own build and by the installed sluiceConfig.cmake.
#   1. find_package(gRPC CONFIG): upstream gRPC and Debian's libgrpc++-dev export gRPC::grpc++.
#   2. pkg-config's grpc++ module, for installations that ship only pkg-config files.
if(NOT TARGET gRPC::grpc++)
  find_package(gRPC CONFIG QUIET)
endif()
if(NOT TARGET gRPC::grpc++)
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(SLUICE_GRPCPP_PC QUIET IMPORTED_TARGET grpc++)
    if(TARGET PkgConfig::SLUICE_GRPCPP_PC)
      add_library(gRPC::grpc++ INTERFACE IMPORTED)
      set_target_properties(gRPC::grpc++ PROPERTIES
        INTERFACE_LINK_LIBRARIES PkgConfig::SLUICE_GRPCPP_PC)
    endif()
  endif()
endif()
