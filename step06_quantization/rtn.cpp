// Round to nearest (RTN), the layer's output error, and the algorithms' names.
#include <fmt/format.h>

#include <vector>

#include "llm/errors.hpp"
#include "step06_quantization/quant_algorithms.hpp"

namespace step06 {

namespace {
void check_weights(const LayerWeights& layer) {
  if (layer.out_features <= 0 || layer.in_features <= 0 ||
      layer.weight.size() != static_cast<std::size_t>(layer.out_features) * layer.in_features)
    throw llm::InputError(fmt::format("quantize: {} weights do not make a [{}, {}] layer", layer.weight.size(),
                                      layer.out_features, layer.in_features));
}
}  // namespace

QuantizedMatrix quantize_rtn(const LayerWeights& layer, const QuantFormat& format) {
  check_weights(layer);
  check_layer_fits(format, layer.out_features, layer.in_features);
  const int group = format.group_columns(layer.in_features);
  const int groups_per_row = (layer.in_features + group - 1) / group;
  std::vector<int> codes(layer.weight.size());                                  // [out, in]
  std::vector<GroupParams> params(static_cast<std::size_t>(layer.out_features) * groups_per_row);  // [out, groups]
  for (int row = 0; row < layer.out_features; ++row) {
    for (int g = 0; g < groups_per_row; ++g) {
      const int first = g * group;
      const int count = std::min(group, layer.in_features - first);  // the last group may be shorter
      const std::size_t offset = static_cast<std::size_t>(row) * layer.in_features + first;
      const GroupParams p = choose_group_params(format.scheme, layer.weight.subspan(offset, count));
      params[static_cast<std::size_t>(row) * groups_per_row + g] = p;
      for (int i = 0; i < count; ++i) codes[offset + i] = quantize_to_code(format.scheme, layer.weight[offset + i], p);
    }
  }
  return pack(format, layer.out_features, layer.in_features, codes, params);
}

double layer_output_error(const LayerWeights& layer, const QuantizedMatrix& quantized,
                          const CalibrationInputs& calibration) {
  check_weights(layer);
  if (quantized.out_features != layer.out_features || quantized.in_features != layer.in_features ||
      calibration.in_features != layer.in_features || calibration.n_rows <= 0 ||
      calibration.rows.size() != static_cast<std::size_t>(calibration.n_rows) * calibration.in_features)
    throw llm::InputError("layer_output_error: the quantized matrix or the calibration rows do not fit the layer");
  const std::vector<float> approximate = dequantize(quantized);  // [out, in]
  // (x . w_o - x . w~_o) = x . (w_o - w~_o): one product with the difference.
  std::vector<float> difference(approximate.size());
  for (std::size_t i = 0; i < difference.size(); ++i) difference[i] = layer.weight[i] - approximate[i];
  double sum = 0.0;
  for (int r = 0; r < calibration.n_rows; ++r) {
    const float* x = calibration.rows.data() + static_cast<std::size_t>(r) * calibration.in_features;
    for (int o = 0; o < layer.out_features; ++o) {
      const float* d = difference.data() + static_cast<std::size_t>(o) * layer.in_features;
      double dot = 0.0;
      for (int i = 0; i < layer.in_features; ++i) dot += static_cast<double>(x[i]) * d[i];
      sum += dot * dot;
    }
  }
  return sum / (static_cast<double>(calibration.n_rows) * layer.out_features);
}

std::string algorithm_name(QuantAlgorithm algorithm) {
  switch (algorithm) {
    case QuantAlgorithm::Rtn: return "rtn";
    case QuantAlgorithm::Gptq: return "gptq";
    case QuantAlgorithm::Awq: return "awq";
  }
  return "unknown";
}

}  // namespace step06
