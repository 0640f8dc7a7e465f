list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/nccl_group.cpp
  ${CMAKE_CURRENT_LIST_DIR}/peer_exchange.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensor_split.cpp)
