// GPTQ (Frantar et al. 2022): quantize one input column at a time and spread
// each column's rounding error over the columns not yet quantized.
//
// The derivation. Rows of W are independent: for one output row w [in], the
// quantized row ŵ makes the error, on the calibration rows X [n, in],
//   ||X w - X ŵ||^2 / n = (w - ŵ)^T (X^T X / n) (w - ŵ),
// a quadratic form with Hessian H = 2 X^T X / n [in, in], the same for every
// row. Quantizing column j to q leaves the error w_j - q; the columns F not
// yet quantized may still move, and the move that cancels it best (Optimal
// Brain Surgeon) is
//   δ_F = -(w_j - q) / [H_F^-1]_jj · [H_F^-1]_{j,F}
// with H_F^-1 the inverse Hessian of the remaining columns. Dropping column j
// from F is one step of Gaussian elimination on H_F^-1, so for a fixed column
// order the rows [H_F^-1]_{j,F} / sqrt([H_F^-1]_jj) are the rows of the upper
// Cholesky factor U of H^-1 (H^-1 = U^T U). One factorisation gives every step:
//   err = (w_j - q) / U_jj,      w_k -= err · U_jk   for every k > j.
// Lazy batches: column k only needs the errors of the columns before it, so the
// columns of a block are updated column by column, and the columns after the
// block once per block: W[:, after] -= Err[:, block] · U[block, after]. The
// same arithmetic, far fewer passes over W.
#include <fmt/format.h>

#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <algorithm>
#include <numeric>
#include <span>
#include <vector>

#include "llm/errors.hpp"
#include "step06_quantization/calibration.hpp"
#include "step06_quantization/quant_algorithms.hpp"

namespace step06 {

namespace {

// Row-major: a row of W (one output's weights) and a row of U are contiguous.
using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// U with H^-1 = U^T U [in, in]: inverse through H's Cholesky factor, then the
// Cholesky factor of the inverse.
RowMatrix upper_cholesky_of_inverse(const Eigen::MatrixXd& hessian) {
  const Eigen::LLT<Eigen::MatrixXd> cholesky(hessian);
  if (cholesky.info() != Eigen::Success)
    throw llm::InputError("GPTQ: the calibration Hessian is not positive definite (raise the dampening)");
  const Eigen::MatrixXd inverse = cholesky.solve(Eigen::MatrixXd::Identity(hessian.rows(), hessian.cols()));
  const Eigen::LLT<Eigen::MatrixXd> inverse_cholesky(inverse);
  if (inverse_cholesky.info() != Eigen::Success)
    throw llm::InputError("GPTQ: the inverse Hessian is not positive definite (raise the dampening)");
  return inverse_cholesky.matrixU();  // Eigen's L^T: H^-1 = L L^T = U^T U
}

// The end of the lazy block that starts at `block_start`: block_columns later,
// or earlier where a group would straddle it. Without act_order a group's
// parameters are chosen when its first column comes up, from the current
// weights of all its columns, while the columns past a block receive the
// block's errors only at its end: so a group that starts inside a block must
// end in it (one that starts a block may run past it, as int8's whole row does).
int lazy_block_end(int block_start, int block_columns, int group, int in) {
  const int block_end = std::min(in, block_start + block_columns);
  const int last_group_start = (block_end - 1) / group * group;
  const int last_group_end = std::min(in, last_group_start + group);
  return last_group_start > block_start && last_group_end > block_end ? last_group_start : block_end;
}

// H = 2 X^T X / n [in, in] and the layer's weights [out, in], with every
// dead input (always 0 in calibration: a zero row and column in H) fixed: its
// weight cannot matter, so it is set to 0 and H_ii to 1 (the reference
// implementation's choice), which keeps H invertible.
struct GptqProblem {
  Eigen::MatrixXd hessian;    // [in, in]
  std::vector<float> weight;  // [out, in] dead columns zeroed
};
GptqProblem hessian_without_dead_inputs(const LayerWeights& layer, const CalibrationInputs& calibration) {
  GptqProblem problem{2.0 * calibration_gram(calibration), {layer.weight.begin(), layer.weight.end()}};
  const int out = layer.out_features;
  const int in = layer.in_features;
  for (int column = 0; column < in; ++column) {
    if (problem.hessian(column, column) != 0.0) continue;
    problem.hessian(column, column) = 1.0;
    for (int row = 0; row < out; ++row) problem.weight[static_cast<std::size_t>(row) * in + column] = 0.0f;
  }
  return problem;
}

// Processing order: order[p] is the column quantized p-th. act_order takes
// the inputs with the most energy (largest H_ii) first, while their errors
// can still be spread over many columns.
std::vector<int> processing_order(const Eigen::MatrixXd& hessian, bool act_order) {
  std::vector<int> order(static_cast<std::size_t>(hessian.rows()));  // [in]
  std::iota(order.begin(), order.end(), 0);
  if (act_order)
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return hessian(a, a) > hessian(b, b); });
  return order;
}

// act_order's static groups: each group's parameters come from the original
// weights, as RTN would choose them, since its columns are quantized out of
// order. params: [out, groups_per_row]; weight: [out, in].
void choose_static_group_params(const QuantFormat& format, const std::vector<float>& weight, int out, int in,
                                int group, std::vector<GroupParams>& params) {
  const int groups_per_row = (in + group - 1) / group;
  for (int row = 0; row < out; ++row)
    for (int g = 0; g < groups_per_row; ++g) {
      const int count = std::min(group, in - g * group);
      const std::span<const float> values(weight.data() + static_cast<std::size_t>(row) * in + g * group, count);
      params[static_cast<std::size_t>(row) * groups_per_row + g] = choose_group_params(format.scheme, values);
    }
}

// What every block of columns reads and writes.
struct GptqState {
  const QuantFormat& format;
  const std::vector<int>& order;  // [in] the column quantized p-th
  const RowMatrix& upper;         // [in, in] U, H^-1 = U^T U, in processing order
  RowMatrix& weights;             // [out, in] the current weights, in processing order
  std::vector<GroupParams>& params;  // [out, groups_per_row], in the original column order
  std::vector<int>& codes;           // [out, in] in the original column order
  bool act_order = false;
  int group = 0;
};

// Quantizes processing columns [block_start, block_end) of every row, each
// rounding error spread at once over the block's later columns; returns the
// block's errors [out, block_end - block_start] (already divided by U_pp).
void quantize_block(GptqState& s, int block_start, int block_end, RowMatrix& block_errors) {
  const int out = static_cast<int>(s.weights.rows());
  const int in = static_cast<int>(s.weights.cols());
  const int groups_per_row = (in + s.group - 1) / s.group;
  std::vector<float> group_values(static_cast<std::size_t>(s.group));  // [group] one group of one row
  block_errors.resize(out, block_end - block_start);
  for (int row = 0; row < out; ++row) {
    double* current = &s.weights(row, 0);  // [in] this row's current weights
    for (int p = block_start; p < block_end; ++p) {
      const int column = s.order[p];
      GroupParams& group_params = s.params[static_cast<std::size_t>(row) * groups_per_row + column / s.group];
      if (!s.act_order && p % s.group == 0) {
        const int count = std::min(s.group, in - p);
        for (int i = 0; i < count; ++i) group_values[static_cast<std::size_t>(i)] = static_cast<float>(current[p + i]);
        group_params = choose_group_params(s.format.scheme, std::span<const float>(group_values).first(count));
      }
      const int code = quantize_to_code(s.format.scheme, static_cast<float>(current[p]), group_params);
      s.codes[static_cast<std::size_t>(row) * in + column] = code;
      const double error = (current[p] - code_value(s.format.scheme, code, group_params)) / s.upper(p, p);
      const double* u_row = &s.upper(p, 0);  // [in] row p of U
      for (int k = p + 1; k < block_end; ++k) current[k] -= error * u_row[k];
      block_errors(row, p - block_start) = error;
    }
  }
}

}  // namespace

QuantizedMatrix quantize_gptq(const LayerWeights& layer, const QuantFormat& format,
                              const CalibrationInputs& calibration, const GptqOptions& options) {
  check_calibration_fits(layer, calibration, "GPTQ");
  check_layer_fits(format, layer.out_features, layer.in_features);
  if (!(options.dampening >= 0.0) || options.block_columns <= 0)
    throw llm::InputError(fmt::format("GPTQ: dampening {} must be >= 0 and block_columns {} > 0", options.dampening,
                                      options.block_columns));
  const int out = layer.out_features;
  const int in = layer.in_features;
  const int group = format.group_columns(in);
  const int groups_per_row = (in + group - 1) / group;  // the last group may be shorter

  const GptqProblem problem = hessian_without_dead_inputs(layer, calibration);
  std::vector<GroupParams> params(static_cast<std::size_t>(out) * groups_per_row);  // [out, groups_per_row]
  const std::vector<int> order = processing_order(problem.hessian, options.act_order);
  if (options.act_order) choose_static_group_params(format, problem.weight, out, in, group, params);

  // H and W with their columns in processing order (p-th column = order[p]).
  Eigen::MatrixXd ordered_hessian(in, in);  // [in, in]
  for (int a = 0; a < in; ++a)
    for (int b = 0; b < in; ++b) ordered_hessian(a, b) = problem.hessian(order[a], order[b]);
  RowMatrix weights(out, in);  // [out, in] the current weights: each error spread lands here
  for (int row = 0; row < out; ++row)
    for (int p = 0; p < in; ++p) weights(row, p) = problem.weight[static_cast<std::size_t>(row) * in + order[p]];

  // Dampening (relative to the mean curvature) makes a singular H invertible
  // and limits how far an error is pushed onto weakly constrained columns.
  const double damp = options.dampening * ordered_hessian.diagonal().mean();
  ordered_hessian.diagonal().array() += damp;
  const RowMatrix upper = upper_cholesky_of_inverse(ordered_hessian);  // [in, in] U, H^-1 = U^T U

  std::vector<int> codes(layer.weight.size());  // [out, in] in the original column order
  GptqState state{format, order, upper, weights, params, codes, options.act_order, group};
  RowMatrix block_errors;  // [out, columns of the block]
  for (int block_start = 0, block_end = 0; block_start < in; block_start = block_end) {
    block_end = options.act_order ? std::min(in, block_start + options.block_columns)  // groups chosen up front
                                  : lazy_block_end(block_start, options.block_columns, group, in);
    quantize_block(state, block_start, block_end, block_errors);
    // The columns after the block receive the whole block's errors at once.
    const int after = in - block_end;
    if (after > 0)
      weights.rightCols(after).noalias() -=
          block_errors * upper.block(block_start, block_end, block_end - block_start, after);
  }
  return pack(format, out, in, codes, params);
}

}  // namespace step06
