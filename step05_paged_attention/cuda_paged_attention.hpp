#pragma once
// PagedAttention on the GPU (kernels in cuda_paged_attention.cu): decode
// attention of many sequences of different lengths in ONE launch, reading K/V
// through each sequence's block table, and the CUDA model's attention hook
// built on it.
//
// CUDA builds only (it names cudaStream_t): the .cu file and the CUDA-only
// .cpp files include it; plain C++ goes through cuda_paged_runner.hpp. No fmt
// or cuBLAS here, so nvcc can compile every file that includes it.
//
// Every pointer is device memory (the KvViews' pools and block tables too)
// unless it says host; the work is queued on `stream` and every launch is
// checked (llm::DeviceError). Bad input is an llm::InputError: head_dim
// outside 1..256, n_heads not a multiple of n_kv_heads, an int8 view, a view
// whose rows are not n_kv_heads * head_dim wide, a length outside
// 1..max_length, more than 65535 queries.
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda_attention.hpp"  // common/cuda: llm::cuda::CudaAttentionKernels
#include "kernels.cuh"         // common/cuda: llm::cuda::kernels::DecodeQueries
#include "llm/attention.hpp"
#include "llm/kv_cache.hpp"

namespace step05::cuda {

// Decode: query i attends keys 0..lengths[i]-1 of views[i] and reads and
// writes row rows[i] of q and out (rows == nullptr: row i). The device arrays
// of `queries` are what the kernel reads; its host copies (views_host,
// lengths_host) are required too: the launch checks every view and length on
// the host first.
// q, out     [batch rows, n_heads, head_dim]
// workspace  paged_decode_workspace_floats(shape, n_queries, max_length) floats
//            (0 floats, and workspace may be null, when one partition per query suffices)
void paged_decode_attention(const llm::AttentionShape& shape, const float* q,
                            const llm::cuda::kernels::DecodeQueries& queries, float* out, float* workspace,
                            cudaStream_t stream);
std::size_t paged_decode_workspace_floats(const llm::AttentionShape& shape, int n_queries, int max_length);

// The same kernel with the table lookups compiled out: row of position p =
// block_table[0] * block_size + p, the table read once per thread block. For
// contiguous views only (each view's block_size >= its length, else
// llm::InputError): the baseline of the paging-overhead measurement. Same
// workspace as paged_decode_attention.
void contiguous_decode_attention(const llm::AttentionShape& shape, const float* q,
                                 const llm::cuda::kernels::DecodeQueries& queries, float* out, float* workspace,
                                 cudaStream_t stream);

// Prefill: n_new queries of one sequence at positions n_past..n_past+n_new-1;
// query i sees keys 0..n_past+i (causal, bottom-right aligned). Runs the
// decode kernel with query i as a decode query of length n_past + i + 1.
// q, out     [n_new, n_heads, head_dim]
// kv         a view whose pointers are device memory (passed by value)
// workspace  paged_prefill_workspace_floats(shape, n_past, n_new) floats (may be 0)
void paged_prefill_attention(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past,
                             int n_new, float* out, float* workspace, cudaStream_t stream);
std::size_t paged_prefill_workspace_floats(const llm::AttentionShape& shape, int n_past, int n_new);

// The CUDA model's attention hook with the four functions above (decode,
// prefill and their workspace sizes).
llm::cuda::CudaAttentionKernels paged_cuda_attention();

// How the decode kernel splits the keys (for tables and tests): `partitions`
// thread blocks per (query, KV head), each over `partition_keys` consecutive
// positions (a multiple of 64). Depends on the shape, the number of queries,
// the longest length and the GPU's SM count only.
struct PartitionPlan {
  int partitions = 1;
  int partition_keys = 0;
};
PartitionPlan paged_decode_partitions(const llm::AttentionShape& shape, int n_queries, int max_length);

}  // namespace step05::cuda
