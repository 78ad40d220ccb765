// The fp32 baseline kernels (declared and documented in kernels.cuh).
//
// Two launch shapes cover everything here:
// - element-wise work (embedding gather, RoPE, SwiGLU, residual add, K/V
//   append) runs one thread per element in a grid-stride loop: any size works
//   with a bounded grid, and neighbouring threads touch neighbouring floats so
//   the loads coalesce;
// - row-wise reductions (RMSNorm, attention) run one thread block per row (or
//   per (query, head)), reduced with warp shuffles and a little shared memory.
//
// Every kernel opens with wait_then_let_next_kernel_launch(): none has work
// that could start before the kernel ahead of it on the stream finishes (they
// read activations, positions and the cache), and each may itself be the
// kernel ahead of a product whose weights can (programmatic_launch.cuh).
// launch_kernel() launches them.
#include <algorithm>
#include <cmath>
#include <string>

#include "device_formulas.cuh"
#include "kernels.cuh"
#include "programmatic_launch.cuh"
#include "llm/cuda/cuda_check.hpp"
#include "llm/errors.hpp"
#include "llm/kv_int8.hpp"  // store_int8_head: the host's int8 arithmetic

namespace llm::cuda::kernels {
namespace {

// 256 threads (8 warps) per block for element-wise kernels: a common sweet
// spot that lets an SM hold many blocks; the exact value barely matters for
// memory-bound element-wise work.
constexpr int kElementwiseThreads = 256;
// Grid-stride loops make any grid size correct; 65535 blocks x 256 threads is
// far more parallelism than any GPU has, so capping there costs nothing.
constexpr std::size_t kMaxElementwiseBlocks = 65535;
// RMSNorm: one block of 256 threads per row; each thread sums dim/256
// squares, then the block reduces 256 partial sums. Rows of 64..8192 floats.
// The half GEMV that folds the norm into its launch sums with blocks of the
// same size (device_formulas.cuh), which keeps the two bit-identical.
constexpr int kRmsnormThreads = device::kNormBlockThreads;
// Attention: one block of 128 threads (4 warps) per (query, head). Threads
// split the keys while computing scores (contexts run to thousands of keys)
// and split the head_dim output columns for the weighted sum of V (64..256),
// so 128 keeps both phases mostly busy.
constexpr int kAttentionThreads = 128;
using device::kWarpSize;
// The reductions below assume whole warps (every lane takes part in the
// shuffles).
static_assert(kRmsnormThreads % kWarpSize == 0 && kAttentionThreads % kWarpSize == 0);
static_assert(kRmsnormThreads <= 1024 && kAttentionThreads <= 1024);

int elementwise_blocks(std::size_t n) {
  return static_cast<int>(std::min((n + kElementwiseThreads - 1) / kElementwiseThreads, kMaxElementwiseBlocks));
}

// Block-wide reductions (device_formulas.cuh): every thread of the block gets
// the result; all threads must call them.
using device::block_reduce;
using device::MaxOp;
using device::SumOp;

// ---------------------------------------------------------------------------
// The formulas the element-wise and fused kernels share.

// The pair at `from` rotated into `to` (device::rotated_pair); `to` may be
// `from` (in place).
__device__ __forceinline__ void rotate_pair(const float* from, float* to, float c, float s) {
  const float2 rotated = device::rotated_pair(from[0], from[1], c, s);
  to[0] = rotated.x;
  to[1] = rotated.y;
}

// silu(gate) * up (device_formulas.cuh).
using device::swiglu_value;

// ---------------------------------------------------------------------------
// Element-wise kernels (grid-stride loops over n elements).

__global__ void gather_rows_kernel(float* __restrict__ out, const float* __restrict__ table,
                                   const int* __restrict__ ids, int width, std::size_t n) {
  wait_then_let_next_kernel_launch();
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t row = idx / width, col = idx % width;
    out[idx] = table[static_cast<std::size_t>(ids[row]) * width + col];
  }
}

// One thread per rotation pair: n = rows * n_heads * head_dim/2.
__global__ void rope_kernel(float* __restrict__ vec, int n_heads, int head_dim, const int* __restrict__ positions,
                            const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                            std::size_t n) {
  wait_then_let_next_kernel_launch();
  const int half = head_dim / 2;
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(idx % half);                         // pair within the head
    const std::size_t head = idx / half;                                // row * n_heads + h
    const std::size_t row = head / n_heads;
    const std::size_t table_index = static_cast<std::size_t>(positions[row]) * half + i;
    const float c = cos_table[table_index], s = sin_table[table_index];
    float* pair = vec + head * head_dim + 2 * i;                        // vec[row, h, 2i]
    rotate_pair(pair, pair, c, s);
  }
}

__global__ void swiglu_kernel(float* __restrict__ gate, const float* __restrict__ up, std::size_t n) {
  wait_then_let_next_kernel_launch();
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    gate[idx] = swiglu_value(gate[idx], up[idx]);
  }
}

__global__ void add_inplace_kernel(float* __restrict__ x, const float* __restrict__ delta, std::size_t n) {
  wait_then_let_next_kernel_launch();
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * blockDim.x)
    x[idx] += delta[idx];
}

// Float32 cache: n = rows * kv_dim; element (r, j) goes to column j of row
// positions[r] of views[r].
__global__ void write_kv_rows_kernel(const float* __restrict__ k, const float* __restrict__ v,
                                     const KvView* __restrict__ views, const int* __restrict__ positions,
                                     int kv_dim, std::size_t n) {
  wait_then_let_next_kernel_launch();
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t row = idx / kv_dim, col = idx % kv_dim;
    const KvView& view = views[row];
    const int pos = positions[row];
    view.key_row(pos)[col] = k[idx];
    view.value_row(pos)[col] = v[idx];
  }
}

// Int8 cache: n = rows * n_kv_heads; thread (r, head) quantizes one head of
// row r (its absmax needs the whole head: one thread walks it; writes are a
// few KiB per token, nothing to optimize).
__global__ void write_kv_rows_int8_kernel(const float* __restrict__ k, const float* __restrict__ v,
                                          const KvView* __restrict__ views, const int* __restrict__ positions,
                                          int kv_dim, int n_kv_heads, std::size_t n) {
  wait_then_let_next_kernel_launch();
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t row = idx / n_kv_heads;
    const int head = static_cast<int>(idx % n_kv_heads);
    store_int8_head(views[row], positions[row], head, k + row * kv_dim, v + row * kv_dim);
  }
}

// ---------------------------------------------------------------------------
// RMSNorm: block r normalizes row r.

// The second half of RMSNorm, once the block knows the row's sum of squares:
// out[i] = weight[i] * (x[i] / sqrt(mean of squares + eps)), the same
// expression as cpu::rmsnorm (device_formulas.cuh). Each thread writes the
// elements it summed.
__device__ __forceinline__ void write_normalized_row(float* __restrict__ out_row, const float* x_row,
                                                     const float* __restrict__ weight, int dim, float eps,
                                                     float sum_of_squares) {
  const float inv_rms = device::inverse_rms(sum_of_squares, dim, eps);
  for (int i = static_cast<int>(threadIdx.x); i < dim; i += static_cast<int>(blockDim.x))
    out_row[i] = device::normalized(weight[i], inv_rms, x_row[i]);
}

__global__ void rmsnorm_kernel(float* __restrict__ out, const float* __restrict__ x,
                               const float* __restrict__ weight, int dim, float eps) {
  wait_then_let_next_kernel_launch();
  __shared__ float reduce_scratch[kWarpSize];
  const std::size_t row_offset = static_cast<std::size_t>(blockIdx.x) * dim;
  const float* x_row = x + row_offset;
  float* out_row = out + row_offset;

  const float partial = device::thread_sum_of_squares(x_row, dim);
  write_normalized_row(out_row, x_row, weight, dim, eps, block_reduce(partial, SumOp{}, reduce_scratch));
}

// ---------------------------------------------------------------------------
// Attention of one query head against keys 0..n_keys-1, by one thread block,
// in three phases separated by block-wide reductions:
//   1. scores[t] = q . k_t / sqrt(head_dim)   (threads split the keys)
//   2. scores[t] = exp(scores[t] - max)       (max subtracted: exp cannot overflow)
//   3. out[d] = sum_t (scores[t] / sum) v_t[d] (threads split the columns d)
// The scores make a round trip through global memory: simple, any length
// fits, and exactly the N x N traffic FlashAttention (step 02) removes.
//
// q       [head_dim] this query head
// kv      the sequence's cache; K/V head `kv_head` is columns
//         kv_head*head_dim .. +head_dim of each row
// scores  [n_keys] this block's private workspace row
// out     [head_dim]
// q_shared [kMaxHeadDim], reduce_scratch [32]: the kernel's shared memory
template <KvElement kElement>
__device__ void attend_one_head(int head_dim, const float* __restrict__ q, const KvView& kv, int kv_head,
                                int n_keys, float* __restrict__ scores, float* __restrict__ out,
                                float* q_shared, float* reduce_scratch) {
  const int tid = static_cast<int>(threadIdx.x), n_threads = static_cast<int>(blockDim.x);
  // Every thread reads the whole query: load it once into shared memory.
  for (int i = tid; i < head_dim; i += n_threads) q_shared[i] = q[i];
  __syncthreads();

  const std::size_t head_offset = static_cast<std::size_t>(kv_head) * head_dim;
  const float scale = sqrtf(static_cast<float>(head_dim));

  // 1. Scores; each thread keeps the max of the scores it wrote.
  float local_max = -INFINITY;
  for (int t = tid; t < n_keys; t += n_threads) {
    float dot = 0.0f;
    if constexpr (kElement == KvElement::Float32) {
      const float* k = kv.key_row(t) + head_offset;
      for (int i = 0; i < head_dim; ++i) dot += q_shared[i] * k[i];
    } else {
      const std::int8_t* k = kv.key_row_int8(t) + head_offset;
      for (int i = 0; i < head_dim; ++i) dot += q_shared[i] * static_cast<float>(k[i]);
      dot *= kv.key_row_scales(t)[kv_head];  // one scale per (position, KV head)
    }
    const float score = dot / scale;
    scores[t] = score;
    local_max = fmaxf(local_max, score);
  }
  const float max_score = block_reduce(local_max, MaxOp{}, reduce_scratch);

  // 2. Exponentials. Each thread revisits exactly the t it wrote in phase 1,
  // so no barrier is needed between the two loops.
  float local_sum = 0.0f;
  for (int t = tid; t < n_keys; t += n_threads) {
    const float e = expf(scores[t] - max_score);
    scores[t] = e;
    local_sum += e;
  }
  // The reduction's __syncthreads also makes every thread's scores[] writes
  // visible to the whole block, which phase 3 needs.
  const float sum = block_reduce(local_sum, SumOp{}, reduce_scratch);

  // 3. Weighted sum of V: thread d walks all keys for column d. Threads of a
  // warp read neighbouring columns of the same V row, so loads coalesce.
  for (int d = tid; d < head_dim; d += n_threads) {
    float acc = 0.0f;
    for (int t = 0; t < n_keys; ++t) {
      if constexpr (kElement == KvElement::Float32)
        acc += (scores[t] / sum) * kv.value_row(t)[head_offset + d];
      else
        acc += (scores[t] / sum) * static_cast<float>(kv.value_row_int8(t)[head_offset + d]) *
               kv.value_row_scales(t)[kv_head];
    }
    out[d] = acc;
  }
}

// Grid (n_new, n_heads): block (i, h) is query i, head h.
__global__ void prefill_attention_kernel(AttentionShape shape, const float* __restrict__ q, KvView kv, int n_past,
                                         int n_new, float* __restrict__ out, float* __restrict__ scores) {
  wait_then_let_next_kernel_launch();
  __shared__ float q_shared[kMaxHeadDim];
  __shared__ float reduce_scratch[kWarpSize];
  const int i = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int group = shape.n_heads / shape.n_kv_heads;        // query heads per KV head
  const std::size_t q_width = static_cast<std::size_t>(shape.n_heads) * shape.head_dim;
  const std::size_t offset = i * q_width + static_cast<std::size_t>(h) * shape.head_dim;  // [i, h, 0]
  const int stride = n_past + n_new;                          // workspace row length: the most keys any query sees
  float* my_scores = scores + (static_cast<std::size_t>(i) * shape.n_heads + h) * stride;
  // Causal, bottom-right aligned: query i sits at position n_past + i.
  // The element type is the same for every block: a uniform branch.
  if (kv.element == KvElement::Int8)
    attend_one_head<KvElement::Int8>(shape.head_dim, q + offset, kv, h / group, n_past + i + 1, my_scores,
                                     out + offset, q_shared, reduce_scratch);
  else
    attend_one_head<KvElement::Float32>(shape.head_dim, q + offset, kv, h / group, n_past + i + 1, my_scores,
                                        out + offset, q_shared, reduce_scratch);
}

// ---------------------------------------------------------------------------
// Fusions.

// Block r: x[r] += delta[r], then the norm of the new x[r], exactly as
// add_inplace_kernel then rmsnorm_kernel compute it. Each thread adds the
// elements it will square: no barrier is needed between the add and the
// sum of squares; the reduction's barriers order the rest.
__global__ void add_rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ delta,
                                   const float* __restrict__ weight, float* __restrict__ out, int dim, float eps) {
  wait_then_let_next_kernel_launch();
  __shared__ float reduce_scratch[kWarpSize];
  const std::size_t row_offset = static_cast<std::size_t>(blockIdx.x) * dim;
  float* x_row = x + row_offset;
  const float* delta_row = delta + row_offset;
  float* out_row = out + row_offset;

  float partial = 0.0f;
  for (int i = static_cast<int>(threadIdx.x); i < dim; i += static_cast<int>(blockDim.x)) {
    const float sum = x_row[i] + delta_row[i];
    x_row[i] = sum;
    partial += sum * sum;
  }
  write_normalized_row(out_row, x_row, weight, dim, eps, block_reduce(partial, SumOp{}, reduce_scratch));
}

// One thread per rotation pair of every query and KV head of every row:
// n = rows * (n_heads + n_kv_heads) * head_dim/2. Heads 0..n_heads-1 of a row
// are its query heads, the rest its KV heads (K rotated, V copied). q_out,
// k_out and v_out may be their inputs (in place): not __restrict__.
template <bool kWriteCache>
__global__ void rope_and_write_kv_kernel(QkvRows in, float* q_out, float* k_out, float* v_out,
                                         const KvView* __restrict__ views,
                                         const int* __restrict__ positions, int n_heads, int n_kv_heads,
                                         int head_dim, const float* __restrict__ cos_table,
                                         const float* __restrict__ sin_table, std::size_t n) {
  wait_then_let_next_kernel_launch();
  const int half = head_dim / 2;
  const int heads_per_row = n_heads + n_kv_heads;
  const int kv_dim = n_kv_heads * head_dim;
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const int pair = static_cast<int>(idx % half);
    const std::size_t row_head = idx / half;
    const auto row = static_cast<int>(row_head / heads_per_row);
    const int head = static_cast<int>(row_head % heads_per_row);
    const int pos = positions[row];
    const std::size_t table_index = static_cast<std::size_t>(pos) * half + pair;
    const float c = cos_table[table_index], s = sin_table[table_index];
    if (head < n_heads) {  // a query head: rotated into q_out (maybe in place)
      const float* from = in.q + static_cast<std::size_t>(row) * in.q_stride + head * head_dim + 2 * pair;
      rotate_pair(from, q_out + (static_cast<std::size_t>(row) * n_heads + head) * head_dim + 2 * pair, c, s);
    } else {  // a KV head: K rotated, V as is, into the cache row (or k_out / v_out)
      const int column = (head - n_heads) * head_dim + 2 * pair;  // within the kv_dim-wide row
      const float* k_from = in.k + static_cast<std::size_t>(row) * in.k_stride + column;
      const float* v_from = in.v + static_cast<std::size_t>(row) * in.v_stride + column;
      float* k_to;
      float* v_to;
      if constexpr (kWriteCache) {
        const KvView& view = views[row];
        k_to = view.key_row(pos) + column;
        v_to = view.value_row(pos) + column;
      } else {
        k_to = k_out + static_cast<std::size_t>(row) * kv_dim + column;
        v_to = v_out + static_cast<std::size_t>(row) * kv_dim + column;
      }
      rotate_pair(k_from, k_to, c, s);
      v_to[0] = v_from[0];
      v_to[1] = v_from[1];
    }
  }
}

// n = rows * hidden: element (r, j) of the SwiGLU output.
__global__ void swiglu_from_fused_kernel(float* __restrict__ gate, const float* __restrict__ gate_up, int hidden,
                                         std::size_t n) {
  wait_then_let_next_kernel_launch();
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < n;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t row = idx / hidden, j = idx % hidden;
    const float* fused_row = gate_up + row * 2 * hidden;
    gate[idx] = swiglu_value(fused_row[j], fused_row[hidden + j]);
  }
}

void check_attention_shape(const AttentionShape& shape) {
  if (shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim)
    throw InputError("the CUDA attention kernels support head_dim 1.." + std::to_string(kMaxHeadDim) + " (got " +
                     std::to_string(shape.head_dim) + ")");
  if (shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 || shape.n_heads > 65535)
    throw InputError("bad attention heads: " + std::to_string(shape.n_heads) + " query heads, " +
                     std::to_string(shape.n_kv_heads) + " KV heads");
}

}  // namespace

// ---------------------------------------------------------------------------
// Launchers.

void gather_rows(float* out, const float* table, const int* ids, int n_rows, int width, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(n_rows) * width;
  if (n == 0) return;  // a grid of 0 blocks is a launch error
  launch_kernel(gather_rows_kernel, elementwise_blocks(n), kElementwiseThreads, 0, stream, out, table, ids, width,
                n);
}

void rmsnorm(float* out, const float* x, const float* weight, int rows, int dim, float eps, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  launch_kernel(rmsnorm_kernel, rows, kRmsnormThreads, 0, stream, out, x, weight, dim, eps);
}

void rope(float* vec, int rows, int n_heads, int head_dim, const int* positions, const float* cos_table,
          const float* sin_table, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(rows) * n_heads * (head_dim / 2);
  if (n == 0) return;
  launch_kernel(rope_kernel, elementwise_blocks(n), kElementwiseThreads, 0, stream, vec, n_heads, head_dim,
                positions, cos_table, sin_table, n);
}

void swiglu(float* gate, const float* up, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(swiglu_kernel, elementwise_blocks(n), kElementwiseThreads, 0, stream, gate, up, n);
}

void add_inplace(float* x, const float* delta, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(add_inplace_kernel, elementwise_blocks(n), kElementwiseThreads, 0, stream, x, delta, n);
}

void write_kv_rows(const float* k, const float* v, const KvView* views, const int* positions, int rows, int kv_dim,
                   int head_dim, KvElement element, cudaStream_t stream) {
  if (element == KvElement::Int8) {
    const int n_kv_heads = kv_dim / head_dim;
    const std::size_t n = static_cast<std::size_t>(rows) * n_kv_heads;
    if (n == 0) return;
    launch_kernel(write_kv_rows_int8_kernel, elementwise_blocks(n), kElementwiseThreads, 0, stream, k, v, views,
                  positions, kv_dim, n_kv_heads, n);
  } else {
    const std::size_t n = static_cast<std::size_t>(rows) * kv_dim;
    if (n == 0) return;
    launch_kernel(write_kv_rows_kernel, elementwise_blocks(n), kElementwiseThreads, 0, stream, k, v, views, positions,
                  kv_dim, n);
  }
}

void add_rmsnorm(float* x, const float* delta, const float* weight, float* out, int rows, int dim, float eps,
                 cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  launch_kernel(add_rmsnorm_kernel, rows, kRmsnormThreads, 0, stream, x, delta, weight, out, dim, eps);
}

void rope_and_write_kv(const QkvRows& in, float* q_out, float* k_out, float* v_out, const KvView* views,
                       const int* positions, int rows, int n_heads, int n_kv_heads, int head_dim,
                       const float* cos_table, const float* sin_table, KvElement element, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(rows) * (n_heads + n_kv_heads) * (head_dim / 2);
  if (n == 0) return;
  if (element == KvElement::Float32) {
    launch_kernel(rope_and_write_kv_kernel<true>, elementwise_blocks(n), kElementwiseThreads, 0, stream, in, q_out,
                  k_out, v_out, views, positions, n_heads, n_kv_heads, head_dim, cos_table, sin_table, n);
  } else {
    launch_kernel(rope_and_write_kv_kernel<false>, elementwise_blocks(n), kElementwiseThreads, 0, stream, in, q_out,
                  k_out, v_out, views, positions, n_heads, n_kv_heads, head_dim, cos_table, sin_table, n);
    write_kv_rows(k_out, v_out, views, positions, rows, n_kv_heads * head_dim, head_dim, element, stream);
  }
}

void swiglu_from_fused(float* gate, const float* gate_up, int rows, int hidden, cudaStream_t stream) {
  const std::size_t n = static_cast<std::size_t>(rows) * hidden;
  if (n == 0) return;
  launch_kernel(swiglu_from_fused_kernel, elementwise_blocks(n), kElementwiseThreads, 0, stream, gate, gate_up,
                hidden, n);
}

std::size_t prefill_scores_floats(const AttentionShape& shape, int n_past, int n_new) {
  return static_cast<std::size_t>(n_new) * shape.n_heads * static_cast<std::size_t>(n_past + n_new);
}

void prefill_attention(const AttentionShape& shape, const float* q, const KvView& kv, int n_past, int n_new,
                       float* out, float* scores, cudaStream_t stream) {
  check_attention_shape(shape);
  if (n_new <= 0) return;
  const dim3 grid(static_cast<unsigned>(n_new), static_cast<unsigned>(shape.n_heads));
  launch_kernel(prefill_attention_kernel, grid, kAttentionThreads, 0, stream, shape, q, kv, n_past, n_new, out,
                scores);
}

bool launches_overlap_here() {
  const OverlapLaunches scope(true);
  return launch_overlaps(reinterpret_cast<const void*>(add_inplace_kernel));
}

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, add_inplace_kernel);
}

}  // namespace llm::cuda::kernels
