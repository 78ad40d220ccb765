// Step 06 (quantization), CPU: the quantized product's kernels. For every
// format (int8, int4-g32/g64/g128, int4sym-g64, nf4) and every SIMD level this
// CPU runs (the others skip with a message), on seeded random RTN-quantized
// weights and random x, over 1..16, 17 and 33 rows and awkward shapes (1, 3,
// 17, 100 outputs; 32, 33, 64, 100, 172, 257, 288 inputs where a group fits):
//   * y matches the product with dequantize(matrix) computed in double, and
//     the portable kernel's y;
//   * every output is written (y is poisoned with NaN first; compare fails on NaN);
//   * a NaN in x comes out as NaN in its row of y, not hidden;
//   * AWQ input scales give dequantize()'s product (which folds them in);
//   * the tolerance is tight enough to see one code off by one;
//   * QuantizedLinear reports the matrix's bytes and sizes; a level the CPU
//     cannot run, or no level at all, is an InputError.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "step06_quantization/cpu_quantized_linear.hpp"
#include "step06_quantization/quant_format.hpp"
#include "step06_test_matrices.hpp"  // random_matrix, random_input_scales, run_kernel, kNaN
#include "test_support.hpp"

namespace step06 {
namespace {

constexpr int kMaxRows = 33;
const std::vector<int> kRowCounts = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 33};
const std::vector<int> kOutFeatures = {1, 3, 17, 100};
const std::vector<int> kInFeatures = {32, 33, 64, 100, 172, 257, 288};
const std::vector<std::string> kFormats = {"int8", "int4-g32", "int4-g64", "int4-g128", "int4sym-g64", "nf4"};
const std::vector<SimdLevel> kLevels = {SimdLevel::Portable, SimdLevel::Avx2, SimdLevel::Avx512};

// The tolerance. Every kernel adds the same terms w~_i x_i in fp32, in its
// own order (and the AVX2 int4 kernels as s (sum q x - z sum x), whose terms
// are up to ~4x larger than |w~ x|). The rounding error of a float sum scales
// with the sum of the |terms|, A = sum_i |w~_i x_i| (about eps * A per add in
// the worst case, ~sqrt(n) * eps * A in practice), so the tolerance is a
// fraction of A, the largest A of the outputs compared. Measured over these
// shapes (<= 288 terms): at most 3e-7 A (AVX2, int4-g128). 2e-6 A leaves ~7x
// margin, and is 25x below what one code off by one moves y by in the least
// sensitive format (int8: s |x_i| ~ A / (288 * 64) = 5e-5 A; the
// OneWrongCodeIsSeen test checks that it fails).
constexpr double kToleranceOfMagnitude = 2e-6;

bool runs(SimdLevel level) { return simd_supported(level); }

// y = x . dequantize(m)^T in double, [rows, out], and the magnitude of each
// output, A = sum_i |w~_i x_i| (what fp32 rounding errors scale with).
struct Reference {
  std::vector<float> y;
  std::vector<double> magnitude;
};
Reference reference_product(const QuantizedMatrix& m, const std::vector<float>& x, int rows) {
  const std::vector<float> w = dequantize(m);  // [out, in], input scales folded in
  Reference reference;
  reference.y.resize(static_cast<std::size_t>(rows) * m.out_features);
  reference.magnitude.resize(reference.y.size());
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < m.out_features; ++o) {
      double sum = 0.0, magnitude = 0.0;
      for (int i = 0; i < m.in_features; ++i) {
        const double term = static_cast<double>(w[static_cast<std::size_t>(o) * m.in_features + i]) *
                            x[static_cast<std::size_t>(r) * m.in_features + i];
        sum += term;
        magnitude += std::fabs(term);
      }
      reference.y[static_cast<std::size_t>(r) * m.out_features + o] = static_cast<float>(sum);
      reference.magnitude[static_cast<std::size_t>(r) * m.out_features + o] = magnitude;
    }
  return reference;
}

// The tolerance for the first `count` outputs of a reference.
llm::Tolerance tolerance_for(const Reference& reference, std::size_t count, double factor = 1.0) {
  const double largest = *std::max_element(reference.magnitude.begin(), reference.magnitude.begin() + count);
  return {factor * kToleranceOfMagnitude * largest, 0.0};
}

std::span<const float> first(const std::vector<float>& values, std::size_t count) { return {values.data(), count}; }

// ---------------------------------------------------------------------------
// Every format x every level the CPU runs.

struct KernelCase {
  std::string format;
  SimdLevel level;
};
// Printed by gtest beside the test's name (without it: the struct's bytes, heap addresses included).
void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.format << " / " << simd_name(c.level); }
std::string case_name(const ::testing::TestParamInfo<KernelCase>& info) {
  std::string name = info.param.format + "_" + simd_name(info.param.level);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}
std::vector<KernelCase> all_cases() {
  std::vector<KernelCase> cases;
  for (const auto& format : kFormats)
    for (SimdLevel level : kLevels) cases.push_back({format, level});
  return cases;
}

class Step06CpuKernels : public ::testing::TestWithParam<KernelCase> {
 protected:
  void SetUp() override {
    if (!runs(GetParam().level))
      GTEST_SKIP() << "this CPU cannot run the " << simd_name(GetParam().level) << " kernels (it runs up to "
                   << simd_name(detected_simd()) << "); skipping";
  }
  QuantFormat format() const { return QuantFormat::parse(GetParam().format); }
  SimdLevel level() const { return GetParam().level; }
};

TEST_P(Step06CpuKernels, MatchesTheDequantizedProductAndThePortableKernel) {
  std::uint64_t seed = 1000;
  int shapes = 0;
  for (int out : kOutFeatures) {
    for (int in : kInFeatures) {
      if (in < format().group_size) continue;  // the layer is smaller than one group
      ++shapes;
      const QuantizedMatrix m = random_matrix(format(), out, in, ++seed);
      const std::vector<float> x = llm::testing::random_vector(static_cast<std::size_t>(kMaxRows) * in, ++seed);
      const Reference reference = reference_product(m, x, kMaxRows);
      for (int rows : kRowCounts) {
        SCOPED_TRACE(::testing::Message() << format().name() << " " << simd_name(level()) << ": [" << out << ", "
                                          << in << "] x " << rows << " rows");
        const std::size_t count = static_cast<std::size_t>(rows) * out;
        const std::vector<float> y = run_kernel(m, x, rows, level());
        const llm::CompareResult vs_reference =
            llm::compare(y, first(reference.y, count), tolerance_for(reference, count));
        EXPECT_TRUE(vs_reference.ok) << "vs the double product: " << vs_reference.summary();
        if (level() != SimdLevel::Portable) {
          // Both within the tolerance of the exact product: within twice it of each other.
          const std::vector<float> portable = run_kernel(m, x, rows, SimdLevel::Portable);
          const llm::CompareResult vs_portable = llm::compare(y, portable, tolerance_for(reference, count, 2.0));
          EXPECT_TRUE(vs_portable.ok) << "vs the portable kernel: " << vs_portable.summary();
        }
      }
    }
  }
  EXPECT_GT(shapes, 0);
}

TEST_P(Step06CpuKernels, InputScalesGiveTheDequantizedProduct) {
  for (int in : {100, 288}) {
    if (in < format().group_size) continue;
    QuantizedMatrix m = random_matrix(format(), 17, in, 7 + in);
    m.input_scales = random_input_scales(in, 99 + in);
    const std::vector<float> x = llm::testing::random_vector(static_cast<std::size_t>(kMaxRows) * in, 5 + in);
    const Reference reference = reference_product(m, x, kMaxRows);
    for (int rows : {1, 5, 16, 17}) {
      SCOPED_TRACE(::testing::Message() << format().name() << " [17, " << in << "] x " << rows << " rows");
      const std::size_t count = static_cast<std::size_t>(rows) * m.out_features;
      const llm::CompareResult result =
          llm::compare(run_kernel(m, x, rows, level()), first(reference.y, count), tolerance_for(reference, count));
      EXPECT_TRUE(result.ok) << result.summary();
    }
  }
}

TEST_P(Step06CpuKernels, NaNInXComesOutAsNaNInItsRow) {
  const int out = 17, in = 288, rows = 5, poisoned_row = 2;
  const QuantizedMatrix m = random_matrix(format(), out, in, 31);
  std::vector<float> x = llm::testing::random_vector(static_cast<std::size_t>(rows) * in, 32);
  const Reference reference = reference_product(m, x, rows);
  x[static_cast<std::size_t>(poisoned_row) * in + 10] = kNaN;  // in output 1's all-zero first group
  const std::vector<float> y = run_kernel(m, x, rows, level());
  for (int r = 0; r < rows; ++r) {
    const std::size_t row_start = static_cast<std::size_t>(r) * out;
    if (r == poisoned_row) {
      // Every output of the row, even output 1 whose group over the NaN has scale 0 (0 * NaN is NaN).
      for (int o = 0; o < out; ++o) EXPECT_TRUE(std::isnan(y[row_start + o])) << "row " << r << " output " << o;
    } else {
      const llm::CompareResult result = llm::compare(std::span<const float>(y.data() + row_start, out),
                                                     std::span<const float>(reference.y.data() + row_start, out),
                                                     tolerance_for(reference, reference.y.size()));
      EXPECT_TRUE(result.ok) << "row " << r << " (no NaN in its x): " << result.summary();
    }
  }
}

// One code off by one, in the column where |x| is largest (where |x_i| is
// tiny a wrong code is invisible in y, in any product): the comparison fails.
TEST_P(Step06CpuKernels, OneWrongCodeIsSeen) {
  const int out = 3, in = 288;
  const QuantizedMatrix m = random_matrix(format(), out, in, 41);
  const std::vector<float> x = llm::testing::random_vector(static_cast<std::size_t>(in), 42);
  const Reference reference = reference_product(m, x, 1);
  const int column = static_cast<int>(
      std::max_element(x.begin(), x.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }) - x.begin());
  std::vector<int> codes = unpack_codes(m);
  int& code = codes[static_cast<std::size_t>(2) * in + column];  // row 2 (row 1 has an all-zero group)
  const int code_max = format().bits() == 8 ? 127 : 15;
  code += code < code_max ? 1 : -1;
  std::vector<GroupParams> params;
  for (int o = 0; o < out; ++o)
    for (int g = 0; g < m.groups_per_row; ++g) params.push_back(m.params(o, g));
  const QuantizedMatrix wrong = pack(format(), out, in, codes, params);
  const llm::CompareResult result =
      llm::compare(run_kernel(wrong, x, 1, level()), reference.y, tolerance_for(reference, reference.y.size()));
  EXPECT_FALSE(result.ok) << "one wrong code passed: " << result.summary();
  EXPECT_EQ(result.over_tolerance, 1u) << result.summary();
}

INSTANTIATE_TEST_SUITE_P(EveryFormatAndLevel, Step06CpuKernels, ::testing::ValuesIn(all_cases()), case_name);

// ---------------------------------------------------------------------------
// The layer, the levels, the errors.

TEST(Step06QuantizedLinear, ReportsTheMatrixAndRunsTheKernel) {
  for (const auto& name : kFormats) {
    SCOPED_TRACE(name);
    const QuantizedMatrix m = random_matrix(QuantFormat::parse(name), 100, 288, 3);
    const QuantizedLinear layer(m);
    EXPECT_EQ(layer.in_features(), 288);
    EXPECT_EQ(layer.out_features(), 100);
    EXPECT_EQ(layer.weight_bytes(), m.bytes());
    EXPECT_EQ(layer.dense_weight(), nullptr);
    const std::vector<float> x = llm::testing::random_vector(4 * 288, 4);
    std::vector<float> y(4 * 100, kNaN);
    layer.forward(x.data(), 4, y.data());
    EXPECT_EQ(y, run_kernel(m, x, 4, detected_simd()));  // the detected level by default: the same bits
  }
}

TEST(Step06QuantizedLinear, ZeroRowsWriteNothing) {
  const QuantizedMatrix m = random_matrix(QuantFormat::parse("int4-g32"), 3, 64, 5);
  for (SimdLevel level : kLevels) {
    if (!runs(level)) continue;
    std::vector<float> y(3, 1.0f);
    quantized_matmul(m, nullptr, 0, y.data(), level);
    EXPECT_EQ(y, std::vector<float>(3, 1.0f)) << simd_name(level);
    EXPECT_THROW(quantized_matmul(m, nullptr, -1, y.data(), level), llm::InputError) << simd_name(level);
  }
}

TEST(Step06QuantizedLinear, AnInconsistentMatrixIsAnInputError) {
  QuantizedMatrix m = random_matrix(QuantFormat::parse("int4-g64"), 3, 128, 6);
  m.packed.pop_back();  // the last row's codes are short
  const std::vector<float> x(128, 1.0f);
  std::vector<float> y(3);
  EXPECT_THROW(quantized_matmul(m, x.data(), 1, y.data(), SimdLevel::Portable), llm::InputError);
  EXPECT_THROW(QuantizedLinear(m, SimdLevel::Portable), llm::InputError);
  // A zero point is a 4-bit code (the AVX-512 kernels index a 16-entry table with it).
  QuantizedMatrix bad_zero = random_matrix(QuantFormat::parse("int4-g64"), 3, 128, 6);
  bad_zero.zeros[4] = 16;
  for (SimdLevel level : kLevels) {
    if (!runs(level)) continue;
    EXPECT_THROW(quantized_matmul(bad_zero, x.data(), 1, y.data(), level), llm::InputError) << simd_name(level);
    EXPECT_THROW(QuantizedLinear(bad_zero, level), llm::InputError) << simd_name(level);
  }
}

TEST(Step06SimdLevels, NamesAndDetection) {
  EXPECT_EQ(simd_name(SimdLevel::Portable), "portable");
  EXPECT_EQ(simd_name(SimdLevel::Avx2), "avx2");
  EXPECT_EQ(simd_name(SimdLevel::Avx512), "avx512");
  EXPECT_TRUE(simd_supported(SimdLevel::Portable));
  EXPECT_TRUE(simd_supported(detected_simd()));
  // The levels nest: a CPU that runs AVX-512 runs AVX2.
  if (simd_supported(SimdLevel::Avx512)) EXPECT_TRUE(simd_supported(SimdLevel::Avx2));
  std::cout << "this CPU runs up to " << simd_name(detected_simd()) << "\n";
}

TEST(Step06SimdLevels, ALevelTheCpuLacksIsAnInputError) {
  const QuantizedMatrix m = random_matrix(QuantFormat::parse("int8"), 3, 33, 8);
  const std::vector<float> x(33, 1.0f);
  std::vector<float> y(3);
  int lacking = 0;
  for (SimdLevel level : kLevels) {
    if (runs(level)) continue;
    ++lacking;
    EXPECT_THROW(quantized_matmul(m, x.data(), 1, y.data(), level), llm::InputError) << simd_name(level);
    EXPECT_THROW(QuantizedLinear(m, level), llm::InputError) << simd_name(level);
  }
  if (lacking == 0) GTEST_SKIP() << "this CPU runs every level (up to " << simd_name(detected_simd()) << "); skipping";
}

TEST(Step06SimdLevels, NotALevelIsAnInputError) {
  const QuantizedMatrix m = random_matrix(QuantFormat::parse("int8"), 3, 33, 9);
  const std::vector<float> x(33, 1.0f);
  std::vector<float> y(3);
  const auto not_a_level = static_cast<SimdLevel>(7);
  EXPECT_FALSE(simd_supported(not_a_level));
  EXPECT_THROW(quantized_matmul(m, x.data(), 1, y.data(), not_a_level), llm::InputError);
  EXPECT_THROW(QuantizedLinear(m, not_a_level), llm::InputError);
}

}  // namespace
}  // namespace step06
