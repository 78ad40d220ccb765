// The AVX-512 kernels of the CPU quantized product (16 floats per __m512, 32
// registers; AVX-512 F + BW): a tuned variant of matmul_portable in
// cpu_quantized_linear.cpp, which is the reference to read first. Compiled
// with per-function target attributes (STEP06_AVX512), so the build's -march
// never decides whether they exist; cpu_quantized_linear.cpp calls them only
// on a CPU that reports AVX-512 F and BW. docs/06_quantization.md, section 6.2.
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

constexpr int kAvx512TileRows = 4;
constexpr int kAvx512Outputs = 4;

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

template <int kRows>
struct Int8Avx512 {
  static constexpr TileKernel run = int8_tile_avx512<kRows>;
};
template <QuantScheme kScheme>
struct FourBitAvx512 {
  template <int kRows>
  struct Kernel {
    static constexpr TileKernel run = four_bit_tile_avx512<kScheme, kRows>;
  };
};
template <QuantScheme kScheme>
constexpr auto kFourBitAvx512 =
    tile_table<FourBitAvx512<kScheme>::template Kernel>(std::make_index_sequence<kAvx512TileRows>());
constexpr auto kInt8Avx512 = tile_table<Int8Avx512>(std::make_index_sequence<kAvx512TileRows>());

}  // namespace

std::span<const TileKernel> avx512_tile_kernels(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::Int8PerChannel: return kInt8Avx512;
    case QuantScheme::Int4Asymmetric: return kFourBitAvx512<QuantScheme::Int4Asymmetric>;
    case QuantScheme::Int4Symmetric: return kFourBitAvx512<QuantScheme::Int4Symmetric>;
    case QuantScheme::NF4: return kFourBitAvx512<QuantScheme::NF4>;
  }
  return {};
}

}  // namespace step06::cpu_kernels

#endif  // STEP06_X86_KERNELS
