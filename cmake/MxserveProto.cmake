# mxserve_protobuf_generate: the one protoc rule of the build.
#
#   mxserve_protobuf_generate(<target>
#     PROTO_ROOT <dir>        # --proto_path; PROTOS are relative to it, and so are the
#                             # generated headers' include paths
#     PROTOS <file.proto>...)
#
# Runs Debian's protoc with grpc_cpp_plugin on PROTOS into
# ${CMAKE_CURRENT_BINARY_DIR}/generated and builds the messages and gRPC stubs as
# the static library <target> (include "<proto path>.grpc.pb.h"). Every output
# depends on every proto of the call, so a changed import regenerates its users.
function(mxserve_protobuf_generate target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "PROTO_ROOT" "PROTOS")
  if(NOT arg_PROTO_ROOT OR NOT arg_PROTOS OR arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "mxserve_protobuf_generate(${target} PROTO_ROOT <dir> PROTOS <files>): "
                        "got '${ARGN}'")
  endif()
  set(generated_dir ${CMAKE_CURRENT_BINARY_DIR}/generated)
  file(MAKE_DIRECTORY ${generated_dir})

  set(proto_files)
  foreach(proto IN LISTS arg_PROTOS)
    list(APPEND proto_files ${arg_PROTO_ROOT}/${proto})
  endforeach()

  set(generated_sources)
  foreach(proto IN LISTS arg_PROTOS)
    string(REGEX REPLACE "\\.proto$" "" stem ${proto})
    set(outputs
      ${generated_dir}/${stem}.pb.cc ${generated_dir}/${stem}.pb.h
      ${generated_dir}/${stem}.grpc.pb.cc ${generated_dir}/${stem}.grpc.pb.h)
    add_custom_command(
      OUTPUT ${outputs}
      COMMAND ${Protobuf_PROTOC_EXECUTABLE}
        --proto_path=${arg_PROTO_ROOT}
        --cpp_out=${generated_dir}
        --grpc_out=${generated_dir}
        --plugin=protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>
        ${proto}
      DEPENDS ${proto_files}
      COMMENT "protoc ${proto}"
      VERBATIM)
    list(APPEND generated_sources ${outputs})
  endforeach()

  add_library(${target} ${generated_sources})
  target_include_directories(${target} PUBLIC ${generated_dir})
  target_link_libraries(${target} PUBLIC protobuf::libprotobuf gRPC::grpc++)
  # Generated code is not ours to warn about.
  target_compile_options(${target} PRIVATE -w)
endfunction()
