deepfuse_test(test_kv_cache ${CMAKE_CURRENT_LIST_DIR}/test_kv_cache.cpp)
