// The AVX2 + FMA kernels of the CPU quantized product (8 floats per __m256,
// 16 registers): a tuned variant of matmul_portable in cpu_quantized_linear.cpp,
// which is the reference to read first. Compiled with per-function target
// attributes (STEP06_AVX2), so the build's -march never decides whether they
// exist; cpu_quantized_linear.cpp calls them only on a CPU that reports
// AVX2 and FMA. docs/06_quantization.md, section 6.2.
#include "step06_quantization/cpu_quantized_linear_kernels.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#if STEP06_X86_KERNELS

namespace step06::cpu_kernels {

namespace {

// AVX2 int8: output features at once, for ~8 accumulators (at most 4).
constexpr int outputs_at_once(int rows) { return std::clamp(8 / (chains_per_row(rows) * rows), 1, 4); }
constexpr int kAvx2TileRows = 4;

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

template <int kRows>
struct Int8Avx2 {
  static constexpr TileKernel run = int8_tile_avx2<kRows>;
};
template <QuantScheme kScheme>
struct FourBitAvx2 {
  template <int kRows>
  struct Kernel {
    static constexpr TileKernel run = four_bit_tile_avx2<kScheme, kRows>;
  };
};
template <QuantScheme kScheme>
constexpr auto kFourBitAvx2 =
    tile_table<FourBitAvx2<kScheme>::template Kernel>(std::make_index_sequence<kAvx2TileRows>());
constexpr auto kInt8Avx2 = tile_table<Int8Avx2>(std::make_index_sequence<kAvx2TileRows>());

}  // namespace

std::span<const TileKernel> avx2_tile_kernels(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::Int8PerChannel: return kInt8Avx2;
    case QuantScheme::Int4Asymmetric: return kFourBitAvx2<QuantScheme::Int4Asymmetric>;
    case QuantScheme::Int4Symmetric: return kFourBitAvx2<QuantScheme::Int4Symmetric>;
    case QuantScheme::NF4: return kFourBitAvx2<QuantScheme::NF4>;
  }
  return {};
}

}  // namespace step06::cpu_kernels

#endif  // STEP06_X86_KERNELS
