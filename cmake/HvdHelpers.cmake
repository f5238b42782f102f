# Helpers shared by the horovod_cpp build.

# Warnings and language level for a horovod_cpp target.
function(hvd_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_17)
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(HVD_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# A target of one of the runtime's layers (base, ops, timeline, the folders of common/), which
# may include the headers of the layers in ARGN (its own first), nothing else. A layer is a
# folder or a single header of the source tree (common/protocol, common/horovod.h). Its include
# root is a folder of the build tree holding one link per allowed layer
# (build/layers/<target>/<layer> -> <source>/<layer>), instead of the source root that would
# expose every layer.
function(hvd_layer target)
  set(root "${CMAKE_CURRENT_BINARY_DIR}/layers/${target}")
  file(REMOVE_RECURSE "${root}")
  file(MAKE_DIRECTORY "${root}")
  foreach(layer IN LISTS ARGN)
    get_filename_component(parent "${root}/${layer}" DIRECTORY)
    file(MAKE_DIRECTORY "${parent}")
    file(CREATE_LINK "${PROJECT_SOURCE_DIR}/${layer}" "${root}/${layer}" SYMBOLIC)
  endforeach()
  target_compile_features(${target} PUBLIC cxx_std_17)
  target_include_directories(${target} PRIVATE "${root}")
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(HVD_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# HVD_SANITIZE=address|undefined|thread|address,undefined: instrument everything we build.
function(hvd_setup_sanitizers sanitizers)
  if(sanitizers STREQUAL "")
    return()
  endif()
  string(REPLACE "," ";" list "${sanitizers}")
  foreach(s IN LISTS list)
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "HVD_SANITIZE: unknown sanitizer '${s}' (use address, undefined or thread)")
    endif()
  endforeach()
  if("thread" IN_LIST list AND "address" IN_LIST list)
    message(FATAL_ERROR "HVD_SANITIZE: thread cannot be combined with address")
  endif()
  add_compile_options(-fsanitize=${sanitizers} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${sanitizers})
endfunction()
