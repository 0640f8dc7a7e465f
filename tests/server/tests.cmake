# src/server: unit tests of its parts, then the whole server end to end (CPU, the reference
# backend on a tiny model) driven by the `openai` Python client from a venv of its own, and curl.
foreach(name text_output openai_request tool_calls structured_output)
  deepfuse_test(test_${name} ${CMAKE_CURRENT_LIST_DIR}/test_${name}.cpp)
  target_link_libraries(test_${name} PRIVATE deepfuse_server)
endforeach()

set(server_venv ${PROJECT_BINARY_DIR}/.venv-server)
add_test(NAME server_venv COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/setup_venv.sh ${server_venv})
# Label `pypi`: they install the client from PyPI, which the GPU machines cannot reach.
set_tests_properties(server_venv PROPERTIES FIXTURES_SETUP server_venv LABELS "cpu;pypi" TIMEOUT 300)
# The tool call tests' stand-in model (see the file).
add_executable(scripted_server ${CMAKE_CURRENT_LIST_DIR}/scripted_server.cpp)
target_link_libraries(scripted_server PRIVATE deepfuse_server)
add_test(NAME server_end_to_end
         COMMAND ${server_venv}/bin/python ${CMAKE_CURRENT_LIST_DIR}/test_server.py
                 --deepfuse $<TARGET_FILE:deepfuse_cli> --work-dir ${PROJECT_BINARY_DIR}/server-test
                 --scripted-server $<TARGET_FILE:scripted_server> --fixtures ${PROJECT_SOURCE_DIR}/tests/fixtures)
set_tests_properties(server_end_to_end PROPERTIES FIXTURES_REQUIRED server_venv LABELS "cpu;pypi" TIMEOUT 900
                     ENVIRONMENT PYTHONUNBUFFERED=1)
# Structured output and forced tool calls (the grammar on the tiny random model), with the same venv.
add_test(NAME server_structured_output
         COMMAND ${server_venv}/bin/python ${CMAKE_CURRENT_LIST_DIR}/test_structured_output.py
                 --deepfuse $<TARGET_FILE:deepfuse_cli> --work-dir ${PROJECT_BINARY_DIR}/server-test-structured
                 --fixtures ${PROJECT_SOURCE_DIR}/tests/fixtures)
set_tests_properties(server_structured_output PROPERTIES FIXTURES_REQUIRED server_venv LABELS "cpu;pypi" TIMEOUT 900
                     ENVIRONMENT PYTHONUNBUFFERED=1)
# The CUDA engine under grammars (skips without a GPU).
deepfuse_test(test_structured_output_gpu ${CMAKE_CURRENT_LIST_DIR}/test_structured_output_gpu.cpp GPU)
target_link_libraries(test_structured_output_gpu PRIVATE deepfuse_server)
foreach(name openai_request tool_calls structured_output)
  target_compile_definitions(test_${name} PRIVATE DEEPFUSE_TOKENIZER_FIXTURES="${PROJECT_SOURCE_DIR}/tests/fixtures/tokenizers")
endforeach()
