// Step 06 (quantization), the formats: names parsed and printed, pack and
// unpack on awkward shapes (a last group shorter than the others, padding),
// round to nearest within half a step of every weight, the bytes a format
// stores, and the InputErrors of bad names and layers too small for a group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "llm/errors.hpp"
#include "step06_quantization/cuda_weight_layout.hpp"
#include "step06_quantization/quant_algorithms.hpp"
#include "step06_quantization/quant_format.hpp"
#include "step06_test_matrices.hpp"  // weights_with_outliers
#include "test_support.hpp"

namespace step06 {
namespace {

using llm::testing::HasSubstr;

// The four schemes; `group` is ignored by int8 (one group per row).
std::vector<QuantFormat> every_scheme(int group) {
  return {{QuantScheme::Int8PerChannel, 0},
          {QuantScheme::Int4Asymmetric, group},
          {QuantScheme::Int4Symmetric, group},
          {QuantScheme::NF4, group}};
}

int lowest_code(QuantScheme scheme) {
  if (scheme == QuantScheme::Int8PerChannel) return -127;
  return scheme == QuantScheme::Int4Symmetric ? 1 : 0;
}
int highest_code(QuantScheme scheme) { return scheme == QuantScheme::Int8PerChannel ? 127 : 15; }

// The shapes of the round-trip tests: 1, 3, 17 rows; columns that are and
// are not whole groups (33 = one group of 32 and one column).
const std::vector<int> kOutFeatures = {1, 3, 17};
const std::vector<int> kInFeatures = {32, 33, 100, 172, 257};

TEST(QuantFormatNames, ParseAndNameRoundTrip) {
  for (const std::string name : {"int8", "int4-g32", "int4-g64", "int4-g128", "int4sym-g64", "nf4", "nf4-g128"}) {
    SCOPED_TRACE(name);
    const QuantFormat format = QuantFormat::parse(name);
    EXPECT_EQ(format.name(), name);
    EXPECT_EQ(QuantFormat::parse(format.name()), format);
  }
  EXPECT_EQ(QuantFormat::parse("int4-g128"), (QuantFormat{QuantScheme::Int4Asymmetric, 128}));
  EXPECT_EQ(QuantFormat::parse("int4sym-g64"), (QuantFormat{QuantScheme::Int4Symmetric, 64}));
  EXPECT_EQ(QuantFormat::parse("int8"), (QuantFormat{QuantScheme::Int8PerChannel, 0}));
  EXPECT_EQ(QuantFormat::parse("nf4"), (QuantFormat{QuantScheme::NF4, 64}));  // QLoRA's block of 64
  EXPECT_EQ(QuantFormat::parse("nf4-g64").name(), "nf4");                      // the short name is the canonical one
  EXPECT_EQ(QuantFormat::parse("int4-g1024").group_size, 1024);
  EXPECT_EQ(QuantFormat::parse("int8").bits(), 8);
  EXPECT_EQ(QuantFormat::parse("nf4").bits(), 4);
  EXPECT_TRUE(QuantFormat::parse("int4-g64").has_zero_points());
  EXPECT_FALSE(QuantFormat::parse("int4sym-g64").has_zero_points());
  EXPECT_EQ(QuantFormat::parse("int8").group_columns(172), 172);
  EXPECT_EQ(QuantFormat::parse("int4-g64").group_columns(172), 64);
}

TEST(QuantFormatNames, BadNamesThrowWithTheProblem) {
  for (const std::string name : {"int3", "fp4", "", "INT8", "int8-g32"}) {
    SCOPED_TRACE(name);
    const std::string message = parse_error_message(name);
    EXPECT_TRUE(HasSubstr(message, "unsupported quantization format '" + name + "'"));
    EXPECT_TRUE(HasSubstr(message, "supported: int8, int4-gN"));
  }
  for (const std::string name : {"int4-g48", "int4-g0", "int4-g2048", "int4-g-32", "int4sym-g16", "nf4-g1056"}) {
    SCOPED_TRACE(name);
    const std::string message = parse_error_message(name);
    EXPECT_TRUE(HasSubstr(message, "'" + name + "'"));
    EXPECT_TRUE(HasSubstr(message, "must be a multiple of 32 between 32 and 1024"));
  }
  for (const std::string name : {"int4-g", "int4-gabc", "int4-g64x", "int4-g 64", "nf4-g"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(HasSubstr(parse_error_message(name), "is not a group size"));
  }
}

// Random codes in each scheme's range and random group parameters survive
// pack -> unpack and dequantize on every awkward shape.
TEST(QuantFormatPacking, RandomCodesRoundTripOnAwkwardShapes) {
  std::mt19937 rng(20240606);
  for (int group : {32, 64})
    for (const QuantFormat& format : every_scheme(group))
      for (int out : kOutFeatures)
        for (int in : kInFeatures) {
          if (format.group_size > in) continue;  // too small a layer: its own test
          SCOPED_TRACE(format.name() + " [" + std::to_string(out) + ", " + std::to_string(in) + "]");
          const int columns = format.group_columns(in);
          const int groups_per_row = (in + columns - 1) / columns;
          std::uniform_int_distribution<int> code_in_range(lowest_code(format.scheme), highest_code(format.scheme));
          std::uniform_int_distribution<int> zero_point(0, 15);
          std::uniform_real_distribution<float> scale(0.001f, 2.0f);
          std::vector<int> codes(static_cast<std::size_t>(out) * in);  // [out, in]
          for (int& code : codes) code = code_in_range(rng);
          std::vector<GroupParams> params(static_cast<std::size_t>(out) * groups_per_row);  // [out, groups]
          for (GroupParams& p : params)
            p = {scale(rng), format.has_zero_points() ? static_cast<float>(zero_point(rng)) : 0.0f};

          const QuantizedMatrix matrix = pack(format, out, in, codes, params);
          EXPECT_EQ(matrix.group_columns, columns);
          EXPECT_EQ(matrix.groups_per_row, groups_per_row);
          EXPECT_EQ(matrix.padded_in, groups_per_row * columns);
          EXPECT_EQ(matrix.packed.size(), static_cast<std::size_t>(out) * matrix.bytes_per_row());
          EXPECT_EQ(matrix.bytes_per_row(), static_cast<std::size_t>(format.bits() == 8 ? matrix.padded_in
                                                                                         : matrix.padded_in / 2));
          EXPECT_EQ(matrix.scales.size(), params.size());
          EXPECT_EQ(matrix.zeros.size(), format.has_zero_points() ? params.size() : 0u);
          EXPECT_TRUE(matrix.input_scales.empty());
          EXPECT_EQ(unpack_codes(matrix), codes);

          const std::vector<float> weight = dequantize(matrix);  // [out, in]
          ASSERT_EQ(weight.size(), codes.size());
          for (int row = 0; row < out; ++row) {
            for (int g = 0; g < groups_per_row; ++g) {
              const GroupParams stored = matrix.params(row, g);
              EXPECT_EQ(stored.scale, params[static_cast<std::size_t>(row) * groups_per_row + g].scale);
              EXPECT_EQ(stored.zero, params[static_cast<std::size_t>(row) * groups_per_row + g].zero);
            }
            for (int column = 0; column < in; ++column) {
              const std::size_t at = static_cast<std::size_t>(row) * in + column;
              ASSERT_EQ(weight[at], code_value(format.scheme, codes[at], matrix.params(row, column / columns)));
            }
            // Padding stores the code that reads back as exactly 0.
            for (int column = in; column < matrix.padded_in; ++column)
              ASSERT_EQ(code_value(format.scheme, matrix.code(row, column), matrix.params(row, groups_per_row - 1)),
                        0.0f)
                  << "padding column " << column;
          }
        }
}

// The byte layout the kernels read: column 2j in the low nibble of byte j,
// column 2j + 1 in the high nibble; int8 codes as two's complement bytes.
TEST(QuantFormatPacking, NibbleOrderAndInt8Bytes) {
  std::vector<int> codes(32);  // [1, 32]
  for (int i = 0; i < 32; ++i) codes[static_cast<std::size_t>(i)] = i % 16;
  const QuantizedMatrix int4 = pack({QuantScheme::Int4Asymmetric, 32}, 1, 32, codes, std::vector<GroupParams>{{1, 0}});
  ASSERT_EQ(int4.packed.size(), 16u);
  EXPECT_EQ(int4.packed[0], 0x10);  // columns 0 (low) and 1 (high)
  EXPECT_EQ(int4.packed[1], 0x32);
  EXPECT_EQ(int4.packed[15], 0xFE);  // columns 30 and 31: codes 14 and 15

  const std::vector<int> signed_codes = {-127, -1, 0, 1, 127};
  const QuantizedMatrix int8 = pack({QuantScheme::Int8PerChannel, 0}, 1, 5, signed_codes,
                                    std::vector<GroupParams>{{0.5f, 0}});
  EXPECT_EQ(std::vector<std::uint8_t>(int8.packed.begin(), int8.packed.end()),
            (std::vector<std::uint8_t>{0x81, 0xFF, 0x00, 0x01, 0x7F}));
  EXPECT_EQ(dequantize(int8), (std::vector<float>{-63.5f, -0.5f, 0.0f, 0.5f, 63.5f}));
}

// Two rows of 35 columns in groups of 32 (int4 asymmetric): each row is
// padded to 64 codes, 32 bytes, and its padding columns hold the zero point
// of the row's last group. Every byte against the layout written out, and
// every code (padding included) read back with code().
TEST(QuantFormatPacking, Int4RowsWithPaddingByteForByte) {
  const int out = 2, in = 35;
  const auto code_of = [](int row, int column) { return (3 * column + 5 * row) % 16; };
  std::vector<int> codes;  // [2, 35]
  for (int row = 0; row < out; ++row)
    for (int column = 0; column < in; ++column) codes.push_back(code_of(row, column));
  // [2 rows, 2 groups]: the zero points of the last groups (9 and 4) are the padding codes.
  const std::vector<GroupParams> params = {{0.5f, 2.0f}, {0.25f, 9.0f}, {1.0f, 7.0f}, {2.0f, 4.0f}};
  const QuantizedMatrix matrix = pack({QuantScheme::Int4Asymmetric, 32}, out, in, codes, params);
  ASSERT_EQ(matrix.padded_in, 64);
  ASSERT_EQ(matrix.packed.size(), 64u);
  // By hand: row 0 starts 0x30 (columns 0 and 1: codes 0 and 3), 0x96 at byte
  // 17 (column 34: code 6; column 35: padding, zero point 9), then 0x99; row
  // 1 (byte 32 on) starts 0x85 (codes 5 and 8) and pads with 0x44.
  EXPECT_EQ(matrix.packed[0], 0x30);
  EXPECT_EQ(matrix.packed[17], 0x96);
  EXPECT_EQ(matrix.packed[18], 0x99);
  EXPECT_EQ(matrix.packed[31], 0x99);
  EXPECT_EQ(matrix.packed[32], 0x85);
  EXPECT_EQ(matrix.packed[32 + 17], (4 << 4) | code_of(1, 34));
  EXPECT_EQ(matrix.packed[63], 0x44);
  const std::uint8_t padding[2] = {9, 4};
  for (int row = 0; row < out; ++row)
    for (int j = 0; j < 32; ++j) {
      const int even = 2 * j < in ? code_of(row, 2 * j) : padding[row];
      const int odd = 2 * j + 1 < in ? code_of(row, 2 * j + 1) : padding[row];
      ASSERT_EQ(matrix.packed[static_cast<std::size_t>(32 * row + j)], odd << 4 | even)
          << "row " << row << " byte " << j;
      ASSERT_EQ(matrix.code(row, 2 * j), even) << "row " << row << " column " << 2 * j;
      ASSERT_EQ(matrix.code(row, 2 * j + 1), odd) << "row " << row << " column " << 2 * j + 1;
    }
  EXPECT_EQ(unpack_codes(matrix), codes);
}

TEST(QuantFormatPacking, CodesOutOfRangeAndBadSizesThrow) {
  const std::vector<GroupParams> one_group = {{1.0f, 8.0f}};
  const auto pack_one = [&](QuantScheme scheme, int bad_code) {
    std::vector<int> codes(32, scheme == QuantScheme::Int4Symmetric ? 8 : 0);
    codes[5] = bad_code;
    return pack({scheme, scheme == QuantScheme::Int8PerChannel ? 0 : 32}, 1, 32, codes, one_group);
  };
  EXPECT_THROW(pack_one(QuantScheme::Int8PerChannel, -128), llm::InputError);  // -128 is not symmetric
  EXPECT_THROW(pack_one(QuantScheme::Int4Asymmetric, 16), llm::InputError);
  EXPECT_THROW(pack_one(QuantScheme::Int4Symmetric, 0), llm::InputError);  // q - 8 = -8 is outside [-7, 7]
  EXPECT_THROW(pack_one(QuantScheme::NF4, -1), llm::InputError);
  EXPECT_NO_THROW(pack_one(QuantScheme::Int4Symmetric, 15));

  const QuantFormat int4{QuantScheme::Int4Asymmetric, 32};
  EXPECT_THROW(pack(int4, 2, 64, std::vector<int>(127, 0), std::vector<GroupParams>(4)), llm::InputError);
  EXPECT_THROW(pack(int4, 2, 64, std::vector<int>(128, 0), std::vector<GroupParams>(3)), llm::InputError);
  EXPECT_THROW(pack(int4, 1, 32, std::vector<int>(32, 0), std::vector<GroupParams>{{-1.0f, 0.0f}}),
               llm::InputError);
  EXPECT_THROW(pack(int4, 1, 32, std::vector<int>(32, 0), std::vector<GroupParams>{{NAN, 0.0f}}), llm::InputError);
}

// Round to nearest: every weight is read back within half a step of its
// group (for NF4, half the gap between the two levels around it, times the
// group's absmax).
TEST(QuantFormatRtn, EveryWeightWithinHalfAStep) {
  std::uint64_t seed = 100;
  for (int group : {32, 64})
    for (const QuantFormat& format : every_scheme(group))
      for (int out : kOutFeatures)
        for (int in : kInFeatures) {
          if (format.group_size > in) continue;
          SCOPED_TRACE(format.name() + " [" + std::to_string(out) + ", " + std::to_string(in) + "]");
          const std::vector<float> weight = weights_with_outliers(static_cast<std::size_t>(out) * in, ++seed);
          const QuantizedMatrix matrix = quantize_rtn({weight, out, in}, format);
          const std::vector<float> approximate = dequantize(matrix);  // [out, in]
          ASSERT_EQ(approximate.size(), weight.size());
          for (int row = 0; row < out; ++row)
            for (int g = 0; g < matrix.groups_per_row; ++g) {
              const int first = g * matrix.group_columns;
              const int count = std::min(matrix.group_columns, in - first);
              const std::size_t start = static_cast<std::size_t>(row) * in + first;
              float absmax = 0.0f;
              for (int i = 0; i < count; ++i) absmax = std::max(absmax, std::fabs(weight[start + i]));
              const GroupParams p = matrix.params(row, g);
              // Float rounding of w / scale and of the product: far below a step.
              const float rounding = 1e-6f * absmax;
              for (int i = 0; i < count; ++i) {
                const float w = weight[start + i];
                float bound = 0.5f * p.scale;
                if (format.scheme == QuantScheme::NF4) {
                  const float normalized = w / p.scale;  // in [-1, 1]
                  std::size_t upper = 1;
                  while (upper < 15 && kNf4Levels[upper] < normalized) ++upper;
                  bound = 0.5f * (kNf4Levels[upper] - kNf4Levels[upper - 1]) * p.scale;
                }
                ASSERT_LE(std::fabs(w - approximate[start + i]), bound + rounding)
                    << "row " << row << " column " << first + i << " weight " << w << " scale " << p.scale;
              }
            }
        }
}

// Int4 asymmetric by hand: 15 steps from the group's min to its max (both
// taken with 0 included), the zero point the code of 0.0, every code rounded
// and clamped to [0, 15].
TEST(QuantFormatRtn, AsymmetricScaleZeroPointAndCodesByHand) {
  constexpr QuantScheme kAsym = QuantScheme::Int4Asymmetric;
  // min -0.3, max 1.2: steps of 0.1, zero point 3.
  const std::vector<float> mixed = {0.52f, -0.3f, 1.2f, 0.0f, 0.07f};
  const GroupParams p = choose_group_params(kAsym, mixed);
  EXPECT_FLOAT_EQ(p.scale, 0.1f);
  EXPECT_EQ(p.zero, 3.0f);
  EXPECT_EQ(quantize_to_code(kAsym, -0.3f, p), 0);
  EXPECT_EQ(quantize_to_code(kAsym, 0.0f, p), 3);
  EXPECT_EQ(quantize_to_code(kAsym, 0.07f, p), 4);   // 0.7 steps: rounds up
  EXPECT_EQ(quantize_to_code(kAsym, 0.52f, p), 8);   // 5.2 steps
  EXPECT_EQ(quantize_to_code(kAsym, -0.13f, p), 2);  // -1.3 steps: rounds to -1
  EXPECT_EQ(quantize_to_code(kAsym, 1.2f, p), 15);
  EXPECT_EQ(quantize_to_code(kAsym, 2.0f, p), 15);   // past the max: clamped
  EXPECT_EQ(quantize_to_code(kAsym, -1.0f, p), 0);   // past the min: clamped
  // min -0.1, max 1.0: -min / scale is 1.36 steps, so the zero point rounds to 1,
  // and 0.0 reads back exactly.
  const std::vector<float> skewed = {1.0f, -0.1f, 0.5f};
  const GroupParams q = choose_group_params(kAsym, skewed);
  EXPECT_FLOAT_EQ(q.scale, 1.1f / 15.0f);
  EXPECT_EQ(q.zero, 1.0f);
  EXPECT_EQ(quantize_to_code(kAsym, -0.1f, q), 0);
  EXPECT_EQ(quantize_to_code(kAsym, 0.0f, q), 1);
  EXPECT_EQ(quantize_to_code(kAsym, 0.5f, q), 8);   // 6.8 steps
  EXPECT_EQ(quantize_to_code(kAsym, 1.0f, q), 15);  // 13.6 steps
  EXPECT_EQ(code_value(kAsym, quantize_to_code(kAsym, 0.0f, q), q), 0.0f);
  // All positive: the range starts at 0, so the zero point is code 0.
  const std::vector<float> positive = {0.2f, 0.75f, 0.5f};
  const GroupParams up = choose_group_params(kAsym, positive);
  EXPECT_FLOAT_EQ(up.scale, 0.05f);
  EXPECT_EQ(up.zero, 0.0f);
  EXPECT_EQ(quantize_to_code(kAsym, 0.5f, up), 10);
  // All negative: the range ends at 0, so the zero point is code 15.
  const std::vector<float> negative = {-0.6f, -0.15f};
  const GroupParams down = choose_group_params(kAsym, negative);
  EXPECT_FLOAT_EQ(down.scale, 0.04f);
  EXPECT_EQ(down.zero, 15.0f);
  EXPECT_EQ(quantize_to_code(kAsym, -0.15f, down), 11);  // -3.75 steps: rounds to -4
  // A zero group: scale 0, and every weight stores the zero point.
  const std::vector<float> zeros = {0.0f, 0.0f, 0.0f};
  const GroupParams flat = choose_group_params(kAsym, zeros);
  EXPECT_EQ(flat.scale, 0.0f);
  EXPECT_EQ(quantize_to_code(kAsym, 0.0f, flat), static_cast<int>(flat.zero));
  EXPECT_EQ(code_value(kAsym, quantize_to_code(kAsym, 0.0f, flat), flat), 0.0f);
}

// The symmetric formats put the group's largest |w| on their extreme code
// (127, 7 or NF4's 1.0), so the largest weights, the ones that matter most,
// are read back to within one float rounding (NF4 exactly: 1.0 * absmax).
TEST(QuantFormatRtn, LargestWeightGetsTheExtremeCode) {
  for (const std::string name : {"int8", "int4sym-g32", "nf4-g32"}) {
    SCOPED_TRACE(name);
    const QuantFormat format = QuantFormat::parse(name);
    const int out = 17, in = 100;
    std::vector<float> weight = weights_with_outliers(static_cast<std::size_t>(out) * in, 7);
    weight[3 * in + 40] = -5.0f;  // a negative extreme in row 3
    const QuantizedMatrix matrix = quantize_rtn({weight, out, in}, format);
    const std::vector<float> approximate = dequantize(matrix);
    for (int row = 0; row < out; ++row)
      for (int g = 0; g < matrix.groups_per_row; ++g) {
        const int first = g * matrix.group_columns;
        const int count = std::min(matrix.group_columns, in - first);
        const std::size_t start = static_cast<std::size_t>(row) * in + first;
        std::size_t largest = start;
        for (int i = 0; i < count; ++i)
          if (std::fabs(weight[start + i]) > std::fabs(weight[largest])) largest = start + i;
        const int code = matrix.code(row, first + static_cast<int>(largest - start));
        const bool positive = weight[largest] > 0.0f;
        // The extreme codes: int8 +-127, int4sym 15 and 1 (+-7 after the offset 8), NF4 15 and 0 (levels +-1).
        if (format.scheme == QuantScheme::Int8PerChannel) EXPECT_EQ(code, positive ? 127 : -127);
        if (format.scheme == QuantScheme::Int4Symmetric) EXPECT_EQ(code, positive ? 15 : 1);
        if (format.scheme == QuantScheme::NF4) EXPECT_EQ(code, positive ? 15 : 0);
        if (format.scheme == QuantScheme::NF4)
          EXPECT_EQ(approximate[largest], weight[largest]);
        else
          EXPECT_NEAR(approximate[largest], weight[largest], std::fabs(weight[largest]) * 2.4e-7f);
      }
  }
}

TEST(QuantFormatRtn, PaddedColumnsReadBackZeroAndDequantizeDropsThem) {
  for (const QuantFormat& format : every_scheme(64)) {
    SCOPED_TRACE(format.name());
    const int out = 3, in = 100;  // int4: two groups of 64, the second with 28 padding columns
    const std::vector<float> weight = weights_with_outliers(static_cast<std::size_t>(out) * in, 11);
    const QuantizedMatrix matrix = quantize_rtn({weight, out, in}, format);
    EXPECT_EQ(dequantize(matrix).size(), static_cast<std::size_t>(out) * in);
    EXPECT_EQ(matrix.padded_in, format.bits() == 8 ? 100 : 128);
    for (int row = 0; row < out; ++row)
      for (int column = in; column < matrix.padded_in; ++column)
        EXPECT_EQ(code_value(format.scheme, matrix.code(row, column), matrix.params(row, matrix.groups_per_row - 1)),
                  0.0f);
  }
}

TEST(QuantFormatRtn, LayerNarrowerThanAGroupThrows) {
  const std::vector<float> weight = llm::testing::random_vector(4 * 16, 3);
  for (const std::string name : {"int4-g32", "int4sym-g64", "nf4"}) {
    SCOPED_TRACE(name);
    try {
      quantize_rtn({weight, 4, 16}, QuantFormat::parse(name));
      ADD_FAILURE() << "a [4, 16] layer quantized with " << name;
    } catch (const llm::InputError& error) {
      EXPECT_TRUE(HasSubstr(error.what(), "layer too small"));
      EXPECT_TRUE(HasSubstr(error.what(), "16 input columns"));
    }
  }
  EXPECT_NO_THROW(quantize_rtn({weight, 4, 16}, QuantFormat::parse("int8")));  // one group = the row
  EXPECT_THROW(quantize_rtn({weight, 4, 15}, QuantFormat::parse("int8")), llm::InputError);  // 64 weights != 60
}

TEST(QuantFormatRtn, AllZeroRowsQuantizeToZeros) {
  for (const QuantFormat& format : every_scheme(32)) {
    SCOPED_TRACE(format.name());
    const int out = 3, in = 40;
    std::vector<float> weight = llm::testing::random_vector(static_cast<std::size_t>(out) * in, 5);
    std::fill(weight.begin() + in, weight.begin() + 2 * in, 0.0f);  // row 1 all zero
    const QuantizedMatrix matrix = quantize_rtn({weight, out, in}, format);
    const std::vector<float> approximate = dequantize(matrix);
    for (float value : approximate) ASSERT_TRUE(std::isfinite(value));
    for (int column = 0; column < in; ++column) EXPECT_EQ(approximate[static_cast<std::size_t>(in + column)], 0.0f);
    for (int g = 0; g < matrix.groups_per_row; ++g) EXPECT_EQ(matrix.params(1, g).scale, 0.0f);
    // The other rows are still quantized (not all zero).
    EXPECT_NE(approximate[0], 0.0f);
  }
}

// bytes() counts codes, fp32 scales, uint8 zero points and fp32 input
// scales: per weight 1 + 4 / in for int8, and for 4-bit groups of g
// 0.5 + 4 / g (+ 1 / g for int4 asymmetric's zero points) when in is a whole
// number of groups, the padding counted when it is not.
TEST(QuantFormatBytes, BytesPerWeightFollowTheLayout) {
  const int out = 8, in = 4096;
  const std::vector<float> weight = llm::testing::random_vector(static_cast<std::size_t>(out) * in, 9);
  const LayerWeights layer{weight, out, in};
  EXPECT_DOUBLE_EQ(quantize_rtn(layer, QuantFormat::parse("int8")).bytes_per_weight(), 1.0 + 4.0 / in);
  EXPECT_DOUBLE_EQ(quantize_rtn(layer, QuantFormat::parse("int4-g64")).bytes_per_weight(), 0.5 + 5.0 / 64);
  EXPECT_DOUBLE_EQ(quantize_rtn(layer, QuantFormat::parse("int4-g128")).bytes_per_weight(), 0.5 + 5.0 / 128);
  EXPECT_DOUBLE_EQ(quantize_rtn(layer, QuantFormat::parse("int4sym-g64")).bytes_per_weight(), 0.5 + 4.0 / 64);
  EXPECT_DOUBLE_EQ(quantize_rtn(layer, QuantFormat::parse("nf4")).bytes_per_weight(), 0.5 + 4.0 / 64);
  EXPECT_NEAR(quantize_rtn(layer, QuantFormat::parse("int8")).bytes_per_weight(), 1.0, 0.001);
  const QuantizedMatrix int4 = quantize_rtn(layer, QuantFormat::parse("int4-g128"));
  EXPECT_EQ(int4.bytes(), static_cast<std::size_t>(out) * (in / 2 + (in / 128) * (4 + 1)));

  // [2, 100] in groups of 32: 4 groups, 128 stored codes per row.
  const LayerWeights narrow{std::span<const float>(weight).first(200), 2, 100};
  EXPECT_DOUBLE_EQ(quantize_rtn(narrow, QuantFormat::parse("int4-g32")).bytes_per_weight(), (64.0 + 4 * 5) / 100);
  // AWQ's input scales add 4 bytes per input column.
  QuantizedMatrix scaled = quantize_rtn(narrow, QuantFormat::parse("int4sym-g32"));
  scaled.input_scales.assign(100, 1.0f);
  EXPECT_DOUBLE_EQ(scaled.bytes_per_weight(), (64.0 + 4 * 4 + 100.0 * 4 / 2) / 100);
}


// stack_rows: the rows of Q, K and V (or gate and up) one after another,
// as the CUDA model's fused products ask for them. Every scheme, a width
// whose last group is short (100 columns in groups of 32): the stacked
// matrix dequantizes to the parts' rows in order and stores their bytes.
TEST(QuantFormatStacking, StackedRowsAreThePartsRowsInOrder) {
  const int in = 100;
  for (const QuantFormat& format : every_scheme(32)) {
    SCOPED_TRACE(format.name());
    std::vector<QuantizedMatrix> parts;
    std::uint64_t seed = 70;
    for (const int out : {5, 1, 3})
      parts.push_back(quantize_rtn(
          {llm::testing::random_vector(static_cast<std::size_t>(out) * in, seed++), out, in}, format));
    const std::vector<const QuantizedMatrix*> pointers = {&parts[0], &parts[1], &parts[2]};
    const QuantizedMatrix stacked = stack_rows(pointers);
    EXPECT_EQ(stacked.out_features, 9);
    EXPECT_EQ(stacked.in_features, in);
    EXPECT_EQ(stacked.bytes(), parts[0].bytes() + parts[1].bytes() + parts[2].bytes());
    std::vector<float> expected;
    for (const QuantizedMatrix& part : parts) {
      const std::vector<float> rows = dequantize(part);
      expected.insert(expected.end(), rows.begin(), rows.end());
    }
    EXPECT_EQ(dequantize(stacked), expected);
  }
}

TEST(QuantFormatStacking, DifferentFormatsWidthsOrInputScalesThrow) {
  const auto layer = [](int out, int in, const char* format) {
    return quantize_rtn({llm::testing::random_vector(static_cast<std::size_t>(out) * in, 80), out, in},
                        QuantFormat::parse(format));
  };
  const QuantizedMatrix g64 = layer(4, 128, "int4-g64");
  const QuantizedMatrix g32 = layer(4, 128, "int4-g32");
  const QuantizedMatrix wider = layer(4, 192, "int4-g64");
  QuantizedMatrix scaled = layer(4, 128, "int4-g64");
  scaled.input_scales.assign(128, 2.0f);
  EXPECT_THROW(stack_rows(std::vector<const QuantizedMatrix*>{}), llm::InputError);
  for (const QuantizedMatrix* other : {&g32, &wider, static_cast<const QuantizedMatrix*>(&scaled)}) {
    const std::vector<const QuantizedMatrix*> pair = {&g64, other};
    EXPECT_THROW(stack_rows(pair), llm::InputError);
  }
}

// --- What the CUDA kernels read (cuda_weight_layout.hpp), checked here
// because every build has it and the GPU tests need a GPU.

// Every lane (g, t) of a warp loads 16 bytes per step; across the four t of
// a row those are the step's columns, each exactly once, and the codes a
// lane multiplies in MMA m (16 columns) are columns 4t .. 4t + 3 of that
// MMA's block: the columns of x the lane reads as its B operand (the
// kernels' x_lane, 2t words = 4t columns into each 16).
TEST(CudaWeightLayout, EachStepsColumnsOnceAndALanesOwnFourPerMma) {
  for (const bool int8 : {false, true}) {
    SCOPED_TRACE(int8 ? "int8" : "4-bit");
    const int codes_per_lane = int8 ? 16 : 32, columns_per_step = int8 ? 64 : 128;
    for (int step : {0, 3}) {
      std::vector<int> seen(static_cast<std::size_t>(columns_per_step), 0);
      for (int t = 0; t < 4; ++t)
        for (int i = 0; i < codes_per_lane; ++i) {
          const int column = int8 ? cuda_int8_column(step, t, i) : cuda_int4_column(step, t, i);
          const int in_step = column - step * columns_per_step;
          ASSERT_GE(in_step, 0);
          ASSERT_LT(in_step, columns_per_step);
          ++seen[static_cast<std::size_t>(in_step)];
          EXPECT_EQ(in_step % 16 / 4, t) << "code " << i << " of lane t = " << t << ": column " << column;
          // 4-bit: word w = i / 8 holds MMAs 2w and 2w + 1; int8: word w = i / 4 is MMA w.
          EXPECT_EQ(in_step / 16 / (int8 ? 1 : 2), int8 ? i / 4 : i / 8) << "code " << i << " sits in another word";
        }
      EXPECT_EQ(seen, std::vector<int>(static_cast<std::size_t>(columns_per_step), 1)) << "step " << step;
    }
  }
}

// A random matrix of awkward size in every scheme: each lane's bytes of the
// tile-major layout read back (nibble i % 2 of byte i / 2, or int8's byte i
// minus the bias 128) as the code of its row and column, and 0 past the
// rows and the padded columns. 37 rows are 3 tiles, laid out on the calling
// thread; 1029 rows are 65, laid out on every core.
TEST(CudaWeightLayout, TileMajorCodesReadBackAsTheMatrix) {
  std::mt19937 rng(20261127);
  const int in = 200;  // 4-bit rows of 2 steps, the second partial
  for (const int out : {37, 1029}) {  // a partial last tile
    for (const QuantFormat& format : every_scheme(64)) {
      SCOPED_TRACE(format.name() + ", " + std::to_string(out) + " rows");
      const int columns = format.group_columns(in), groups_per_row = (in + columns - 1) / columns;
      std::uniform_int_distribution<int> code_in_range(lowest_code(format.scheme), highest_code(format.scheme));
      std::vector<int> codes(static_cast<std::size_t>(out) * in);
      for (int& code : codes) code = code_in_range(rng);
      const std::vector<GroupParams> params(static_cast<std::size_t>(out) * groups_per_row, GroupParams{0.5f, 8.0f});
      const QuantizedMatrix q = pack(format, out, in, codes, params);
      const bool int8 = format.bits() == 8;
      const int columns_per_step = int8 ? 64 : 128, m_tiles = (out + 15) / 16;
      const int total_steps = (q.padded_in + columns_per_step - 1) / columns_per_step;
      const std::vector<std::uint8_t> bytes = cuda_tile_major_codes(q);
      ASSERT_EQ(bytes.size(), static_cast<std::size_t>(m_tiles) * total_steps * 2 * 32 * 16);
      for (int tile = 0; tile < m_tiles; ++tile)
        for (int step = 0; step < total_steps; ++step)
          for (int half = 0; half < 2; ++half)
            for (int lane = 0; lane < 32; ++lane) {
              const std::size_t at = ((static_cast<std::size_t>(tile) * total_steps + step) * 2 + half) * 32 * 16 +
                                     static_cast<std::size_t>(lane) * 16;
              const int row = 16 * tile + lane / 4 + 8 * half, t = lane % 4;
              for (int i = 0; i < (int8 ? 16 : 32); ++i) {
                const int column = int8 ? cuda_int8_column(step, t, i) : cuda_int4_column(step, t, i);
                const int stored =
                    int8 ? static_cast<int>(bytes[at + i]) - 128 : bytes[at + i / 2] >> (4 * (i % 2)) & 0xF;
                const int want = row < out && column < q.padded_in ? q.code(row, column) : 0;
                ASSERT_EQ(stored, want) << "row " << row << " column " << column << " (lane " << lane << ", code " << i
                                        << ")";
              }
            }
    }
  }
}

// The group tables: each tile's rows in the lanes' pair order (rows g and
// g + 8 in slots 2g and 2g + 1, what a lane reads as one __half2 and one
// 16-bit word), every scale times one power of two that puts the largest in
// [2^14, 2^15), and 0 for the rows that pad the last tile.
TEST(CudaWeightLayout, GroupTablesPairTheLanesRows) {
  std::mt19937 rng(7);
  const int out = 37, in = 96;  // 3 tiles, the last with 5 rows; groups of 32
  std::uniform_int_distribution<int> code(0, 15), zero_point(0, 15);
  std::uniform_real_distribution<float> scale(0.001f, 3.0f);
  std::vector<int> codes(static_cast<std::size_t>(out) * in);
  for (int& c : codes) c = code(rng);
  std::vector<GroupParams> params(static_cast<std::size_t>(out) * 3);
  for (GroupParams& p : params) p = {scale(rng), static_cast<float>(zero_point(rng))};
  const QuantizedMatrix q = pack({QuantScheme::Int4Asymmetric, 32}, out, in, codes, params);
  const CudaGroupTables tables = cuda_group_tables(q);
  ASSERT_EQ(tables.rows_padded, 48);
  ASSERT_EQ(tables.scales.size(), 3u * 48);
  ASSERT_EQ(tables.zeros.size(), 3u * 48);
  const float largest = *std::max_element(tables.scales.begin(), tables.scales.end());
  EXPECT_GE(largest, 16384.0f);
  EXPECT_LT(largest, 32768.0f);
  const float pow2 = 1.0f / tables.output_scale;
  EXPECT_EQ(std::exp2(std::round(std::log2(pow2))), pow2) << "a power of two";
  for (int group = 0; group < 3; ++group)
    for (int tile = 0; tile < 3; ++tile)
      for (int g = 0; g < 8; ++g)
        for (int which = 0; which < 2; ++which) {  // row g, then row g + 8
          const int row = 16 * tile + g + 8 * which;
          const std::size_t slot = static_cast<std::size_t>(group) * 48 + 16 * tile + 2 * g + which;
          const std::size_t host = static_cast<std::size_t>(row) * 3 + group;
          const float want_scale = row < out ? q.scales[host] * pow2 : 0.0f;
          const int want_zero = row < out ? q.zeros[host] : 0;
          EXPECT_EQ(tables.scales[slot], want_scale) << "group " << group << " row " << row;
          EXPECT_EQ(tables.zeros[slot], want_zero) << "group " << group << " row " << row;
        }
  // The symmetric formats store no zero points (codes 1..15).
  for (int& c : codes) c = 1 + c % 15;
  const QuantizedMatrix symmetric = pack({QuantScheme::Int4Symmetric, 32}, out, in, codes,
                                         std::vector<GroupParams>(params.size(), GroupParams{0.5f, 8.0f}));
  EXPECT_TRUE(cuda_group_tables(symmetric).zeros.empty());
}

}  // namespace
}  // namespace step06
