list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/kv_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mlp_layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fp8_slice.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weight_sources.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu_weights.cpp
  ${CMAKE_CURRENT_LIST_DIR}/forward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/forward_mixed.cpp
  ${CMAKE_CURRENT_LIST_DIR}/graph_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rank_group.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_bench.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_tuning.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tuner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step.cpp
  ${CMAKE_CURRENT_LIST_DIR}/score.cpp
  ${CMAKE_CURRENT_LIST_DIR}/random_arch.cpp)
