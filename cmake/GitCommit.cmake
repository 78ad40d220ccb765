# The commit goes into every results table so a number can be traced to code.
# It is re-read at every build (not only at configure time); see
# WriteGitCommit.cmake. LLM_GIT_COMMIT_SOURCE is the generated file.
set(LLM_GIT_COMMIT_SOURCE ${CMAKE_BINARY_DIR}/generated/git_commit.cpp)
add_custom_target(llm_git_commit
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${CMAKE_SOURCE_DIR} -DOUTPUT=${LLM_GIT_COMMIT_SOURCE}
          -P ${CMAKE_SOURCE_DIR}/cmake/WriteGitCommit.cmake
  BYPRODUCTS ${LLM_GIT_COMMIT_SOURCE}
  COMMENT "Reading the git commit"
  VERBATIM)
