list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/timing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/decode_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mlp_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/power_cap.cpp
  ${CMAKE_CURRENT_LIST_DIR}/qkv_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sampling_bench.cpp)

# The commit benchmarks report, stamped at every build (not only at configure): a build dir
# configured at an older commit would otherwise label new results with the old commit.
set(DEEPFUSE_COMMIT_HEADER ${CMAKE_BINARY_DIR}/generated/deepfuse_commit.hpp)
add_custom_target(deepfuse_commit_stamp ALL
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DOUTPUT=${DEEPFUSE_COMMIT_HEADER}
          -P ${PROJECT_SOURCE_DIR}/cmake/commit_stamp.cmake
  BYPRODUCTS ${DEEPFUSE_COMMIT_HEADER}
  COMMENT "Stamping the git commit for benchmark results" VERBATIM)
