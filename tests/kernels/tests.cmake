deepfuse_test(test_mlp_shape_checks ${CMAKE_CURRENT_LIST_DIR}/test_mlp_shape_checks.cpp)
deepfuse_test(test_mlp_gpu ${CMAKE_CURRENT_LIST_DIR}/test_mlp_gpu.cpp GPU)
deepfuse_test(test_gemm_gpu ${CMAKE_CURRENT_LIST_DIR}/test_gemm_gpu.cpp GPU)
