#pragma once
// Small helpers shared by step 02's .cu files (CUDA translation units only).
// No fmt here: nvcc cannot evaluate fmt's consteval format-string checks
// (C++20), so the messages below are built with std::string.
#include <cuda_runtime.h>
#include <cmath>
#include <string>

#include "llm/cuda/cuda_check.hpp"
#include "llm/errors.hpp"
#include "step02_flash_attention/attention_problem.hpp"
#include "step02_flash_attention/kernel_image.hpp"

namespace step02::cuda::detail {

inline cudaStream_t stream_of(const AttentionArgs& args) { return static_cast<cudaStream_t>(args.stream); }

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// log2(e): kernels that use exp2f fold it into the softmax scale, so
// exp(x * scale) becomes exp2(x * scale * log2e): one MUFU.EX2 instruction
// instead of a multiply plus one (FlashAttention-2 does the same).
constexpr float kLog2e = 1.4426950408889634f;

// Last key query `row` may see (-1: none); the same rule as
// AttentionProblem::last_visible_key, usable in kernels.
__device__ __forceinline__ int last_visible_key(int row, int seqlen_q, int seqlen_k, bool causal) {
  return causal ? min(seqlen_k - 1, seqlen_k - seqlen_q + row) : seqlen_k - 1;
}

// Dynamic shared memory above 48 KiB must be requested per kernel (an opt-in
// that exists since Volta). Checks the device's limit first so a too-large
// tile fails with a sentence instead of a launch error.
template <class Kernel>
void allow_dynamic_shared_memory(Kernel kernel, int bytes, const char* kernel_name) {
  int device = 0, max_optin = 0;
  LLM_CUDA_CHECK(cudaGetDevice(&device));
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > max_optin)
    throw llm::DeviceError(std::string(kernel_name) + " needs " + std::to_string(bytes) +
                           " bytes of shared memory per block; this GPU allows " + std::to_string(max_optin));
  if (bytes > 48 * 1024)
    LLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// What `kernel` (a __global__ function) was compiled for, as this GPU would
// run it ({0, 0}: the build holds no image this GPU can run).
template <class Kernel>
KernelImage kernel_image_of(Kernel kernel) {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // clear the error: the caller reports it in words
    return {};
  }
  return {attributes.ptxVersion, attributes.binaryVersion};
}

}  // namespace step02::cuda::detail
