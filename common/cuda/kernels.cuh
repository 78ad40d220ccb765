#pragma once
// The fp32 baseline kernels of the transformer on the GPU: one host function
// per operation, each launching one kernel on `stream` and checking the launch
// (kernels.cu). They compute the formulas of common/src/cpu/ops.cpp and
// attention.cpp in float (sums may run in another order, so results agree to
// fp32 rounding, not bit for bit), written to be obviously right rather than
// fast: this is the "before" the later steps improve on. cuBLAS does the matrix products
// (cuda_linear.hpp).
//
// Every pointer is device memory unless it says otherwise, and no output
// overlaps an input (the kernels declare their pointers __restrict__); "in
// place" means the one buffer named so. Matrices are row-major, one token per
// row, as on the CPU. Host-only declarations: a .cpp may include this file.
#include <cuda_runtime.h>

#include <cstddef>

#include "llm/attention.hpp"
#include "llm/kv_cache.hpp"

namespace llm::cuda::kernels {

// The attention kernels keep one query head in shared memory; 256 covers every
// Llama-family model (64 or 128 in practice).
inline constexpr int kMaxHeadDim = 256;

// out[r, :] = table[ids[r], :]. The token-embedding lookup, and the selection
// of the rows that get logits.
// table [*, width], ids [n_rows] (device ints), out [n_rows, width]
void gather_rows(float* out, const float* table, const int* ids, int n_rows, int width, cudaStream_t stream);

// RMSNorm of every row: out[r, i] = weight[i] * (x[r, i] / sqrt(mean(x[r, :]^2) + eps)).
// x, out [rows, dim], weight [dim]
void rmsnorm(float* out, const float* x, const float* weight, int rows, int dim, float eps, cudaStream_t stream);

// RoPE in place on every head of every row, llama2.c's convention: adjacent
// pairs (x[2i], x[2i+1]) rotated by the angle of (positions[r], i), read from
// tables computed on the host (cpu::RopeTable, so both devices use the same
// angles to the last bit).
// vec [rows, n_heads, head_dim], positions [rows],
// cos_table, sin_table [max_positions, head_dim/2]
void rope(float* vec, int rows, int n_heads, int head_dim, const int* positions, const float* cos_table,
          const float* sin_table, cudaStream_t stream);

// gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); n values.
void swiglu(float* gate, const float* up, std::size_t n, cudaStream_t stream);

// x[i] += delta[i]; n values (the residual connection).
void add_inplace(float* x, const float* delta, std::size_t n, cudaStream_t stream);

// Appends each row's K and V to the cache in the views' element type:
// views[r] at positions[r] gets k[r], v[r] (Float32: copied; Int8: quantized
// per KV head by store_int8_head, the host's code).
// k, v [rows, kv_dim], views [rows] (device copies; their pointers are device
// memory), positions [rows]; element: the element type of every view.
void write_kv_rows(const float* k, const float* v, const KvView* views, const int* positions, int rows, int kv_dim,
                   int head_dim, KvElement element, cudaStream_t stream);

// --- Fusions: one launch where the unfused forward has two or three, each
// switched on by CudaFusions (cuda_model.hpp). At decode a launch costs more
// than the bytes these kernels move, so fewer launches is the whole gain.

// x += delta, then out = RMSNorm(x) * weight, row by row, in one launch: the
// residual connection of one sub-block and the norm that opens the next.
// Bit-identical to add_inplace followed by rmsnorm (the same operations in
// the same order, only without the round trip of x through a second kernel).
// x [rows, dim] (updated in place), delta [rows, dim], weight [dim], out [rows, dim]
void add_rmsnorm(float* x, const float* delta, const float* weight, float* out, int rows, int dim, float eps,
                 cudaStream_t stream);

// RoPE on the query and key heads of every row and the K/V append, in one
// launch (fp32 caches): q_out[r] = rope(q_in[r]); the cache row positions[r]
// of views[r] gets rope(k_in[r]) and v_in[r]. The inputs may be three
// buffers or three column ranges of the fused QKV product (`*_stride`:
// floats from one row to the next). Int8 caches: rotated K and plain V go to
// k_out / v_out [rows, kv_dim] instead, and write_kv_rows quantizes them
// (an int8 head's scale needs the whole head first). q_out may equal q_in
// (in place, stride n_heads * head_dim).
// q_in [rows, q_stride], k_in [rows, k_stride], v_in [rows, v_stride],
// q_out [rows, n_heads * head_dim], views [rows], positions [rows],
// cos_table, sin_table [max_positions, head_dim/2]
struct QkvRows {
  const float* q;
  const float* k;
  const float* v;
  int q_stride, k_stride, v_stride;
};
void rope_and_write_kv(const QkvRows& in, float* q_out, float* k_out, float* v_out, const KvView* views,
                       const int* positions, int rows, int n_heads, int n_kv_heads, int head_dim,
                       const float* cos_table, const float* sin_table, KvElement element, cudaStream_t stream);

// gate[r, j] = silu(gate_up[r, j]) * gate_up[r, hidden + j]: SwiGLU reading
// the fused gate/up product, whose row is [w1 x | w3 x].
// gate_up [rows, 2 * hidden], gate [rows, hidden]
void swiglu_from_fused(float* gate, const float* gate_up, int rows, int hidden, cudaStream_t stream);

// Naive attention, prefill: n_new queries of one sequence at positions
// n_past..n_past+n_new-1; query i sees keys 0..n_past+i (causal, bottom-right).
// One thread block per (query, head): scores of all visible keys go to the
// global `scores` workspace, then softmax, then the weighted sum of V.
// q, out  [n_new, n_heads, head_dim]
// kv      a view whose pointers are device memory (passed by value)
// scores  workspace of prefill_scores_floats(shape, n_past, n_new) floats
void prefill_attention(const AttentionShape& shape, const float* q, const KvView& kv, int n_past, int n_new,
                       float* out, float* scores, cudaStream_t stream);
std::size_t prefill_scores_floats(const AttentionShape& shape, int n_past, int n_new);

// The decode queries of a batch (a sequence's single row, or each row of a
// short run: CudaModel::kShortRunRows): query i sees
// keys 0..lengths[i]-1 of views[i] and reads and writes row rows[i] of q and
// out (rows == nullptr: row i), so a mixed batch needs no gather/scatter.
struct DecodeQueries {
  // [n_queries] each, device memory.
  const KvView* views = nullptr;
  const int* lengths = nullptr;
  const int* rows = nullptr;
  // The same arrays in host memory (a kernel launched once per query, or
  // sized on the host, reads these).
  const KvView* views_host = nullptr;
  const int* lengths_host = nullptr;
  const int* rows_host = nullptr;
  int n_queries = 0;
  int max_length = 0;  // >= every length
  // Split-KV's merge in the last split block (split_kv_decode_attention.cuh):
  // split_kv_decode_merge_tickets(shape, n_queries) ticket counters in device
  // memory, zero before the first call; every call leaves them zero. Their
  // own buffer, which nothing else writes (a workspace shared with prefill
  // would overwrite them). Null: the merge runs as a kernel of its own.
  // Other decode kernels ignore it.
  unsigned int* merge_tickets = nullptr;
};
// The model's decode attention, split_kv_decode_attention.cuh, takes these.

// Whether launch_kernel (programmatic_launch.cuh) launches these kernels
// with programmatic dependent launch on the current GPU, inside an
// OverlapLaunches(true) scope: an sm_90 or later GPU, and code for it
// compiled for sm_90 or later. For tests, which must know whether they
// compared overlapped launches at all.
bool launches_overlap_here();

// Asks the runtime for the attributes of one of this file's kernels: fails
// (cudaErrorNoKernelImageForDevice, ...) when the binary holds no code this
// GPU can run, so device_status() can say so instead of every launch failing.
cudaError_t probe_kernel_image();

}  // namespace llm::cuda::kernels
