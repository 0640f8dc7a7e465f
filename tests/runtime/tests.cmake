deepfuse_test(test_engine_gpu ${CMAKE_CURRENT_LIST_DIR}/test_engine_gpu.cpp GPU)
