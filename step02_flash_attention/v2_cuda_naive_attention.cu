// Variant 2: naive attention on the GPU, the way one would first write it.
// Three kernels, each obviously right, with the whole score matrix of every
// head in global memory (HBM) between them:
//   1. scores:  S[h, i, j] = q_i . k_j / sqrt(d)   (-inf where masked)
//   2. softmax: each row of S becomes P in place
//   3. P V:     out[i, h, :] = sum_j P[h, i, j] v_j
// S is written once and read twice (plus the softmax's own passes): for
// 8 heads at 16k tokens that is 8 GiB of traffic per pass through HBM, the
// bottleneck FlashAttention removes.
#include "step02_flash_attention/cuda_attention.hpp"
#include "step02_flash_attention/cuda_common.cuh"

namespace step02::cuda {
namespace {

using detail::ceil_div;

constexpr int kScoreThreads = 128;    // keys per block of the scores kernel (one thread per key)
constexpr int kSoftmaxThreads = 256;  // threads sharing one row of S

// One thread per (query i, key j, head h): a dot product over d.
__global__ void scores_kernel(const float* __restrict__ q, llm::KvView kv, float* __restrict__ scores, int seqlen_q,
                              int seqlen_k, int n_heads, int group, int head_dim, float scale, bool causal) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;  // key
  const int i = blockIdx.y;                             // query
  const int h = blockIdx.z;                             // head
  if (j >= seqlen_k) return;
  float* row = scores + (static_cast<size_t>(h) * seqlen_q + i) * seqlen_k;  // S[h, i, :]
  if (j > detail::last_visible_key(i, seqlen_q, seqlen_k, causal)) {
    row[j] = -INFINITY;  // masked: exp(-inf) = 0 in the softmax
    return;
  }
  const float* q_row = q + (static_cast<size_t>(i) * n_heads + h) * head_dim;  // [d]
  const float* k_row = kv.key_row(j) + (h / group) * head_dim;                // [d]
  float dot = 0.0f;
  for (int c = 0; c < head_dim; ++c) dot += q_row[c] * k_row[c];
  row[j] = dot * scale;
}

// Reduces `value` over the block (max or sum); every thread gets the result.
// `shared` holds one float per warp. The barrier at the end keeps a fast warp
// from overwriting `shared` (in the next reduction) before every warp has
// read this one's result.
template <bool kMax>
__device__ float block_reduce(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = kMax ? fmaxf(value, other) : value + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();  // every warp's partial is in shared memory
  value = shared[0];
  for (int w = 1; w < n_warps; ++w) value = kMax ? fmaxf(value, shared[w]) : value + shared[w];
  __syncthreads();  // everyone has read shared[] before it is reused
  return value;
}

// One block per row of S (grid: queries x heads). Max, then exp and sum,
// then normalize, each pass over the row in global memory.
__global__ void softmax_rows_kernel(float* __restrict__ scores, int seqlen_q, int seqlen_k) {
  __shared__ float partial[kSoftmaxThreads / 32];
  float* row = scores + (static_cast<size_t>(blockIdx.y) * seqlen_q + blockIdx.x) * seqlen_k;
  float row_max = -INFINITY;
  for (int j = threadIdx.x; j < seqlen_k; j += blockDim.x) row_max = fmaxf(row_max, row[j]);
  row_max = block_reduce<true>(row_max, partial);
  if (row_max == -INFINITY) {  // the query sees no key: P row = 0, so its output is 0
    for (int j = threadIdx.x; j < seqlen_k; j += blockDim.x) row[j] = 0.0f;
    return;
  }
  float sum = 0.0f;
  for (int j = threadIdx.x; j < seqlen_k; j += blockDim.x) {
    const float e = expf(row[j] - row_max);  // max subtracted: never overflows
    row[j] = e;
    sum += e;
  }
  sum = block_reduce<false>(sum, partial);
  const float inv_sum = 1.0f / sum;
  for (int j = threadIdx.x; j < seqlen_k; j += blockDim.x) row[j] *= inv_sum;
}

// One block per (query, head), one thread per output dimension c; each
// thread walks the whole row of P (masked entries are 0).
__global__ void pv_kernel(const float* __restrict__ probs, llm::KvView kv, float* __restrict__ out, int seqlen_q,
                          int seqlen_k, int n_heads, int group, int head_dim) {
  const int i = blockIdx.x, h = blockIdx.y, c = threadIdx.x;
  if (c >= head_dim) return;
  const float* p_row = probs + (static_cast<size_t>(h) * seqlen_q + i) * seqlen_k;  // P[h, i, :]
  const int kv_offset = (h / group) * head_dim + c;
  float acc = 0.0f;
  for (int j = 0; j < seqlen_k; ++j) acc += p_row[j] * kv.value_row(j)[kv_offset];
  out[(static_cast<size_t>(i) * n_heads + h) * head_dim + c] = acc;
}

}  // namespace

std::size_t naive_workspace_bytes(const AttentionProblem& p) {
  return static_cast<std::size_t>(p.n_heads) * p.seqlen_q * p.seqlen_k * sizeof(float);
}

void naive_attention(const AttentionProblem& p, const AttentionArgs& args) {
  if (p.seqlen_q > 65535 || p.n_heads > 65535 || p.head_dim > 1024)
    throw llm::InputError("cuda_naive: seqlen_q and heads must be <= 65535 and head_dim <= 1024 (grid limits)");
  auto* scores = static_cast<float*>(args.workspace);  // [n_heads, Sq, Sk]
  const cudaStream_t stream = detail::stream_of(args);
  const dim3 score_grid(ceil_div(p.seqlen_k, kScoreThreads), p.seqlen_q, p.n_heads);
  scores_kernel<<<score_grid, kScoreThreads, 0, stream>>>(args.q, args.kv, scores, p.seqlen_q, p.seqlen_k, p.n_heads,
                                                          p.group(), p.head_dim, softmax_scale(p.head_dim), p.causal);
  LLM_CUDA_CHECK_LAUNCH();
  softmax_rows_kernel<<<dim3(p.seqlen_q, p.n_heads), kSoftmaxThreads, 0, stream>>>(scores, p.seqlen_q, p.seqlen_k);
  LLM_CUDA_CHECK_LAUNCH();
  // Round the block up to whole warps; threads past head_dim return at once.
  const int pv_threads = ceil_div(p.head_dim, 32) * 32;
  pv_kernel<<<dim3(p.seqlen_q, p.n_heads), pv_threads, 0, stream>>>(scores, args.kv, args.out, p.seqlen_q, p.seqlen_k,
                                                                   p.n_heads, p.group(), p.head_dim);
  LLM_CUDA_CHECK_LAUNCH();
}

}  // namespace step02::cuda
