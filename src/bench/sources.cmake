list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/timing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/decode_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mlp_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/qkv_bench.cpp)

# The commit benchmarks report; refreshed on every configure (scripts/build.sh configures).
if(DEFINED ENV{DEEPFUSE_COMMIT})
  set(DEEPFUSE_GIT_COMMIT $ENV{DEEPFUSE_COMMIT})  # a copied tree (GPU machine): its .git may be stale
else()
  execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                  OUTPUT_VARIABLE DEEPFUSE_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
if(NOT DEEPFUSE_GIT_COMMIT)
  set(DEEPFUSE_GIT_COMMIT unknown)
endif()
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/timing.cpp PROPERTIES
  COMPILE_DEFINITIONS DEEPFUSE_GIT_COMMIT="${DEEPFUSE_GIT_COMMIT}")
