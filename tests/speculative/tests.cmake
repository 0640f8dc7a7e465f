deepfuse_test(test_speculative_drafters ${CMAKE_CURRENT_LIST_DIR}/test_drafters.cpp)
deepfuse_test(test_speculative_verify ${CMAKE_CURRENT_LIST_DIR}/test_verify.cpp)
