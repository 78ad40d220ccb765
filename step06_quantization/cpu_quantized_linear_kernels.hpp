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

// The kernels by tile height: kernels[n - 1] runs n rows.
template <template <int> class Kernel, std::size_t... kIndex>
constexpr auto tile_table(std::index_sequence<kIndex...>) {
  return std::array<TileKernel, sizeof...(kIndex)>{Kernel<kIndex + 1>::run...};
}

// The tile kernels of `scheme` by tile height (kernels[n - 1] runs n rows),
// in cpu_quantized_linear_avx2.cpp and cpu_quantized_linear_avx512.cpp. Call
// them only on a CPU that runs the instruction set.
std::span<const TileKernel> avx2_tile_kernels(QuantScheme scheme);
std::span<const TileKernel> avx512_tile_kernels(QuantScheme scheme);

#endif  // STEP06_X86_KERNELS

}  // namespace step06::cpu_kernels
