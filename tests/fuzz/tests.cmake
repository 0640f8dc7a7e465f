# The libFuzzer target needs clang (-fsanitize=fuzzer); the rest of the build uses the default
# compiler, so the fuzzer is compiled by a direct clang++ command over just the parser sources.
# Built when DEEPFUSE_FUZZ=ON, or automatically whenever clang++ is found.
find_program(DEEPFUSE_CLANGXX NAMES clang++ clang++-14)
if(DEEPFUSE_FUZZ AND NOT DEEPFUSE_CLANGXX)
  message(FATAL_ERROR "DEEPFUSE_FUZZ=ON needs clang++ (scripts/install-deps.sh installs clang)")
endif()
if(DEEPFUSE_CLANGXX)
  set(fuzz_sources
    ${CMAKE_CURRENT_LIST_DIR}/fuzz_model_parsers.cpp
    ${PROJECT_SOURCE_DIR}/src/core/error.cpp
    ${PROJECT_SOURCE_DIR}/src/model/config.cpp
    ${PROJECT_SOURCE_DIR}/src/model/quantization.cpp
    ${PROJECT_SOURCE_DIR}/src/model/safetensors.cpp
    ${PROJECT_SOURCE_DIR}/src/model/checkpoint.cpp)
  file(GLOB fuzz_headers ${PROJECT_SOURCE_DIR}/include/deepfuse/*.hpp)
  set(fuzz_binary ${CMAKE_CURRENT_BINARY_DIR}/fuzz/fuzz_model_parsers)
  set(fuzz_includes -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src)
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND fuzz_includes -isystem ${dir})
  endforeach()
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fuzz)
  add_custom_command(
    OUTPUT ${fuzz_binary}
    COMMAND ${DEEPFUSE_CLANGXX} -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined
            -fno-sanitize-recover=undefined ${fuzz_includes} ${fuzz_sources} -o ${fuzz_binary}
    DEPENDS ${fuzz_sources} ${fuzz_headers}
    COMMENT "Building libFuzzer target fuzz_model_parsers with clang"
    VERBATIM)
  add_custom_target(fuzz_model_parsers ALL DEPENDS ${fuzz_binary})
  add_test(NAME fuzz_model_parsers
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_fuzz.sh ${fuzz_binary} $<TARGET_FILE:deepfuse_cli>
                   ${PROJECT_SOURCE_DIR}/tests/fixtures ${CMAKE_CURRENT_BINARY_DIR}/fuzz_work)
  set_tests_properties(fuzz_model_parsers PROPERTIES LABELS cpu TIMEOUT 300)
else()
  message(STATUS "clang++ not found: libFuzzer target fuzz_model_parsers not built")
endif()
