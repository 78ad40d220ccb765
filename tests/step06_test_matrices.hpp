#pragma once
// What step 06's test suites share: seeded random weights (with outliers, as
// trained layers have), RTN-quantized matrices with an all-zero group, AWQ-like
// input scales, one run of the CPU product into an output poisoned with NaN,
// and the error a format name is refused with.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llm/errors.hpp"
#include "step06_quantization/cpu_quantized_linear.hpp"
#include "step06_quantization/quant_algorithms.hpp"
#include "step06_quantization/quant_format.hpp"
#include "test_support.hpp"

namespace step06 {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Random weights with a few large ones (trained layers have outliers), [n]:
// values in [-0.1, 0.1], one in 50 of them (and at least one) 20 times larger.
inline std::vector<float> weights_with_outliers(std::size_t n, std::uint64_t seed) {
  std::vector<float> weight = llm::testing::random_vector(n, seed, 0.1f);
  std::mt19937_64 rng(seed + 1);
  std::uniform_int_distribution<std::size_t> position(0, n - 1);
  for (int i = 0; i < static_cast<int>(n / 50) + 1; ++i) weight[position(rng)] *= 20.0f;
  return weight;
}

// `weights` [out, in] rounded to nearest in `format`, after zeroing the first
// group of row 1 when there is one (an all-zero group has scale 0 and must
// read back as zeros).
inline QuantizedMatrix quantized_with_zero_group(const QuantFormat& format, std::vector<float> weights, int out,
                                                 int in) {
  if (out > 1) std::fill_n(weights.begin() + in, format.group_columns(in), 0.0f);
  return quantize_rtn({weights, out, in}, format);
}

// Fresh RTN weights [out, in] in [-1, 1], with the all-zero group above.
inline QuantizedMatrix random_matrix(const QuantFormat& format, int out, int in, std::uint64_t seed) {
  return quantized_with_zero_group(format, llm::testing::random_vector(static_cast<std::size_t>(out) * in, seed),
                                   out, in);
}

// AWQ-like input scales [in]: positive, in [1/4, 4] (x / s is what a product reads).
inline std::vector<float> random_input_scales(int in, std::uint64_t seed) {
  std::vector<float> scales = llm::testing::random_vector(static_cast<std::size_t>(in), seed);
  for (float& scale : scales) scale = std::exp2(2.0f * scale);
  return scales;
}

// The kernel's y [rows, out] for the first `rows` rows of x, poisoned with
// NaN before the call (an output the kernel does not write fails any comparison).
inline std::vector<float> run_kernel(const QuantizedMatrix& m, const std::vector<float>& x, int rows,
                                     SimdLevel level) {
  std::vector<float> y(static_cast<std::size_t>(rows) * m.out_features, kNaN);
  quantized_matmul(m, x.data(), rows, y.data(), level);
  return y;
}

// The message QuantFormat::parse refuses `name` with (a failure, and "",
// when it parses).
inline std::string parse_error_message(const std::string& name) {
  try {
    QuantFormat::parse(name);
  } catch (const llm::InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "'" << name << "' parsed without an error";
  return {};
}

}  // namespace step06
