list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/draft_budget.cpp
  ${CMAKE_CURRENT_LIST_DIR}/drafter.cpp
  ${CMAKE_CURRENT_LIST_DIR}/launch_ahead.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ngram_index.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reference_sequence.cpp
  ${CMAKE_CURRENT_LIST_DIR}/suffix_automaton.cpp
  ${CMAKE_CURRENT_LIST_DIR}/suffix_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/verify.cpp)
