deepfuse_test(test_kv_block_pool ${CMAKE_CURRENT_LIST_DIR}/test_kv_block_pool.cpp)
deepfuse_test(test_step_scheduler ${CMAKE_CURRENT_LIST_DIR}/test_step_scheduler.cpp)
