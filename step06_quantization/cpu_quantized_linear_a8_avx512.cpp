// The AVX-512 VNNI kernels of the product with int8 activations (W8A8 and
// W4A8): a tuned variant of matmul_int8_activations_portable in
// cpu_quantized_linear.cpp, which is the reference to read first. Compiled
// with per-function target attributes (STEP06_AVX512_VNNI) and called only on
// a CPU that reports AVX-512 F, BW, VL and VNNI. docs/06_quantization.md,
// section 6.2.
//
// The instruction: vpdpbusd (_mm512_dpbusd_epi32) multiplies 64 unsigned
// bytes by 64 signed bytes and adds each group of 4 neighbouring products
// into one of 16 int32 lanes. One instruction does 64 multiply-adds of
// weights by x; the fp32 kernels needed a convert or a table lookup and then
// an FMA per 16 weights. A vector of 64 codes is two 32-column blocks of x,
// each with its own scale, so after the dot product the 16 int32 lanes are
// converted to fp32 and multiplied by their lanes' scales (16 lane scales per
// 64 columns, prepared with the codes: Int8PairOfBlocks::lane_scales).
#include "step06_quantization/cpu_quantized_linear_kernels.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <utility>

#include "step06_quantization/int8_activations.hpp"

#if STEP06_X86_KERNELS

namespace step06::cpu_kernels {

namespace {

constexpr int kTileRows = 4;
// Output features at once: 4 x 4 rows = 16 accumulators, beside 4 vectors
// each of x codes, lane scales and lane starting values: 28 of the 32
// registers, the rest for the weights being unpacked.
constexpr int kOutputsAtOnce = 4;
// Columns per vector of codes: two 32-column blocks of x.
constexpr int kPairColumns = 2 * kActivationBlockColumns;

// x of one step (64 columns) for every row of the tile: codes, lane scales
// and the lanes' starting values, loaded once and shared by the outputs.
template <int kRows>
struct PairOfRows {
  __m512i codes[kRows];
  __m512 scales[kRows];
  __m512i dot_starts[kRows];
};
template <int kRows>
STEP06_AVX512_VNNI_INLINE PairOfRows<kRows> load_pair(const Int8PairOfBlocks* const (&x_rows)[kRows], int pair) {
  PairOfRows<kRows> x;
  for (int r = 0; r < kRows; ++r) {
    const Int8PairOfBlocks& record = x_rows[r][pair];
    x.codes[r] = _mm512_load_si512(record.codes);
    x.scales[r] = _mm512_load_ps(record.lane_scales);
    x.dot_starts[r] = _mm512_load_si512(record.lane_offsets);
  }
  return x;
}

// sums[q][r] += (the lane dot products of weights[q] and x's row r) * scale
// (each lane's x scale, times the lanes' weight scales when given).
template <int kRows, int kOutputs, bool kWeightScales>
STEP06_AVX512_VNNI_INLINE void multiply_pair(const __m512i (&weights)[kOutputs], const PairOfRows<kRows>& x,
                                             const __m512 (&weight_scales)[kOutputs], __m512 (&sums)[kOutputs][kRows]) {
#pragma GCC unroll 4
  for (int q = 0; q < kOutputs; ++q)
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512i dot = _mm512_dpbusd_epi32(x.dot_starts[r], weights[q], x.codes[r]);
      const __m512 scale = kWeightScales ? _mm512_mul_ps(x.scales[r], weight_scales[q]) : x.scales[r];
      sums[q][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, sums[q][r]);
    }
}

// The tile's rows of prepared x.
template <int kRows>
STEP06_AVX512_VNNI_INLINE void tile_rows(const Int8Product& p, int first_row,
                                         const Int8PairOfBlocks* (&x_rows)[kRows]) {
  for (int r = 0; r < kRows; ++r) x_rows[r] = p.x_pairs + static_cast<std::size_t>(first_row + r) * p.pairs_per_row;
}

// totals[q * kRows + r] = the sum of the 16 lanes of sums[q][r].
template <int kRows, int kOutputs>
STEP06_AVX512_VNNI_INLINE void lane_totals(const __m512 (&sums)[kOutputs][kRows], float (&totals)[kOutputs * kRows]) {
  __m512 all_sums[kOutputs * kRows];
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r) all_sums[q * kRows + r] = sums[q][r];
  sum_each_avx512(all_sums, totals);
}

// ---------------------------------------------------------------------------
// int8 weights (per output channel scale).
//
// vpdpbusd wants one operand unsigned. x is signed; so are the weights. The
// kernel flips each weight byte's top bit (vpxord with 0x80), which reads the
// byte as the unsigned w + 128, and takes the extra 128 * x back out in the
// integers: each lane's dot product starts from -128 times the sum of its 4 x
// codes (Int8PairOfBlocks::lane_offsets, prepared once per row of x), so it
// ends as the exact sum of w * x. Per 64 weights: one load and one xor per
// output feature, then per row of x one vpdpbusd, one convert and one FMA
// with the lane scales.

template <int kRows, int kOutputs>
STEP06_AVX512_VNNI_INLINE void int8_weight_outputs(const Int8Product& p, int o, int first_row) {
  const QuantizedMatrix& m = *p.matrix;
  const __m512i top_bit = _mm512_set1_epi8(static_cast<char>(0x80));
  const std::uint8_t* row_codes[kOutputs];
  for (int q = 0; q < kOutputs; ++q)
    row_codes[q] = m.packed.data() + static_cast<std::size_t>(o + q) * m.bytes_per_row();
  const Int8PairOfBlocks* x_rows[kRows];
  tile_rows(p, first_row, x_rows);
  __m512 sums[kOutputs][kRows];
  for (auto& output : sums)
    for (auto& sum : output) sum = _mm512_setzero_ps();
  const __m512 no_weight_scales[kOutputs] = {};  // (the row's one scale is applied at the end)
  const int whole_pairs = m.in_features / kPairColumns;
  for (int pair = 0; pair < whole_pairs; ++pair) {
    const PairOfRows<kRows> x = load_pair(x_rows, pair);
    __m512i flipped_codes[kOutputs];
    for (int q = 0; q < kOutputs; ++q)
      flipped_codes[q] = _mm512_xor_si512(_mm512_loadu_si512(row_codes[q] + pair * kPairColumns), top_bit);
    multiply_pair<kRows, kOutputs, false>(flipped_codes, x, no_weight_scales, sums);
  }
  if (whole_pairs < p.pairs_per_row) {
    // The row's last, short pair: a masked load (bytes past the row are not
    // read; they load as 0, flip to 128 and meet x codes of 0).
    const int tail_columns = m.in_features - whole_pairs * kPairColumns;
    const __mmask64 real = (__mmask64{1} << tail_columns) - 1;  // tail_columns < 64
    const PairOfRows<kRows> x = load_pair(x_rows, whole_pairs);
    __m512i flipped_codes[kOutputs];
    for (int q = 0; q < kOutputs; ++q)
      flipped_codes[q] =
          _mm512_xor_si512(_mm512_maskz_loadu_epi8(real, row_codes[q] + whole_pairs * kPairColumns), top_bit);
    multiply_pair<kRows, kOutputs, false>(flipped_codes, x, no_weight_scales, sums);
  }
  float totals[kOutputs * kRows];
  lane_totals(sums, totals);
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r)
      p.y[static_cast<std::size_t>(first_row + r) * m.out_features + o + q] =
          m.scales[static_cast<std::size_t>(o + q)] * totals[q * kRows + r];
}

template <int kRows>
STEP06_AVX512_VNNI void int8_weight_tile(const Int8Product& p, int out_begin, int out_end, int first_row) {
  int o = out_begin;
  for (; o + kOutputsAtOnce <= out_end; o += kOutputsAtOnce)
    int8_weight_outputs<kRows, kOutputsAtOnce>(p, o, first_row);
  for (; o < out_end; ++o) int8_weight_outputs<kRows, 1>(p, o, first_row);
}

// ---------------------------------------------------------------------------
// 4-bit weights (int4 with a zero point, int4 symmetric).
//
// The codes q in 0..15 are already unsigned bytes once unpacked, so they go
// into vpdpbusd as they are; the zero point z comes off separately:
//   sum_j (q_j - z) x_j = sum_j q_j x_j - z * sum_j x_j
// Symmetric (z = 8 for every group): -8 * sum_j x_j over each lane's 4 codes
// is a property of x alone, prepared once per call, and it is the value each
// lane's dot product starts from (Int8PairOfBlocks::lane_offsets): no
// zero-point work per output at all, and the sum is exact in int32.
// Asymmetric: sum_j x_j per group (scales applied) is prepared once per call
// (Int8Product::zero_point_terms), and the zero points cost one short dot
// product over the groups per output feature and row (zero_point_term
// below), not an instruction per weight.
//
// Unpacking 64 columns: 32 bytes of codes, two 16-byte units, hold the even
// columns of both blocks in their low nibbles and the odd ones in their high
// nibbles. [bytes | bytes >> 4] & 0x0F gives 64 codes in the order
// [evens of b | evens of b + 1 | odds of b | odds of b + 1], the order x was
// prepared in (CodeOrder::EvenOddPerBlockPair): a load and 2 instructions per
// 64 weights, shared by every row of the tile. vpdpbusd lanes 0-3 and 8-11
// then hold block b's sums, 4-7 and 12-15 block b + 1's.
//
// Each lane is scaled by its block's x scale times its group's weight scale.
// With groups of 64, 128, ... both blocks of a step are in one group, whose
// scales are broadcast once per group; with groups of 32, 96, ... the two
// blocks can lie in two groups and the lanes take a blend of the two groups'
// scales (kPairsStraddleGroups).

// The 64 codes of one step, unpacked: the 32 bytes in both halves of a
// register (a broadcast load is a load only, no ALU work; a masked load, for
// a row's short last step, costs an ALU operation, so only that step takes
// one), the upper half shifted right by 4 (vpsrlvw, one shift count per
// 16-bit lane), both halves masked to 4 bits.
STEP06_AVX512_VNNI_INLINE __m512i unpack_pair(__m256i packed) {
  const __m512i high_half_by_4 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m512i both_halves = _mm512_broadcast_i64x4(packed);
  return _mm512_and_si512(_mm512_srlv_epi16(both_halves, high_half_by_4), _mm512_set1_epi8(0x0F));
}

// sum over groups g of scale_w[g] * zero[g] * terms[g]: what the zero points
// take off one output's sum. 16 groups per step, the last step masked.
STEP06_AVX512_VNNI_INLINE float zero_point_term(const float* weight_scales, const std::uint8_t* zeros,
                                                const float* terms, int groups) {
  __m512 sum = _mm512_setzero_ps();
  for (int g = 0; g < groups; g += 16) {
    const __mmask16 real = static_cast<__mmask16>(groups - g >= 16 ? 0xFFFF : (1u << (groups - g)) - 1);
    const __m512 zero_points = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(real, zeros + g)));
    const __m512 scaled_zeros = _mm512_mul_ps(_mm512_maskz_loadu_ps(real, weight_scales + g), zero_points);
    sum = _mm512_fmadd_ps(scaled_zeros, _mm512_maskz_loadu_ps(real, terms + g), sum);
  }
  return _mm512_reduce_add_ps(sum);
}

template <QuantScheme kScheme, bool kPairsStraddleGroups, int kRows, int kOutputs>
STEP06_AVX512_VNNI_INLINE void four_bit_outputs(const Int8Product& p, int o, int first_row) {
  const QuantizedMatrix& m = *p.matrix;
  const std::size_t row_bytes = m.bytes_per_row();
  const int groups = m.groups_per_row;
  const int blocks_per_group = m.group_columns / kActivationBlockColumns;
  const int code_blocks = m.padded_in / kActivationBlockColumns;  // blocks of codes stored per row
  const std::uint8_t* codes[kOutputs];   // output o + q's codes
  const float* weight_scales[kOutputs];  // and its group scales
  for (int q = 0; q < kOutputs; ++q) {
    codes[q] = m.packed.data() + static_cast<std::size_t>(o + q) * row_bytes;
    weight_scales[q] = m.scales.data() + static_cast<std::size_t>(o + q) * groups;
  }
  const Int8PairOfBlocks* x_rows[kRows];
  tile_rows(p, first_row, x_rows);
  __m512 sums[kOutputs][kRows];
  for (auto& output : sums)
    for (auto& sum : output) sum = _mm512_setzero_ps();
  if constexpr (!kPairsStraddleGroups) {
    // Groups of whole steps: the group's scales broadcast once per group.
    const int pairs_per_group = blocks_per_group / 2;
    for (int g = 0, pair = 0; g < groups; ++g) {
      __m512 group_scales[kOutputs];
      for (int q = 0; q < kOutputs; ++q) group_scales[q] = _mm512_set1_ps(weight_scales[q][g]);
      for (int end = pair + pairs_per_group; pair < end; ++pair) {
        const PairOfRows<kRows> x = load_pair(x_rows, pair);
        __m512i weights[kOutputs];
        for (int q = 0; q < kOutputs; ++q)
          weights[q] = unpack_pair(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes[q] + pair * 32)));
        multiply_pair<kRows, kOutputs, true>(weights, x, group_scales, sums);
      }
    }
  } else {
    // Block b of step `pair` is 2 * pair, block b + 1 the next; their groups
    // are followed as the steps go (no division per step).
    int group_b = 0, block_in_group = 0;  // block b's group, and its place in it
    for (int pair = 0; pair < p.pairs_per_row; ++pair) {
      const bool second_block_real = 2 * pair + 1 < code_blocks;
      const bool second_starts_group = block_in_group + 1 == blocks_per_group;
      const int group_b1 = second_block_real && second_starts_group ? group_b + 1 : group_b;
      const PairOfRows<kRows> x = load_pair(x_rows, pair);
      __m512i weights[kOutputs];
      __m512 lane_weight_scales[kOutputs];  // group_b's for block b's lanes, group_b1's for block b + 1's
      for (int q = 0; q < kOutputs; ++q) {
        const std::uint8_t* pair_codes = codes[q] + pair * 32;
        weights[q] = unpack_pair(second_block_real ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair_codes))
                                                   : _mm256_maskz_loadu_epi8(__mmask32{0xFFFF}, pair_codes));
        lane_weight_scales[q] = _mm512_mask_blend_ps(__mmask16{0xF0F0}, _mm512_set1_ps(weight_scales[q][group_b]),
                                                     _mm512_set1_ps(weight_scales[q][group_b1]));
      }
      multiply_pair<kRows, kOutputs, true>(weights, x, lane_weight_scales, sums);
      // Two blocks on: the group of block 2 * pair + 2.
      block_in_group += 2;
      while (block_in_group >= blocks_per_group) {
        block_in_group -= blocks_per_group;
        ++group_b;
      }
    }
  }
  float totals[kOutputs * kRows];
  lane_totals(sums, totals);
  for (int q = 0; q < kOutputs; ++q)
    for (int r = 0; r < kRows; ++r) {
      float result = totals[q * kRows + r];
      if constexpr (kScheme == QuantScheme::Int4Asymmetric) {
        const float* terms = p.zero_point_terms + static_cast<std::size_t>(first_row + r) * groups;
        const std::uint8_t* zeros = m.zeros.data() + static_cast<std::size_t>(o + q) * groups;
        result -= zero_point_term(weight_scales[q], zeros, terms, groups);
      }
      p.y[static_cast<std::size_t>(first_row + r) * m.out_features + o + q] = result;
    }
}

template <QuantScheme kScheme, bool kPairsStraddleGroups, int kRows>
STEP06_AVX512_VNNI void four_bit_tile_of(const Int8Product& p, int out_begin, int out_end, int first_row) {
  int o = out_begin;
  for (; o + kOutputsAtOnce <= out_end; o += kOutputsAtOnce)
    four_bit_outputs<kScheme, kPairsStraddleGroups, kRows, kOutputsAtOnce>(p, o, first_row);
  for (; o < out_end; ++o) four_bit_outputs<kScheme, kPairsStraddleGroups, kRows, 1>(p, o, first_row);
}

template <QuantScheme kScheme, int kRows>
void four_bit_tile(const Int8Product& p, int out_begin, int out_end, int first_row) {
  if (p.matrix->group_columns % kPairColumns == 0) {
    four_bit_tile_of<kScheme, false, kRows>(p, out_begin, out_end, first_row);
  } else {
    four_bit_tile_of<kScheme, true, kRows>(p, out_begin, out_end, first_row);
  }
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

std::span<const Int8TileKernel> a8_avx512_tile_kernels(QuantScheme scheme) {
  return int8_activation_kernels_for(scheme, kInt8Weights, kFourBitWeights<QuantScheme::Int4Asymmetric>,
                                     kFourBitWeights<QuantScheme::Int4Symmetric>);
}

}  // namespace step06::cpu_kernels

#endif  // STEP06_X86_KERNELS
