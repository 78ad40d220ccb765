#include "step06_quantization/calibration.hpp"

#include <fmt/format.h>

#include <cmath>

#include "llm/errors.hpp"

namespace step06 {

void check_calibration_fits(const LayerWeights& layer, const CalibrationInputs& calibration,
                            std::string_view algorithm) {
  if (layer.out_features <= 0 || layer.in_features <= 0 ||
      layer.weight.size() != static_cast<std::size_t>(layer.out_features) * layer.in_features)
    throw llm::InputError(fmt::format("{}: {} weights do not make a [{}, {}] layer", algorithm, layer.weight.size(),
                                      layer.out_features, layer.in_features));
  if (calibration.in_features != layer.in_features)
    throw llm::InputError(fmt::format("{}: calibration rows have {} features, the layer has {} input columns",
                                      algorithm, calibration.in_features, layer.in_features));
  if (calibration.n_rows <= 0)
    throw llm::InputError(fmt::format("{}: no calibration rows (record some forwards first)", algorithm));
  if (calibration.rows.size() != static_cast<std::size_t>(calibration.n_rows) * calibration.in_features)
    throw llm::InputError(fmt::format("{}: {} calibration values are not {} rows of {}", algorithm,
                                      calibration.rows.size(), calibration.n_rows, calibration.in_features));
  for (std::size_t i = 0; i < calibration.rows.size(); ++i)
    if (!std::isfinite(calibration.rows[i]))
      throw llm::InputError(fmt::format("{}: calibration row {} column {} is {}", algorithm,
                                        i / calibration.in_features, i % calibration.in_features,
                                        calibration.rows[i]));
}

Eigen::MatrixXd calibration_gram(const CalibrationInputs& calibration) {
  using FloatRows = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const FloatRows> rows(calibration.rows.data(), calibration.n_rows, calibration.in_features);
  const Eigen::MatrixXd x = rows.cast<double>();  // [n, in]
  // Symmetric: one triangle is enough to compute (half the work), then mirrored.
  Eigen::MatrixXd lower = Eigen::MatrixXd::Zero(calibration.in_features, calibration.in_features);
  lower.selfadjointView<Eigen::Lower>().rankUpdate(x.transpose(), 1.0 / calibration.n_rows);
  return lower.selfadjointView<Eigen::Lower>();
}

}  // namespace step06
