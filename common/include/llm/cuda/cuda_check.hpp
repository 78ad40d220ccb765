#pragma once
// Every CUDA and cuBLAS call of the course goes through one of these macros, so
// a failure becomes an llm::DeviceError that names the call, the file:line and
// the runtime's own error text, instead of a silent wrong answer later on.
//
//   LLM_CUDA_CHECK(cudaMalloc(&p, bytes));
//   LLM_CUBLAS_CHECK(cublasSgemm(...));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   LLM_CUDA_CHECK_LAUNCH();   // a bad launch configuration shows up here
//
// A kernel launch returns nothing: a bad grid, too much shared memory or a
// missing kernel image for this GPU is only reported by the next
// cudaGetLastError(), hence LLM_CUDA_CHECK_LAUNCH() after every launch. Faults
// inside a running kernel (an out-of-bounds read) surface asynchronously, at
// the next synchronizing call, which is checked too.
//
// CUDA-aware translation units only (.cu files, and .cpp files of common/cuda
// or of a step's CUDA code): it includes the CUDA headers. Code that must also
// build without CUDA talks to llm/cuda/cuda_runtime_api.hpp instead.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "llm/errors.hpp"

namespace llm::cuda::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t error, const char* expression, const char* file, int line) {
  throw DeviceError(std::string("CUDA error ") + std::to_string(static_cast<int>(error)) + " (" +
                    cudaGetErrorName(error) + ": " + cudaGetErrorString(error) + ") in " + expression + " at " +
                    file + ":" + std::to_string(line));
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* expression, const char* file,
                                            int line) {
  throw DeviceError(std::string("cuBLAS error ") + std::to_string(static_cast<int>(status)) + " (" +
                    cublasGetStatusName(status) + ": " + cublasGetStatusString(status) + ") in " + expression +
                    " at " + file + ":" + std::to_string(line));
}

}  // namespace llm::cuda::detail

// Evaluates `expr` (a cudaError_t) once; throws llm::DeviceError unless cudaSuccess.
#define LLM_CUDA_CHECK(expr)                                                             \
  do {                                                                                   \
    const cudaError_t llm_cuda_error_ = (expr);                                          \
    if (llm_cuda_error_ != cudaSuccess)                                                  \
      ::llm::cuda::detail::throw_cuda_error(llm_cuda_error_, #expr, __FILE__, __LINE__); \
  } while (0)

// Evaluates `expr` (a cublasStatus_t) once; throws llm::DeviceError unless success.
#define LLM_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                         \
    const cublasStatus_t llm_cublas_status_ = (expr);                                          \
    if (llm_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                           \
      ::llm::cuda::detail::throw_cublas_error(llm_cublas_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// Right after a kernel launch: reports (and clears) a launch error.
#define LLM_CUDA_CHECK_LAUNCH() LLM_CUDA_CHECK(cudaGetLastError())
