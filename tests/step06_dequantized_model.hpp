#pragma once
// The reference a quantized model is checked against: the same CPU model with
// every quantized Linear replaced by fp32 DenseLinear over dequantize() of
// its matrix. Shared by step 06's CPU and GPU model tests.
#include <memory>
#include <vector>

#include "llm/cpu_model.hpp"
#include "llm/linear.hpp"
#include "step06_quantization/quant_format.hpp"
#include "step06_quantization/quantized_layers.hpp"

namespace step06::testing {

// DenseLinear over dequantize(matrix), but with no fp32 rows to lend
// (dense_weight() nullptr), exactly like the quantized layer it stands for:
// a tied classifier keeps the fp32 embedding in both models.
class DequantizedLinear final : public llm::Linear {
 public:
  explicit DequantizedLinear(const QuantizedMatrix& matrix)
      : dense_(dequantize(matrix), matrix.out_features, matrix.in_features) {}
  void forward(const float* x, int rows, float* y) const override { dense_.forward(x, rows, y); }
  int in_features() const override { return dense_.in_features(); }
  int out_features() const override { return dense_.out_features(); }
  std::size_t weight_bytes() const override { return dense_.weight_bytes(); }

 private:
  llm::DenseLinear dense_;
};

// The CPU model whose quantized sites are DequantizedLinear, the rest fp32.
// `layers` must outlive the model.
inline std::unique_ptr<llm::CpuModel> cpu_model_with_dequantized(const llm::ModelWeights& weights,
                                                                 const QuantizedLayers& layers) {
  llm::CpuModelOptions options;
  options.linear_factory = [&layers](const std::vector<float>& weight, int out, int in,
                                     const llm::LinearSite& site) -> std::unique_ptr<llm::Linear> {
    const auto found = layers.matrices.find(site);
    if (found == layers.matrices.end()) return std::make_unique<llm::DenseLinear>(weight, out, in);
    return std::make_unique<DequantizedLinear>(found->second);
  };
  return std::make_unique<llm::CpuModel>(weights, options);
}

}  // namespace step06::testing
