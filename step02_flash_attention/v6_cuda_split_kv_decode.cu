// Variant 6: split-KV decode (Flash-Decoding), fp32.
//
// In decode each sequence has ONE query per head. A prefill-style kernel
// gives each (query block, head) one thread block, so a 32-head model gets 32
// blocks: a quarter of an H100's 132 SMs, each walking the whole cache alone.
// Flash-Decoding splits the keys too:
//   kernel 1, grid (splits, heads, queries): block s runs the online softmax
//     over keys [s * chunk, (s + 1) * chunk) and writes a PARTIAL result
//     (m_s, l_s, o_s = unnormalized sum) to the workspace;
//   kernel 2, grid (heads, queries): merges the partials exactly like the
//     online softmax merges tiles:
//       M = max_s m_s,  l = sum_s 2^(m_s - M) l_s,  out = sum_s 2^(m_s - M) o_s / l
// Decode is memory bound (every K and V byte is used once), so the point is
// to have enough blocks in flight to pull HBM bandwidth, not tensor cores.
//
// Inside kernel 1 each of the 4 warps takes every 4th key of the split. A
// warp computes q . k with its 32 lanes each holding d/32 consecutive dims
// (one coalesced row read per key) and a butterfly sum; it then updates its
// own running (m, l, o) and at the end the 4 warps merge through shared memory.
// K/V are read through the KvView, so a paged cache (step 05) works as is.
#include <algorithm>

#include "llm/cuda/cuda_runtime_api.hpp"

#include "exercise.cuh"
#include "step02_flash_attention/cuda_attention.hpp"
#include "step02_flash_attention/cuda_common.cuh"

namespace step02::cuda {
namespace {

using detail::ceil_div;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMinKeysPerSplit = 128;  // below this a split's fixed cost (launch, merge) outweighs its work
constexpr int kMaxSplits = 128;

// Layout of the workspace: partial outputs then partial (m, l).
//   o_part  [queries, heads, splits, d]
//   ml_part [queries, heads, splits, 2]
struct Partials {
  float* o;
  float* ml;
};
Partials partials(void* workspace, const AttentionProblem& p, int splits) {
  auto* base = static_cast<float*>(workspace);
  return {base, base + static_cast<std::size_t>(p.seqlen_q) * p.n_heads * splits * p.head_dim};
}


template <int kHeadDim>
__global__ void __launch_bounds__(kThreads)
    split_kv_partial_kernel(const float* __restrict__ q, llm::KvView kv, Partials part, int seqlen_q, int seqlen_k,
                            int n_heads, int group, int keys_per_split, float scale_log2, bool causal) {
  constexpr int kDimsPerLane = kHeadDim / 32;  // 2 (d = 64) or 4 (d = 128)
  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_o[kWarps][kHeadDim];

  const int split = blockIdx.x, h = blockIdx.y, i = blockIdx.z, splits = gridDim.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kv_offset = (h / group) * kHeadDim + lane * kDimsPerLane;  // this lane's dims in a K/V row
  const int n_keys = detail::last_visible_key(i, seqlen_q, seqlen_k, causal) + 1;
  const int begin = split * keys_per_split;
  const int end = min(begin + keys_per_split, n_keys);  // may be <= begin: an empty split

  float q_part[kDimsPerLane];  // this lane's dims of the query, pre-scaled into the log2 domain
  const float* q_row = q + (static_cast<size_t>(i) * n_heads + h) * kHeadDim + lane * kDimsPerLane;
#pragma unroll
  for (int x = 0; x < kDimsPerLane; ++x) q_part[x] = q_row[x] * scale_log2;

  float m = -INFINITY, l = 0.0f, o[kDimsPerLane];
#pragma unroll
  for (int x = 0; x < kDimsPerLane; ++x) o[x] = 0.0f;
  for (int j = begin + warp; j < end; j += kWarps) {
    const float* k_row = kv.key_row(j) + kv_offset;
    float s = 0.0f;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) s += q_part[x] * k_row[x];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);  // all lanes: q.k
    const float m_new = fmaxf(m, s);
    const float rescale = exp2f(m - m_new);  // 0 for the warp's first key
    const float p = exp2f(s - m_new);
    const float* v_row = kv.value_row(j) + kv_offset;
    l = rescale * l + p;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) o[x] = rescale * o[x] + p * v_row[x];
    m = m_new;
  }

  // Merge the 4 warps' (m, l, o) into the split's partial.
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int x = 0; x < kDimsPerLane; ++x) warp_o[warp][lane * kDimsPerLane + x] = o[x];
  __syncthreads();  // all four warps' results are in shared memory
  const size_t slot = (static_cast<size_t>(i) * n_heads + h) * splits + split;
  float block_m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) block_m = fmaxf(block_m, warp_m[w]);
  // A warp (or the whole split) that saw no key has m = -inf and weight 0;
  // if nobody saw a key the partial is (m = -inf, l = 0, o = 0).
  const float base = block_m == -INFINITY ? 0.0f : block_m;
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    float acc = 0.0f;
    for (int w = 0; w < kWarps; ++w) acc += exp2f(warp_m[w] - base) * warp_o[w][c];
    part.o[slot * kHeadDim + c] = acc;
  }
  if (threadIdx.x == 0) {
    float block_l = 0.0f;
    for (int w = 0; w < kWarps; ++w) block_l += exp2f(warp_m[w] - base) * warp_l[w];
    part.ml[slot * 2 + 0] = block_m;
    part.ml[slot * 2 + 1] = block_l;
  }
}

// One block per (head, query), one thread per output dim.
__global__ void split_kv_reduce_kernel(Partials part, float* __restrict__ out, int n_heads, int head_dim, int splits) {
  const int h = blockIdx.x, i = blockIdx.y, c = threadIdx.x;
  if (c >= head_dim) return;
  // BEGIN EXERCISE ex02.3
  // STUB: LLM_CUDA_EXERCISE_TODO("ex02.3");
  // STUB: out[(static_cast<size_t>(i) * n_heads + h) * head_dim + c] = llm::cuda::device::exercise_nan();
  const size_t first = (static_cast<size_t>(i) * n_heads + h) * splits;
  float global_m = -INFINITY;
  for (int s = 0; s < splits; ++s) global_m = fmaxf(global_m, part.ml[(first + s) * 2]);
  float l = 0.0f, acc = 0.0f;
  if (global_m != -INFINITY) {
    for (int s = 0; s < splits; ++s) {
      const float weight = exp2f(part.ml[(first + s) * 2] - global_m);  // 0 for an empty split
      l += weight * part.ml[(first + s) * 2 + 1];
      acc += weight * part.o[(first + s) * head_dim + c];
    }
  }
  out[(static_cast<size_t>(i) * n_heads + h) * head_dim + c] = l > 0.0f ? acc / l : 0.0f;
  // END EXERCISE ex02.3
}

template <int kHeadDim>
void launch(const AttentionProblem& p, const AttentionArgs& args) {
  const int splits = split_kv_splits(p);
  const int keys_per_split = ceil_div(p.seqlen_k, splits);
  const Partials part = partials(args.workspace, p, splits);
  const cudaStream_t stream = detail::stream_of(args);
  split_kv_partial_kernel<kHeadDim><<<dim3(splits, p.n_heads, p.seqlen_q), kThreads, 0, stream>>>(
      args.q, args.kv, part, p.seqlen_q, p.seqlen_k, p.n_heads, p.group(), keys_per_split,
      softmax_scale(p.head_dim) * detail::kLog2e, p.causal);
  LLM_CUDA_CHECK_LAUNCH();
  split_kv_reduce_kernel<<<dim3(p.n_heads, p.seqlen_q), kHeadDim, 0, stream>>>(part, args.out, p.n_heads, kHeadDim,
                                                                              splits);
  LLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

int split_kv_splits(const AttentionProblem& p) {
  // Enough blocks for about two waves of 2 blocks per SM, but no split
  // shorter than kMinKeysPerSplit keys.
  const long long wanted_blocks = 4LL * llm::cuda::sm_count();
  const long long base_blocks = static_cast<long long>(p.n_heads) * p.seqlen_q;
  const int by_occupancy = static_cast<int>(std::max(1LL, (wanted_blocks + base_blocks - 1) / base_blocks));
  const int by_length = std::max(1, p.seqlen_k / kMinKeysPerSplit);
  return std::min({by_occupancy, by_length, kMaxSplits});
}

std::size_t split_kv_workspace_bytes(const AttentionProblem& p) {
  const std::size_t slots = static_cast<std::size_t>(p.seqlen_q) * p.n_heads * split_kv_splits(p);
  return slots * (p.head_dim + 2) * sizeof(float);
}

void split_kv_decode_attention(const AttentionProblem& p, const AttentionArgs& args) {
  if (const char* why = fused_unsupported(p))
    throw llm::InputError(std::string("cuda_split_kv_decode: ") + why);
  if (p.seqlen_q > 65535) throw llm::InputError("cuda_split_kv_decode: more than 65535 queries (grid.z limit)");
  if (p.head_dim == 64) launch<64>(p, args);
  else launch<128>(p, args);
}

}  // namespace step02::cuda
