// Step 06 (quantization), CPU: the products with int8 activations (W8A8 /
// W4A8, the "-a8" formats).
//   * quantize_activations: blocks of 32 columns, scale absmax / 127, codes in
//     [-127, 127] within half a step of x, code sums, zero padding, an
//     all-zero block (scale 0), non-finite blocks (NaN scale), AWQ's input
//     scales dividing x first, and the InputErrors of bad sizes;
//   * the names: "-a8" parsed and printed, refused on NF4 and bad groups, the
//     same weight bytes as without it;
//   * exactness: for int8, int4 and int4sym (groups of 32, 64, 96, 128) x every
//     SIMD level this CPU runs for int8 activations (the others skip with a
//     message) x 1..33 rows x awkward shapes (1..70 outputs; 32..1000 inputs
//     where a group fits), with and without input scales, y matches the
//     float64 product of the same quantized operands (the weights' codes times
//     their group scales, and x as quantize_activations rounded it), each
//     output within a tolerance from the terms the kernel adds in float; and
//     the portable kernel's y; and it is not the product with fp32 x (so the
//     int8 path is what ran);
//   * the layer picks the detected level for int8 activations; a level the CPU
//     cannot run is an InputError; 0 rows write nothing; a NaN or an infinity
//     in x comes out as NaN in its row only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "llm/errors.hpp"
#include "step06_quantization/cpu_quantized_linear.hpp"
#include "step06_quantization/int8_activations.hpp"
#include "step06_quantization/quant_algorithms.hpp"
#include "step06_quantization/quant_format.hpp"
#include "step06_test_matrices.hpp"  // weights_with_outliers, quantized_with_zero_group, run_kernel, ...
#include "test_support.hpp"

namespace step06 {
namespace {

using llm::testing::HasSubstr;

constexpr float kInfinity = std::numeric_limits<float>::infinity();
const std::vector<SimdLevel> kLevels = {SimdLevel::Portable, SimdLevel::Avx2, SimdLevel::Avx512};

bool runs(SimdLevel level) { return simd_supported(level, ActivationFormat::Int8Blocks); }

// The largest |value| of a span (0 for an empty one).
float absmax_of(std::span<const float> values) {
  float absmax = 0.0f;
  for (float value : values) absmax = std::max(absmax, std::fabs(value));
  return absmax;
}

// ---------------------------------------------------------------------------
// quantize_activations

// Checks `activations` against the x it rounded, `divided_x` [rows, in] (x
// already divided by any input scales, every value finite): the sizes, and
// for every block the scale (absmax / 127), every code (in [-127, 127], its
// value within half a step of x, the block's largest |x| on +-127), the
// code sums and the zero padding. An all-zero block has scale 0 and codes 0.
void expect_rounded_blocks(const std::vector<float>& divided_x, int rows, int in, const Int8Activations& activations) {
  const int blocks = (in + kActivationBlockColumns - 1) / kActivationBlockColumns;
  ASSERT_EQ(activations.rows, rows);
  ASSERT_EQ(activations.in_features, in);
  ASSERT_EQ(activations.blocks_per_row, blocks);
  ASSERT_EQ(activations.codes_per_row, blocks * kActivationBlockColumns);
  ASSERT_EQ(activations.codes.size(), static_cast<std::size_t>(rows) * activations.codes_per_row);
  ASSERT_EQ(activations.scales.size(), static_cast<std::size_t>(rows) * blocks);
  ASSERT_EQ(activations.code_sums.size(), static_cast<std::size_t>(rows) * blocks);
  for (int r = 0; r < rows; ++r) {
    const std::int8_t* row_codes = activations.codes.data() + static_cast<std::size_t>(r) * activations.codes_per_row;
    for (int b = 0; b < blocks; ++b) {
      SCOPED_TRACE(::testing::Message() << "in " << in << ", row " << r << ", block " << b);
      const int first = b * kActivationBlockColumns;
      const int end = std::min(in, first + kActivationBlockColumns);
      const std::span<const float> block_x(divided_x.data() + static_cast<std::size_t>(r) * in + first,
                                           static_cast<std::size_t>(end - first));
      const float absmax = absmax_of(block_x);
      const std::size_t block_index = static_cast<std::size_t>(r) * blocks + b;
      const float scale = activations.scales[block_index];
      EXPECT_FLOAT_EQ(scale, absmax / 127.0f);
      // Float rounding of x / scale and of code * scale: far below half a step.
      const float slack = 1e-6f * absmax;
      std::int32_t code_sum = 0;
      for (int column = first; column < end; ++column) {
        const int code = row_codes[column];
        const float x = block_x[static_cast<std::size_t>(column - first)];
        ASSERT_GE(code, -127) << "column " << column;
        ASSERT_LE(code, 127) << "column " << column;
        ASSERT_LE(std::fabs(x - activations.value(r, column)), 0.5f * scale + slack)
            << "column " << column << ": x " << x << ", code " << code << ", scale " << scale;
        if (std::fabs(x) == absmax && absmax > 0.0f) EXPECT_EQ(code, x > 0.0f ? 127 : -127) << "column " << column;
        code_sum += code;
      }
      EXPECT_EQ(activations.code_sums[block_index], code_sum);
    }
    for (int column = in; column < activations.codes_per_row; ++column)
      ASSERT_EQ(row_codes[column], 0) << "row " << r << " padding column " << column;
  }
}

// Widths of one column, a block short of one column, one block, a block and
// one column, and the small preset's 288, from wide to narrow: one
// Int8Activations is reused (as the kernels reuse theirs), so a buffer left
// longer, or a code sum left over, from a wider call would show.
TEST(Step06QuantizeActivations, BlocksOfThirtyTwoOnAwkwardWidths) {
  Int8Activations activations;
  std::uint64_t seed = 300;
  for (int in : {288, 100, 33, 32, 31, 1}) {
    const int rows = 3;
    // Activations with outliers (LLMs have outlier channels: section 3.1), so
    // the blocks' scales differ; row 1's first block all zero.
    std::vector<float> x = weights_with_outliers(static_cast<std::size_t>(rows) * in, ++seed);
    std::fill_n(x.begin() + in, std::min(in, kActivationBlockColumns), 0.0f);
    quantize_activations(x.data(), rows, in, {}, activations);
    expect_rounded_blocks(x, rows, in, activations);
    EXPECT_EQ(activations.scales[static_cast<std::size_t>(activations.blocks_per_row)], 0.0f) << "the all-zero block";
    for (int column = 0; column < std::min(in, kActivationBlockColumns); ++column)
      EXPECT_EQ(activations.value(1, column), 0.0f) << "the all-zero block, column " << column;
  }
}

TEST(Step06QuantizeActivations, InputScalesDivideXFirst) {
  const int rows = 2, in = 100;
  const std::vector<float> x = weights_with_outliers(static_cast<std::size_t>(rows) * in, 11);
  const std::vector<float> input_scales = random_input_scales(in, 12);
  std::vector<float> divided = x;  // [rows, in]: x / s, column by column
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < in; ++j) divided[static_cast<std::size_t>(r) * in + j] /= input_scales[j];
  Int8Activations activations;
  quantize_activations(x.data(), rows, in, input_scales, activations);
  expect_rounded_blocks(divided, rows, in, activations);
  // The same x without the scales rounds to other blocks (so the check above can fail).
  Int8Activations unscaled;
  quantize_activations(x.data(), rows, in, {}, unscaled);
  EXPECT_NE(unscaled.scales, activations.scales);
}

// A block holding a NaN, +inf or -inf gets a NaN scale (its values read back
// as NaN); the other blocks of the row are rounded as usual.
TEST(Step06QuantizeActivations, NonFiniteBlocksGetANaNScale) {
  const int rows = 3, in = 100;  // 4 blocks, the last one of 4 columns
  std::vector<float> x = weights_with_outliers(static_cast<std::size_t>(rows) * in, 21);
  const std::vector<float> clean = x;
  // (row, column) of the non-finite values: row 0 block 1, row 1 the short
  // last block, row 2 blocks 0 and 2.
  const std::vector<std::pair<int, int>> poisoned = {{0, 40}, {1, 97}, {2, 0}, {2, 70}};
  x[static_cast<std::size_t>(0) * in + 40] = kNaN;
  x[static_cast<std::size_t>(1) * in + 97] = kInfinity;
  x[static_cast<std::size_t>(2) * in + 0] = -kInfinity;
  x[static_cast<std::size_t>(2) * in + 70] = kNaN;
  Int8Activations activations;
  quantize_activations(x.data(), rows, in, {}, activations);
  Int8Activations reference;
  quantize_activations(clean.data(), rows, in, {}, reference);
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < activations.blocks_per_row; ++b) {
      const bool is_poisoned = std::any_of(poisoned.begin(), poisoned.end(), [&](const std::pair<int, int>& at) {
        return at.first == r && at.second / kActivationBlockColumns == b;
      });
      const std::size_t block_index = static_cast<std::size_t>(r) * activations.blocks_per_row + b;
      if (is_poisoned) {
        EXPECT_TRUE(std::isnan(activations.scales[block_index])) << "row " << r << " block " << b;
        EXPECT_TRUE(std::isnan(activations.value(r, b * kActivationBlockColumns))) << "row " << r << " block " << b;
      } else {
        // The clean blocks are rounded as without the poison.
        EXPECT_EQ(activations.scales[block_index], reference.scales[block_index]) << "row " << r << " block " << b;
        EXPECT_EQ(activations.code_sums[block_index], reference.code_sums[block_index])
            << "row " << r << " block " << b;
      }
    }
}

TEST(Step06QuantizeActivations, BadSizesAndInputScalesAreInputErrors) {
  const std::vector<float> x(2 * 40, 0.5f);
  Int8Activations activations;
  EXPECT_THROW(quantize_activations(x.data(), -1, 40, {}, activations), llm::InputError);
  EXPECT_THROW(quantize_activations(x.data(), 2, -40, {}, activations), llm::InputError);
  const std::vector<float> scales(41, 1.0f);
  EXPECT_THROW(quantize_activations(x.data(), 2, 40, std::span<const float>(scales).first(39), activations),
               llm::InputError);
  EXPECT_THROW(quantize_activations(x.data(), 2, 40, scales, activations), llm::InputError);
  // No rows: nothing to round, and no error.
  EXPECT_NO_THROW(quantize_activations(nullptr, 0, 40, {}, activations));
  EXPECT_EQ(activations.rows, 0);
  EXPECT_TRUE(activations.codes.empty());
  EXPECT_TRUE(activations.scales.empty());
}

// ---------------------------------------------------------------------------
// The names

TEST(Step06Int8ActivationNames, ParseAndNameRoundTrip) {
  struct Named {
    std::string name;
    QuantScheme scheme;
    int group_size;
  };
  for (const Named& named : std::vector<Named>{{"int8-a8", QuantScheme::Int8PerChannel, 0},
                                               {"int4-g64-a8", QuantScheme::Int4Asymmetric, 64},
                                               {"int4-g96-a8", QuantScheme::Int4Asymmetric, 96},
                                               {"int4sym-g32-a8", QuantScheme::Int4Symmetric, 32},
                                               {"int4sym-g1024-a8", QuantScheme::Int4Symmetric, 1024}}) {
    SCOPED_TRACE(named.name);
    const QuantFormat format = QuantFormat::parse(named.name);
    EXPECT_EQ(format, (QuantFormat{named.scheme, named.group_size, ActivationFormat::Int8Blocks}));
    EXPECT_TRUE(format.int8_activations());
    EXPECT_EQ(format.name(), named.name);
    // Without "-a8": the same weights, fp32 activations, a different format.
    const std::string weights_name = named.name.substr(0, named.name.size() - 3);
    const QuantFormat fp32 = QuantFormat::parse(weights_name);
    EXPECT_EQ(fp32, (QuantFormat{named.scheme, named.group_size, ActivationFormat::Fp32}));
    EXPECT_FALSE(fp32.int8_activations());
    EXPECT_NE(fp32, format);
    EXPECT_EQ(fp32.name(), weights_name);
    EXPECT_EQ(format.bits(), fp32.bits());
    EXPECT_EQ(format.has_zero_points(), fp32.has_zero_points());
  }
}

TEST(Step06Int8ActivationNames, Nf4AndBadNamesAreInputErrors) {
  // NF4's levels are not integers: no integer dot product.
  for (const std::string name : {"nf4-a8", "nf4-g64-a8", "nf4-g128-a8"}) {
    SCOPED_TRACE(name);
    const std::string message = parse_error_message(name);
    EXPECT_TRUE(HasSubstr(message, "'" + name + "'"));
    EXPECT_TRUE(HasSubstr(message, "NF4"));
  }
  for (const std::string name : {"int4-g48-a8", "int4sym-g16-a8", "int4-g2048-a8"}) {
    SCOPED_TRACE(name);
    const std::string message = parse_error_message(name);
    EXPECT_TRUE(HasSubstr(message, "'" + name + "'"));
    EXPECT_TRUE(HasSubstr(message, "must be a multiple of 32 between 32 and 1024"));
  }
  for (const std::string name : {"-a8", "a8", "int8a8", "int8-A8", "int8-a8-a8", "int8-a16", "int4-g64-a8x"}) {
    SCOPED_TRACE(name);
    EXPECT_FALSE(parse_error_message(name).empty());
  }
}

// The activation format changes the product, not the storage: a matrix packed
// (or rounded to nearest) as "int8" and as "int8-a8" holds the same bytes.
TEST(Step06Int8ActivationNames, TheWeightsAreTheSameBytes) {
  for (const std::string name : {"int8", "int4-g64", "int4sym-g32", "int4-g96"}) {
    SCOPED_TRACE(name);
    const QuantFormat fp32 = QuantFormat::parse(name);
    const QuantFormat int8 = QuantFormat::parse(name + "-a8");
    const int out = 5, in = 100;
    const std::vector<float> weights = weights_with_outliers(static_cast<std::size_t>(out) * in, 51);
    const QuantizedMatrix rounded_fp32 = quantize_rtn({weights, out, in}, fp32);
    const QuantizedMatrix rounded_int8 = quantize_rtn({weights, out, in}, int8);
    std::vector<GroupParams> params;  // [out, groups_per_row]
    for (int o = 0; o < out; ++o)
      for (int g = 0; g < rounded_fp32.groups_per_row; ++g) params.push_back(rounded_fp32.params(o, g));
    const QuantizedMatrix packed_int8 = pack(int8, out, in, unpack_codes(rounded_fp32), params);
    for (const QuantizedMatrix* int8_matrix : {&rounded_int8, &packed_int8}) {
      EXPECT_EQ(int8_matrix->format, int8);
      EXPECT_EQ(int8_matrix->packed, rounded_fp32.packed);
      EXPECT_EQ(int8_matrix->scales, rounded_fp32.scales);
      EXPECT_EQ(int8_matrix->zeros, rounded_fp32.zeros);
      EXPECT_EQ(int8_matrix->padded_in, rounded_fp32.padded_in);
      EXPECT_EQ(int8_matrix->bytes(), rounded_fp32.bytes());
    }
  }
}

// ---------------------------------------------------------------------------
// The products: every scheme with integer weights x every level the CPU runs.

constexpr int kMaxRows = 33;
const std::vector<int> kRowCounts = {1, 2, 3, 4, 5, 7, 16, 17, 33};
const std::vector<int> kOutFeatures = {1, 3, 5, 17, 33, 70};
const std::vector<int> kInFeatures = {32, 33, 63, 64, 96, 100, 288, 1000};
// The widest rows (1000 inputs: 32 blocks, the most float adds per output) go
// with up to 17 outputs: with 33 and 70 they alone would double this file's
// time under the sanitizers (the float64 product is most of it).
bool in_the_test(int out, int in) { return in < 1000 || out <= 17; }
const std::vector<std::string> kFormats = {"int8-a8",        "int4-g32-a8",    "int4-g64-a8",
                                           "int4-g96-a8",    "int4-g128-a8",   "int4sym-g32-a8",
                                           "int4sym-g64-a8", "int4sym-g96-a8", "int4sym-g128-a8"};

// The zero point a scheme's integer weight subtracts from the code
// (quant_format.hpp: q for int8, q - 8 for int4sym, q - zero for int4).
int zero_point(QuantScheme scheme, const GroupParams& params) {
  if (scheme == QuantScheme::Int4Symmetric) return 8;
  if (scheme == QuantScheme::Int4Asymmetric) return static_cast<int>(params.zero);
  return 0;
}

// The tolerance, per output, from the terms the kernel adds in float. The
// integer dot products of a block (32 products of at most 127 x 127, or 15 x
// 127) are exact in int32 in every kernel; rounding enters only when a
// block's integer sum (or its two parts q . c and zero x sum c, for kernels
// that split off the zero point) is converted and multiplied by the block's
// and the group's scales, a few roundings of 2^-24 relative to that block's
// term, and when the block terms are added in fp32, each add off by at most
// 2^-24 of the running sum. All of those are bounded by
//   M = sum_j scale_g (|q_j - zero| + zero) |x~_j|
// (|q| <= |q - zero| + zero, so M bounds the split parts too), and each
// output is off by at most about (blocks + 3) x 6e-8 x M: 2e-6 M at 1000
// inputs (32 blocks). 1e-5 M leaves 5x for orders of addition we do not know
// (measured over these shapes, every level: at most 3e-7 M); the float64
// reference's own error (x~ as a float) is below 1e-7 M. The 1e-30: an
// output whose every term is 0 (an all-zero weight group against a zero
// block) must come out 0, not anything else.
constexpr double kToleranceOfMagnitude = 1e-5;
constexpr double kToleranceFloor = 1e-30;

// The product of the same quantized operands in float64 [rows, out]:
//   y[r, o] = sum_j w~[o, j] x~[r, j],  w~ = (q - zero) x group scale (WITHOUT
// the input scales dequantize() folds in: they are in x~ here), x~ =
// quantize_activations' value(); and each output's tolerance.
struct ExactProduct {
  std::vector<double> y;          // [rows, out]
  std::vector<double> tolerance;  // [rows, out]
};
ExactProduct exact_product(const QuantizedMatrix& m, const Int8Activations& x) {
  const int out = m.out_features, in = m.in_features;
  const std::vector<int> codes = unpack_codes(m);  // [out, in]
  std::vector<double> weight(codes.size());         // [out, in]: w~
  std::vector<double> magnitude(codes.size());      // [out, in]: scale_g (|q - zero| + zero)
  for (int o = 0; o < out; ++o)
    for (int j = 0; j < in; ++j) {
      const GroupParams params = m.params(o, j / m.group_columns);
      const int zero = zero_point(m.format.scheme, params);
      const int integer = codes[static_cast<std::size_t>(o) * in + j] - zero;
      weight[static_cast<std::size_t>(o) * in + j] = static_cast<double>(integer) * params.scale;
      magnitude[static_cast<std::size_t>(o) * in + j] = static_cast<double>(params.scale) * (std::abs(integer) + zero);
    }
  ExactProduct exact;
  exact.y.resize(static_cast<std::size_t>(x.rows) * out);
  exact.tolerance.resize(exact.y.size());
  std::vector<double> x_rounded(static_cast<std::size_t>(in));  // [in]: x~ of one row
  for (int r = 0; r < x.rows; ++r) {
    for (int j = 0; j < in; ++j) x_rounded[j] = x.value(r, j);
    for (int o = 0; o < out; ++o) {
      double sum = 0.0, bound = 0.0;
      for (int j = 0; j < in; ++j) {
        sum += weight[static_cast<std::size_t>(o) * in + j] * x_rounded[j];
        bound += magnitude[static_cast<std::size_t>(o) * in + j] * std::fabs(x_rounded[j]);
      }
      exact.y[static_cast<std::size_t>(r) * out + o] = sum;
      exact.tolerance[static_cast<std::size_t>(r) * out + o] = kToleranceOfMagnitude * bound + kToleranceFloor;
    }
  }
  return exact;
}

// Every output of `got` [rows, out] within factor x its tolerance of `want`
// (NaN never passes); on failure, how many are off and the worst one.
::testing::AssertionResult within_tolerance(std::span<const float> got, std::span<const double> want,
                                            std::span<const double> tolerance, int out, double factor = 1.0) {
  std::size_t off = 0, worst = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double ratio = error / (factor * tolerance[i]);
    if (ratio <= 1.0) continue;  // (false for NaN in got, want or tolerance: NaN counts as off)
    ++off;
    // The worst: the first NaN, else the largest ratio.
    const bool worse = std::isnan(ratio) ? !std::isnan(worst_ratio) : ratio > worst_ratio && !std::isnan(worst_ratio);
    if (off == 1 || worse) {
      worst = i;
      worst_ratio = ratio;
    }
  }
  if (off == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << off << " of " << got.size() << " outputs off; worst: row "
                                       << worst / out << " output " << worst % out << ": got " << got[worst]
                                       << ", want " << want[worst] << " +- " << factor * tolerance[worst] << " ("
                                       << worst_ratio << " x the tolerance)";
}

// The levels this CPU runs for int8 activations; the others are named as skipped.
std::vector<SimdLevel> levels_to_test() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : kLevels) {
    if (runs(level))
      levels.push_back(level);
    else
      std::cout << "this CPU cannot run the " << simd_name(level) << " kernels for int8 activations (it runs up to "
                << simd_name(detected_simd(ActivationFormat::Int8Blocks)) << "); skipping them\n";
  }
  return levels;
}

// One format, every level the CPU runs (one test entry per format, not per
// format and level: the float64 product and the portable kernel's y are
// computed once and shared by the levels, and under the sanitizers each
// entry's process start costs about as much as the checks of a small test).
class Step06Int8ActivationProducts : public ::testing::TestWithParam<std::string> {
 protected:
  QuantFormat format() const { return QuantFormat::parse(GetParam()); }
};

TEST_P(Step06Int8ActivationProducts, EveryLevelMatchesTheFloat64ProductAndThePortableKernel) {
  const std::vector<SimdLevel> levels = levels_to_test();
  std::uint64_t seed = 2000;
  int shapes = 0;
  for (int out : kOutFeatures) {
    for (int in : kInFeatures) {
      if (in < format().group_size || !in_the_test(out, in)) continue;  // smaller than one group, or too slow
      ++shapes;
      // Weights and x with outliers: group and block scales that differ, lopsided groups (zero points far from 8).
      QuantizedMatrix m = quantized_with_zero_group(
          format(), weights_with_outliers(static_cast<std::size_t>(out) * in, ++seed), out, in);
      std::vector<float> x = weights_with_outliers(static_cast<std::size_t>(kMaxRows) * in, ++seed);
      std::fill_n(x.begin(), std::min(in, kActivationBlockColumns), 0.0f);  // row 0's first block: scale 0
      const std::vector<float> input_scales = random_input_scales(in, ++seed);
      for (const bool scaled : {false, true}) {
        m.input_scales = scaled ? input_scales : std::vector<float>{};
        Int8Activations rounded;
        quantize_activations(x.data(), kMaxRows, in, m.input_scales, rounded);
        const ExactProduct exact = exact_product(m, rounded);
        for (int rows : kRowCounts) {
          const std::size_t count = static_cast<std::size_t>(rows) * out;
          const std::span<const double> want(exact.y.data(), count), tolerance(exact.tolerance.data(), count);
          const std::vector<float> portable = run_kernel(m, x, rows, SimdLevel::Portable);
          const std::vector<double> portable_y(portable.begin(), portable.end());
          for (SimdLevel level : levels) {
            SCOPED_TRACE(::testing::Message() << format().name() << " " << simd_name(level) << ": [" << out << ", "
                                              << in << "] x " << rows << " rows" << (scaled ? ", input scales" : ""));
            const std::vector<float> y = level == SimdLevel::Portable ? portable : run_kernel(m, x, rows, level);
            EXPECT_TRUE(within_tolerance(y, want, tolerance, out)) << "vs the float64 product";
            // Both within the tolerance of the exact product: within twice it of each other.
            if (level != SimdLevel::Portable)
              EXPECT_TRUE(within_tolerance(y, portable_y, tolerance, out, 2.0)) << "vs the portable kernel";
          }
        }
      }
    }
  }
  EXPECT_GT(shapes, 0);
}

// Rounding x changes y by far more than the tolerance: y is not the product
// with fp32 x (neither the fp32-x kernel's bits nor the float64 product with
// x itself), so the int8 path is what ran.
TEST_P(Step06Int8ActivationProducts, EveryLevelIsNotTheProductWithFp32X) {
  const int out = 17, in = 288, rows = 4;
  const QuantizedMatrix m = random_matrix(format(), out, in, 61);
  QuantizedMatrix fp32_x = m;  // the same bytes, the fp32-x product
  fp32_x.format.activations = ActivationFormat::Fp32;
  const std::vector<float> x = llm::testing::random_vector(static_cast<std::size_t>(rows) * in, 62);
  Int8Activations rounded;
  quantize_activations(x.data(), rows, in, {}, rounded);
  const ExactProduct exact = exact_product(m, rounded);
  const std::vector<float> y_fp32_x = run_kernel(fp32_x, x, rows, detected_simd());
  const std::vector<float> weight = dequantize(m);  // [out, in] (no input scales here)
  std::vector<double> fp32_x_product(static_cast<std::size_t>(rows) * out);  // [rows, out]: x unrounded, float64
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      double sum = 0.0;
      for (int j = 0; j < in; ++j)
        sum += static_cast<double>(weight[static_cast<std::size_t>(o) * in + j]) *
               x[static_cast<std::size_t>(r) * in + j];
      fp32_x_product[static_cast<std::size_t>(r) * out + o] = sum;
    }
  for (SimdLevel level : levels_to_test()) {
    SCOPED_TRACE(simd_name(level));
    const std::vector<float> y = run_kernel(m, x, rows, level);
    EXPECT_TRUE(within_tolerance(y, exact.y, exact.tolerance, out)) << "vs the float64 product with int8 x";
    std::size_t same_bits = 0, off = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      same_bits += y[i] == y_fp32_x[i] ? 1 : 0;
      off += std::fabs(y[i] - fp32_x_product[i]) > exact.tolerance[i] ? 1 : 0;
    }
    EXPECT_LT(same_bits, y.size() / 4) << "outputs equal to the fp32-x kernel's";
    EXPECT_GT(off, y.size() / 2) << "outputs off from the float64 product with fp32 x (most must be)";
  }
}

// A NaN or an infinity in x: every output of its row is NaN (even output 1,
// whose first group, over the NaN, is all zero: 0 x NaN is NaN), the other
// rows are untouched.
TEST_P(Step06Int8ActivationProducts, NonFiniteXComesOutAsNaNInItsRowOnly) {
  const int out = 17, in = 300, rows = 6;  // 10 blocks, the last one of 12 columns; groups of up to 128 fit
  const QuantizedMatrix m = quantized_with_zero_group(
      format(), weights_with_outliers(static_cast<std::size_t>(out) * in, 71), out, in);
  std::vector<float> x = weights_with_outliers(static_cast<std::size_t>(rows) * in, 72);
  Int8Activations rounded;
  quantize_activations(x.data(), rows, in, {}, rounded);
  const ExactProduct exact = exact_product(m, rounded);
  x[static_cast<std::size_t>(1) * in + 10] = kNaN;
  x[static_cast<std::size_t>(4) * in + 299] = kInfinity;  // in the short last block
  for (SimdLevel level : levels_to_test()) {
    const std::vector<float> y = run_kernel(m, x, rows, level);
    for (int r = 0; r < rows; ++r) {
      SCOPED_TRACE(::testing::Message() << simd_name(level) << ", row " << r);
      const std::size_t row_start = static_cast<std::size_t>(r) * out;
      if (r == 1 || r == 4) {
        for (int o = 0; o < out; ++o) EXPECT_TRUE(std::isnan(y[row_start + o])) << "output " << o;
      } else {
        EXPECT_TRUE(within_tolerance(std::span<const float>(y).subspan(row_start, out),
                                     std::span<const double>(exact.y).subspan(row_start, out),
                                     std::span<const double>(exact.tolerance).subspan(row_start, out), out))
            << "(finite x)";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryFormat, Step06Int8ActivationProducts, ::testing::ValuesIn(kFormats),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// ---------------------------------------------------------------------------
// The layer and the levels.

TEST(Step06Int8ActivationLayer, PicksTheDetectedLevelForInt8Activations) {
  const SimdLevel detected = detected_simd(ActivationFormat::Int8Blocks);
  for (const std::string& name : kFormats) {
    SCOPED_TRACE(name);
    const QuantizedMatrix m = random_matrix(QuantFormat::parse(name), 33, 288, 91);
    const QuantizedLinear layer(m);
    EXPECT_EQ(layer.in_features(), 288);
    EXPECT_EQ(layer.out_features(), 33);
    EXPECT_EQ(layer.weight_bytes(), m.bytes());
    const std::vector<float> x = llm::testing::random_vector(5 * 288, 92);
    std::vector<float> y(5 * 33, kNaN);
    layer.forward(x.data(), 5, y.data());
    EXPECT_EQ(y, run_kernel(m, x, 5, detected));  // the same bits as the detected level's kernel
  }
}

TEST(Step06Int8ActivationLayer, LevelsForInt8Activations) {
  const SimdLevel detected = detected_simd(ActivationFormat::Int8Blocks);
  EXPECT_TRUE(runs(SimdLevel::Portable));
  EXPECT_TRUE(runs(detected));
  // The detected level is the best one: none above it runs.
  for (SimdLevel level : kLevels)
    if (level > detected) EXPECT_FALSE(runs(level)) << simd_name(level);
  // Int8 activations need what fp32 ones do, and AVX-512 adds VNNI (vpdpbusd)
  // and VL (byte-masked 256-bit loads).
  for (SimdLevel level : kLevels)
    if (runs(level)) EXPECT_TRUE(simd_supported(level, ActivationFormat::Fp32)) << simd_name(level);
  EXPECT_EQ(runs(SimdLevel::Avx2), simd_supported(SimdLevel::Avx2, ActivationFormat::Fp32));
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  EXPECT_EQ(runs(SimdLevel::Avx512), simd_supported(SimdLevel::Avx512, ActivationFormat::Fp32) &&
                                         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl"));
#endif
  std::cout << "for int8 activations this CPU runs up to " << simd_name(detected) << "\n";
}

TEST(Step06Int8ActivationLayer, ZeroRowsWriteNothing) {
  for (const std::string name : {"int8-a8", "int4-g32-a8", "int4sym-g96-a8"}) {
    const QuantizedMatrix m = random_matrix(QuantFormat::parse(name), 3, 128, 81);
    for (SimdLevel level : levels_to_test()) {
      SCOPED_TRACE(name + " " + simd_name(level));
      std::vector<float> y(3, 1.0f);
      quantized_matmul(m, nullptr, 0, y.data(), level);
      EXPECT_EQ(y, std::vector<float>(3, 1.0f));
      EXPECT_THROW(quantized_matmul(m, nullptr, -1, y.data(), level), llm::InputError);
    }
  }
}

TEST(Step06Int8ActivationLayer, ALevelTheCpuLacksIsAnInputError) {
  const QuantizedMatrix m = random_matrix(QuantFormat::parse("int4-g32-a8"), 3, 64, 93);
  const std::vector<float> x(64, 1.0f);
  std::vector<float> y(3);
  int lacking = 0;
  for (SimdLevel level : {SimdLevel::Portable, SimdLevel::Avx2, SimdLevel::Avx512, static_cast<SimdLevel>(7)}) {
    if (runs(level)) continue;
    ++lacking;
    EXPECT_THROW(quantized_matmul(m, x.data(), 1, y.data(), level), llm::InputError) << simd_name(level);
    EXPECT_THROW(QuantizedLinear(m, level), llm::InputError) << simd_name(level);
  }
  EXPECT_GE(lacking, 1);  // at least the level that is not one
}

}  // namespace
}  // namespace step06
