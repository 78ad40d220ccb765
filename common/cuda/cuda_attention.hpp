#pragma once
// The attention hook on the GPU, the twin of cpu::AttentionKernels
// (llm/attention.hpp): plain functions, one per phase, chosen by whoever
// builds the CudaModel. A step that writes a better kernel (FlashAttention in
// step 02, paged attention in step 05) plugs it in here without touching the
// layer code. Each phase also says how much workspace it needs, so the naive
// kernels can keep their O(N^2) scores and a tiled kernel can ask for none.
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels.cuh"
#include "split_kv_decode_attention.cuh"
#include "llm/attention.hpp"
#include "llm/kv_cache.hpp"

namespace llm::cuda {

struct CudaAttentionKernels {
  // Prefill: n_new queries of one sequence at positions n_past.., causal
  // bottom-right. q, out [n_new, n_heads, head_dim]; kv's pointers are device
  // memory. See kernels::prefill_attention.
  using PrefillFn = void (*)(const AttentionShape& shape, const float* q, const KvView& kv, int n_past, int n_new,
                             float* out, float* workspace, cudaStream_t stream);
  using PrefillWorkspaceFn = std::size_t (*)(const AttentionShape& shape, int n_past, int n_new);  // floats
  // Decode: the batch's single-row queries (kernels::DecodeQueries: device
  // arrays for a kernel that takes them all at once, host copies for one that
  // is launched per query, as step 02's split-KV and step 03's group-aware
  // kernels are). See split_kv_decode_attention.cuh.
  using DecodeFn = void (*)(const AttentionShape& shape, const float* q, const kernels::DecodeQueries& queries,
                            float* out, float* workspace, cudaStream_t stream);
  using DecodeWorkspaceFn = std::size_t (*)(const AttentionShape& shape, int n_queries, int max_length);  // floats

  // Prefill: the naive kernel (step 02 plugs in FlashAttention). Decode: the
  // split-KV, group-aware kernel (split_kv_decode_attention.cuh), which
  // combines the decode lessons of steps 02, 03 and 05 (it replaced a naive
  // decode kernel whose time per token grew with the context).
  PrefillFn prefill = kernels::prefill_attention;
  PrefillWorkspaceFn prefill_workspace = kernels::prefill_scores_floats;
  DecodeFn decode = kernels::split_kv_decode_attention;
  DecodeWorkspaceFn decode_workspace = kernels::split_kv_decode_workspace_floats;

  // Whether these kernels read a cache of `element`: the common kernels read
  // every element type (int8 rows times their per-head scales); any other
  // kernel is taken to read fp32 rows, so the model refuses to pair it with an
  // int8 cache.
  bool reads(KvElement element) const {
    return element == KvElement::Float32 ||
           (prefill == kernels::prefill_attention && decode == kernels::split_kv_decode_attention);
  }

  // CUDA graphs (cuda_model.hpp) replay a decode forward's launches with the
  // arguments they were captured with. That is only right for a decode kernel
  // whose launches are the same for every max_length of a bucket, reading
  // lengths, views and rows from device memory. Returns that bucket for
  // max_length, or -1 where the kernel gives no such promise (a step's
  // kernel, launched per query from the host copies or sized by max_length
  // itself): those forwards run without a graph.
  int graph_bucket(int max_length) const {
    if (decode != kernels::split_kv_decode_attention) return -1;
    const kernels::DecodeSplit split = kernels::split_kv_decode_split(max_length);
    return split.splits * (1 << 20) + split.keys_per_split;  // both halves of the launch, in one int
  }
};

}  // namespace llm::cuda
