#pragma once
// The linear-layer hook: every matrix product of the transformer goes through
// Linear::forward, so a step can swap the weight format (int8/int4 in step 06)
// without touching the layer code. The reference is DenseLinear: fp32 weights
// and Eigen's product.
#include <compare>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llm/huge_page_allocator.hpp"

namespace llm {

class Linear {
 public:
  virtual ~Linear() = default;
  // y[rows, out_features] = x[rows, in_features] . W^T, rows stored row-major.
  virtual void forward(const float* x, int rows, float* y) const = 0;
  virtual int in_features() const = 0;
  virtual int out_features() const = 0;
  virtual std::size_t weight_bytes() const = 0;  // bytes read per full product
  // The fp32 weights [out_features, in_features] row-major when the layer
  // keeps them that way (DenseLinear), else nullptr. A model with a tied
  // classifier reads its embedding rows from here instead of a second copy.
  virtual const float* dense_weight() const { return nullptr; }
};

// Which matrix of the transformer a Linear is: what a factory (or step 06's
// calibration recorder) needs to treat layers differently (keep the
// classifier in fp32, calibrate GPTQ per layer).
enum class LinearRole { Query, Key, Value, Output, Gate, Up, Down, Classifier };
struct LinearSite {
  int layer = -1;  // 0..n_layers-1; -1 for the classifier
  LinearRole role = LinearRole::Classifier;
  // llama2.c's tensor names: "wq", "wk", "wv", "wo", "w1" (gate), "w3" (up),
  // "w2" (down), "classifier".
  std::string role_name() const;
  std::string name() const;  // "layer 3 wq", "classifier"
  auto operator<=>(const LinearSite&) const = default;
};

// y[out_features] = W[out_features, in_features] x[in_features], W row-major,
// one weight row at a time: W is read front to back as a single stream.
// DenseLinear's decode product (why this order: linear.cpp), and the loop
// step 01's benchmark measures against Eigen's general product.
void matvec_row_by_row(const float* weight, int out_features, int in_features, const float* x, float* y);

// fp32 weights, [out_features, in_features] row-major, multiplied with Eigen.
class DenseLinear final : public Linear {
 public:
  DenseLinear(const std::vector<float>& weight, int out_features, int in_features);
  void forward(const float* x, int rows, float* y) const override;
  int in_features() const override { return in_; }
  int out_features() const override { return out_; }
  std::size_t weight_bytes() const override { return weight_.size() * sizeof(float); }
  const float* dense_weight() const override { return weight_.data(); }

  // Up to this many rows, and for matrices larger than a core's L2 cache, use
  // the one-pass small-batch product (see forward).
  static constexpr int kSmallBatchRows = 16;
  static constexpr std::size_t kSmallBatchMinWeightBytes = 2u << 20;

 private:
  // [out_features, in_features], on huge pages where the OS allows: decode
  // reads every weight once per token (llm/huge_page_allocator.hpp).
  HugePageVector<float> weight_;
  int out_;
  int in_;
};

// Builds a Linear from an fp32 matrix [out, in]; `site` says which layer and
// role it is, so a factory may treat some differently.
using LinearFactory = std::function<std::unique_ptr<Linear>(const std::vector<float>& weight, int out_features,
                                                            int in_features, const LinearSite& site)>;

LinearFactory dense_linear_factory();

}  // namespace llm
