deepfuse_test(test_reference_mlp ${CMAKE_CURRENT_LIST_DIR}/test_mlp.cpp)
deepfuse_test(test_reference_ops ${CMAKE_CURRENT_LIST_DIR}/test_norm_rope_attention.cpp)
deepfuse_test(test_reference_sampling ${CMAKE_CURRENT_LIST_DIR}/test_sampling.cpp)
deepfuse_test(test_reference_decoder ${CMAKE_CURRENT_LIST_DIR}/test_decoder.cpp)
