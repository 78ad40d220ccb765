#pragma once
// What cpu_quantized_linear.cpp shares with its tuned kernels,
// cpu_quantized_linear_avx2.cpp and cpu_quantized_linear_avx512.cpp: the
// product a tile kernel computes, the tile kernels' type, and the small
// helpers both instruction sets use. Internal to step 06's CPU product
// (cpu_quantized_linear.hpp is the interface); docs/06_quantization.md,
// section 6.2, explains the tiles.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <span>
#include <utility>

#include "step06_quantization/quant_format.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define STEP06_X86_KERNELS 1
#include <immintrin.h>
// A function compiled for an instruction set the build's -march may not
// include; only called after __builtin_cpu_supports said the CPU has it.
// (GCC: a lambda does not inherit its function's target; the kernels use none.)
#define STEP06_AVX2 __attribute__((target("avx2,fma")))
#define STEP06_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma")))
#define STEP06_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline
#define STEP06_AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx2,fma"), always_inline)) inline
// The int8-activation kernels on AVX-512 add VNNI (vpdpbusd) and VL (byte
// masks on 256-bit loads).
#define STEP06_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))
#define STEP06_AVX512_VNNI_INLINE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma"), always_inline)) inline
#else
#define STEP06_X86_KERNELS 0
#endif

namespace step06::cpu_kernels {

// Columns in the unit every SIMD kernel decodes at once: 16 bytes of 4-bit
// codes, 32 bytes of int8 codes. Every 4-bit group is whole units (the format
// requires group sizes that are multiples of 32).
constexpr int kBlockColumns = 32;

struct Product {
  const QuantizedMatrix* matrix = nullptr;
  const float* x = nullptr;  // prepared [rows, x_stride]
  int x_stride = 0;          // floats per prepared row: whole 32-column blocks
  // [rows, groups_per_row]: the sum of each group's prepared x (the AVX2 int4
  // kernels' zero-point term), else nullptr.
  const float* group_sums = nullptr;
  float* y = nullptr;  // [rows, out_features]
};

// Computes y for output features [out_begin, out_end) and the tile of rows
// starting at first_row; the number of rows is the kernel's template argument.
using TileKernel = void (*)(const Product& product, int out_begin, int out_end, int first_row);

// AVX-512's prepared x for the int8-activation kernels: one record per 64
// columns of a row (two 32-column blocks), everything one step of a kernel
// reads for that row, in one place (one pointer per row of the tile).
struct alignas(64) Int8PairOfBlocks {
  std::int8_t codes[64];  // x's codes in the kernel's order (0 past the real columns)
  float lane_scales[16];  // the block scale of each vpdpbusd lane's 4 codes
  // The value each lane's dot product starts from: -offset times the sum of
  // its 4 codes, with offset 128 (int8 weights, read as w + 128) or 8 (int4
  // symmetric, stored as q = w + 8), so that it sums w * x exactly in int32;
  // 0 for int4 with zero points.
  std::int32_t lane_offsets[16];
};

// The product with int8 activations (int8_activations.hpp), prepared for one
// SIMD level: x's codes in the order that level's kernels read them.
struct Int8Product {
  const QuantizedMatrix* matrix = nullptr;
  // AVX-512: [rows, pairs_per_row] records.
  const Int8PairOfBlocks* x_pairs = nullptr;
  int pairs_per_row = 0;
  // AVX2: [rows, x_stride] codes (0 past the real columns) and [rows,
  // scales_stride] block scales, one per 32 columns.
  const std::int8_t* x_codes = nullptr;
  int x_stride = 0;
  const float* x_scales = nullptr;
  int scales_stride = 0;
  // [rows, groups_per_row] for int4 asymmetric weights, and int4 symmetric
  // on AVX2: per weight group, the sum over its blocks of block scale * sum
  // of the block's codes (what the zero point multiplies), else nullptr.
  const float* zero_point_terms = nullptr;
  float* y = nullptr;  // [rows, out_features]
};
using Int8TileKernel = void (*)(const Int8Product& product, int out_begin, int out_end, int first_row);

// The tiles. An FMA's result can be added to again only 4 cycles later, and a
// core starts 2 per cycle: 8 independent accumulators must be in flight or the
// FMA units wait. A tile of R rows x P outputs has R * P accumulators; with
// 1-2 rows each sum is also split in two chains (the even and odd vectors of
// a unit). AVX-512 (32 registers): tiles of up to 4 rows x 4 outputs (16
// accumulators, 8 vectors of x, 2 weights, 4 tables). AVX2 (16 registers):
// up to 4 rows, with ~8 accumulators (see each kernel).

// Chains per row: two when the tile has 1-2 rows, else one.
constexpr int chains_per_row(int rows) { return rows <= 2 ? 2 : 1; }

// The 32-column units of group g that hold real columns. The last group of a
// row may be mostly padding (in 288 with groups of 128: 1 real unit of 4):
// padded codes read back as 0 and meet x = 0, so those units are skipped.
inline int units_in_group(const QuantizedMatrix& m, int g) {
  const int columns_left = m.in_features - g * m.group_columns;
  return std::min(m.group_columns, columns_left + kBlockColumns - 1) / kBlockColumns;
}

#if STEP06_X86_KERNELS

// Returns v, pinned in a register. With several output features at once, each
// vector of x is used once per output feature; GCC folds the load into every
// FMA that uses it (a memory operand looks free) and loads x 2-4 times where
// once will do (the batch-1 int4 loop is faster with x loaded once per unit
// and pinned). The empty asm emits nothing; it only tells the compiler that
// the value must be in a register at this point.
STEP06_AVX2_INLINE __m256 in_register(__m256 v) {
  asm("" : "+x"(v));
  return v;
}
STEP06_AVX512_INLINE __m512 in_register(__m512 v) {
  asm("" : "+v"(v));  // "v": any of the 32 vector registers
  return v;
}

// sums[i] = the sum of the 8 lanes of v[i]. Four vectors at a time: two
// rounds of vhaddps (pairwise sums of neighbours, interleaving two vectors)
// leave [v0 v1 v2 v3] partial sums in each 128-bit half; adding the halves
// finishes them: 4 results for 5 instructions instead of 4 x 5.
template <int kCount>
STEP06_AVX2_INLINE void sum_each_avx2(const __m256 (&v)[kCount], float (&sums)[kCount]) {
  for (int first = 0; first < kCount; first += 4) {
    __m256 four[4];
    for (int i = 0; i < 4; ++i) four[i] = first + i < kCount ? v[first + i] : _mm256_setzero_ps();
    const __m256 pairs = _mm256_hadd_ps(_mm256_hadd_ps(four[0], four[1]), _mm256_hadd_ps(four[2], four[3]));
    alignas(16) float four_sums[4];
    _mm_store_ps(four_sums, _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1)));
    for (int i = 0; i < 4 && first + i < kCount; ++i) sums[first + i] = four_sums[i];
  }
}

// sums[i] = the sum of the 16 lanes of v[i], for many vectors at once (what
// _mm512_reduce_add_ps does for one in ~8 instructions). Four vectors fold
// into one in two rounds of vshuff32x4 (moves whole 128-bit lanes) + add: each
// 128-bit lane k then holds 4 partial sums of v[k]. Two such vectors finish
// with vunpcklps/vunpckhps + add and a swap of 64-bit halves + add: element 0
// of lane k is the sum of the first's v[k], element 1 the second's. 8 results
// for 23 instructions instead of 8 x 8.
template <int kCount>
STEP06_AVX512_INLINE void sum_each_avx512(const __m512 (&v)[kCount], float (&sums)[kCount]) {
  if constexpr (kCount == 1) {
    sums[0] = _mm512_reduce_add_ps(v[0]);
  } else {
    for (int first = 0; first < kCount; first += 8) {
      __m512 eight[8];  // v[first .. first + 7], zeros past the end
      for (int i = 0; i < 8; ++i) eight[i] = first + i < kCount ? v[first + i] : _mm512_setzero_ps();
      __m512 quads[2];  // quads[h]: 128-bit lane k holds 4 partial sums of eight[4h + k]
      quads[1] = _mm512_setzero_ps();
      for (int h = 0; h < (first + 4 < kCount ? 2 : 1); ++h) {
        const __m512* four = eight + 4 * h;
        // [a.L0+a.L2, a.L1+a.L3, b.L0+b.L2, b.L1+b.L3] for the pairs (a, b) = (v0, v1), (v2, v3).
        const __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(four[0], four[1], 0x44),
                                         _mm512_shuffle_f32x4(four[0], four[1], 0xEE));
        const __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(four[2], four[3], 0x44),
                                         _mm512_shuffle_f32x4(four[2], four[3], 0xEE));
        // Lanes 0+1 of v01 are v0's, 2+3 v1's: pick even lanes, odd lanes, add.
        quads[h] = _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, 0x88), _mm512_shuffle_f32x4(v01, v23, 0xDD));
      }
      // Per 128-bit lane, [a0 a1 a2 a3] and [b0 b1 b2 b3] -> [a0+a2, b0+b2, a1+a3, b1+b3] -> [sum a, sum b, ..].
      __m512 pairs = _mm512_add_ps(_mm512_unpacklo_ps(quads[0], quads[1]), _mm512_unpackhi_ps(quads[0], quads[1]));
      pairs = _mm512_add_ps(pairs, _mm512_permute_ps(pairs, 0x4E));  // 0x4E: swap the 64-bit halves of each lane
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, pairs);
      for (int k = 0; k < 4; ++k) {
        if (first + k < kCount) sums[first + k] = lanes[4 * k];
        if (first + 4 + k < kCount) sums[first + 4 + k] = lanes[4 * k + 1];
      }
    }
  }
}

// The kernels by tile height: kernels[n - 1] runs n rows.
template <template <int> class Kernel, std::size_t... kIndex>
constexpr auto tile_table(std::index_sequence<kIndex...>) {
  using KernelType = decltype(Kernel<1>::run);
  return std::array<std::remove_const_t<KernelType>, sizeof...(kIndex)>{Kernel<kIndex + 1>::run...};
}

// The int8-activation tile kernels of one SIMD level for `scheme`, given that
// level's tables by weight scheme (empty for NF4, whose levels are not
// integers; check_matrix refuses it).
inline std::span<const Int8TileKernel> int8_activation_kernels_for(QuantScheme scheme,
                                                                   std::span<const Int8TileKernel> int8_weights,
                                                                   std::span<const Int8TileKernel> int4_asymmetric,
                                                                   std::span<const Int8TileKernel> int4_symmetric) {
  switch (scheme) {
    case QuantScheme::Int8PerChannel: return int8_weights;
    case QuantScheme::Int4Asymmetric: return int4_asymmetric;
    case QuantScheme::Int4Symmetric: return int4_symmetric;
    case QuantScheme::NF4: return {};
  }
  return {};
}

// The tile kernels of `scheme` by tile height (kernels[n - 1] runs n rows),
// in cpu_quantized_linear_avx2.cpp and cpu_quantized_linear_avx512.cpp. Call
// them only on a CPU that runs the instruction set.
std::span<const TileKernel> avx2_tile_kernels(QuantScheme scheme);
std::span<const TileKernel> avx512_tile_kernels(QuantScheme scheme);
// The same with int8 activations (int8, int4 asymmetric and symmetric
// weights; empty for NF4), in cpu_quantized_linear_a8_avx2.cpp and
// cpu_quantized_linear_a8_avx512.cpp (AVX-512 VNNI).
std::span<const Int8TileKernel> a8_avx2_tile_kernels(QuantScheme scheme);
std::span<const Int8TileKernel> a8_avx512_tile_kernels(QuantScheme scheme);

#endif  // STEP06_X86_KERNELS

}  // namespace step06::cpu_kernels
