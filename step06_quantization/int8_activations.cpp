#include "step06_quantization/int8_activations.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "llm/errors.hpp"

namespace step06 {

float Int8Activations::value(int row, int column) const {
  const std::size_t block = static_cast<std::size_t>(row) * blocks_per_row + column / kActivationBlockColumns;
  return static_cast<float>(codes[static_cast<std::size_t>(row) * codes_per_row + column]) * scales[block];
}

void quantize_activations(const float* x, int rows, int in_features, std::span<const float> input_scales,
                          Int8Activations& activations) {
  if (rows < 0 || in_features <= 0)
    throw llm::InputError(fmt::format("int8 activations: {} rows of {} columns", rows, in_features));
  if (!input_scales.empty() && input_scales.size() != static_cast<std::size_t>(in_features))
    throw llm::InputError(fmt::format("int8 activations: {} input scales for {} columns", input_scales.size(),
                                      in_features));
  activations.rows = rows;
  activations.in_features = in_features;
  activations.blocks_per_row = (in_features + kActivationBlockColumns - 1) / kActivationBlockColumns;
  activations.codes_per_row = activations.blocks_per_row * kActivationBlockColumns;
  const std::size_t blocks = static_cast<std::size_t>(rows) * activations.blocks_per_row;
  activations.codes.assign(static_cast<std::size_t>(rows) * activations.codes_per_row, 0);
  activations.scales.resize(blocks);
  activations.code_sums.resize(blocks);
  for (int r = 0; r < rows; ++r) {
    const float* x_row = x + static_cast<std::size_t>(r) * in_features;
    std::int8_t* row_codes = activations.codes.data() + static_cast<std::size_t>(r) * activations.codes_per_row;
    for (int block = 0; block < activations.blocks_per_row; ++block) {
      const int first = block * kActivationBlockColumns;
      const int end = std::min(in_features, first + kActivationBlockColumns);
      float values[kActivationBlockColumns];  // the block's x, divided by the input scales
      float absmax = 0.0f;
      bool finite = true;
      for (int column = first; column < end; ++column) {
        const float value = input_scales.empty() ? x_row[column] : x_row[column] / input_scales[column];
        values[column - first] = value;
        finite = finite && std::isfinite(value);
        absmax = std::max(absmax, std::fabs(value));
      }
      const std::size_t index = static_cast<std::size_t>(r) * activations.blocks_per_row + block;
      std::int32_t code_sum = 0;
      if (!finite) {
        // Codes 0 and a NaN scale: every product with this block is NaN.
        activations.scales[index] = std::numeric_limits<float>::quiet_NaN();
      } else {
        // absmax maps to 127, not 128: codes stay in [-127, 127], symmetric,
        // and -128 never appears (the AVX2 kernel's sign trick needs that).
        const float scale = absmax / 127.0f;
        const float inverse = absmax > 0.0f ? 127.0f / absmax : 0.0f;
        for (int column = first; column < end; ++column) {
          const int code = std::clamp(static_cast<int>(std::lrint(values[column - first] * inverse)), -127, 127);
          row_codes[column] = static_cast<std::int8_t>(code);
          code_sum += code;
        }
        activations.scales[index] = scale;
      }
      activations.code_sums[index] = code_sum;
    }
  }
}

}  // namespace step06
