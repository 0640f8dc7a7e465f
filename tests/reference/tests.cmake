deepfuse_test(test_reference_mlp ${CMAKE_CURRENT_LIST_DIR}/test_mlp.cpp)
