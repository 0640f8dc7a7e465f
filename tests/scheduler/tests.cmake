deepfuse_test(test_scheduler
  ${CMAKE_CURRENT_LIST_DIR}/test_decode_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_builtin_plans.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_tuning_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_profiler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/test_plan_choices.cpp)
