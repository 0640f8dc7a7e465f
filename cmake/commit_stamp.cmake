# Run at build time (cmake -P): writes OUTPUT, a header defining DEEPFUSE_GIT_COMMIT, the commit
# benchmarks report ("-dirty" appended when tracked files differ from it). DEEPFUSE_COMMIT in the
# environment wins (a copied tree on the GPU machine may carry a stale .git). The file is
# rewritten only when the commit changed, so a build with nothing new to compile stays a no-op.
if(DEFINED ENV{DEEPFUSE_COMMIT})
  set(commit "$ENV{DEEPFUSE_COMMIT}")
else()
  execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY "${SOURCE_DIR}"
                  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  # Tracked files changed since that commit: the binary is not the commit's, and says so.
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY "${SOURCE_DIR}"
                  RESULT_VARIABLE changed OUTPUT_QUIET ERROR_QUIET)
  if(commit AND changed EQUAL 1)
    string(APPEND commit "-dirty")
  endif()
endif()
if(NOT commit)
  set(commit unknown)
endif()
set(content "#define DEEPFUSE_GIT_COMMIT \"${commit}\"\n")
set(previous "")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" previous)
endif()
if(NOT previous STREQUAL content)
  file(WRITE "${OUTPUT}" "${content}")
endif()
