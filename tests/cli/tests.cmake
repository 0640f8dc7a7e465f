deepfuse_test(test_cli ${CMAKE_CURRENT_LIST_DIR}/test_cli.cpp)
target_compile_definitions(test_cli PRIVATE DEEPFUSE_CLI="$<TARGET_FILE:deepfuse_cli>")
add_dependencies(test_cli deepfuse_cli)
