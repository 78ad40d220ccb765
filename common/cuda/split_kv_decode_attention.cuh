#pragma once
// The CUDA model's decode attention: split-KV (Flash-Decoding), GQA-aware,
// one block-table lookup per cache block, for fp32 and int8 caches
// (split_kv_decode_attention.cu explains how the three ideas combine).
//
// It replaced a naive decode kernel behind the same hook
// (CudaAttentionKernels::DecodeFn / DecodeWorkspaceFn, cuda_attention.hpp):
// the same DecodeQueries, the same q and out rows, the same result to fp32
// rounding, but no [queries, heads, length] score matrix in global memory,
// every K/V row read once per KV head (not once per query head), and the keys
// of a long sequence spread over many thread blocks.
//
// CUDA graphs. The launches (grids, blocks, every argument) depend only on
// the shape, n_queries, split_kv_decode_split(max_length) and the device
// pointers; the kernels read each query's view, length and row from the
// device arrays of DecodeQueries. So a decode forward captured into a graph
// can be replayed while the lengths grow, as long as max_length stays in the
// same split bucket (a power of two, below), and an eager call computes
// bit for bit what a replay of the same inputs computes. The host copies in
// DecodeQueries are only checked (when present), never launched with.
//
// Host-only declarations: a .cpp may include this file.
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels.cuh"
#include "llm/attention.hpp"

namespace llm::cuda::kernels {

// Decode attention of a batch's single-row queries: query i attends to keys
// 0..lengths[i]-1 of views[i] (fp32 or int8 elements, contiguous or paged)
// and reads and writes row rows[i] (rows == nullptr: row i).
// q, out     [batch rows, n_heads, head_dim] device memory, not overlapping
// workspace  split_kv_decode_workspace_floats(shape, n_queries, max_length)
//            floats of device memory (may be null when that is 0)
// With several splits, the last split block of each (query, KV head, head
// chunk) to finish merges the splits' partial results when
// queries.merge_tickets is given (one launch), else a second kernel does
// (the before row); the same bits either way.
// Throws InputError for a shape it cannot take (head_dim outside
// 1..kMaxHeadDim, n_heads not a multiple of n_kv_heads, more than 65535
// queries or (KV head, head chunk) pairs) and for host copies of the
// queries that contradict the shape (a length outside 1..max_length, a view
// whose rows are not n_kv_heads * head_dim wide). n_queries == 0: nothing.
void split_kv_decode_attention(const AttentionShape& shape, const float* q, const DecodeQueries& queries,
                               float* out, float* workspace, cudaStream_t stream);

// Ticket counters (DecodeQueries::merge_tickets) a call with this shape and
// n_queries uses: one per (query, KV head, chunk of up to 8 of its query
// heads), at most n_queries * n_heads.
std::size_t split_kv_decode_merge_tickets(const AttentionShape& shape, int n_queries);

// Floats of workspace a call with this shape, n_queries and max_length needs:
// the partial results of every split (0 when there is one split: the kernel
// then writes out directly). Constant within a split bucket.
std::size_t split_kv_decode_workspace_floats(const AttentionShape& shape, int n_queries, int max_length);

// How the keys are split for a batch whose longest query sees max_length
// keys: `splits` thread blocks per (query, KV head, head chunk), each over
// `keys_per_split` consecutive keys, splits * keys_per_split >= max_length.
// Piecewise constant: max_length is rounded up to a power of two (at least
// 64) first, so every max_length of one bucket gets the same split.
struct DecodeSplit {
  int splits;
  int keys_per_split;
};
DecodeSplit split_kv_decode_split(int max_length);

}  // namespace llm::cuda::kernels
