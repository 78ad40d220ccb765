#pragma once
// The tensor-core pieces every FlashAttention-2 kernel of step 02 shares
// (v4_v5_cuda_flash2_mma.cu, the baseline; v7_v16_cuda_flash2_tuned.cu, the
// ladder on top of it): the 16-bit packing of P, the tile loads from global memory (through
// registers, or with cp.async), and ldmatrix. CUDA translation units only.
//
// The mma.sync fragment layouts (PTX ISA, "mma.m16n8k16") are written out
// beside the product itself, in common/cuda/mma_fragments.cuh (lane = 4 g + t):
// a thread holds two rows (g and g+8) of every accumulator, and the C
// fragments of S for keys 16k..16k+15 (two n-tiles of 8) are exactly the A
// fragment of P for the P V product: P goes from the first mma to the second
// without touching memory (converted to 16 bits in registers).
//
//  Q tile (64 x d)        K tile (64 keys x d)              S for one warp (16 x 64)
//  +------------+ warp 0  +------------+                    +--+--+--+--+--+--+--+--+
//  |  16 rows   |-------->|            |  S = Q K^T  ---->  |n0|n1|n2|n3|n4|n5|n6|n7| 8 C fragments
//  +------------+ warp 1  |  shared by |                    +--+--+--+--+--+--+--+--+
//  |  16 rows   |         |  all warps |  P = exp2(S - m)   then O(16 x d) += P V
//  +------------+ ...     +------------+                    (d/8 C fragments of O per warp)
//
// sm_75 (T4) runs the fp16 product as two k8 halves; bf16 mma needs sm_80:
// the bf16 kernel compiles to a trap below that, and the host refuses to
// launch a kernel compiled below it (kernel_image.hpp: decided from the
// kernel's own attributes, so a compute_75-only build on an sm_90 card,
// which runs the JIT-compiled compute_75 code, refuses too).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "mma_fragments.cuh"

namespace step02::cuda::mma {

// Shared-memory rows are padded by 8 elements (16 bytes): with a row stride
// of d + 8 halves (144 or 272 bytes, 4 banks past a multiple of 128 bytes),
// eight consecutive rows start in eight different groups of 4 banks. The 32
// lanes' 32-bit fragment loads, and each 8-row phase of an ldmatrix, then hit
// 32 different banks (without the pad, rows 0, 2, 4, 6 start in the same
// bank: 4-way conflicts). The pad also keeps every row 16-byte aligned, which
// cp.async's 16-byte copies and ldmatrix's row addresses require.
constexpr int kPad = 8;

// D = A B + D on one 16 x 8 x 16 tile: the course's one tensor-core product
// (common/cuda/mma_fragments.cuh, with the sm_75 and bf16 rules).
using llm::cuda::device::mma_16x8x16;

// Two fp32 values -> one register of two 16-bit values (lo in the low half).
template <bool kBf16>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (kBf16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

// 2^x as one instruction: the special-function unit's ex2.approx.ftz
// (MUFU.EX2; 2^-inf = +0). exp2f compiles to the same MUFU.EX2 wrapped in a
// fix-up for results below 2^-126 (a compare, then a multiply before and a
// square after, predicated: they issue whether or not they apply), four
// instructions where one does. The fix-up keeps probabilities under 2^-126
// (1.2e-38) from flushing to zero; a row's probabilities add up to at least 1,
// and P goes into the next product in 16 bits (fp16 flushes below 6e-8), so
// nothing the output can show is lost.
__device__ __forceinline__ float fast_exp2(float x) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(result) : "f"(x));
  return result;
}

// Two 16-bit values already in the right format -> one register.
__device__ __forceinline__ std::uint32_t pack_bits(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

// --- Fragments from a padded shared tile [rows][kLd] by plain loads (variant
// 4's way; variant 8 replaces them with ldmatrix). g = lane / 4, t = lane % 4.

// The A fragment (16 x 16, row-major) of rows row0 .. row0 + 15, columns
// 16 kk .. 16 kk + 15: four 32-bit loads (two adjacent elements each).
template <int kLd>
__device__ __forceinline__ void load_a_fragment_by_words(std::uint32_t (&a)[4], const std::uint16_t* tile, int row0,
                                                         int kk, int g, int t) {
  const std::uint16_t* base = tile + row0 * kLd + kk * 16 + 2 * t;
  a[0] = *reinterpret_cast<const std::uint32_t*>(base + g * kLd);
  a[1] = *reinterpret_cast<const std::uint32_t*>(base + (g + 8) * kLd);
  a[2] = *reinterpret_cast<const std::uint32_t*>(base + g * kLd + 8);
  a[3] = *reinterpret_cast<const std::uint32_t*>(base + (g + 8) * kLd + 8);
}

// The B fragment of S = Q K^T for keys 8n .. 8n + 7, dims 16 kk .. 16 kk + 15.
// B = K^T: B[dim][key] = K[key][dim], so B's "column" g is key row 8n + g,
// and each register is two adjacent dims of that row: two 32-bit loads.
template <int kLd>
__device__ __forceinline__ void load_key_fragment_by_words(std::uint32_t (&b)[2], const std::uint16_t* k_tile, int n,
                                                           int kk, int g, int t) {
  const std::uint16_t* key = k_tile + (n * 8 + g) * kLd + kk * 16 + 2 * t;
  b[0] = *reinterpret_cast<const std::uint32_t*>(key);
  b[1] = *reinterpret_cast<const std::uint32_t*>(key + 8);
}

// The B fragment of O += P V for keys 16 ks .. 16 ks + 15, dims 8n .. 8n + 7.
// B = V[key][dim]: b[0] = V[16ks + 2t, +1][8n + g], b[1] = V[16ks + 8 + 2t, +1][8n + g];
// the two values of a register come from two rows, so they are four 16-bit
// loads packed by hand.
template <int kLd>
__device__ __forceinline__ void load_value_fragment_by_halves(std::uint32_t (&b)[2], const std::uint16_t* v_tile,
                                                              int ks, int n, int g, int t) {
  const std::uint16_t* column = v_tile + (ks * 16 + 2 * t) * kLd + n * 8 + g;
  b[0] = pack_bits(column[0], column[kLd]);
  b[1] = pack_bits(column[8 * kLd], column[9 * kLd]);
}

// --- Asynchronous copies (sm_80+) and ldmatrix (sm_75+).
//
// The kernels that use these need sm_80 (kFlash2TunedMinComputeCapability);
// compiled for an older target the helpers trap, and the host refuses to
// launch such an image, as for bf16 above.

// Starts a 16-byte copy global -> shared that does not pass through registers
// (.cg: cached in L2 only; the tile is read once per block from there). With
// `valid` false nothing is read and the 16 bytes are zero-filled (the
// "src-size" operand is 0): rows past the sequence. `from` must still be a
// valid address; the callers pass the tensor's first row then.
__device__ __forceinline__ void cp_async_16(void* to_shared, const void* from_global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(to_shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from_global),
               "r"(valid ? 16 : 0));
#else
  (void)to_shared; (void)from_global; (void)valid;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif
}

// Closes this thread's group of copies issued since its last commit.
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most kPending of this thread's most recent groups are still
// in flight (groups complete in order). The copies are then visible to this
// thread; to the rest of the block only after a __syncthreads().
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Four 8 x 8 matrices of 16-bit values from shared memory, one register each.
// Lanes 8i .. 8i+7 give the addresses of matrix i's eight rows (16 bytes
// each, 16-byte aligned); lane 4g + t receives row g, columns 2t and 2t+1 of
// each matrix: exactly the layout of an mma fragment register. One
// instruction replaces the four 32-bit loads of an A fragment (or two B
// fragments) and reads each row as one 16-byte access.
// kTransposed: each matrix is transposed on the way (.trans): lane 4g + t
// receives rows 2t and 2t+1 of column g. For V in O += P V, whose B fragment
// wants two keys (rows of V) of one dimension (a column of V) in one register.
template <bool kTransposed = false>
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&regs)[4], const std::uint16_t* row_address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row_address));
  if constexpr (kTransposed)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(regs[0]), "=r"(regs[1]), "=r"(regs[2]), "=r"(regs[3])
                 : "r"(address));
#else
  (void)row_address;
  regs[0] = regs[1] = regs[2] = regs[3] = 0u;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif
}

// --- Tile loads: global [seqlen, heads, d] 16-bit -> shared [kTileRows][d + kPad].

// Copies rows row0 .. row0 + kTileRows - 1 of one head of a [seqlen, heads,
// d] 16-bit tensor into a padded shared tile [kTileRows][d + kPad], 16 bytes
// per copy (coalesced: neighbouring threads take neighbouring 16-byte pieces
// of a row). Rows past `seqlen` are zero: their scores are masked, and a
// zero value times a zero probability stays zero (garbage could be NaN, and
// NaN * 0 = NaN).
// kAsync false: through registers, complete when the call returns (the
// caller's barrier makes it visible). kAsync true: cp.async copies the
// caller commits and waits for (cp_async_commit / cp_async_wait).
template <int kHeadDim, int kTileRows, int kThreads, bool kAsync>
__device__ __forceinline__ void load_tile(std::uint16_t* tile, const std::uint16_t* __restrict__ src, int row0,
                                          int seqlen, int heads, int head) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte pieces per row
  for (int idx = threadIdx.x; idx < kTileRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, chunk = idx % kChunks;
    const bool valid = row0 + r < seqlen;
    const std::uint16_t* from =
        src + (static_cast<std::size_t>(valid ? row0 + r : 0) * heads + head) * kHeadDim + chunk * 8;
    std::uint16_t* to = tile + r * (kHeadDim + kPad) + chunk * 8;
    if constexpr (kAsync) {
      cp_async_16(to, from, valid);
    } else {
      uint4 value = make_uint4(0u, 0u, 0u, 0u);
      if (valid) value = *reinterpret_cast<const uint4*>(from);
      *reinterpret_cast<uint4*>(to) = value;
    }
  }
}

}  // namespace step02::cuda::mma
