// Variants 4 and 5: FlashAttention-2 style with tensor cores, fp16 or bf16
// inputs, fp32 accumulation and softmax.
//
// What changes against FlashAttention-1 (variant 3):
//  * Work partitioning. A block of kWarps = 4 warps owns kRows = 64 query
//    rows, 16 per warp, and all four warps share each K/V tile. A warp's
//    rows are its own from start to end, so the softmax statistics of a row
//    never leave the warp: no shared-memory exchange between warps (FA1's
//    "split-K" across warps needed one per tile).
//  * Fewer non-matmul FLOPs. The output stays UNNORMALIZED (o = sum p v)
//    and is divided by l once at the end; each thread keeps a partial l and
//    the four threads of a row add theirs up only after the last tile; exp
//    is exp2 with log2(e) folded into the scale.
//  * Tensor cores. S = Q K^T and O += P V are mma.sync instructions on
//    16 x 8 x 16 fragments; S, P and O never leave registers (the fragment
//    layouts are drawn in flash2_mma.cuh, with the product and the tile load).
// docs/02_flash_attention.md, section 5, compares the three kernels;
// v7_v16_cuda_flash2_tuned.cu takes this kernel to its anchors' speed, one
// change per variant.
#include <cstdint>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "step02_flash_attention/cuda_attention.hpp"
#include "step02_flash_attention/cuda_common.cuh"
#include "step02_flash_attention/flash2_mma.cuh"

namespace step02::cuda {
namespace {

using detail::ceil_div;

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 16;                // the M of one mma
constexpr int kRows = kWarps * kRowsPerWarp;    // 64 query rows per block
constexpr int kKeys = 64;                       // keys per K/V tile = 8 n-tiles of 8
constexpr int kThreads = kWarps * 32;
using mma::kPad;  // rows of d + 8 elements: flash2_mma.cuh says why
using mma::mma_16x8x16;
using mma::pack2;

template <int kHeadDim>
constexpr int shared_bytes() {
  return 3 * kRows * (kHeadDim + kPad) * 2;  // Q, K, V tiles of 64 rows in 16 bits (kKeys == kRows)
}
static_assert(kKeys == kRows, "shared_bytes assumes the Q and K/V tiles have the same number of rows");

template <bool kBf16, int kHeadDim>
__global__ void __launch_bounds__(kThreads)
    flash2_kernel(const std::uint16_t* __restrict__ q, const std::uint16_t* __restrict__ k,
                  const std::uint16_t* __restrict__ v, float* __restrict__ out, int seqlen_q, int seqlen_k,
                  int n_heads, int n_kv_heads, int group, float scale_log2, bool causal) {
  constexpr int kLd = kHeadDim + kPad;       // shared row stride (elements)
  constexpr int kKSteps = kHeadDim / 16;     // k-steps of S = Q K^T
  constexpr int kKeyTiles = kKeys / 8;       // n-tiles of S (8 keys each)
  constexpr int kDimTiles = kHeadDim / 8;    // n-tiles of O (8 dims each)
  extern __shared__ std::uint16_t smem[];
  std::uint16_t* q_s = smem;                 // [kRows][kLd]
  std::uint16_t* k_s = q_s + kRows * kLd;    // [kKeys][kLd]
  std::uint16_t* v_s = k_s + kKeys * kLd;    // [kKeys][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;      // fragment coordinates (the layout table in flash2_mma.cuh)
  const int q0 = blockIdx.x * kRows;
  const int h = blockIdx.y, kv_head = h / group;
  const int warp_row0 = warp * kRowsPerWarp;
  // The two query rows this thread accumulates (rows g and g + 8 of its warp's 16).
  const int row_a = q0 + warp_row0 + g, row_b = row_a + 8;
  const int last_a = detail::last_visible_key(row_a, seqlen_q, seqlen_k, causal);
  const int last_b = detail::last_visible_key(row_b, seqlen_q, seqlen_k, causal);
  // Same value in every thread: all threads run the same tiles and barriers.
  const int keys_needed =
      detail::last_visible_key(min(q0 + kRows, seqlen_q) - 1, seqlen_q, seqlen_k, causal) + 1;

  mma::load_tile<kHeadDim, kRows, kThreads, /*kAsync=*/false>(q_s, q, q0, seqlen_q, n_heads, h);
  __syncthreads();  // the Q tile is complete before warps read their fragments
  // The warp's Q rows as A fragments, loaded once and kept in registers.
  std::uint32_t q_frag[kKSteps][4];
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) mma::load_a_fragment_by_words<kLd>(q_frag[kk], q_s, warp_row0, kk, g, t);

  float o_acc[kDimTiles][4];  // unnormalized O, rows g / g+8, dims 8n + 2t, +1
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY;  // running max (log2 domain) of rows a and b
  float l_a = 0.0f, l_b = 0.0f;            // this thread's PART of the running sums (16 of 64 columns)

  for (int k0 = 0; k0 < keys_needed; k0 += kKeys) {
    // Barrier: every warp is done with the previous K/V tile before it is
    // overwritten. (A second buffer filled with cp.async while computing on
    // the first hides the load: variant 7.)
    __syncthreads();
    mma::load_tile<kHeadDim, kRows, kThreads, /*kAsync=*/false>(k_s, k, k0, seqlen_k, n_kv_heads, kv_head);
    mma::load_tile<kHeadDim, kRows, kThreads, /*kAsync=*/false>(v_s, v, k0, seqlen_k, n_kv_heads, kv_head);
    __syncthreads();  // the tile is complete before any warp reads it

    // S = Q K^T for the warp's 16 rows x 64 keys: 8 C fragments.
    float s[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        std::uint32_t b[2];  // B = K^T: key row 8n + g (flash2_mma.cuh)
        mma::load_key_fragment_by_words<kLd>(b, k_s, n, kk, g, t);
        mma_16x8x16<kBf16>(s[n], q_frag[kk], b[0], b[1]);
      }
    }

    // Scale into the log2 domain and mask (key past the row's last visible key,
    // which also covers keys past seqlen_k); then the row maxima of this tile.
    // __fmul_rn: the scaled score is rounded on its own, never fused into an
    // FMA with the "- m" below. Whether the compiler would fuse it depends on
    // the code around it, and the tuned variants (v7_v16) change that code:
    // with the product pinned, they give this kernel's output bit for bit.
    float tile_max_a = -INFINITY, tile_max_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      const int key = k0 + n * 8 + 2 * t;
      s[n][0] = key <= last_a ? __fmul_rn(s[n][0], scale_log2) : -INFINITY;
      s[n][1] = key + 1 <= last_a ? __fmul_rn(s[n][1], scale_log2) : -INFINITY;
      s[n][2] = key <= last_b ? __fmul_rn(s[n][2], scale_log2) : -INFINITY;
      s[n][3] = key + 1 <= last_b ? __fmul_rn(s[n][3], scale_log2) : -INFINITY;
      tile_max_a = fmaxf(tile_max_a, fmaxf(s[n][0], s[n][1]));
      tile_max_b = fmaxf(tile_max_b, fmaxf(s[n][2], s[n][3]));
    }
    // A row's 64 columns are spread over the 4 threads of a quad (t = 0..3,
    // neighbouring lanes): two butterfly shuffles give all four the row max.
#pragma unroll
    for (int offset = 1; offset <= 2; offset *= 2) {
      tile_max_a = fmaxf(tile_max_a, __shfl_xor_sync(0xffffffffu, tile_max_a, offset));
      tile_max_b = fmaxf(tile_max_b, __shfl_xor_sync(0xffffffffu, tile_max_b, offset));
    }
    const float m_new_a = fmaxf(m_a, tile_max_a), m_new_b = fmaxf(m_b, tile_max_b);
    // A row with no visible key so far has m_new = -inf; subtracting 0
    // instead keeps exp2(-inf - (-inf)) = NaN out: every p and the rescale are 0.
    const float base_a = m_new_a == -INFINITY ? 0.0f : m_new_a;
    const float base_b = m_new_b == -INFINITY ? 0.0f : m_new_b;
    const float rescale_a = exp2f(m_a - base_a), rescale_b = exp2f(m_b - base_b);
    m_a = m_new_a;
    m_b = m_new_b;

    // P = exp2(S - m), and this thread's share of the row sums.
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      s[n][0] = exp2f(s[n][0] - base_a);
      s[n][1] = exp2f(s[n][1] - base_a);
      s[n][2] = exp2f(s[n][2] - base_b);
      s[n][3] = exp2f(s[n][3] - base_b);
      sum_a += s[n][0] + s[n][1];
      sum_b += s[n][2] + s[n][3];
    }
    l_a = rescale_a * l_a + sum_a;
    l_b = rescale_b * l_b + sum_b;
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
      o_acc[n][0] *= rescale_a;
      o_acc[n][1] *= rescale_a;
      o_acc[n][2] *= rescale_b;
      o_acc[n][3] *= rescale_b;
    }

    // O += P V, 16 keys per k-step. P's A fragment is two of S's C fragments
    // (n-tiles 2ks and 2ks+1), rounded to 16 bits (P is in [0, 1]: no overflow).
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      const std::uint32_t p_frag[4] = {pack2<kBf16>(s[2 * ks][0], s[2 * ks][1]),
                                       pack2<kBf16>(s[2 * ks][2], s[2 * ks][3]),
                                       pack2<kBf16>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                                       pack2<kBf16>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
      // B = V: two keys of one dim per register, packed by hand from 16-bit
      // loads (flash2_mma.cuh says why).
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        std::uint32_t b[2];
        mma::load_value_fragment_by_halves<kLd>(b, v_s, ks, n, g, t);
        mma_16x8x16<kBf16>(o_acc[n], p_frag, b[0], b[1]);
      }
    }
  }

  // The full row sums: add the four partial sums of each quad, once.
#pragma unroll
  for (int offset = 1; offset <= 2; offset *= 2) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, offset);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, offset);
  }
  // Normalize once (0 for a row that saw no key) and write fp32 output.
  const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n) {
    const int dim = n * 8 + 2 * t;
    if (row_a < seqlen_q)
      *reinterpret_cast<float2*>(out + (static_cast<size_t>(row_a) * n_heads + h) * kHeadDim + dim) =
          make_float2(o_acc[n][0] * inv_a, o_acc[n][1] * inv_a);
    if (row_b < seqlen_q)
      *reinterpret_cast<float2*>(out + (static_cast<size_t>(row_b) * n_heads + h) * kHeadDim + dim) =
          make_float2(o_acc[n][2] * inv_b, o_acc[n][3] * inv_b);
  }
}

template <bool kBf16, int kHeadDim>
void launch(const AttentionProblem& p, const AttentionArgs& args) {
  constexpr int bytes = shared_bytes<kHeadDim>();  // 27 KiB at d = 64, 51 KiB at d = 128 (opt-in)
  detail::allow_dynamic_shared_memory(flash2_kernel<kBf16, kHeadDim>, bytes, "cuda_flash2");
  const dim3 grid(ceil_div(p.seqlen_q, kRows), p.n_heads);
  flash2_kernel<kBf16, kHeadDim><<<grid, kThreads, bytes, detail::stream_of(args)>>>(
      args.q16, args.k16, args.v16, args.out, p.seqlen_q, p.seqlen_k, p.n_heads, p.n_kv_heads, p.group(),
      softmax_scale(p.head_dim) * detail::kLog2e, p.causal);
  LLM_CUDA_CHECK_LAUNCH();
}

// What flash2_kernel was compiled for on this GPU: both head dims come from
// the same compilation, so one instance speaks for both.
template <bool kBf16>
KernelImage kernel_image() {
  return detail::kernel_image_of(flash2_kernel<kBf16, 64>);
}

// Tensor-core mma needs code compiled for sm_75 (fp16) or sm_80 (bf16): said
// in words rather than as a launch failure or a trap. Decided once per
// process (neither the card nor the kernel's image changes between calls),
// not on every call: the step's timing loops call flash2 back to back.
template <bool kBf16>
void require_tensor_cores(const char* name) {
  static const std::string why = tensor_core_unavailable(
      kBf16 ? "bf16 tensor-core mma" : "fp16 tensor-core mma",
      kBf16 ? kFlash2Bf16MinComputeCapability : kFlash2Fp16MinComputeCapability, kernel_image<kBf16>(),
      llm::cuda::compute_capability());
  if (!why.empty()) throw llm::DeviceError(std::string(name) + ": " + why);
}

template <bool kBf16>
void flash2(const AttentionProblem& p, const AttentionArgs& args, const char* name) {
  if (const char* why = fused_unsupported(p)) throw llm::InputError(std::string(name) + ": " + why);
  require_tensor_cores<kBf16>(name);
  if (p.head_dim == 64) launch<kBf16, 64>(p, args);
  else launch<kBf16, 128>(p, args);
}

}  // namespace

void flash2_fp16_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2<false>(p, args, "cuda_flash2_fp16");
}
void flash2_bf16_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2<true>(p, args, "cuda_flash2_bf16");
}
KernelImage flash2_fp16_kernel_image() { return kernel_image<false>(); }
KernelImage flash2_bf16_kernel_image() { return kernel_image<true>(); }

}  // namespace step02::cuda
