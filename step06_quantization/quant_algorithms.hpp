#pragma once
// Quantization algorithms: which codes and scales a format's storage gets
// for a layer's weights. Each returns a QuantizedMatrix that any kernel runs.
//   RTN   round to nearest, group by group: no data needed.
//   GPTQ  (Frantar et al. 2022) quantizes one column at a time and spreads each
//         column's rounding error over the columns not yet quantized, weighted
//         by the inverse Hessian of the layer's output error on calibration
//         inputs: the errors cancel in the product instead of adding up.
//   AWQ   (Lin et al. 2023) scales up the input channels that carry large
//         activations before rounding (their weights then lose less relative
//         precision) and divides the input by the same scales; the scale
//         exponent is searched on a grid to minimise the layer's output error.
// Calibration inputs are the rows a layer saw during forwards of the fp32
// model (LinearInputRecorder, linear_input_recorder.hpp): X [rows, in_features] row-major.
#include <span>
#include <string>
#include <vector>

#include "step06_quantization/quant_format.hpp"

namespace step06 {

// W [out_features, in_features] row-major fp32 weights of one layer.
struct LayerWeights {
  std::span<const float> weight;  // [out_features, in_features]
  int out_features = 0;
  int in_features = 0;
};

// Calibration activations of one layer: [rows, in_features] row-major.
struct CalibrationInputs {
  std::span<const float> rows;
  int n_rows = 0;
  int in_features = 0;
};

QuantizedMatrix quantize_rtn(const LayerWeights& layer, const QuantFormat& format);

struct GptqOptions {
  // Dampening: H + damp * mean(diag H) * I before inverting, so a Hessian
  // that is singular (an input channel that is always 0) still inverts.
  double dampening = 0.01;
  // Columns per lazy batch: errors are applied to the columns of the batch at
  // once per column and to the rest of the matrix once per batch (GPTQ's "lazy
  // batch updates": the same result, far fewer passes over W).
  int block_columns = 128;
  // Quantize columns in order of decreasing Hessian diagonal (the inputs with
  // the most energy first). Groups stay contiguous in the stored layout:
  // with act_order each group's scale and zero are chosen up front from the
  // original weights ("static groups"), so only the rounding order changes.
  bool act_order = false;
};

// Throws llm::InputError when the inputs do not fit the layer, or no rows.
QuantizedMatrix quantize_gptq(const LayerWeights& layer, const QuantFormat& format,
                              const CalibrationInputs& calibration, const GptqOptions& options = {});

struct AwqOptions {
  int grid_points = 20;  // alpha in {0, 1/grid, ..., (grid-1)/grid}; alpha 0 = no scaling (plain RTN)
};
struct AwqResult {
  QuantizedMatrix matrix;          // with input_scales set (empty when alpha 0 won)
  double alpha = 0.0;              // the chosen exponent: s_j = mean|x_j|^alpha (normalised)
  double output_error = 0.0;       // the layer's output error at alpha (layer_output_error)
  double output_error_unscaled = 0.0;  // at alpha 0: the search never returns more than this
};
// Per-input-channel scales s_j = (mean over rows of |x_j|)^alpha, normalised
// so that sqrt(max s * min s) = 1; W diag(s) is quantized with RTN and x / s
// is what the product reads.
AwqResult quantize_awq(const LayerWeights& layer, const QuantFormat& format, const CalibrationInputs& calibration,
                       const AwqOptions& options = {});

// AWQ over matrices that read the same input: Q, K and V read the attention
// norm's output, gate and up the FFN norm's. One alpha for all of them, the
// one with the least output error of the group as a whole (their outputs
// stacked), so that every matrix divides its input by the same scales: the
// CUDA model multiplies such a group as one stacked matrix (one QKV product,
// one gate-up product), and a stack can divide x by one vector only. AWQ's
// reference implementation scales these groups together for the same reason.
struct AwqGroupResult {
  std::vector<QuantizedMatrix> matrices;  // one per layer, in order, all with the same input_scales
  double alpha = 0.0;                     // the group's exponent
  double output_error = 0.0;              // mean over the stacked outputs at alpha
  double output_error_unscaled = 0.0;     // at alpha 0 (plain RTN)
};
// Throws llm::InputError when `layers` is empty or one does not fit the calibration.
AwqGroupResult quantize_awq_group(std::span<const LayerWeights> layers, const QuantFormat& format,
                                  const CalibrationInputs& calibration, const AwqOptions& options = {});

// Mean squared error of the layer's outputs on the calibration rows:
// sum over rows r and outputs o of (x_r . w_o - x_r . w~_o)^2 / (rows * out),
// where w~ is the dequantized matrix (input scales folded in).
double layer_output_error(const LayerWeights& layer, const QuantizedMatrix& quantized,
                          const CalibrationInputs& calibration);

enum class QuantAlgorithm { Rtn, Gptq, Awq };
std::string algorithm_name(QuantAlgorithm algorithm);  // "rtn", "gptq", "awq"

}  // namespace step06
