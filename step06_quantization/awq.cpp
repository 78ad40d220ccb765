// AWQ (Lin et al. 2023): activation-aware scaling before round to nearest.
//
// A weight's rounding error reaches the output multiplied by its input, so
// the weights of input channels with large activations matter most. Scaling
// column j of W up by s_j > 1 before quantizing gives those weights more of
// the group's codes (less relative rounding error); the product divides the
// input by the same s_j, so in exact arithmetic nothing changes:
//   y = W x = (W diag(s)) (x / s)  ≈  Q(W diag(s)) (x / s).
// The scales follow the activations, s_j = (mean over rows of |x_j|)^alpha,
// and the exponent alpha is searched on a grid for the least output error on
// the calibration rows. alpha = 0 is plain RTN, so the search never loses to it.
// Matrices that read the same input (Q, K and V; gate and up) share one
// alpha, searched on their outputs together (quantize_awq_group): they must
// divide that input by the same scales to be multiplied as one stacked matrix.
//
// The search measures each candidate's error through the Gram matrix
// G = X^T X / n (calibration.hpp): the mean over rows of (x . d)^2 is d^T G d,
// so one product with G per candidate [out, in] x [in, in] replaces a pass
// over every calibration row [n, in] x [in, out]: the cost no longer grows
// with the number of rows n. It is layer_output_error's sum in another order:
// equal up to double rounding.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "llm/errors.hpp"
#include "step06_quantization/calibration.hpp"
#include "step06_quantization/quant_algorithms.hpp"

namespace step06 {

namespace {

// The reference implementation's floor on a scale: an input that is always 0
// (mean 0) would otherwise get s = 0 and a division by zero in x / s.
constexpr double kMinScale = 1e-4;

// Mean over the calibration rows of |x_j| [in].
std::vector<double> mean_abs_activation(const CalibrationInputs& calibration) {
  std::vector<double> mean(static_cast<std::size_t>(calibration.in_features), 0.0);
  for (int r = 0; r < calibration.n_rows; ++r) {
    const float* x = calibration.rows.data() + static_cast<std::size_t>(r) * calibration.in_features;
    for (int j = 0; j < calibration.in_features; ++j) mean[static_cast<std::size_t>(j)] += std::fabs(x[j]);
  }
  for (double& value : mean) value /= calibration.n_rows;
  return mean;
}

// s_j = max(mean_j^alpha, floor), divided by sqrt(max s * min s) so that the
// scales sit around 1 (up by as much as down): W diag(s) keeps its magnitude. [in]
std::vector<float> input_scales_for(const std::vector<double>& mean_abs, double alpha) {
  std::vector<double> scales(mean_abs.size());
  for (std::size_t j = 0; j < scales.size(); ++j) scales[j] = std::max(std::pow(mean_abs[j], alpha), kMinScale);
  const auto [smallest, largest] = std::minmax_element(scales.begin(), scales.end());
  const double normalizer = std::sqrt(*smallest * *largest);
  std::vector<float> normalized(scales.size());
  for (std::size_t j = 0; j < scales.size(); ++j) normalized[j] = static_cast<float>(scales[j] / normalizer);
  return normalized;
}

// layer_output_error(layer, quantized, calibration) from gram = X^T X / n [in, in]:
// sum over outputs o of d_o^T G d_o / out, with d_o = w_o - w~_o.
double output_error_from_gram(const LayerWeights& layer, const QuantizedMatrix& quantized,
                              const Eigen::MatrixXd& gram) {
  const std::vector<float> approximate = dequantize(quantized);  // [out, in] input scales folded in
  Eigen::MatrixXd difference(layer.out_features, layer.in_features);  // [out, in]
  for (int row = 0; row < layer.out_features; ++row)
    for (int column = 0; column < layer.in_features; ++column) {
      const std::size_t at = static_cast<std::size_t>(row) * layer.in_features + column;
      difference(row, column) = layer.weight[at] - approximate[at];  // in float, as layer_output_error does
    }
  const Eigen::MatrixXd difference_times_gram = difference * gram;  // [out, in]
  return (difference_times_gram.array() * difference.array()).sum() / layer.out_features;
}

}  // namespace

AwqGroupResult quantize_awq_group(std::span<const LayerWeights> layers, const QuantFormat& format,
                                  const CalibrationInputs& calibration, const AwqOptions& options) {
  if (layers.empty()) throw llm::InputError("AWQ: a group of no layers");
  for (const LayerWeights& layer : layers) check_calibration_fits(layer, calibration, "AWQ");
  if (options.grid_points < 1)
    throw llm::InputError(fmt::format("AWQ: grid_points {} must be at least 1", options.grid_points));
  const std::vector<double> mean_abs = mean_abs_activation(calibration);  // [in]
  const Eigen::MatrixXd gram = calibration_gram(calibration);            // [in, in] X^T X / n
  int stacked_outputs = 0;
  for (const LayerWeights& layer : layers) stacked_outputs += layer.out_features;

  std::vector<float> scaled_weight;  // [out, in] W diag(s) of the layer being rounded
  AwqGroupResult best;
  for (int point = 0; point < options.grid_points; ++point) {
    const double alpha = static_cast<double>(point) / options.grid_points;
    // s = 1 at alpha 0: plain RTN, no input scales stored. [in] or empty
    const std::vector<float> scales = point == 0 ? std::vector<float>{} : input_scales_for(mean_abs, alpha);
    std::vector<QuantizedMatrix> candidates;
    double squared_error = 0.0;  // summed over the group's outputs
    for (const LayerWeights& layer : layers) {
      QuantizedMatrix candidate;
      if (scales.empty()) {
        candidate = quantize_rtn(layer, format);
      } else {
        scaled_weight.resize(layer.weight.size());
        for (int row = 0; row < layer.out_features; ++row)
          for (int column = 0; column < layer.in_features; ++column) {
            const std::size_t at = static_cast<std::size_t>(row) * layer.in_features + column;
            scaled_weight[at] = layer.weight[at] * scales[static_cast<std::size_t>(column)];
          }
        candidate = quantize_rtn({scaled_weight, layer.out_features, layer.in_features}, format);
        candidate.input_scales = scales;  // dequantize() and the kernels divide column j by s_j
      }
      // output_error_from_gram is a mean over the layer's outputs: times
      // out_features, the layer's share of the stacked sum.
      squared_error += output_error_from_gram(layer, candidate, gram) * layer.out_features;
      candidates.push_back(std::move(candidate));
    }
    const double error = squared_error / stacked_outputs;
    if (point == 0) best.output_error_unscaled = error;
    if (point == 0 || error < best.output_error) {  // ties keep the smaller alpha
      best.matrices = std::move(candidates);
      best.alpha = alpha;
      best.output_error = error;
    }
  }
  return best;
}

AwqResult quantize_awq(const LayerWeights& layer, const QuantFormat& format, const CalibrationInputs& calibration,
                       const AwqOptions& options) {
  AwqGroupResult group = quantize_awq_group(std::span<const LayerWeights>(&layer, 1), format, calibration, options);
  return {std::move(group.matrices.front()), group.alpha, group.output_error, group.output_error_unscaled};
}

}  // namespace step06
