list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/error.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bf16.cpp
  ${CMAKE_CURRENT_LIST_DIR}/float16.cpp
  ${CMAKE_CURRENT_LIST_DIR}/float8.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weight_format.cpp
  ${CMAKE_CURRENT_LIST_DIR}/logprobs.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rope.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device_attributes.cpp
  ${CMAKE_CURRENT_LIST_DIR}/graph_timing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/roofline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/warm_up.cpp)
