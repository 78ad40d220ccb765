// Variant 3: FlashAttention-1 style, fp32, no tensor cores.
//
// Grid: (query blocks of kRows, heads). Block: kRows threads, ONE THREAD PER
// QUERY ROW. The block walks the keys in tiles of kKeys; each tile of K and V
// is loaded once into shared memory and then read by all kRows threads, so
// K/V come from HBM once per query block instead of once per query (that
// reuse, plus never writing S, is the whole win over variant 2).
//
// Per row the thread keeps, in registers:
//   m  running max of the scores,  l  running sum of exp(score - m),
//   o[d]  the output so far, kept NORMALIZED after every tile as in the
//         FlashAttention paper's Algorithm 1:
//           o <- (l * exp(m - m') * o + sum_j exp(s_j - m') v_j) / l'
// That per-tile division of the whole output row is one of the non-matmul
// costs FlashAttention-2 removes (variant 4 divides once at the end).
//
// Shared memory per block (fp32):
//   q_t  [d, kRows]   the block's query rows, TRANSPOSED: in a loop over c,
//                     thread r reads q_t[c][r]; neighbours read neighbouring
//                     words, so the 32 lanes of a warp hit 32 different banks.
//                     (Row-major q[r][c] would put a whole warp on one bank.)
//                     Why not registers: o[d] already takes d registers per
//                     thread, and q[d] on top would spill at d = 128.
//   k    [kKeys, d]   keys of the tile; every thread reads the same k[j][c]
//   v    [kKeys, d]   at the same time: a broadcast, no bank conflict.
// d = 64:  q_t 16 KiB + K, V 2 x 8 KiB (kKeys 32) = 32 KiB
// d = 128: q_t 32 KiB + K, V 2 x 8 KiB (kKeys 16) = 48 KiB, the most a block
//          gets without an opt-in, on every GPU from the T4 on.
#include "cuda_attention.hpp"
#include "cuda_common.cuh"

namespace step02::cuda {
namespace {

using detail::ceil_div;

constexpr int kRows = 64;  // query rows (= threads) per block: 2 warps

template <int kHeadDim>
constexpr int keys_per_tile() {
  return kHeadDim <= 64 ? 32 : 16;  // keeps shared memory at <= 48 KiB (see above)
}

template <int kHeadDim>
constexpr int shared_bytes() {
  return (kHeadDim * kRows + 2 * keys_per_tile<kHeadDim>() * kHeadDim) * static_cast<int>(sizeof(float));
}

template <int kHeadDim>
__global__ void __launch_bounds__(kRows)
    flash1_kernel(const float* __restrict__ q, llm::KvView kv, float* __restrict__ out, int seqlen_q, int seqlen_k,
                  int n_heads, int group, float scale, bool causal) {
  constexpr int kKeys = keys_per_tile<kHeadDim>();
  extern __shared__ float shared[];
  float* q_t = shared;                          // [kHeadDim, kRows]
  float* k_tile = q_t + kHeadDim * kRows;       // [kKeys, kHeadDim]
  float* v_tile = k_tile + kKeys * kHeadDim;    // [kKeys, kHeadDim]

  const int tid = threadIdx.x;
  const int q0 = blockIdx.x * kRows;
  const int h = blockIdx.y;
  const int kv_head = h / group;
  const int row = q0 + tid;  // this thread's query
  const bool has_row = row < seqlen_q;
  const int last_key = has_row ? detail::last_visible_key(row, seqlen_q, seqlen_k, causal) : -1;
  // Keys the block needs: up to what its last valid row sees (same value in
  // every thread, so every thread runs the same number of tiles and reaches
  // the same barriers).
  const int block_last_row = min(q0 + kRows, seqlen_q) - 1;
  const int keys_needed = detail::last_visible_key(block_last_row, seqlen_q, seqlen_k, causal) + 1;

  // This thread's query row, pre-scaled by 1/sqrt(d), into column `tid` of q_t.
  for (int c = 0; c < kHeadDim; ++c)
    q_t[c * kRows + tid] = has_row ? q[(static_cast<size_t>(row) * n_heads + h) * kHeadDim + c] * scale : 0.0f;

  float m = -INFINITY;  // running max
  float l = 0.0f;       // running sum of exp(s - m)
  float o[kHeadDim];    // normalized output so far (registers: every index is a compile-time constant)
#pragma unroll
  for (int c = 0; c < kHeadDim; ++c) o[c] = 0.0f;

  for (int k0 = 0; k0 < keys_needed; k0 += kKeys) {
    // Barrier 1: every thread has finished reading the previous K/V tile (and,
    // the first time, q_t is complete) before the tile is overwritten.
    __syncthreads();
    // Cooperative load: the block's threads copy kKeys rows of K and V, four
    // floats at a time along a row (coalesced). Rows past seqlen_k are zero;
    // they are masked below and never weighted.
    constexpr int kVecPerRow = kHeadDim / 4;
    for (int idx = tid; idx < kKeys * kVecPerRow; idx += kRows) {
      const int j = idx / kVecPerRow, c4 = idx % kVecPerRow;
      float4 key = make_float4(0.f, 0.f, 0.f, 0.f), value = key;
      if (k0 + j < seqlen_k) {
        key = reinterpret_cast<const float4*>(kv.key_row(k0 + j) + kv_head * kHeadDim)[c4];
        value = reinterpret_cast<const float4*>(kv.value_row(k0 + j) + kv_head * kHeadDim)[c4];
      }
      reinterpret_cast<float4*>(k_tile + j * kHeadDim)[c4] = key;
      reinterpret_cast<float4*>(v_tile + j * kHeadDim)[c4] = value;
    }
    // Barrier 2: the whole tile is in shared memory before anyone reads it.
    __syncthreads();

    // The causal mask inside a tile is a prefix of its keys for each row.
    const int visible = max(0, min(kKeys, last_key - k0 + 1));
    if (visible == 0) continue;  // this row sees nothing here (no barrier below, so divergence is fine)

    float s[kKeys];  // scores of this row against the tile
#pragma unroll
    for (int j = 0; j < kKeys; ++j) s[j] = 0.0f;
#pragma unroll 8
    for (int c = 0; c < kHeadDim; ++c) {
      const float qc = q_t[c * kRows + tid];
#pragma unroll
      for (int j = 0; j < kKeys; ++j) s[j] += qc * k_tile[j * kHeadDim + c];
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeys; ++j)
      if (j < visible) tile_max = fmaxf(tile_max, s[j]);
    const float m_new = fmaxf(m, tile_max);  // finite: visible > 0
    const float rescale = expf(m - m_new);    // 0 on the first tile (m = -inf)
    float tile_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      s[j] = j < visible ? expf(s[j] - m_new) : 0.0f;  // s now holds p
      tile_sum += s[j];
    }
    const float l_new = rescale * l + tile_sum;
    // FA1's update, output kept normalized: o = (l * rescale * o + P V) / l_new.
    const float inv_l_new = 1.0f / l_new;
    const float keep = l * rescale * inv_l_new;
#pragma unroll
    for (int c = 0; c < kHeadDim; ++c) {
      float pv = 0.0f;
#pragma unroll
      for (int j = 0; j < kKeys; ++j) pv += s[j] * v_tile[j * kHeadDim + c];
      o[c] = keep * o[c] + pv * inv_l_new;
    }
    m = m_new;
    l = l_new;
  }

  // Already normalized; a row that saw no key keeps o = 0.
  if (has_row) {
    float* out_row = out + (static_cast<size_t>(row) * n_heads + h) * kHeadDim;
#pragma unroll
    for (int c = 0; c < kHeadDim; ++c) out_row[c] = o[c];
  }
}

template <int kHeadDim>
void launch(const AttentionProblem& p, const AttentionArgs& args) {
  constexpr int bytes = shared_bytes<kHeadDim>();
  detail::allow_dynamic_shared_memory(flash1_kernel<kHeadDim>, bytes, "cuda_flash1");
  const dim3 grid(ceil_div(p.seqlen_q, kRows), p.n_heads);
  flash1_kernel<kHeadDim><<<grid, kRows, bytes, detail::stream_of(args)>>>(
      args.q, args.kv, args.out, p.seqlen_q, p.seqlen_k, p.n_heads, p.group(), softmax_scale(p.head_dim), p.causal);
  LLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

const char* fused_unsupported(const AttentionProblem& p) {
  if (p.head_dim != 64 && p.head_dim != 128) return "the fused kernels are compiled for head_dim 64 and 128 only";
  if (p.n_heads > 65535) return "more than 65535 heads (grid.y limit)";
  return nullptr;
}

void flash1_attention(const AttentionProblem& p, const AttentionArgs& args) {
  if (const char* why = fused_unsupported(p)) throw llm::InputError(std::string("cuda_flash1: ") + why);
  if (p.head_dim == 64) launch<64>(p, args);
  else launch<128>(p, args);
}

}  // namespace step02::cuda
