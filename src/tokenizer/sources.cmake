list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/unicode.cpp
  ${CMAKE_CURRENT_LIST_DIR}/regex.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bpe_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/normalizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pre_tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/added_tokens.cpp
  ${CMAKE_CURRENT_LIST_DIR}/post_processor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/decoder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_loader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tiny_tokenizer.cpp)
list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/chat_template.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja/value.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja/lexer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja/parser.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja/builtins.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja/evaluator.cpp)
