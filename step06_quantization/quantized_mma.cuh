// W8A16 / W4A16 on the tensor cores: what step 06's two matmul kernels
// share. y [rows, out] = x [rows, in] . dequantize(W)^T for 1..16 rows (more
// rows: 16 at a time), int8 per channel, int4 asymmetric and symmetric groups
// and NF4, fp16 or fp32 activations, fp32 accumulation.
//
// The two kernels (CudaQuantizedKernel picks one; the persistent one by
// default: the model's path, except for int4 products of 1..4 rows, which
// run the CUDA-core decode GEMV of int4_decode_gemv.cu) are
//   quantized_mma_persistent.cu: the persistent pipelined kernel, the
//     model's, and its schedule (plan_persistent);
//   quantized_mma_one_shot.cu: the one-shot split-K kernel, the first
//     version, kept to time against.
// Both share every device piece below: x staging, dequantization in
// registers, the MMAs of one step, the output. In both a block is 256
// threads = 8 warps, each warp one 16-row m16n8k16 MMA tile, so a block
// covers 128 output rows (a "row block") and its 8 warps share one staged
// copy of x. The sizes, what a launch takes and the launches, as the host
// side sees them: quantized_mma_launch.cuh; the host side itself (the
// device copy of a matrix, the launches per 16 rows, the model's Linear
// hook): cuda_quantized_kernels.cu.
//
// Invariants: every weight byte is read once per call, in the tile-major
// layout of DeviceQuantizedMatrix (a warp load = 512 contiguous bytes);
// results are bitwise reproducible (no atomicAdd on values). Why this design
// (the flop and activation budgets, the layout, fp16 ranges, the persistent
// schedule): docs/06_quantization.md, section 6.3.
//
// Included only by .cu files (nvcc): the device code is compiled into each
// kernel's file, which instantiates its kernel for every scheme, activation
// type and token tile.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

// common/cuda (a public include directory of llm_common in CUDA builds).
#include "exercise.cuh"
#include "mma_fragments.cuh"
#include "step06_quantization/quant_format.hpp"  // QuantScheme, kNf4Levels
#include "step06_quantization/quantized_mma_launch.cuh"

namespace step06::quantized_mma {

// Per-scheme constants of the kernels.
template <QuantScheme kScheme>
struct SchemeTraits {
  static constexpr bool kInt8 = kScheme == QuantScheme::Int8PerChannel;
  static constexpr bool kZeros = kScheme == QuantScheme::Int4Asymmetric;  // zero points stored per group
  static constexpr int kBits = kInt8 ? 8 : 4;
  static constexpr int kColumnsPerStep = kStepBytes * 8 / kBits;  // 64 (int8) or 128 (4-bit)
  static constexpr int kWordsPerStep = kColumnsPerStep / 2;       // staged x words (fp16 pairs) per step
  static constexpr int kSliceColumns = kColumnsPerStep * kMaxSteps;  // 512 or 1024
  // Groups a slice can touch: one per 32 columns (the smallest group) plus
  // one a group straddling the slice's start adds. int8: one group per row.
  static constexpr int kMaxGroups = kInt8 ? 1 : kSliceColumns / 32 + 1;
  // Persistent kernel: group scales staged per unit. 4-bit: one per 32-column
  // word of the step (a word lies in one group: groups are whole multiples
  // of 32 columns), so the loop looks its scale up without tracking groups;
  // int8: the row's one scale.
  static constexpr int kScaleEntriesPerStep = kInt8 ? 1 : 4;
  // A staged x row in 32-bit words (2 fp16 each): the slice plus 8 words of
  // padding, so rows start 8 banks apart (stride = 8 mod 32 words). The B
  // fragment loads are 64-bit (4 fp16 per lane, see multiply_int4_word): a
  // half-warp (lanes 4g + t, g in 0..3) reads words 8g + 2t (+ same offset)
  // mod 32, 16 distinct even banks, each access taking 2 banks: all 32 banks
  // once, no conflict. The persistent kernel's rows (a whole number of
  // steps plus 8 words) keep the same residue.
  static constexpr int kXStrideWords = kSliceColumns / 2 + 8;
  static_assert(kSliceColumns % 64 == 0, "the bank argument needs a slice of whole 32-word rows");
  static_assert(kWordsPerStep % 32 == 0, "the bank argument needs steps of whole 32-word rows");
  static_assert(kSliceColumns / 4 <= kThreads, "staging: one 4-column unit of a row per thread");
};

// NF4's 16 levels, for stage_nf4_levels. In an unnamed namespace: each
// kernel's file holds its own copy (a __constant__ variable defined in two
// files would be defined twice on the host side, where it has a shadow).
namespace {
__constant__ float kNf4LevelsDevice[16] = {
    kNf4Levels[0],  kNf4Levels[1],  kNf4Levels[2],  kNf4Levels[3],  kNf4Levels[4],  kNf4Levels[5],
    kNf4Levels[6],  kNf4Levels[7],  kNf4Levels[8],  kNf4Levels[9],  kNf4Levels[10], kNf4Levels[11],
    kNf4Levels[12], kNf4Levels[13], kNf4Levels[14], kNf4Levels[15]};
}  // namespace

// --- Small device helpers.

template <class Act>
__device__ __forceinline__ Act from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ std::uint32_t half_bits(float v) { return __half_as_ushort(__float2half_rn(v)); }

// fp16x2 a - b on the bits (both lanes).
__device__ __forceinline__ std::uint32_t sub_f16x2(std::uint32_t a, std::uint32_t b) {
  std::uint32_t d;
  asm("sub.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// (a & kMask) | kBits as one instruction (LOP3, lookup table 0xEA = (a & b) |
// c). Written in C++, with both operands constants, the compiler emits an
// AND and then an OR (a LOP3 holds one immediate, and it does not keep the
// other in a register): two instructions per fp16x2 register of weights,
// where this takes one (ptxas keeps kBits in a register for the whole loop).
// Compiled for sm_75 it stays the C++ expression: there the one register
// more makes the persistent kernel spill under its 128-register cap (int4
// symmetric, fp32 activations, 9-16 rows), and the T4 path is the fallback.
template <std::uint32_t kMask, std::uint32_t kBits>
__device__ __forceinline__ std::uint32_t and_or(std::uint32_t a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return (a & kMask) | kBits;
#else
  std::uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(a), "n"(kMask), "n"(kBits));
  return d;
#endif
}

// The tensor-core product (d += A . B on a 16 x 8 x 16 tile, fp16 inputs,
// fp32 accumulation; the fragment layouts, lane = 4 g + t, are written out
// in common/cuda/mma_fragments.cuh) and a 16-byte vector's 32-bit words.
using llm::cuda::device::mma_16x8x16;
using llm::cuda::device::word_of;

// --- Dequantization in registers: one fp16x2 register of an A fragment.
//
// A 32-bit word of codes holds 8 nibbles; register k (0..3) of a fragment
// is the pair of columns in nibbles k (low half) and k + 4 (high half): the
// upload puts each pair there. The int4 schemes become the exact fp16
// integers code - zero (int4_fragments); NF4 looks the same two nibbles up
// in the 16-entry table of fp16 levels.
__device__ __forceinline__ std::uint32_t nf4_pair(std::uint32_t word, int k, const unsigned short* levels) {
  const std::uint32_t low = levels[(word >> (4 * k)) & 0xF];
  const std::uint32_t high = levels[(word >> (4 * k + 16)) & 0xF];
  return low | (high << 16);
}
// int8: the word's bytes were stored as q + 128 (the upload flips the sign
// bit) so byte_perm can place byte i under an 0x64 high byte: fp16 1024 + q
// + 128; subtracting 1152 leaves q exactly. `selector` picks bytes (0, 1) or (2, 3).
__device__ __forceinline__ std::uint32_t int8_pair(std::uint32_t biased_word, unsigned selector) {
  constexpr std::uint32_t kHalf2Of1152 = 0x64806480u;
  return sub_f16x2(__byte_perm(biased_word, 0x64646464u, selector), kHalf2Of1152);
}

// --- Staging x.
//
// Staging runs while the weight loads are in flight; what it must not do is
// wait for its own loads one at a time. So every load below is
// unconditional, in straight-line unrolled code: an address that would be
// out of range is clamped to a valid one and the value is replaced by 0
// afterwards. The compiler can then issue all of a batch's loads before the
// first one returns (one round trip per batch, not one per row).

// 4 activations as loaded: 16 bytes of fp32 or 8 bytes of fp16 (4 halves).
template <class Act>
using RawUnit = std::conditional_t<std::is_same_v<Act, float>, float4, uint2>;

// Loads 4 activations of one row at `column` as one vector, or (at the end
// of a row, or when the host found x unaligned) one at a time with each
// column clamped into the row; either way always from a valid address.
template <class Act>
__device__ __forceinline__ RawUnit<Act> load_unit(const Act* row, int column, int in, bool vector_unit) {
  if constexpr (std::is_same_v<Act, float>) {
    if (vector_unit) return __ldg(reinterpret_cast<const float4*>(row + column));
    return make_float4(__ldg(row + min(column, in - 1)), __ldg(row + min(column + 1, in - 1)),
                       __ldg(row + min(column + 2, in - 1)), __ldg(row + min(column + 3, in - 1)));
  } else {
    if (vector_unit) return __ldg(reinterpret_cast<const uint2*>(row + column));
    const auto bits = [&](int i) -> std::uint32_t { return __half_as_ushort(__ldg(row + min(column + i, in - 1))); };
    return make_uint2(bits(0) | (bits(1) << 16), bits(2) | (bits(3) << 16));
  }
}

template <class Act>
__device__ __forceinline__ float unit_value(const RawUnit<Act>& raw, int i) {
  if constexpr (std::is_same_v<Act, float>) {
    return i == 0 ? raw.x : i == 1 ? raw.y : i == 2 ? raw.z : raw.w;
  } else {
    const std::uint32_t word = i < 2 ? raw.x : raw.y;
    return __half2float(__ushort_as_half(static_cast<unsigned short>(i % 2 == 0 ? word & 0xFFFF : word >> 16)));
  }
}

// One unit of 4 columns of x, [column, column + 4), rows 0 .. kRows - 1,
// into shared memory as fp16: row r's two words at dst + r * stride_words
// (one 64-bit store per row). Columns >= in_features and rows >= `rows` are
// 0, so padded weights (and the MMA tile's tokens past the batch) multiply
// zeros. With AWQ input scales, x / s is what is staged (y = Q(W diag(s))
// (x / s)). Rows are loaded in batches of 16 registers (4 rows of fp32, 8
// of fp16): what fits beside the weights and group parameters already in
// flight.
template <class Act, int kRows>
__device__ __forceinline__ void stage_x_unit(std::uint32_t* dst, int stride_words, const DeviceMatrixView& m,
                                             const Act* x, int rows, int column, bool vector_x) {
  constexpr int kBatchRows = std::is_same_v<Act, float> ? 4 : 8;
  const int in = m.in_features;
  float inverse_scale[4] = {1.0f, 1.0f, 1.0f, 1.0f};  // and 0 past in_features
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (m.inverse_input_scales != nullptr) inverse_scale[i] = __ldg(m.inverse_input_scales + min(column + i, in - 1));
    if (column + i >= in) inverse_scale[i] = 0.0f;
  }
  // The 4-wide load needs the whole unit inside the row and the host's
  // alignment check (in_features % 4 == 0, x aligned to 4 activations).
  const bool vector_unit = vector_x && column + 3 < in;
  // Not unrolled: the compiler would hoist every batch's loads to the top
  // and need registers for all of them at once.
#pragma unroll 1
  for (int batch = 0; batch < kRows; batch += kBatchRows) {
    RawUnit<Act> raw[kBatchRows];
#pragma unroll
    for (int r = 0; r < kBatchRows; ++r)  // rows past the batch re-read the last row (discarded below)
      raw[r] = load_unit(x + static_cast<std::size_t>(min(batch + r, rows - 1)) * in, column, in, vector_unit);
#pragma unroll
    for (int r = 0; r < kBatchRows; ++r) {
      const bool token_exists = batch + r < rows;
      std::uint32_t h[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)  // x * 0 would keep a NaN or inf of a discarded row: select instead
        h[i] = half_bits(token_exists && column + i < in ? unit_value<Act>(raw[r], i) * inverse_scale[i] : 0.0f);
      // fp16 -> fp32 -> fp16 is exact: the A16 path stages x unchanged.
      *reinterpret_cast<uint2*>(dst + (batch + r) * stride_words) =
          make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
    }
  }
}

// NF4's 16 levels as fp16 bits into shared memory (threads 0..15; visible
// after the next barrier).
__device__ __forceinline__ void stage_nf4_levels(unsigned short* levels) {
  if (threadIdx.x < 16) levels[threadIdx.x] = static_cast<unsigned short>(half_bits(kNf4LevelsDevice[threadIdx.x]));
}

// --- Weights.

// One step of a warp's tile: its lane's 16 bytes of rows 0-7 and of rows
// 8-15. __ldcs (ld.global.cs, "cache streaming"): lines are allocated
// evict-first in L1 and L2. The weights are read exactly once per launch,
// so they should not push x, the scales or the partial sums (read again)
// out of L2. It exists on every architecture and needs no cache-policy
// register (sm_80's L2::evict_first cache hints would be the finer tool).
__device__ __forceinline__ void load_step_codes(uint4 (&codes)[2], const uint4* step_codes) {
  codes[0] = __ldcs(step_codes);
  codes[1] = __ldcs(step_codes + kWarpSize);
}

// --- The math of one step.
//
// acc[nt] is a warp's 16 x 8 output tile for tokens [8 nt, 8 nt + 8) in the
// D-fragment layout (mma_16x8x16). x_* point at the lane's B operands in a
// staged x: token g (+ 8 nt rows of x_stride_words), columns 4t.. of each 16.

// The A fragment of MMA 2w + h of a 4-bit word: a0 and a2 are row g's nibble
// pairs (2h, 2h + 4) and (2h + 1, 2h + 5) of `low`, a1 and a3 the same pairs
// of row g + 8 (`high`), fp16x2 each (mma_16x8x16). `zeros` = z(row g) |
// z(row g + 8) << 8 (int4 asymmetric's zero table entry). `report_exercise`:
// the thread's first word of the launch.
template <QuantScheme kScheme>
__device__ __forceinline__ void int4_fragments(std::uint32_t low, std::uint32_t high, int h, unsigned zeros,
                                               const unsigned short* nf4_levels,
                                               [[maybe_unused]] bool report_exercise, std::uint32_t& a0,
                                               std::uint32_t& a1, std::uint32_t& a2, std::uint32_t& a3) {
  if constexpr (kScheme == QuantScheme::NF4) {
    static_cast<void>(zeros);
    a0 = nf4_pair(low, 2 * h, nf4_levels), a2 = nf4_pair(low, 2 * h + 1, nf4_levels);
    a1 = nf4_pair(high, 2 * h, nf4_levels), a3 = nf4_pair(high, 2 * h + 1, nf4_levels);
  } else {
    static_cast<void>(nf4_levels);
    // BEGIN EXERCISE ex06.3
    // STUB: if (report_exercise && h == 0) LLM_CUDA_EXERCISE_TODO("ex06.3");  // one line per launch
    // STUB: a0 = a1 = a2 = a3 = half_bits(llm::cuda::device::exercise_nan()) * 0x00010001u;  // NaN pairs
    // The classic trick (there is no int -> fp16 conversion
    // instruction): (word >> 4k) & 0x000F000F keeps nibble k in
    // the low half and nibble k + 4 in the high half; OR-ing
    // 0x6400 (fp16 1024, whose mantissa step is exactly 1) makes
    // each half the fp16 number 1024 + code. Subtracting 1024 +
    // zero (also exact) leaves code - zero: the integer the
    // group's scale multiplies after the MMA. The mask and the OR
    // are one instruction (and_or).
    // fp16x2 (1024 + zero) of rows g (zero_low) and g + 8 (zero_high);
    // int4 symmetric's zero is 8 for every row (codes 1..15 stand for -7..7).
    std::uint32_t zero_low = 0x64086408u, zero_high = 0x64086408u;
    if constexpr (kScheme == QuantScheme::Int4Asymmetric) {
      // The group's zero points, z(row g) | z(row g + 8) << 8, each
      // byte placed under an 0x64 high byte in both halves.
      zero_low = __byte_perm(zeros, 0x64646464u, 0x4040);
      zero_high = __byte_perm(zeros, 0x64646464u, 0x4141);
    }
    constexpr std::uint32_t kHalf2Of1024 = 0x64006400u;  // fp16 bits of (1024, 1024)
    const auto code_minus_zero = [](std::uint32_t word, int k, std::uint32_t zero_pair) {
      return sub_f16x2(and_or<0x000F000Fu, kHalf2Of1024>(word >> (4 * k)), zero_pair);
    };
    a0 = code_minus_zero(low, 2 * h, zero_low), a2 = code_minus_zero(low, 2 * h + 1, zero_low);
    a1 = code_minus_zero(high, 2 * h, zero_high), a3 = code_minus_zero(high, 2 * h + 1, zero_high);
    // END EXERCISE ex06.3
  }
}

// 4-bit: word w of a lane's 16 bytes covers 32 columns (2 MMAs), which lie in
// one group (groups are whole multiples of 32 columns). Its product is formed
// from exact integers, then scaled by the group's scale pair (rows g, g + 8)
// in fp32. x_word: the lane's B operand of the word's first MMA.
template <QuantScheme kScheme, int kNTiles>
__device__ __forceinline__ void multiply_int4_word(float (&acc)[kNTiles][4], std::uint32_t low, std::uint32_t high,
                                                   const std::uint32_t* x_word, int x_stride_words, __half2 scale,
                                                   unsigned zeros, const unsigned short* nf4_levels,
                                                   bool report_exercise) {
  float part[kNTiles][4];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) part[nt][0] = part[nt][1] = part[nt][2] = part[nt][3] = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // MMA 2w + h: nibble pairs 2h (a0, a1) and 2h + 1 (a2, a3)
    std::uint32_t a0, a1, a2, a3;
    int4_fragments<kScheme>(low, high, h, zeros, nf4_levels, report_exercise, a0, a1, a2, a3);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const uint2 b = *reinterpret_cast<const uint2*>(x_word + 8 * h + 8 * nt * x_stride_words);
      mma_16x8x16<false>(part[nt], {a0, a1, a2, a3}, b.x, b.y);
    }
  }
  const float2 s = __half22float2(scale);
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    acc[nt][0] = fmaf(s.x, part[nt][0], acc[nt][0]);
    acc[nt][1] = fmaf(s.x, part[nt][1], acc[nt][1]);
    acc[nt][2] = fmaf(s.y, part[nt][2], acc[nt][2]);
    acc[nt][3] = fmaf(s.y, part[nt][3], acc[nt][3]);
  }
}

// int8: word w of a lane's 16 bytes is MMA w (16 columns); int8_pair takes
// bytes 0, 1 for a0 and 2, 3 for a2 in place. One group per row: the sums
// stay unscaled until the end (scale_rows).
template <int kNTiles>
__device__ __forceinline__ void multiply_int8_word(float (&acc)[kNTiles][4], std::uint32_t low, std::uint32_t high,
                                                   const std::uint32_t* x_word, int x_stride_words) {
  const std::uint32_t a0 = int8_pair(low, 0x4140), a2 = int8_pair(low, 0x4342);
  const std::uint32_t a1 = int8_pair(high, 0x4140), a3 = int8_pair(high, 0x4342);
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const uint2 b = *reinterpret_cast<const uint2*>(x_word + 8 * nt * x_stride_words);
    mma_16x8x16<false>(acc[nt], {a0, a1, a2, a3}, b.x, b.y);
  }
}

// A 4-bit word's group parameters as the lane reads them.
struct WordScale {
  __half2 scale;   // rows g, g + 8
  unsigned zeros;  // z(row g) | z(row g + 8) << 8 (int4 asymmetric), else unused
};

// One step of a warp's tile: codes[0] (rows 0-7) and codes[1] (rows 8-15),
// 4 words each, against the staged x at x_step (the step's first column).
// word_params(w) gives word w's group parameters (4-bit only; called once
// per word, in order).
template <QuantScheme kScheme, int kNTiles, class WordParams>
__device__ __forceinline__ void multiply_step(float (&acc)[kNTiles][4], const uint4 (&codes)[2],
                                              const std::uint32_t* x_step, int x_stride_words,
                                              const unsigned short* nf4_levels, bool first_step,
                                              WordParams&& word_params) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    // The lane's codes of this word: rows g (low) and g + 8 (high).
    const std::uint32_t low = word_of(codes[0], w), high = word_of(codes[1], w);
    if constexpr (kScheme == QuantScheme::Int8PerChannel) {
      multiply_int8_word<kNTiles>(acc, low, high, x_step + 8 * w, x_stride_words);
    } else {
      const WordScale params = word_params(w);
      multiply_int4_word<kScheme, kNTiles>(acc, low, high, x_step + 16 * w, x_stride_words, params.scale,
                                           params.zeros, nf4_levels, first_step && w == 0);
    }
  }
}

// int8: the unscaled sums times the rows' scale pair (rows g, g + 8).
template <int kNTiles>
__device__ __forceinline__ void scale_rows(float (&acc)[kNTiles][4], __half2 scale_pair) {
  const float2 scale = __half22float2(scale_pair);
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    acc[nt][0] *= scale.x, acc[nt][1] *= scale.x;
    acc[nt][2] *= scale.y, acc[nt][3] *= scale.y;
  }
}

// y for a warp's tile: D fragment element i of tile nt is (row g + 8 (i /
// 2), token 8 nt + 2t + i % 2); rows past the matrix and tokens past the
// batch are not written.
template <class Act, int kNTiles>
__device__ __forceinline__ void write_output_tile(const float (&acc)[kNTiles][4], const DeviceMatrixView& m,
                                                  int tile_row0, int g, int t, int rows, Act* y) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = tile_row0 + g + 8 * (i / 2), token = 8 * nt + 2 * t + i % 2;
      if (row < m.out_features && token < rows)
        y[static_cast<std::size_t>(token) * m.out_features + row] = from_float<Act>(acc[nt][i] * m.output_scale);
    }
}

template <int kNTiles>
__device__ __forceinline__ void zero_tile(float (&acc)[kNTiles][4]) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
}

// Calls f with the scheme as a compile-time constant (std::integral_constant):
// the one switch from a matrix's run-time scheme to the kernels' template.
template <class F>
decltype(auto) with_scheme(QuantScheme scheme, F&& f) {
  switch (scheme) {
    case QuantScheme::Int8PerChannel:
      return f(std::integral_constant<QuantScheme, QuantScheme::Int8PerChannel>{});
    case QuantScheme::Int4Asymmetric:
      return f(std::integral_constant<QuantScheme, QuantScheme::Int4Asymmetric>{});
    case QuantScheme::Int4Symmetric:
      return f(std::integral_constant<QuantScheme, QuantScheme::Int4Symmetric>{});
    case QuantScheme::NF4:
      break;
  }
  return f(std::integral_constant<QuantScheme, QuantScheme::NF4>{});
}

}  // namespace step06::quantized_mma
