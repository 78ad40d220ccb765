#pragma once
// The linear-layer hook: every matrix product of the transformer goes through
// Linear::forward, so a step can swap the weight format (int8/int4 in step 06)
// without touching the layer code. The reference is DenseLinear: fp32 weights
// and Eigen's product.
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace llm {

class Linear {
 public:
  virtual ~Linear() = default;
  // y[rows, out_features] = x[rows, in_features] . W^T, rows stored row-major.
  virtual void forward(const float* x, int rows, float* y) const = 0;
  virtual int in_features() const = 0;
  virtual int out_features() const = 0;
  virtual std::size_t weight_bytes() const = 0;  // bytes read per full product
};

// fp32 weights, [out_features, in_features] row-major, multiplied with Eigen.
class DenseLinear final : public Linear {
 public:
  DenseLinear(const std::vector<float>& weight, int out_features, int in_features);
  void forward(const float* x, int rows, float* y) const override;
  int in_features() const override { return in_; }
  int out_features() const override { return out_; }
  std::size_t weight_bytes() const override { return weight_.size() * sizeof(float); }

  // Up to this many rows, and for matrices larger than a core's L2 cache, use
  // the one-pass small-batch product (see forward).
  static constexpr int kSmallBatchRows = 16;
  static constexpr std::size_t kSmallBatchMinWeightBytes = 2u << 20;

 private:
  std::vector<float> weight_;  // [out_features, in_features]
  int out_;
  int in_;
};

// Builds a Linear from an fp32 matrix [out, in]; `name` is the tensor's role
// ("wq", "w2", "classifier", ...) so a factory may treat some differently.
using LinearFactory = std::function<std::unique_ptr<Linear>(
    const std::vector<float>& weight, int out_features, int in_features, const std::string& name)>;

LinearFactory dense_linear_factory();

}  // namespace llm
