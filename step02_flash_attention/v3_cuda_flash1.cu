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
// Shared memory: see shared_bytes() below. docs/02_flash_attention.md,
// section 5, compares it with FlashAttention-2 and split-KV decode.
#include <cstdint>
#include <string>

#include "exercise.cuh"
#include "step02_flash_attention/cuda_attention.hpp"
#include "step02_flash_attention/cuda_common.cuh"
#include "step02_flash_attention/cuda_model_hooks.hpp"

namespace step02::cuda {
namespace {

using detail::ceil_div;

constexpr int kRows = 64;  // query rows (= threads) per block: 2 warps

template <int kHeadDim>
constexpr int keys_per_tile() {
  // d = 128: 16 keys keep shared memory at <= 48 KiB (see above).
  // d <= 16: 16 keys too, for registers: s[kKeys] is a register array next to
  // o[d], and with 32 keys ptxas (CUDA 13, sm_90) spilled at d = 16; with 16
  // it needs at most ~120 registers and spills nothing (ptxas -v, sm_75..90).
  return kHeadDim <= 16 || kHeadDim > 64 ? 16 : 32;
}

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
// d = 8:   q_t  2 KiB + K, V 2 x 0.5 KiB (kKeys 16) = 3 KiB (the `tiny` preset)
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
    // The online-softmax update of this row with the tile: s[0..visible) are
    // its scores, v_tile its values; m, l and o[] are carried to the next tile.
    // BEGIN EXERCISE ex02.2
    // STUB: if (k0 == 0) LLM_CUDA_EXERCISE_TODO("ex02.2");  // one line per launch, not one per tile
    // STUB: for (int c = 0; c < kHeadDim; ++c) o[c] = llm::cuda::device::exercise_nan();
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
    // END EXERCISE ex02.2
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

// The head dims the kernel is compiled for, listed once: the pack both
// instantiates the kernel and is what flash1_unsupported accepts. It has to be
// a compile-time list because o[kHeadDim] must live in registers, and
// registers cannot be indexed by a runtime value. 8 and 48 are the heads of
// the `tiny` and `small` presets (stories260K, stories15M dims), 64 and 128
// the Llama family's, 16 and 32 small test models'. Every entry is a multiple
// of 4 (the float4 loads) and at most 128 (48 KiB of shared memory and 128
// output registers per thread; 256 would need an opt-in the T4 cannot give
// and would spill o[]). The model's own kernels take any head_dim up to 256.
template <int... kDims>
struct HeadDims {
  static bool contains(int d) { return ((d == kDims) || ...); }
  // Runs launch<d> for the one d equal to p.head_dim (the caller checked
  // contains(p.head_dim)): a fold over ||, which stops at the first match.
  static void dispatch(const AttentionProblem& p, const AttentionArgs& args) {
    static_cast<void>(((p.head_dim == kDims && (launch<kDims>(p, args), true)) || ...));
  }
  static std::string list() {  // "8, 16, 32, 48, 64, 128"
    std::string s;
    ((s += (s.empty() ? "" : ", ") + std::to_string(kDims)), ...);
    return s;
  }
};
using Flash1HeadDims = HeadDims<8, 16, 32, 48, 64, 128>;

// float4 loads of K/V rows need every row start on a 16-byte boundary: the
// pool pointers aligned (cudaMalloc gives 256 bytes) and the row and head
// offsets (multiples of kv_dim and head_dim floats) multiples of 4 floats.
// head_dim % 4 == 0 is guaranteed by the list above; the rest is the caller's
// memory, checked here so a misaligned view fails with a sentence instead of
// a misaligned-address fault inside the kernel.
const char* kv_view_misaligned(const llm::KvView& kv) {
  const auto aligned = [](const float* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
  if (!aligned(kv.keys) || !aligned(kv.values)) return "K/V pool pointers must be 16-byte aligned (float4 loads)";
  if (kv.kv_dim % 4 != 0) return "K/V rows must be a multiple of 4 floats (float4 loads)";
  return nullptr;
}

}  // namespace

const char* fused_unsupported(const AttentionProblem& p) {
  if (p.head_dim != 64 && p.head_dim != 128) return "the fused kernels are compiled for head_dim 64 and 128 only";
  if (p.n_heads > 65535) return "more than 65535 heads (grid.y limit)";
  return nullptr;
}

const char* flash1_unsupported(const AttentionProblem& p) {
  // Built once; the pointer stays valid for the program's life.
  static const std::string head_dims = "cuda_flash1 is compiled for head_dim " + Flash1HeadDims::list() + " only";
  if (!Flash1HeadDims::contains(p.head_dim)) return head_dims.c_str();
  if (p.n_heads > 65535) return "more than 65535 heads (grid.y limit)";
  return nullptr;
}

void flash1_attention(const AttentionProblem& p, const AttentionArgs& args) {
  if (const char* why = flash1_unsupported(p)) throw llm::InputError(std::string("cuda_flash1: ") + why);
  if (const char* why = kv_view_misaligned(args.kv)) throw llm::InputError(std::string("cuda_flash1: ") + why);
  Flash1HeadDims::dispatch(p, args);
}

// ---------------------------------------------------------------------------
// The model's attention hook (llm::cuda::CudaAttentionKernels::PrefillFn).
// The twin of step02::cpu::flash_prefill: the hook's arguments ARE an
// attention problem (Sq = n_new queries against Sk = n_past + n_new keys of
// the model's cache, causal bottom-right), so this only renames them and runs
// the variant-table kernel above; no second kernel to keep in sync.

void flash1_prefill(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past, int n_new,
                    float* out, float* /*workspace: FlashAttention needs none*/, cudaStream_t stream) {
  // Shape first, even for an empty run, so a config the kernel cannot take
  // fails on the first forward whatever its batch looks like.
  const AttentionProblem shape_only{shape.n_heads, shape.n_kv_heads, shape.head_dim, 1, 1, true};
  shape_only.validate();
  if (const char* why = flash1_unsupported(shape_only))
    throw llm::InputError(std::string("step02 flash1_prefill: ") + why);
  if (n_new <= 0) return;  // a grid of 0 blocks is a launch error
  if (n_past < 0) throw llm::InputError("step02 flash1_prefill: n_past must be >= 0");

  PrefillCall call = prefill_call(shape, q, kv, n_past, n_new, out);  // see attention_problem.hpp
  call.args.stream = stream;  // the model's stream: the launch is queued behind the K/V writes
  flash1_attention(call.problem, call.args);
}

std::size_t flash1_prefill_workspace_floats(const llm::AttentionShape& /*shape*/, int /*n_past*/, int /*n_new*/) {
  // Zero: the scores live one tile at a time in registers and shared memory.
  // (The naive hook asks for n_new x n_heads x (n_past + n_new) floats here.)
  return 0;
}

}  // namespace step02::cuda
