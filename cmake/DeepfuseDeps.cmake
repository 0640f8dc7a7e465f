# Finds every external dependency in one place. All come from the CUDA toolkit or Debian
# packages (scripts/install-deps.sh); on the GPU machine, from the prefix scripts/device/gpu.sh unpacks.
find_package(CUDAToolkit REQUIRED)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
if(DEEPFUSE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

# PCRE2 (pre-tokenizer regexes, UTF + UCP) and utf8proc (NFC normalization) for src/tokenizer.
# Searched with find_path/find_library so a private prefix given by CMAKE_PREFIX_PATH (the GPU
# machine unpacks Debian .debs there) works like the system one. The static archives are preferred
# so the binary needs no runtime .so where the libraries were only unpacked.
function(deepfuse_find_c_library target header static_name shared_name)
  find_path(${target}_INCLUDE_DIR ${header} PATH_SUFFIXES include)
  find_library(${target}_LIBRARY NAMES ${static_name} ${shared_name}
               PATH_SUFFIXES lib/x86_64-linux-gnu lib64 lib)
  if(NOT ${target}_INCLUDE_DIR OR NOT ${target}_LIBRARY)
    message(FATAL_ERROR "${target} not found (${header}, ${static_name}); run scripts/install-deps.sh")
  endif()
  add_library(deepfuse::${target} UNKNOWN IMPORTED)
  set_target_properties(deepfuse::${target} PROPERTIES
    IMPORTED_LOCATION "${${target}_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${${target}_INCLUDE_DIR}")
  message(STATUS "deepfuse: ${target}: ${${target}_LIBRARY}")
endfunction()
deepfuse_find_c_library(pcre2 pcre2.h libpcre2-8.a pcre2-8)
set_property(TARGET deepfuse::pcre2 PROPERTY INTERFACE_COMPILE_DEFINITIONS PCRE2_CODE_UNIT_WIDTH=8)
deepfuse_find_c_library(utf8proc utf8proc.h libutf8proc.a utf8proc)
# utf8proc.h marks its functions dllimport-style unless told the library is static.
if(utf8proc_LIBRARY MATCHES "\\.a$")
  set_property(TARGET deepfuse::utf8proc PROPERTY INTERFACE_COMPILE_DEFINITIONS UTF8PROC_STATIC)
endif()

# cpp-httplib for `deepfuse serve`: Debian ships it compiled (libcpp-httplib.so, with OpenSSL, zlib
# and brotli support built in), so its header must be used with the same feature macros.
find_path(httplib_INCLUDE_DIR httplib.h PATH_SUFFIXES include)
find_library(httplib_LIBRARY NAMES cpp-httplib PATH_SUFFIXES lib/x86_64-linux-gnu lib64 lib)
if(NOT httplib_INCLUDE_DIR OR NOT httplib_LIBRARY)
  message(FATAL_ERROR "cpp-httplib not found (httplib.h, libcpp-httplib.so); run scripts/install-deps.sh")
endif()
add_library(deepfuse::httplib UNKNOWN IMPORTED)
set_target_properties(deepfuse::httplib PROPERTIES
  IMPORTED_LOCATION "${httplib_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${httplib_INCLUDE_DIR}"
  INTERFACE_COMPILE_DEFINITIONS "CPPHTTPLIB_OPENSSL_SUPPORT;CPPHTTPLIB_ZLIB_SUPPORT;CPPHTTPLIB_BROTLI_SUPPORT")
message(STATUS "deepfuse: httplib: ${httplib_LIBRARY}")

# NCCL for tensor parallelism (src/dist). The CUDA toolkit ships it on some installs (lib/, not
# only lib64/); elsewhere it comes from a prefix: DEEPFUSE_NCCL_ROOT (e.g. PyTorch's wheel dir
# .../site-packages/nvidia/nccl, which has only libnccl.so.2) or CMAKE_PREFIX_PATH.
set(DEEPFUSE_NCCL_ROOT "" CACHE PATH "A prefix holding include/nccl.h and lib/libnccl.so[.2]")
if(DEEPFUSE_NCCL_ROOT)  # asked for by name: searched first and alone
  find_path(NCCL_INCLUDE_DIR nccl.h PATHS ${DEEPFUSE_NCCL_ROOT} PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR PATHS ${DEEPFUSE_NCCL_ROOT} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
endif()
# Then CMAKE_PREFIX_PATH and the system (find_* defaults), then the toolkit's own dirs; NAMES_PER_DIR
# lets a prefix's libnccl.so.2 win over a later directory's libnccl.so.
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
             HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "NCCL not found (nccl.h: '${NCCL_INCLUDE_DIR}', libnccl: '${NCCL_LIBRARY}'); searched the "
                      "CUDA toolkit, DEEPFUSE_NCCL_ROOT and CMAKE_PREFIX_PATH. Pass -DDEEPFUSE_NCCL_ROOT=<dir with "
                      "include/nccl.h and lib/libnccl.so.2> (e.g. site-packages/nvidia/nccl)")
endif()
add_library(deepfuse::nccl UNKNOWN IMPORTED)
set_target_properties(deepfuse::nccl PROPERTIES
  IMPORTED_LOCATION "${NCCL_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
message(STATUS "deepfuse: nccl: ${NCCL_LIBRARY} (${NCCL_INCLUDE_DIR})")

# xgrammar's C++ core for structured output (src/server/grammar): Debian does not package it, so
# scripts/deps/xgrammar.sh (run by install-deps.sh) builds its PyPI source distribution into
# .xgrammar/install, a static library with its headers (and dlpack's).
set(DEEPFUSE_XGRAMMAR_ROOT "${PROJECT_SOURCE_DIR}/.xgrammar/install" CACHE PATH
    "A prefix holding include/xgrammar/xgrammar.h and lib/libxgrammar.a (scripts/deps/xgrammar.sh)")
find_path(xgrammar_INCLUDE_DIR xgrammar/xgrammar.h HINTS ${DEEPFUSE_XGRAMMAR_ROOT} PATH_SUFFIXES include)
find_library(xgrammar_LIBRARY NAMES libxgrammar.a HINTS ${DEEPFUSE_XGRAMMAR_ROOT} PATH_SUFFIXES lib lib64)
if(NOT xgrammar_INCLUDE_DIR OR NOT xgrammar_LIBRARY)
  message(FATAL_ERROR "xgrammar not found in '${DEEPFUSE_XGRAMMAR_ROOT}' (xgrammar/xgrammar.h, libxgrammar.a); "
                      "run scripts/install-deps.sh (or scripts/deps/xgrammar.sh)")
endif()
add_library(deepfuse::xgrammar STATIC IMPORTED)
set_target_properties(deepfuse::xgrammar PROPERTIES
  IMPORTED_LOCATION "${xgrammar_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${xgrammar_INCLUDE_DIR}"
  INTERFACE_COMPILE_DEFINITIONS "XGRAMMAR_ENABLE_CPPTRACE=0;XGRAMMAR_ENABLE_INTERNAL_CHECK=0")
message(STATUS "deepfuse: xgrammar: ${xgrammar_LIBRARY}")
