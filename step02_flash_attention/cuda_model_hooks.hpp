#pragma once
// Step 02's FlashAttention as the CUDA model's attention hook: functions with
// exactly the signatures of llm::cuda::CudaAttentionKernels (common/cuda/
// cuda_attention.hpp), so a CudaModel runs its prefill through the FA1 kernel
// of variant 3. The GPU twin of step02::cpu::flash_prefill (cpu_attention.hpp).
//
// CUDA builds only: the signatures use cudaStream_t. Plain C++ code reaches
// the model through cuda_runner.hpp (make_cuda_model), which exists in every
// build. Kept free of the model's headers (cuBLAS, fmt) so .cu files can
// include it too.
#include <cuda_runtime.h>

#include <cstddef>

#include "llm/attention.hpp"
#include "llm/kv_cache.hpp"

namespace step02::cuda {

// Prefill attention of n_new queries at positions n_past..n_past+n_new-1 of
// one sequence; query i sees keys 0..n_past+i (causal, bottom-right).
// Query head h reads K/V head h / (n_heads / n_kv_heads) (GQA).
// q, out     [n_new, n_heads, head_dim] (device memory)
// kv         the sequence's cache view, positions 0..n_past+n_new-1 written;
//            its pool and block table are device memory
// workspace  unused (flash1_prefill_workspace_floats asks for none)
// Queued on `stream`, launch checked. Throws llm::InputError for a head_dim
// the FA1 kernel is not compiled for (flash1_unsupported lists them) and
// llm::DeviceError when the launch fails.
void flash1_prefill(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past, int n_new,
                    float* out, float* workspace, cudaStream_t stream);

// Floats of workspace flash1_prefill needs: 0. No score matrix is ever
// stored, which is the point of FlashAttention.
std::size_t flash1_prefill_workspace_floats(const llm::AttentionShape& shape, int n_past, int n_new);

}  // namespace step02::cuda
