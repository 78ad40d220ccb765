# llm_enable_warnings(<target>): the warnings every library of the course is
# compiled with (C++ sources; nvcc has its own, cmake/Cuda.cmake).
# Eigen's AVX-512 code trips GCC 12's -Wmaybe-uninitialized (false positives),
# so GCC, and only GCC, has that one off; clang does not issue it.
function(llm_enable_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized>)
endfunction()
