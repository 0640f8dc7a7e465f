list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/kv_block_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_scheduler.cpp)
