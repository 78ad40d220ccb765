# Run at build time (cmake -P): writes the current commit into a source file,
# touching it only when the commit changed, so results always name the code
# they were measured with. Uncommitted changes, new files included, add "-dirty".
execute_process(COMMAND git rev-parse --short=10 HEAD
  WORKING_DIRECTORY ${SOURCE_DIR}
  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0)
  set(commit "unknown")
endif()
execute_process(COMMAND git status --porcelain --untracked-files=normal
  WORKING_DIRECTORY ${SOURCE_DIR}
  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(dirty)
  set(commit "${commit}-dirty")
endif()
set(content "// Generated at build time by cmake/WriteGitCommit.cmake.\nnamespace llm { const char* git_commit() { return \"${commit}\"; } }\n")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT old STREQUAL content)
  file(WRITE ${OUTPUT} "${content}")
endif()
