// The AVX2 kernels of the product with int8 activations (W8A8 and W4A8): a
// tuned variant of matmul_int8_activations_portable in
// cpu_quantized_linear.cpp, which is the reference to read first. Compiled
// with per-function target attributes (STEP06_AVX2) and called only on a CPU
// that reports AVX2 and FMA. docs/06_quantization.md, section 6.2.
//
// AVX2 has no instruction that sums byte products into int32 lanes at once;
// two do it (what llama.cpp's AVX2 kernels do as well):
//   vpmaddubsw (_mm256_maddubs_epi16): 32 unsigned bytes times 32 signed
//              bytes, neighbouring pairs of products added into 16 int16 lanes
//              (saturating: the operands must keep a pair under 32767)
//   vpmaddwd   (_mm256_madd_epi16) with ones: neighbouring int16 pairs added
//              into 8 int32 lanes
// One 32-column block of x is one vector: its 8 int32 lanes are converted to
// fp32 and multiplied by the block's scale (and the group's weight scale).
#include "step06_quantization/cpu_quantized_linear_kernels.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#include "step06_quantization/int8_activations.hpp"

#if STEP06_X86_KERNELS

namespace step06::cpu_kernels {

namespace {

constexpr int kTileRows = 4;
// Output features at once: 4 with one row of x (4 accumulators), else 2 (up
// to 8), so that accumulators, x codes and scales fit the 16 registers.
constexpr int outputs_at_once(int rows) { return rows == 1 ? 4 : 2; }

// The int32 sums of 4 neighbouring byte products, 8 lanes, from the int16
// pair sums of vpmaddubsw.
STEP06_AVX2_INLINE __m256i pairs_to_int32(__m256i int16_pairs) {
  return _mm256_madd_epi16(int16_pairs, _mm256_set1_epi16(1));
}

// x of one 32-column block for every row of the tile: its codes and its
// scale (in every lane), loaded once and shared by the output features.
template <int kRows>
struct BlockOfRows {
  __m256i codes[kRows];
  __m256 scales[kRows];
};
template <int kRows>
STEP06_AVX2_INLINE BlockOfRows<kRows> load_block(const Int8Product& p, int first_row, int block) {
  BlockOfRows<kRows> x;
  for (int r = 0; r < kRows; ++r) {
    const std::size_t row = static_cast<std::size_t>(first_row + r);
    x.codes[r] = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(p.x_codes + row * p.x_stride + block * kActivationBlockColumns));
    x.scales[r] = _mm256_broadcast_ss(p.x_scales + row * p.scales_stride + block);
  }
  return x;
}

// ---------------------------------------------------------------------------
// int8 weights (per output channel scale).
//
// vpmaddubsw wants its first operand unsigned, and both weights and x are
// signed. The sign trick: w * x = |w| * (x with w's sign), so the kernel
// passes |w| (vpsignb w, w) as the unsigned operand and x times the sign of
// w (vpsignb x, w) as the signed one. Both stay within [-127, 127] (the
// formats never store -128), so a pair of products is at most
// 2 * 127 * 127 = 32258 and never saturates.

// One block of 32 columns: the weights' 32 codes of each output (at
// `codes[q]`) against every row of the tile.
template <int kRows, int kOutputs>
STEP06_AVX2_INLINE void int8_weight_block(const Int8Product& p, const std::uint8_t* const (&codes)[kOutputs],
                                          int block, int first_row, __m256 (&sums)[kOutputs][kRows]) {
  const BlockOfRows<kRows> x = load_block<kRows>(p, first_row, block);
#pragma GCC unroll 4
  for (int q = 0; q < kOutputs; ++q) {
    const __m256i weights = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes[q]));
    const __m256i weight_magnitudes = _mm256_sign_epi8(weights, weights);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m256i signed_x = _mm256_sign_epi8(x.codes[r], weights);
      const __m256i dot = pairs_to_int32(_mm256_maddubs_epi16(weight_magnitudes, signed_x));
      sums[q][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), x.scales[r], sums[q][r]);
    }
  }
}

template <int kRows, int kOutputs>
STEP06_AVX2_INLINE void int8_weight_outputs(const Int8Product& p, int o, int first_row) {
  const QuantizedMatrix& m = *p.matrix;
  const int whole_blocks = m.in_features / kActivationBlockColumns;
  const int tail_columns = m.in_features % kActivationBlockColumns;
  const std::uint8_t* row_codes[kOutputs];
  for (int q = 0; q < kOutputs; ++q)
    row_codes[q] = m.packed.data() + static_cast<std::size_t>(o + q) * m.bytes_per_row();
  __m256 sums[kOutputs][kRows];
  for (auto& output : sums)
    for (auto& sum : output) sum = _mm256_setzero_ps();
  for (int block = 0; block < whole_blocks; ++block) {
    const std::uint8_t* block_codes[kOutputs];
    for (int q = 0; q < kOutputs; ++q) block_codes[q] = row_codes[q] + block * kActivationBlockColumns;
    int8_weight_block<kRows, kOutputs>(p, block_codes, block, first_row, sums);
  }
  if (tail_columns > 0) {
    // The rows' last codes in zero-filled blocks: a 32-byte load at the end
    // of a row would read the next row (or past the matrix).
    alignas(32) std::uint8_t tails[kOutputs][kActivationBlockColumns] = {};
    const std::uint8_t* block_codes[kOutputs];
    for (int q = 0; q < kOutputs; ++q) {
      std::memcpy(tails[q], row_codes[q] + whole_blocks * kActivationBlockColumns,
                  static_cast<std::size_t>(tail_columns));
      block_codes[q] = tails[q];
    }
    int8_weight_block<kRows, kOutputs>(p, block_codes, whole_blocks, first_row, sums);
  }
  __m256 all_sums[kOutputs * kRows];
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r) all_sums[q * kRows + r] = sums[q][r];
  float results[kOutputs * kRows];
  sum_each_avx2(all_sums, results);
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r)
      p.y[static_cast<std::size_t>(first_row + r) * m.out_features + o + q] =
          m.scales[static_cast<std::size_t>(o + q)] * results[q * kRows + r];
}

template <int kRows>
STEP06_AVX2 void int8_weight_tile(const Int8Product& p, int out_begin, int out_end, int first_row) {
  constexpr int kOutputs = outputs_at_once(kRows);
  int o = out_begin;
  for (; o + kOutputs <= out_end; o += kOutputs) int8_weight_outputs<kRows, kOutputs>(p, o, first_row);
  for (; o < out_end; ++o) int8_weight_outputs<kRows, 1>(p, o, first_row);
}

// ---------------------------------------------------------------------------
// 4-bit weights (int4 with a zero point, int4 symmetric).
//
// The codes q in 0..15 are the unsigned operand as they are (a pair of
// products is at most 2 * 15 * 127: no saturation), and the zero point comes
// off afterwards, as on AVX-512:
//   sum_j (q_j - z) x_j = sum_j q_j x_j - z * sum_j x_j
// with sum_j x_j per group prepared once per call
// (Int8Product::zero_point_terms).
//
// Unpacking a block: its 16 bytes of codes hold the even columns in their low
// nibbles and the odd ones in their high nibbles: [bytes | bytes >> 4] & 0x0F
// is 32 codes in the order [evens | odds], the order x was prepared in
// (CodeOrder::EvenOddPerBlock).

// sum over groups g of scale_w[g] * zero[g] * terms[g] (zero = 8 for the
// symmetric scheme): 8 groups per step, then the rest one by one.
template <QuantScheme kScheme>
STEP06_AVX2_INLINE float zero_point_term(const float* weight_scales, const std::uint8_t* zeros, const float* terms,
                                         int groups) {
  __m256 sum = _mm256_setzero_ps();
  int g = 0;
  for (; g + 8 <= groups; g += 8) {
    __m256 zero_points = _mm256_set1_ps(8.0f);
    if constexpr (kScheme == QuantScheme::Int4Asymmetric) {
      std::int64_t eight_zeros;  // 8 uint8 zero points
      std::memcpy(&eight_zeros, zeros + g, sizeof(eight_zeros));
      zero_points = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(eight_zeros)));
    }
    sum = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(weight_scales + g), zero_points), _mm256_loadu_ps(terms + g),
                          sum);
  }
  const __m256 partial_sums[1] = {sum};
  float results[1];
  sum_each_avx2(partial_sums, results);
  for (; g < groups; ++g) {
    const float zero_point = kScheme == QuantScheme::Int4Asymmetric ? static_cast<float>(zeros[g]) : 8.0f;
    results[0] += weight_scales[g] * zero_point * terms[g];
  }
  return results[0];
}

template <QuantScheme kScheme, int kRows, int kOutputs>
STEP06_AVX2_INLINE void four_bit_outputs(const Int8Product& p, int o, int first_row) {
  const QuantizedMatrix& m = *p.matrix;
  const std::size_t row_bytes = m.bytes_per_row();
  const int groups = m.groups_per_row;
  const int blocks_per_group = m.group_columns / kActivationBlockColumns;
  const __m256i low_nibble = _mm256_set1_epi8(0x0F);
  // Output o + q: its codes at codes + q * row_bytes, its group g's scale at [q * groups + g].
  const std::uint8_t* codes = m.packed.data() + static_cast<std::size_t>(o) * row_bytes;
  const float* weight_scales = m.scales.data() + static_cast<std::size_t>(o) * groups;
  __m256 sums[kOutputs][kRows];
  for (auto& output : sums)
    for (auto& sum : output) sum = _mm256_setzero_ps();
  const int blocks = p.x_stride / kActivationBlockColumns;  // padded_in / 32: every block of codes
  for (int block = 0; block < blocks; ++block) {
    const int group = block / blocks_per_group;
    const BlockOfRows<kRows> x = load_block<kRows>(p, first_row, block);
#pragma GCC unroll 4
    for (int q = 0; q < kOutputs; ++q) {
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + q * row_bytes + block * 16));
      const __m256i weight_codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low_nibble);
      const __m256 weight_scale = _mm256_broadcast_ss(weight_scales + q * groups + group);
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) {
        const __m256i dot = pairs_to_int32(_mm256_maddubs_epi16(weight_codes, x.codes[r]));
        sums[q][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(x.scales[r], weight_scale), sums[q][r]);
      }
    }
  }
  __m256 all_sums[kOutputs * kRows];
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r) all_sums[q * kRows + r] = sums[q][r];
  float results[kOutputs * kRows];
  sum_each_avx2(all_sums, results);
  const std::uint8_t* zeros = m.zeros.empty() ? nullptr : m.zeros.data() + static_cast<std::size_t>(o) * groups;
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r) {
      const float* terms = p.zero_point_terms + static_cast<std::size_t>(first_row + r) * groups;
      const std::uint8_t* output_zeros = zeros == nullptr ? nullptr : zeros + q * groups;
      const float zero_points = zero_point_term<kScheme>(weight_scales + q * groups, output_zeros, terms, groups);
      p.y[static_cast<std::size_t>(first_row + r) * m.out_features + o + q] = results[q * kRows + r] - zero_points;
    }
}

template <QuantScheme kScheme, int kRows>
STEP06_AVX2 void four_bit_tile(const Int8Product& p, int out_begin, int out_end, int first_row) {
  constexpr int kOutputs = outputs_at_once(kRows);
  int o = out_begin;
  for (; o + kOutputs <= out_end; o += kOutputs) four_bit_outputs<kScheme, kRows, kOutputs>(p, o, first_row);
  for (; o < out_end; ++o) four_bit_outputs<kScheme, kRows, 1>(p, o, first_row);
}

template <int kRows>
struct Int8Weights {
  static constexpr Int8TileKernel run = int8_weight_tile<kRows>;
};
template <QuantScheme kScheme>
struct FourBitWeights {
  template <int kRows>
  struct Kernel {
    static constexpr Int8TileKernel run = four_bit_tile<kScheme, kRows>;
  };
};

constexpr auto kInt8Weights = tile_table<Int8Weights>(std::make_index_sequence<kTileRows>());
template <QuantScheme kScheme>
constexpr auto kFourBitWeights =
    tile_table<FourBitWeights<kScheme>::template Kernel>(std::make_index_sequence<kTileRows>());

}  // namespace

std::span<const Int8TileKernel> a8_avx2_tile_kernels(QuantScheme scheme) {
  return int8_activation_kernels_for(scheme, kInt8Weights, kFourBitWeights<QuantScheme::Int4Asymmetric>,
                                     kFourBitWeights<QuantScheme::Int4Symmetric>);
}

}  // namespace step06::cpu_kernels

#endif  // STEP06_X86_KERNELS
