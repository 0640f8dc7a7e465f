deepfuse_test(test_core ${CMAKE_CURRENT_LIST_DIR}/test_core.cpp)
deepfuse_test(test_logprobs ${CMAKE_CURRENT_LIST_DIR}/test_logprobs.cpp)
deepfuse_test(test_roofline ${CMAKE_CURRENT_LIST_DIR}/test_roofline.cpp)
