#include "llm/linear.hpp"

#include <Eigen/Core>
#include <fmt/format.h>

#include "llm/errors.hpp"

namespace llm {

DenseLinear::DenseLinear(const std::vector<float>& weight, int out_features, int in_features)
    : weight_(weight), out_(out_features), in_(in_features) {
  if (weight_.size() != static_cast<std::size_t>(out_features) * in_features)
    throw InputError(fmt::format("linear layer: {} weights for a {} x {} matrix", weight_.size(), out_features,
                                 in_features));
}

void DenseLinear::forward(const float* x, int rows, float* y) const {
  using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const RowMajor> w(weight_.data(), out_, in_);  // [out, in]
  if (rows == 1) {
    // Decode: a matrix-vector product. Each output is the dot product of a
    // weight row with x, so the whole matrix streams through once per token.
    Eigen::Map<Eigen::VectorXf>(y, out_).noalias() = w * Eigen::Map<const Eigen::VectorXf>(x, in_);
    return;
  }
  // Prefill: Y[rows, out] = X[rows, in] . W^T, one matrix-matrix product, so
  // each weight is read once for all rows (this is what makes prefill fast).
  const Eigen::Map<const RowMajor> xs(x, rows, in_);
  Eigen::Map<RowMajor>(y, rows, out_).noalias() = xs * w.transpose();
}

LinearFactory dense_linear_factory() {
  return [](const std::vector<float>& weight, int out_features, int in_features, const std::string&) {
    return std::make_unique<DenseLinear>(weight, out_features, in_features);
  };
}

}  // namespace llm
