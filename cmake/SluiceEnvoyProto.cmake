# The Envoy part's wire contract: proto/envoy/**.proto (Envoy's packages, message names and field
# numbers) generated into the build tree and compiled once into the STATIC library
# sluice_envoy_proto, warnings off (generated code, not ours). Defines nothing when protoc,
# libprotobuf or grpc_cpp_plugin is missing; the caller checks TARGET sluice_envoy_proto.
# Used by sluice's own build (the protos of the source tree) and by the installed
# sluiceConfig.cmake, which sets SLUICE_ENVOY_PROTO_DIR to the installed protos: a consumer
# generates and compiles the protocol with its own protoc and gRPC, in its build tree.
if(NOT DEFINED SLUICE_ENVOY_PROTO_DIR)
  set(SLUICE_ENVOY_PROTO_DIR "${CMAKE_CURRENT_LIST_DIR}/../proto")
endif()
find_package(Protobuf QUIET)
if(TARGET gRPC::grpc_cpp_plugin)
  set(SLUICE_GRPC_CPP_PLUGIN "$<TARGET_FILE:gRPC::grpc_cpp_plugin>")
else()
  find_program(SLUICE_GRPC_CPP_PLUGIN grpc_cpp_plugin)
endif()
if(TARGET protobuf::protoc AND TARGET protobuf::libprotobuf AND SLUICE_GRPC_CPP_PLUGIN)
  cmake_path(ABSOLUTE_PATH SLUICE_ENVOY_PROTO_DIR NORMALIZE OUTPUT_VARIABLE proto_in)
  set(proto_out "${CMAKE_CURRENT_BINARY_DIR}/envoy_proto")
  file(MAKE_DIRECTORY "${proto_out}")  # exists at configure time, as imported targets require
  set(messages
    envoy/config/core/v3/base
    envoy/type/v3/ratelimit_unit
    envoy/extensions/common/ratelimit/v3/ratelimit
    envoy/service/ratelimit/v3/rls)
  set(protos)
  set(outputs "${proto_out}/envoy/service/ratelimit/v3/rls.grpc.pb.cc"
              "${proto_out}/envoy/service/ratelimit/v3/rls.grpc.pb.h")
  foreach(m IN LISTS messages)
    list(APPEND protos "${proto_in}/${m}.proto")
    list(APPEND outputs "${proto_out}/${m}.pb.cc" "${proto_out}/${m}.pb.h")
  endforeach()
  add_custom_command(
    OUTPUT ${outputs}
    COMMAND "${CMAKE_COMMAND}" -E make_directory "${proto_out}"
    COMMAND protobuf::protoc -I "${proto_in}" --cpp_out "${proto_out}" ${protos}
    COMMAND protobuf::protoc -I "${proto_in}" --grpc_out "${proto_out}"
            "--plugin=protoc-gen-grpc=${SLUICE_GRPC_CPP_PLUGIN}"
            "${proto_in}/envoy/service/ratelimit/v3/rls.proto"
    DEPENDS ${protos}
    COMMENT "Generating the Envoy rate limit service protocol"
    VERBATIM)
  list(FILTER outputs INCLUDE REGEX "\\.cc$")
  add_library(sluice_envoy_proto STATIC ${outputs})
  target_include_directories(sluice_envoy_proto SYSTEM PUBLIC "$<BUILD_INTERFACE:${proto_out}>")
  target_link_libraries(sluice_envoy_proto PUBLIC gRPC::grpc++ protobuf::libprotobuf)
  target_compile_options(sluice_envoy_proto PRIVATE -w)
  # Built only when something links it (the service, its tests): a project that vendors sluice
  # does not compile the protocol unless it uses the Envoy part.
  set_target_properties(sluice_envoy_proto PROPERTIES POSITION_INDEPENDENT_CODE ON EXCLUDE_FROM_ALL ON)
endif()
