#include "llm/linear.hpp"

#include <Eigen/Core>
#include <fmt/format.h>

#include "llm/errors.hpp"

namespace llm {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

void matvec_row_by_row(const float* weight, int out_features, int in_features, const float* x, float* y) {
  const Eigen::Map<const RowMajor> w(weight, out_features, in_features);  // [out, in]
  const Eigen::Map<const Eigen::RowVectorXf> x_row(x, in_features);       // [in]
  for (int row = 0; row < out_features; ++row) y[row] = w.row(row).dot(x_row);
}

DenseLinear::DenseLinear(const std::vector<float>& weight, int out_features, int in_features)
    : weight_(weight.begin(), weight.end()), out_(out_features), in_(in_features) {
  if (weight_.size() != static_cast<std::size_t>(out_features) * in_features)
    throw InputError(fmt::format("linear layer: {} weights for a {} x {} matrix", weight_.size(), out_features,
                                 in_features));
}

void DenseLinear::forward(const float* x, int rows, float* y) const {
  const Eigen::Map<const RowMajor> w(weight_.data(), out_, in_);  // [out, in]
  if (rows == 1) {
    // Decode: a matrix-vector product. Each output is the dot product of a
    // weight row with x, so the whole matrix streams through once per token
    // and memory bandwidth is the limit. One row at a time, on purpose:
    // Eigen's general `w * x` walks several weight rows side by side (that
    // many read streams, `in_` floats apart), which a core's prefetchers
    // follow less well than one sequential stream front to back, the way
    // llama2.c's one-row loop reads W. The chapter measures both
    // (docs/01_kv_cache.md, section 5.2).
    matvec_row_by_row(weight_.data(), out_, in_, x, y);
    return;
  }
  if (rows <= kSmallBatchRows && weight_bytes() > kSmallBatchMinWeightBytes) {
    // A few rows (speculative verification, batched decode) against a matrix
    // too big for the core's caches: the cost is one pass over W from memory.
    // So make exactly one pass, dotting each weight row with every input row
    // while it is in cache. A general matrix-matrix product would first copy
    // ("pack") W into a blocked layout (a second pass, plus writes), and
    // separate matrix-vector products would read W once per row. For a small
    // matrix that stays in cache, arithmetic is the cost and the packed
    // product below is faster.
    const Eigen::Map<const RowMajor> xs(x, rows, in_);  // [rows, in]
    for (int o = 0; o < out_; ++o) {
      const auto w_row = w.row(o);
      for (int r = 0; r < rows; ++r) y[static_cast<std::size_t>(r) * out_ + o] = w_row.dot(xs.row(r));
    }
    return;
  }
  // Prefill: Y[rows, out] = X[rows, in] . W^T, one matrix-matrix product, so
  // each weight is read once for all rows (this is what makes prefill fast).
  const Eigen::Map<const RowMajor> xs(x, rows, in_);
  Eigen::Map<RowMajor>(y, rows, out_).noalias() = xs * w.transpose();
}

LinearFactory dense_linear_factory() {
  return [](const std::vector<float>& weight, int out_features, int in_features, const LinearSite&) {
    return std::make_unique<DenseLinear>(weight, out_features, in_features);
  };
}

std::string LinearSite::role_name() const {
  switch (role) {
    case LinearRole::Query: return "wq";
    case LinearRole::Key: return "wk";
    case LinearRole::Value: return "wv";
    case LinearRole::Output: return "wo";
    case LinearRole::Gate: return "w1";
    case LinearRole::Up: return "w3";
    case LinearRole::Down: return "w2";
    case LinearRole::Classifier: return "classifier";
  }
  return "unknown";
}

std::string LinearSite::name() const {
  return layer < 0 ? role_name() : fmt::format("layer {} {}", layer, role_name());
}

}  // namespace llm
