list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/decode_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/variants.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plan_checks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/builtin_plans.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plan_json.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tuning_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profiler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/plan_text.cpp)
