# README.md and bench/results: the limits of issue 55 (a one-page README, at most 60 result files,
# each described) and citations of files that exist. No build needed; Python only.
find_package(Python3 COMPONENTS Interpreter REQUIRED)
add_test(NAME docs_limits COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_docs.py ${PROJECT_SOURCE_DIR})
set_tests_properties(docs_limits PROPERTIES LABELS cpu TIMEOUT 60)
