deepfuse_test(test_engine_gpu ${CMAKE_CURRENT_LIST_DIR}/test_engine_gpu.cpp GPU)
deepfuse_test(test_kv_cache ${CMAKE_CURRENT_LIST_DIR}/test_kv_cache.cpp)
deepfuse_test(test_random_arch ${CMAKE_CURRENT_LIST_DIR}/test_random_arch.cpp)
deepfuse_test(test_runtime_gpu ${CMAKE_CURRENT_LIST_DIR}/test_runtime_gpu.cpp GPU)
deepfuse_test(test_decode_buckets ${CMAKE_CURRENT_LIST_DIR}/test_decode_buckets.cpp)
# The engine comparisons again with o_proj forced onto the cluster GEMV: the tiny test models are
# below the size where the engine picks it by itself.
gtest_discover_tests(test_engine_gpu TEST_PREFIX "oproj_gemv." TEST_FILTER "*EngineVsReference*"
                     PROPERTIES LABELS gpu ENVIRONMENT "DEEPFUSE_OPROJ_GEMV=1" DISCOVERY_TIMEOUT 60)
deepfuse_test(test_kv_block_pool ${CMAKE_CURRENT_LIST_DIR}/test_kv_block_pool.cpp)
