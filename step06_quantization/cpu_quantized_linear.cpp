// The quantized product on the CPU (cpu_quantized_linear.hpp):
//   y[rows, out_features] = x[rows, in_features] . W~^T,   W~ = dequantize(matrix),
// computed from the packed codes; no dequantized copy of W is ever written.
//
// Every scheme has three kernels:
//   portable  plain C++, one weight at a time, exactly as dequantize() defines
//             it: the reference to read first.
//   avx2      8 floats per register (AVX2 + FMA, 16 registers).
//   avx512    16 floats per register (AVX-512 F + BW, 32 registers).
// The SIMD kernels are compiled with per-function target attributes, so one
// binary carries all three and picks at run time from what the CPU reports:
// the -march of the build never decides which kernel runs.
//
// What the SIMD kernels share (and why it is fast):
//  * x is prepared once per call into a scratch buffer: divided by the input
//    scales (AWQ), zero-padded to whole 32-column blocks (a padded code reads
//    back as 0 and meets x = 0, so there is no tail loop over x), and, for
//    4-bit codes, put in the order the codes come out of their bytes (see
//    prepare_input). That is rows * in floats, nothing next to W's size.
//  * At one row, unpacking is the cost, not memory: an int4 weight is half a
//    byte, but turning 32 of them into two vectors of floats and two FMAs
//    takes ~6 vector instructions, and the AMD EPYC (Zen 5) core this was
//    measured on runs about 2 of those per cycle: ~30 G weights/s, 16 GB/s of
//    int4 codes, where the int8 kernel (3 instructions per 16 weights) streams
//    40+ GB/s. So the kernels count instructions per weight: the AVX-512 int4
//    kernels turn a code into its finished fp32 weight with one table lookup
//    (vpermps), AVX2 moves the scale and zero point out of the inner loop
//    (algebra), int8 applies its one scale per row at the end.
//  * Register tiles of R rows of x by P output features: each unpacked weight
//    vector is FMA'd into R rows while it is in a register, each vector of x
//    into P outputs (loads per FMA: 1/P + 1/(2R)). Measured on int4-g64
//    [768, 288]: 16 rows x 1 output ran at 37 GMAC/s, 4 x 4 at 70.
//  * Output features are walked in blocks of ~8 KB of codes and, within a
//    block, rows of x tile by tile: the block's codes come from memory for the
//    first tile and from L1 for the others, so W is read from memory once per
//    call for up to 16 rows of x, and once per 16 rows beyond that.
#include "step06_quantization/cpu_quantized_linear.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "llm/errors.hpp"

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

namespace step06 {

namespace {

// Rows of x per pass over W: up to this many rows, every weight is read from
// memory once; beyond, once per pass.
constexpr int kRowsPerPass = 16;
// Columns in the unit every SIMD kernel decodes at once: 16 bytes of 4-bit
// codes, 32 bytes of int8 codes. Every 4-bit group is whole units (the format
// requires group sizes that are multiples of 32).
constexpr int kBlockColumns = 32;
// Bytes of codes per block of output features: the block stays in L1 (32-48
// KB) beside the prepared x while every row tile runs over it.
constexpr std::size_t kCodeBytesPerOutputBlock = 8 * 1024;

bool is_four_bit(QuantScheme scheme) { return scheme != QuantScheme::Int8PerChannel; }

// Throws InputError unless the matrix's sizes are consistent (what every
// kernel below relies on to stay inside its buffers).
void check_matrix(const QuantizedMatrix& m) {
  const bool four_bit = is_four_bit(m.format.scheme);
  const std::size_t out = static_cast<std::size_t>(std::max(m.out_features, 0));
  const std::size_t groups = out * static_cast<std::size_t>(std::max(m.groups_per_row, 0));
  const bool consistent =
      m.out_features > 0 && m.in_features > 0 && m.group_columns > 0 && m.groups_per_row > 0 &&
      m.padded_in == m.groups_per_row * m.group_columns && m.padded_in >= m.in_features &&
      m.padded_in - m.group_columns < m.in_features && (!four_bit || m.group_columns % kBlockColumns == 0) &&
      m.packed.size() == out * m.bytes_per_row() && m.scales.size() == groups &&
      m.zeros.size() == (m.format.has_zero_points() ? groups : 0) &&
      (m.input_scales.empty() || m.input_scales.size() == static_cast<std::size_t>(m.in_features));
  if (!consistent)
    throw llm::InputError(fmt::format(
        "quantized product: the {} matrix [{}, {}] is inconsistent (group {}, {} groups per row, padded to {}; {} "
        "code bytes, {} scales, {} zero points, {} input scales)",
        m.format.name(), m.out_features, m.in_features, m.group_columns, m.groups_per_row, m.padded_in,
        m.packed.size(), m.scales.size(), m.zeros.size(), m.input_scales.size()));
  // The AVX-512 kernels index a 16-row table with the zero point. (A scan of
  // out * groups bytes: done once per QuantizedLinear, once per call of the
  // free function.)
  const auto zero_out_of_range = std::find_if(m.zeros.begin(), m.zeros.end(), [](std::uint8_t z) { return z > 15; });
  if (zero_out_of_range != m.zeros.end())
    throw llm::InputError(fmt::format("quantized product: the {} matrix has zero point {} (group {}), outside [0, 15]",
                                      m.format.name(), *zero_out_of_range, zero_out_of_range - m.zeros.begin()));
}

// ---------------------------------------------------------------------------
// The prepared input.

// The 4-bit kernels' order of x. A byte of 4-bit codes holds column 2j in its
// low nibble and 2j + 1 in its high one, so one 16-byte unit of 32 columns
// splits into a vector of its even columns (the low nibbles) and one of its
// odd columns (the high nibbles). x is stored the same way, block by block:
// [x0 x2 ... x30 | x1 x3 ... x31], so both vectors multiply plain contiguous
// loads of x.
enum class InputOrder { Natural, EvenOdd };

// prepared [rows, stride]: x [rows, in] divided column by column by the input
// scales (if any), each row zero-padded from in to stride, columns in `order`.
// (Run once per call: for a small layer at one row it is a visible part of
// the call, so the loops are the plain ones a compiler vectorizes.)
void prepare_input(const QuantizedMatrix& m, const float* x, int rows, int stride, InputOrder order,
                   std::vector<float>& prepared) {
  const int in = m.in_features;
  prepared.resize(static_cast<std::size_t>(rows) * stride);
  for (int r = 0; r < rows; ++r) {
    const float* x_row = x + static_cast<std::size_t>(r) * in;
    float* row = prepared.data() + static_cast<std::size_t>(r) * stride;
    if (m.input_scales.empty()) {
      std::copy(x_row, x_row + in, row);
    } else {
      for (int column = 0; column < in; ++column) row[column] = x_row[column] / m.input_scales[column];
    }
    std::fill(row + in, row + stride, 0.0f);
    if (order == InputOrder::EvenOdd) {
      // Each 32-column block to [evens | odds], through a copy of the block.
      for (int block = 0; block < stride; block += kBlockColumns) {
        float natural[kBlockColumns];
        std::copy(row + block, row + block + kBlockColumns, natural);
        for (int j = 0; j < kBlockColumns / 2; ++j) {
          row[block + j] = natural[2 * j];
          row[block + kBlockColumns / 2 + j] = natural[2 * j + 1];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The portable kernel: the reference, in plain C++. y[r, o] is the sum over
// output o's groups of the sum over the group's columns of w~ * x[r, column],
// with every w~ exactly as dequantize() computes it: a 4-bit code stands for
// one of 16 values in its group, computed once per group with code_value()
// and looked up per weight; an int8 weight is its code times the row's scale.
// Output features outer: a row of codes (a few hundred bytes) comes from
// memory once and stays in L1 for every row of x.

// x: prepared [rows, in_features] (natural order, input scales divided out).
void matmul_portable(const QuantizedMatrix& m, const float* x, int rows, float* y) {
  const bool four_bit = is_four_bit(m.format.scheme);
  for (int o = 0; o < m.out_features; ++o) {
    const std::uint8_t* codes = m.packed.data() + static_cast<std::size_t>(o) * m.bytes_per_row();  // row o
    for (int r = 0; r < rows; ++r) y[static_cast<std::size_t>(r) * m.out_features + o] = 0.0f;
    for (int g = 0; g < m.groups_per_row; ++g) {
      const GroupParams params = m.params(o, g);
      float values[16] = {};  // 4-bit: values[code] = the weight the code stands for in this group
      if (four_bit)
        for (int code = 0; code < 16; ++code) values[code] = code_value(m.format.scheme, code, params);
      const int first = g * m.group_columns;
      const int end = std::min(m.in_features, first + m.group_columns);
      for (int r = 0; r < rows; ++r) {
        const float* x_row = x + static_cast<std::size_t>(r) * m.in_features;
        float group_sum = 0.0f;
        for (int column = first; column < end; ++column) {
          // Byte j of a 4-bit row: column 2j in the low nibble, 2j + 1 in the high one.
          const float weight =
              four_bit ? values[column % 2 == 0 ? codes[column / 2] & 0x0F : codes[column / 2] >> 4]
                       : static_cast<float>(static_cast<std::int8_t>(codes[column])) * params.scale;
          group_sum += weight * x_row[column];
        }
        y[static_cast<std::size_t>(r) * m.out_features + o] += group_sum;
      }
    }
  }
}

#if STEP06_X86_KERNELS

// ---------------------------------------------------------------------------
// The SIMD kernels: what they read, and the loop that hands them tiles.

int round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

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

// The loop nest around the tile kernels (kernels[n - 1] does n rows):
//   passes of 16 rows of x        (their prepared x, <= 16 * padded_in floats, stays in L1/L2)
//     blocks of output features   (~8 KB of codes: read from memory once, then from L1)
//       tiles of rows             (one kernel call: the tile's accumulators live in registers)
void run_tiles(const Product& product, int rows, std::span<const TileKernel> kernels) {
  const QuantizedMatrix& m = *product.matrix;
  const int tile_rows = static_cast<int>(kernels.size());
  for (int pass = 0; pass < rows; pass += kRowsPerPass) {
    const int pass_end = std::min(rows, pass + kRowsPerPass);
    // With one tile the codes are read once anyway: no blocks (a block's last
    // few outputs run one at a time, slower). Else blocks of whole groups of 8
    // outputs (the kernels do 2-4 at once).
    const int block_outputs =
        pass_end - pass <= tile_rows
            ? m.out_features
            : static_cast<int>(std::max<std::size_t>(8, kCodeBytesPerOutputBlock / m.bytes_per_row() / 8 * 8));
    for (int out_begin = 0; out_begin < m.out_features; out_begin += block_outputs) {
      const int out_end = std::min(m.out_features, out_begin + block_outputs);
      // The pass's rows in tiles as even as possible (5 rows: 3 + 2, not 4 + 1):
      // a tile of one row decodes every weight for one row's worth of FMAs.
      const int pass_rows = pass_end - pass;
      const int tiles = (pass_rows + tile_rows - 1) / tile_rows;
      for (int tile = 0, first_row = pass; tile < tiles; ++tile) {
        const int n = pass_rows / tiles + (tile < pass_rows % tiles ? 1 : 0);
        kernels[static_cast<std::size_t>(n - 1)](product, out_begin, out_end, first_row);
        first_row += n;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The tiles. An FMA's result can be added to again only 4 cycles later, and a
// core starts 2 per cycle: 8 independent accumulators must be in flight or the
// FMA units wait. A tile of R rows x P outputs has R * P accumulators; with
// 1-2 rows each sum is also split in two chains (the even and odd vectors of
// a unit). AVX-512 (32 registers): tiles of up to 4 rows x 4 outputs (16
// accumulators, 8 vectors of x, 2 weights, 4 tables). AVX2 (16 registers):
// up to 4 rows, with ~8 accumulators (see each kernel).

// Chains per row: two when the tile has 1-2 rows, else one.
constexpr int chains_per_row(int rows) { return rows <= 2 ? 2 : 1; }
// AVX2 int8: output features at once, for ~8 accumulators (at most 4).
constexpr int outputs_at_once(int rows) { return std::clamp(8 / (chains_per_row(rows) * rows), 1, 4); }
constexpr int kAvx2TileRows = 4;
constexpr int kAvx512TileRows = 4;
constexpr int kAvx512Outputs = 4;

// The 32-column units of group g that hold real columns. The last group of a
// row may be mostly padding (in 288 with groups of 128: 1 real unit of 4):
// padded codes read back as 0 and meet x = 0, so those units are skipped.
inline int units_in_group(const QuantizedMatrix& m, int g) {
  const int columns_left = m.in_features - g * m.group_columns;
  return std::min(m.group_columns, columns_left + kBlockColumns - 1) / kBlockColumns;
}

// The 16 values (q - z) of the codes q = 0..15, for each zero point z =
// 0..15 (1 KB, in L1): the int4 table of a group is a row of it times the
// group's scale, computed exactly as code_value() does. Row 0 is the codes
// themselves, row 8 the symmetric scheme's q - 8.
struct CodeMinusZeroTable {
  alignas(64) float values[16][16];
};
constexpr CodeMinusZeroTable make_code_minus_zero_table() {
  CodeMinusZeroTable table{};
  for (int zero = 0; zero < 16; ++zero)
    for (int code = 0; code < 16; ++code) table.values[zero][code] = static_cast<float>(code - zero);
  return table;
}
constexpr CodeMinusZeroTable kCodeMinusZero = make_code_minus_zero_table();

// Returns v, pinned in a register. With several output features at once, each
// vector of x is used once per output feature; GCC folds the load into every
// FMA that uses it (a memory operand looks free) and loads x 2-4 times where
// once will do. Measured on the batch-1 int4 loop: ~25% faster with x loaded
// once per unit and pinned. The empty asm emits nothing; it only tells the
// compiler that the value must be in a register at this point.
STEP06_AVX2_INLINE __m256 in_register(__m256 v) {
  asm("" : "+x"(v));
  return v;
}
STEP06_AVX512_INLINE __m512 in_register(__m512 v) {
  asm("" : "+v"(v));  // "v": any of the 32 vector registers
  return v;
}

// ---------------------------------------------------------------------------
// AVX2 + FMA (8 floats per __m256, 16 registers).

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

// int8 per channel: w = q * scale with one scale per output feature, so the
// kernel sums q * x over the row and multiplies by the scale once at the end.
// A 32-column unit is 4 vectors of 8: vpmovsxbd widens 8 int8 codes straight
// from memory to 8 int32 lanes, vcvtdq2ps makes them floats, and each vector
// is FMA'd into every row of the tile (4 vectors alive per output feature at a
// time; the accumulators take at most 8 of the 16 registers).
template <int kRows, int kOutputs>
STEP06_AVX2_INLINE void int8_unit_avx2(const std::uint8_t* const (&codes)[kOutputs], const float* const (&x)[kRows],
                                       int column, __m256 (&sums)[kOutputs][chains_per_row(kRows)][kRows]) {
  constexpr int kChains = chains_per_row(kRows);
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    __m256 x_k[kRows];  // the rows' x at this vector's 8 columns, shared by the output features
    for (int r = 0; r < kRows; ++r) {
      x_k[r] = _mm256_loadu_ps(x[r] + column + 8 * k);
      if constexpr (kOutputs > 1) x_k[r] = in_register(x_k[r]);
    }
#pragma GCC unroll 4
    for (int q = 0; q < kOutputs; ++q) {
      const __m128i eight_codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes[q] + 8 * k));
      const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight_codes));
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) sums[q][k % kChains][r] = _mm256_fmadd_ps(w, x_k[r], sums[q][k % kChains][r]);
    }
  }
}

// Output features o .. o + kOutputs - 1 for the tile's kRows rows.
template <int kRows, int kOutputs>
STEP06_AVX2_INLINE void int8_outputs_avx2(const Product& p, int o, int first_row, const float* const (&x)[kRows]) {
  constexpr int kChains = chains_per_row(kRows);
  const QuantizedMatrix& m = *p.matrix;
  const int whole_units = m.in_features / kBlockColumns;
  const int tail_columns = m.in_features % kBlockColumns;
  const std::uint8_t* row_codes[kOutputs];
  for (int q = 0; q < kOutputs; ++q)
    row_codes[q] = m.packed.data() + static_cast<std::size_t>(o + q) * m.bytes_per_row();
  __m256 sums[kOutputs][kChains][kRows];
  for (auto& output : sums)
    for (auto& chain : output)
      for (auto& sum : chain) sum = _mm256_setzero_ps();
  for (int unit = 0; unit < whole_units; ++unit) {
    const int column = unit * kBlockColumns;
    const std::uint8_t* unit_codes[kOutputs];
    for (int q = 0; q < kOutputs; ++q) unit_codes[q] = row_codes[q] + column;
    int8_unit_avx2<kRows, kOutputs>(unit_codes, x, column, sums);
  }
  if (tail_columns > 0) {
    // The row is not whole units (an int8 row is in_features bytes, any
    // length): copy its last codes into a zero-filled unit rather than read
    // past the row (the last row's bytes end the buffer). x is zero there.
    alignas(32) std::uint8_t tails[kOutputs][kBlockColumns] = {};
    const std::uint8_t* unit_codes[kOutputs];
    for (int q = 0; q < kOutputs; ++q) {
      std::memcpy(tails[q], row_codes[q] + whole_units * kBlockColumns, static_cast<std::size_t>(tail_columns));
      unit_codes[q] = tails[q];
    }
    int8_unit_avx2<kRows, kOutputs>(unit_codes, x, whole_units * kBlockColumns, sums);
  }
  __m256 row_sums[kOutputs * kRows];
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r)
      row_sums[q * kRows + r] = kChains == 2 ? _mm256_add_ps(sums[q][0][r], sums[q][kChains - 1][r]) : sums[q][0][r];
  float results[kOutputs * kRows];
  sum_each_avx2(row_sums, results);
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r)
      p.y[static_cast<std::size_t>(first_row + r) * m.out_features + o + q] =
          m.scales[static_cast<std::size_t>(o + q)] * results[q * kRows + r];
}

template <int kRows>
STEP06_AVX2 void int8_tile_avx2(const Product& p, int out_begin, int out_end, int first_row) {
  constexpr int kOutputs = outputs_at_once(kRows);
  const float* x[kRows];  // the tile's prepared rows
  for (int r = 0; r < kRows; ++r) x[r] = p.x + static_cast<std::size_t>(first_row + r) * p.x_stride;
  int o = out_begin;
  for (; o + kOutputs <= out_end; o += kOutputs) int8_outputs_avx2<kRows, kOutputs>(p, o, first_row, x);
  for (; o < out_end; ++o) int8_outputs_avx2<kRows, 1>(p, o, first_row, x);
}

// 4-bit schemes on AVX2. A 16-byte unit holds 32 codes; two vpmovzxbd widen
// bytes 0-7 and 8-15 to int32 lanes, and each gives two vectors: the low
// nibbles (even columns) and the high nibbles (odd columns). In the prepared
// x order [x0 x2 .. x30 | x1 x3 .. x31] they meet x at offsets 0, 8, 16, 24.
//
// AVX2 has no 16-entry float lookup in one instruction, so the codes become
// floats and the group's parameters are applied once per group, not per
// weight (algebra that moves work out of the inner loop):
//   sum_i s (q_i - z) x_i = s (sum_i q_i x_i - z sum_i x_i)
// sum_i q_i x_i is FMA'd per weight; s multiplies it once per group; and
// z sum_i x_i uses the group's sum of x, computed once per call for all output
// features (int4 asymmetric: the stored zero point; int4 symmetric: z = 8).
// NF4's codes index 16 levels: vpermps looks up 8 entries by the low 3 bits,
// so two lookups (levels 0-7 and 8-15) and a blend on bit 3 give the level.

// The 8 values of `codes` (int32 lanes whose low 4 bits are the code; higher
// bits are ignored) as floats: the code itself, or its NF4 level.
template <QuantScheme kScheme>
STEP06_AVX2_INLINE __m256 code_values_avx2(__m256i codes, __m256 nf4_levels_low, __m256 nf4_levels_high) {
  if constexpr (kScheme == QuantScheme::NF4) {
    const __m256 low = _mm256_permutevar8x32_ps(nf4_levels_low, codes);    // levels[code & 7]
    const __m256 high = _mm256_permutevar8x32_ps(nf4_levels_high, codes);  // levels[8 + (code & 7)]
    // blendv picks by each lane's sign bit: shift bit 3 of the code there.
    return _mm256_blendv_ps(low, high, _mm256_castsi256_ps(_mm256_slli_epi32(codes, 28)));
  } else {
    return _mm256_cvtepi32_ps(_mm256_and_si256(codes, _mm256_set1_epi32(0x0F)));
  }
}

// Two accumulators per row and output: the group's sum of q x, and the total
// over groups of s * (that sum). One row: 2 outputs at once, two chains per
// group sum (low and high nibbles); 2-4 rows: one output, one chain. At most 8
// accumulators, 2 weight vectors, 2-8 of x, 2 NF4 tables: the 16 registers.
constexpr int four_bit_outputs_at_once_avx2(int rows) { return rows == 1 ? 2 : 1; }

template <QuantScheme kScheme, int kRows, int kOutputs>
STEP06_AVX2_INLINE void four_bit_outputs_avx2(const Product& p, int o, int first_row, const float* const (&x)[kRows],
                                              const float* const (&x_group_sums)[kRows]) {
  constexpr int kChains = kRows == 1 ? 2 : 1;
  const QuantizedMatrix& m = *p.matrix;
  const int units_per_group = m.group_columns / kBlockColumns;
  const __m256 nf4_levels_low = _mm256_loadu_ps(kNf4Levels.data());
  const __m256 nf4_levels_high = _mm256_loadu_ps(kNf4Levels.data() + 8);
  const std::uint8_t* row_codes[kOutputs];
  std::size_t first_group[kOutputs];  // index of the output's first group in scales / zeros
  for (int q = 0; q < kOutputs; ++q) {
    row_codes[q] = m.packed.data() + static_cast<std::size_t>(o + q) * m.bytes_per_row();
    first_group[q] = static_cast<std::size_t>(o + q) * m.groups_per_row;
  }
  __m256 totals[kOutputs][kRows];     // sum over groups of s * sum q x
  float zero_terms[kOutputs][kRows];  // sum over groups of s * z * sum x
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r) {
      totals[q][r] = _mm256_setzero_ps();
      zero_terms[q][r] = 0.0f;
    }
  for (int g = 0; g < m.groups_per_row; ++g) {
    __m256 group_sums[kOutputs][kChains][kRows];
    for (auto& output : group_sums)
      for (auto& chain : output)
        for (auto& sum : chain) sum = _mm256_setzero_ps();
    for (int unit = 0; unit < units_in_group(m, g); ++unit) {
      const int column = (g * units_per_group + unit) * kBlockColumns;
      // Bytes 0-7 of the unit hold columns 0,2..14 (low nibbles: the prepared
      // x at offset 0) and 1,3..15 (high: offset 16); bytes 8-15 hold 16..30
      // (offset 8) and 17..31 (offset 24).
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        __m256 x_low[kRows], x_high[kRows];  // the rows' x for the low and the high nibbles of these 8 bytes
        for (int r = 0; r < kRows; ++r) {
          x_low[r] = _mm256_loadu_ps(x[r] + column + 8 * half);
          x_high[r] = _mm256_loadu_ps(x[r] + column + 16 + 8 * half);
          if constexpr (kOutputs > 1) {
            x_low[r] = in_register(x_low[r]);
            x_high[r] = in_register(x_high[r]);
          }
        }
#pragma GCC unroll 2
        for (int q = 0; q < kOutputs; ++q) {
          const __m256i bytes = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row_codes[q] + column / 2 + 8 * half)));
          const __m256 w_low = code_values_avx2<kScheme>(bytes, nf4_levels_low, nf4_levels_high);
          const __m256 w_high = code_values_avx2<kScheme>(_mm256_srli_epi32(bytes, 4), nf4_levels_low, nf4_levels_high);
#pragma GCC unroll 4
          for (int r = 0; r < kRows; ++r) {
            group_sums[q][0][r] = _mm256_fmadd_ps(w_low, x_low[r], group_sums[q][0][r]);
            group_sums[q][kChains - 1][r] = _mm256_fmadd_ps(w_high, x_high[r], group_sums[q][kChains - 1][r]);
          }
        }
      }
    }
    for (int q = 0; q < kOutputs; ++q) {
      const float scale = m.scales[first_group[q] + g];
      const __m256 scale_vector = _mm256_set1_ps(scale);
      for (int r = 0; r < kRows; ++r) {
        const __m256 group_sum = kChains == 2 ? _mm256_add_ps(group_sums[q][0][r], group_sums[q][kChains - 1][r])
                                              : group_sums[q][0][r];
        totals[q][r] = _mm256_fmadd_ps(group_sum, scale_vector, totals[q][r]);
      }
      if constexpr (kScheme != QuantScheme::NF4) {
        const float zero =
            kScheme == QuantScheme::Int4Asymmetric ? static_cast<float>(m.zeros[first_group[q] + g]) : 8.0f;
        for (int r = 0; r < kRows; ++r) zero_terms[q][r] += scale * zero * x_group_sums[r][g];
      }
    }
  }
  __m256 row_totals[kOutputs * kRows];
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r) row_totals[q * kRows + r] = totals[q][r];
  float results[kOutputs * kRows];
  sum_each_avx2(row_totals, results);
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r)
      p.y[static_cast<std::size_t>(first_row + r) * m.out_features + o + q] = results[q * kRows + r] - zero_terms[q][r];
}

template <QuantScheme kScheme, int kRows>
STEP06_AVX2 void four_bit_tile_avx2(const Product& p, int out_begin, int out_end, int first_row) {
  constexpr int kOutputs = four_bit_outputs_at_once_avx2(kRows);
  const QuantizedMatrix& m = *p.matrix;
  const float* x[kRows];             // the tile's prepared rows (even/odd order)
  const float* x_group_sums[kRows];  // the tile's rows of group sums of x (nullptr for NF4)
  for (int r = 0; r < kRows; ++r) {
    x[r] = p.x + static_cast<std::size_t>(first_row + r) * p.x_stride;
    x_group_sums[r] =
        p.group_sums ? p.group_sums + static_cast<std::size_t>(first_row + r) * m.groups_per_row : nullptr;
  }
  int o = out_begin;
  for (; o + kOutputs <= out_end; o += kOutputs)
    four_bit_outputs_avx2<kScheme, kRows, kOutputs>(p, o, first_row, x, x_group_sums);
  for (; o < out_end; ++o) four_bit_outputs_avx2<kScheme, kRows, 1>(p, o, first_row, x, x_group_sums);
}

// ---------------------------------------------------------------------------
// AVX-512 (16 floats per __m512, 32 registers).

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

// int8 per channel, as on AVX2 with vectors twice as wide: a 32-column unit is
// 2 vectors (vpmovsxbd: 16 int8 codes from memory to 16 int32 lanes;
// vcvtdq2ps), each FMA'd into every row of the tile, for 4 output features
// at once (each vector of x loaded once for the 4).
template <int kRows, int kOutputs>
STEP06_AVX512_INLINE void int8_unit_avx512(const std::uint8_t* const (&codes)[kOutputs],
                                           const float* const (&x)[kRows], int column,
                                           __m512 (&sums)[kOutputs][chains_per_row(kRows)][kRows]) {
  constexpr int kChains = chains_per_row(kRows);
#pragma GCC unroll 2
  for (int k = 0; k < 2; ++k) {
    __m512 x_k[kRows];  // the rows' x at this vector's 16 columns, shared by the output features
    for (int r = 0; r < kRows; ++r) {
      x_k[r] = _mm512_loadu_ps(x[r] + column + 16 * k);
      if constexpr (kOutputs > 1) x_k[r] = in_register(x_k[r]);
    }
#pragma GCC unroll 4
    for (int q = 0; q < kOutputs; ++q) {
      const __m128i sixteen_codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes[q] + 16 * k));
      const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sixteen_codes));
#pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) sums[q][k % kChains][r] = _mm512_fmadd_ps(w, x_k[r], sums[q][k % kChains][r]);
    }
  }
}

template <int kRows, int kOutputs>
STEP06_AVX512_INLINE void int8_outputs_avx512(const Product& p, int o, int first_row, const float* const (&x)[kRows]) {
  constexpr int kChains = chains_per_row(kRows);
  const QuantizedMatrix& m = *p.matrix;
  const int whole_units = m.in_features / kBlockColumns;
  const int tail_columns = m.in_features % kBlockColumns;
  const std::uint8_t* row_codes[kOutputs];
  for (int q = 0; q < kOutputs; ++q)
    row_codes[q] = m.packed.data() + static_cast<std::size_t>(o + q) * m.bytes_per_row();
  __m512 sums[kOutputs][kChains][kRows];
  for (auto& output : sums)
    for (auto& chain : output)
      for (auto& sum : chain) sum = _mm512_setzero_ps();
  for (int unit = 0; unit < whole_units; ++unit) {
    const int column = unit * kBlockColumns;
    const std::uint8_t* unit_codes[kOutputs];
    for (int q = 0; q < kOutputs; ++q) unit_codes[q] = row_codes[q] + column;
    int8_unit_avx512<kRows, kOutputs>(unit_codes, x, column, sums);
  }
  if (tail_columns > 0) {
    // As in the AVX2 kernel: the rows' last codes in zero-filled units.
    alignas(32) std::uint8_t tails[kOutputs][kBlockColumns] = {};
    const std::uint8_t* unit_codes[kOutputs];
    for (int q = 0; q < kOutputs; ++q) {
      std::memcpy(tails[q], row_codes[q] + whole_units * kBlockColumns, static_cast<std::size_t>(tail_columns));
      unit_codes[q] = tails[q];
    }
    int8_unit_avx512<kRows, kOutputs>(unit_codes, x, whole_units * kBlockColumns, sums);
  }
  __m512 row_sums[kOutputs * kRows];
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r)
      row_sums[q * kRows + r] = kChains == 2 ? _mm512_add_ps(sums[q][0][r], sums[q][kChains - 1][r]) : sums[q][0][r];
  float results[kOutputs * kRows];
  sum_each_avx512(row_sums, results);
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r)
      p.y[static_cast<std::size_t>(first_row + r) * m.out_features + o + q] =
          m.scales[static_cast<std::size_t>(o + q)] * results[q * kRows + r];
}

template <int kRows>
STEP06_AVX512 void int8_tile_avx512(const Product& p, int out_begin, int out_end, int first_row) {
  constexpr int kOutputs = kAvx512Outputs;
  const float* x[kRows];  // the tile's prepared rows
  for (int r = 0; r < kRows; ++r) x[r] = p.x + static_cast<std::size_t>(first_row + r) * p.x_stride;
  int o = out_begin;
  for (; o + kOutputs <= out_end; o += kOutputs) int8_outputs_avx512<kRows, kOutputs>(p, o, first_row, x);
  for (; o < out_end; ++o) int8_outputs_avx512<kRows, 1>(p, o, first_row, x);
}

// 4-bit schemes on AVX-512: a group's weights are a 16-entry table. A code
// q in 0..15 can only stand for 16 values in its group, table[q] = w~(q):
//   int4 asymmetric (q - z) * s,  int4 symmetric (q - 8) * s,  NF4 level[q] * s.
// The table is one register, built once per group with one multiply (a row
// of kCodeMinusZero or the NF4 levels, times the scale broadcast from memory),
// and vpermps (_mm512_permutexvar_ps) looks up 16 codes in it at once, using
// the low 4 bits of each int32 lane: code to finished fp32 weight in ONE
// instruction, with no conversion, no per-group scaling, no zero-point term.
// The entries are computed as dequantize() computes them: the decoded weights
// are W~ bit for bit.
//
// A 16-byte unit (32 codes): vpmovzxbd widens the 16 bytes to int32 lanes;
// vpermps on them directly reads the low nibbles (even columns: the higher
// bits are ignored), and after a 4-bit shift the high nibbles (odd columns).
// 2 vectors of finished weights for 4 instructions, each FMA'd into every row
// of the tile against the prepared x at offsets 0 and 16, for 4 output
// features at once (4 tables; each vector of x loaded once for the 4).
template <QuantScheme kScheme, int kRows, int kOutputs>
STEP06_AVX512_INLINE void four_bit_outputs_avx512(const Product& p, int o, int first_row,
                                                  const float* const (&x)[kRows]) {
  constexpr int kChains = chains_per_row(kRows);
  const QuantizedMatrix& m = *p.matrix;
  const std::size_t row_bytes = m.bytes_per_row();
  const std::size_t groups = static_cast<std::size_t>(m.groups_per_row);
  // Output o + q: its codes at codes + q * row_bytes, its group g's scale and
  // zero point at [q * groups + g].
  const std::uint8_t* codes = m.packed.data() + static_cast<std::size_t>(o) * row_bytes;
  const float* scales = m.scales.data() + static_cast<std::size_t>(o) * groups;
  const std::uint8_t* zeros = m.zeros.empty() ? nullptr : m.zeros.data() + static_cast<std::size_t>(o) * groups;
  __m512 sums[kOutputs][kChains][kRows];  // chains: [even and odd columns] or [all]
  for (auto& output : sums)
    for (auto& chain : output)
      for (auto& sum : chain) sum = _mm512_setzero_ps();
  std::size_t column = 0;  // the unit's first column
  for (std::size_t g = 0; g < groups; ++g) {
    __m512 tables[kOutputs];  // tables[q][code] = the weight the code stands for in this group
    for (int q = 0; q < kOutputs; ++q) {
      const float* values = kScheme == QuantScheme::NF4             ? kNf4Levels.data()
                            : kScheme == QuantScheme::Int4Symmetric ? kCodeMinusZero.values[8]
                                                                    : kCodeMinusZero.values[zeros[q * groups + g]];
      tables[q] = _mm512_mul_ps(_mm512_loadu_ps(values), _mm512_set1_ps(scales[q * groups + g]));
    }
    const int units = units_in_group(m, static_cast<int>(g));
    for (int unit = 0; unit < units; ++unit, column += kBlockColumns) {
      __m512 x_even[kRows], x_odd[kRows];  // the rows' x at the unit's even and odd columns
      for (int r = 0; r < kRows; ++r) {
        x_even[r] = _mm512_loadu_ps(x[r] + column);
        x_odd[r] = _mm512_loadu_ps(x[r] + column + 16);
        if constexpr (kOutputs > 1) {
          x_even[r] = in_register(x_even[r]);
          x_odd[r] = in_register(x_odd[r]);
        }
      }
#pragma GCC unroll 4
      for (int q = 0; q < kOutputs; ++q) {
        const std::uint8_t* unit_codes = codes + q * row_bytes + column / 2;
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(unit_codes)));
        const __m512 w_even = _mm512_permutexvar_ps(bytes, tables[q]);                        // low nibbles
        const __m512 w_odd = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), tables[q]);  // high nibbles
#pragma GCC unroll 16
        for (int r = 0; r < kRows; ++r) {
          sums[q][0][r] = _mm512_fmadd_ps(w_even, x_even[r], sums[q][0][r]);
          sums[q][kChains - 1][r] = _mm512_fmadd_ps(w_odd, x_odd[r], sums[q][kChains - 1][r]);
        }
      }
    }
    // The skipped padding units (see units_in_group) move `column` on too.
    column = (g + 1) * static_cast<std::size_t>(m.group_columns);
  }
  __m512 row_sums[kOutputs * kRows];
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r)
      row_sums[q * kRows + r] = kChains == 2 ? _mm512_add_ps(sums[q][0][r], sums[q][kChains - 1][r]) : sums[q][0][r];
  float results[kOutputs * kRows];
  sum_each_avx512(row_sums, results);
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r)
      p.y[static_cast<std::size_t>(first_row + r) * m.out_features + o + q] = results[q * kRows + r];
}

template <QuantScheme kScheme, int kRows>
STEP06_AVX512 void four_bit_tile_avx512(const Product& p, int out_begin, int out_end, int first_row) {
  constexpr int kOutputs = kAvx512Outputs;
  const float* x[kRows];  // the tile's prepared rows (even/odd order)
  for (int r = 0; r < kRows; ++r) x[r] = p.x + static_cast<std::size_t>(first_row + r) * p.x_stride;
  int o = out_begin;
  for (; o + kOutputs <= out_end; o += kOutputs) four_bit_outputs_avx512<kScheme, kRows, kOutputs>(p, o, first_row, x);
  for (; o < out_end; ++o) four_bit_outputs_avx512<kScheme, kRows, 1>(p, o, first_row, x);
}

// The kernels by tile height: kernels[n - 1] runs n rows.
template <template <int> class Kernel, std::size_t... kIndex>
constexpr auto tile_table(std::index_sequence<kIndex...>) {
  return std::array<TileKernel, sizeof...(kIndex)>{Kernel<kIndex + 1>::run...};
}
template <int kRows>
struct Int8Avx2 {
  static constexpr TileKernel run = int8_tile_avx2<kRows>;
};
template <int kRows>
struct Int8Avx512 {
  static constexpr TileKernel run = int8_tile_avx512<kRows>;
};
template <QuantScheme kScheme>
struct FourBit {
  template <int kRows>
  struct Avx2 {
    static constexpr TileKernel run = four_bit_tile_avx2<kScheme, kRows>;
  };
  template <int kRows>
  struct Avx512 {
    static constexpr TileKernel run = four_bit_tile_avx512<kScheme, kRows>;
  };
};

template <QuantScheme kScheme>
constexpr auto kFourBitAvx2 = tile_table<FourBit<kScheme>::template Avx2>(std::make_index_sequence<kAvx2TileRows>());
template <QuantScheme kScheme>
constexpr auto kFourBitAvx512 =
    tile_table<FourBit<kScheme>::template Avx512>(std::make_index_sequence<kAvx512TileRows>());
constexpr auto kInt8Avx2 = tile_table<Int8Avx2>(std::make_index_sequence<kAvx2TileRows>());
constexpr auto kInt8Avx512 = tile_table<Int8Avx512>(std::make_index_sequence<kAvx512TileRows>());

std::span<const TileKernel> tile_kernels(QuantScheme scheme, SimdLevel level) {
  const bool avx512 = level == SimdLevel::Avx512;
  switch (scheme) {
    case QuantScheme::Int8PerChannel: return avx512 ? std::span<const TileKernel>(kInt8Avx512) : kInt8Avx2;
    case QuantScheme::Int4Asymmetric:
      return avx512 ? std::span<const TileKernel>(kFourBitAvx512<QuantScheme::Int4Asymmetric>)
                    : kFourBitAvx2<QuantScheme::Int4Asymmetric>;
    case QuantScheme::Int4Symmetric:
      return avx512 ? std::span<const TileKernel>(kFourBitAvx512<QuantScheme::Int4Symmetric>)
                    : kFourBitAvx2<QuantScheme::Int4Symmetric>;
    case QuantScheme::NF4:
      return avx512 ? std::span<const TileKernel>(kFourBitAvx512<QuantScheme::NF4>) : kFourBitAvx2<QuantScheme::NF4>;
  }
  return {};
}

#endif  // STEP06_X86_KERNELS

// What the CPU reports (CPUID, and XGETBV: the OS saves the wide registers).
bool cpu_runs_avx2() {
#if STEP06_X86_KERNELS
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}
bool cpu_runs_avx512() {
#if STEP06_X86_KERNELS
  __builtin_cpu_init();
  return cpu_runs_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}

void run_product(const QuantizedMatrix& matrix, const float* x, int rows, float* y, SimdLevel level);

void check_level(SimdLevel level) {
  if (!simd_supported(level))
    throw llm::InputError(fmt::format("quantized product: this CPU cannot run the {} kernels (it runs up to {})",
                                      simd_name(level), simd_name(detected_simd())));
}

}  // namespace

std::string simd_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Portable: return "portable";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Avx512: return "avx512";
  }
  return fmt::format("unknown SIMD level {}", static_cast<int>(level));
}

SimdLevel detected_simd() {
  static const SimdLevel detected = cpu_runs_avx512() ? SimdLevel::Avx512
                                    : cpu_runs_avx2() ? SimdLevel::Avx2
                                                      : SimdLevel::Portable;
  return detected;
}

bool simd_supported(SimdLevel level) {
  switch (level) {
    case SimdLevel::Portable: return true;
    case SimdLevel::Avx2: return detected_simd() != SimdLevel::Portable;
    case SimdLevel::Avx512: return detected_simd() == SimdLevel::Avx512;
  }
  return false;  // not a level
}

void quantized_matmul(const QuantizedMatrix& matrix, const float* x, int rows, float* y, SimdLevel level) {
  check_level(level);
  check_matrix(matrix);
  run_product(matrix, x, rows, y, level);
}

QuantizedLinear::QuantizedLinear(QuantizedMatrix matrix, SimdLevel level) : matrix_(std::move(matrix)), level_(level) {
  check_level(level_);
  check_matrix(matrix_);
}

// The layer's matrix and level were checked once, when it was built.
void QuantizedLinear::forward(const float* x, int rows, float* y) const { run_product(matrix_, x, rows, y, level_); }

namespace {

// The product, for a checked matrix and a level this CPU runs.
void run_product(const QuantizedMatrix& matrix, const float* x, int rows, float* y, SimdLevel level) {
  if (rows < 0) throw llm::InputError(fmt::format("quantized product: {} rows", rows));
  if (rows == 0) return;
  // Scratch reused across calls (one thread per model, as everywhere in the course).
  thread_local std::vector<float> prepared;    // [rows, stride]
  thread_local std::vector<float> group_sums;  // [rows, groups_per_row]
  if (level == SimdLevel::Portable) {
    prepare_input(matrix, x, rows, matrix.in_features, InputOrder::Natural, prepared);
    matmul_portable(matrix, prepared.data(), rows, y);
    return;
  }
#if STEP06_X86_KERNELS
  const bool four_bit = is_four_bit(matrix.format.scheme);
  Product product;
  product.matrix = &matrix;
  product.x_stride = four_bit ? matrix.padded_in : round_up(matrix.in_features, kBlockColumns);
  prepare_input(matrix, x, rows, product.x_stride, four_bit ? InputOrder::EvenOdd : InputOrder::Natural, prepared);
  product.x = prepared.data();
  product.y = y;
  const bool needs_group_sums = level == SimdLevel::Avx2 && (matrix.format.scheme == QuantScheme::Int4Asymmetric ||
                                                             matrix.format.scheme == QuantScheme::Int4Symmetric);
  if (needs_group_sums) {
    // The sum of x over each group, per row: a group is whole 32-column
    // blocks, and the even/odd order only moves columns within a block.
    group_sums.assign(static_cast<std::size_t>(rows) * matrix.groups_per_row, 0.0f);
    for (int r = 0; r < rows; ++r)
      for (int g = 0; g < matrix.groups_per_row; ++g) {
        const float* group_x = product.x + static_cast<std::size_t>(r) * product.x_stride + g * matrix.group_columns;
        float sum = 0.0f;
        for (int i = 0; i < matrix.group_columns; ++i) sum += group_x[i];
        group_sums[static_cast<std::size_t>(r) * matrix.groups_per_row + g] = sum;
      }
    product.group_sums = group_sums.data();
  }
  run_tiles(product, rows, tile_kernels(matrix.format.scheme, level));
#endif
}

}  // namespace

}  // namespace step06
