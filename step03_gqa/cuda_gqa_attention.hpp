#pragma once
// The two decode-attention variants on the GPU (kernels in
// cuda_gqa_attention.cu), and CudaDecodeProblem, which uploads one sequence's
// K/V and query once so the variants can be run and timed on it.
//
// No CUDA types here: ordinary .cpp code of any build includes this header.
// Without CUDA (cuda_gqa_attention_unavailable.cpp) every entry point throws
// llm::DeviceError("built without CUDA").
#include <memory>
#include <span>
#include <vector>

#include "llm/harness/timer.hpp"
#include "step03_gqa/gqa_attention.hpp"

namespace step03 {

// Device scratch the kernels need, sized for `capacity` positions. Every
// pointer is device memory.
struct CudaDecodeWorkspace {
  float* scores = nullptr;           // [n_heads, capacity] scores, then probabilities
  float* expanded_keys = nullptr;    // [capacity, n_heads, head_dim] repeat_kv's copy of K
  float* expanded_values = nullptr;  // [capacity, n_heads, head_dim] repeat_kv's copy of V
  const int* single_block_table = nullptr;  // [1] = {0}: the block table of the expanded copy
  int capacity = 0;
};

// Limits of the kernels (checked on the host; InputError beyond them).
inline constexpr int kCudaMaxHeadDim = 256;  // one K row lives in a warp's registers: 8 floats per lane
inline constexpr int kCudaMaxGroup = 32;     // query heads per KV head held in shared memory and registers

// One sequence, one query. q, out [n_heads, head_dim] device memory; kv's
// pointers (and block table) device memory; `length` positions valid.
void repeat_kv_decode_attention_cuda(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv,
                                     int length, float* out, const CudaDecodeWorkspace& workspace);
void group_aware_decode_attention_cuda(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv,
                                       int length, float* out, const CudaDecodeWorkspace& workspace);

// One decode-attention problem resident on the GPU: K/V rows 0..capacity-1 of
// a host view, copied into one contiguous device block, and a query.
class CudaDecodeProblem {
 public:
  // host_kv: a view whose pointers are host memory, rows 0..capacity-1 valid.
  // q: [n_heads, head_dim] host memory. Throws DeviceError without a usable GPU.
  CudaDecodeProblem(const llm::AttentionShape& shape, const llm::KvView& host_kv, int capacity,
                    std::span<const float> q);
  ~CudaDecodeProblem();
  CudaDecodeProblem(const CudaDecodeProblem&) = delete;
  CudaDecodeProblem& operator=(const CudaDecodeProblem&) = delete;

  // Runs `fn` once over positions 0..length-1; returns out [n_heads, head_dim].
  std::vector<float> run(CudaDecodeAttentionFn fn, int length);
  // Times `fn` with CUDA events (L2 flushed before each run, llm::cuda::time_cuda).
  llm::TimingStats time(CudaDecodeAttentionFn fn, int length, int warmup, int runs);

 private:
  struct DeviceState;  // the DeviceBuffers (CUDA types) live in the .cu file
  std::unique_ptr<DeviceState> state_;
};

}  // namespace step03
