#pragma once
// What GPTQ and AWQ share about a layer's calibration rows X [n, in]: the
// checks that they fit the layer, and their Gram matrix X^T X / n, the
// quadratic form of the layer's output error: for a row error d = w - ŵ,
//   mean over rows of (x . d)^2 = d^T (X^T X / n) d.
#include <Eigen/Core>
#include <string_view>

#include "step06_quantization/quant_algorithms.hpp"

namespace step06 {

// Throws llm::InputError, naming `algorithm` ("GPTQ", "AWQ"), unless the
// weights make a layer and the calibration rows fit it: as many features as
// input columns, at least one row, rows.size() == n_rows * in_features, every
// value finite.
void check_calibration_fits(const LayerWeights& layer, const CalibrationInputs& calibration,
                            std::string_view algorithm);

// X^T X / n [in, in] in double (each entry sums n products), both triangles filled.
Eigen::MatrixXd calibration_gram(const CalibrationInputs& calibration);

}  // namespace step06
