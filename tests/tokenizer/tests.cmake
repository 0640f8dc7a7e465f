deepfuse_test(test_tokenizer_parity ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer_parity.cpp)
target_compile_definitions(test_tokenizer_parity PRIVATE DEEPFUSE_TOKENIZER_FIXTURES="${PROJECT_SOURCE_DIR}/tests/fixtures/tokenizers")
deepfuse_test(test_chat_template ${CMAKE_CURRENT_LIST_DIR}/test_chat_template.cpp)
target_compile_definitions(test_chat_template PRIVATE DEEPFUSE_TOKENIZER_FIXTURES="${PROJECT_SOURCE_DIR}/tests/fixtures/tokenizers")
