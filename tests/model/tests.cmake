deepfuse_test(test_model_config ${CMAKE_CURRENT_LIST_DIR}/test_config.cpp)
deepfuse_test(test_safetensors ${CMAKE_CURRENT_LIST_DIR}/test_safetensors.cpp)
deepfuse_test(test_hf_parity ${CMAKE_CURRENT_LIST_DIR}/test_hf_parity.cpp)
target_compile_definitions(test_hf_parity PRIVATE DEEPFUSE_FIXTURES_DIR="${PROJECT_SOURCE_DIR}/tests/fixtures")
