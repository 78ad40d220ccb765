#pragma once
// The CUDA stub of a workshop exercise (docs/workshop.md; the CPU stub is
// llm/exercise.hpp). A kernel cannot throw, and a __trap() would leave the
// CUDA context unusable for every later test in the process, so the stub of a
// kernel's exercise region does two harmless things instead:
//
//   LLM_CUDA_EXERCISE_TODO("exNN.M");        // one line of device printf
//   output[i] = llm::cuda::device::exercise_nan();   // the stub's own result
//
// The printf (thread 0 of block 0 only, so one line per launch) shows up in
// the test's output at the next synchronization, naming the exercise and the
// place to write it; the NaN fails every check, since NaN never passes one.
#include <cuda_runtime.h>

#include <cstdio>

namespace llm::cuda::device {

__device__ inline void exercise_not_done(const char* exercise_id, const char* file, int line) {
  const bool first_thread_of_the_grid = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 &&
                                        blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
  if (first_thread_of_the_grid)
    printf("ExerciseNotDone: exercise %s is not written yet: write it at %s:%d (this kernel writes NaN until "
           "then). Hints: scripts/workshop.py hint %s\n",
           exercise_id, file, line, exercise_id);
}

// A quiet NaN: what a stubbed kernel writes where its result would go.
__device__ inline float exercise_nan() { return __int_as_float(0x7fffffff); }

}  // namespace llm::cuda::device

#define LLM_CUDA_EXERCISE_TODO(exercise_id) ::llm::cuda::device::exercise_not_done(exercise_id, __FILE__, __LINE__)
