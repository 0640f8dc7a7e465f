deepfuse_test(test_kv_cache ${CMAKE_CURRENT_LIST_DIR}/test_kv_cache.cpp)
deepfuse_test(test_random_arch ${CMAKE_CURRENT_LIST_DIR}/test_random_arch.cpp)
deepfuse_test(test_runtime_gpu ${CMAKE_CURRENT_LIST_DIR}/test_runtime_gpu.cpp GPU)
deepfuse_test(test_decode_buckets ${CMAKE_CURRENT_LIST_DIR}/test_decode_buckets.cpp)
