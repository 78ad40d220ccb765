#include "step06_quantization/linear_input_recorder.hpp"

#include <cstddef>
#include <memory>
#include <utility>

namespace step06 {

using llm::Linear;
using llm::LinearFactory;
using llm::LinearSite;

// A Linear that appends its input rows to the recorder, then runs the layer it wraps.
class LinearInputRecorder::RecordingLinear final : public Linear {
 public:
  RecordingLinear(std::unique_ptr<Linear> inner, LinearSite site, LinearInputRecorder& recorder)
      : inner_(std::move(inner)), site_(site), recorder_(recorder) {}
  void forward(const float* x, int rows, float* y) const override {
    std::vector<float>& recorded = recorder_.inputs_[site_];  // [rows so far, in_features]
    recorded.insert(recorded.end(), x, x + static_cast<std::size_t>(rows) * in_features());
    inner_->forward(x, rows, y);
  }
  int in_features() const override { return inner_->in_features(); }
  int out_features() const override { return inner_->out_features(); }
  std::size_t weight_bytes() const override { return inner_->weight_bytes(); }
  const float* dense_weight() const override { return inner_->dense_weight(); }

 private:
  std::unique_ptr<Linear> inner_;
  LinearSite site_;
  LinearInputRecorder& recorder_;
};

LinearFactory LinearInputRecorder::wrap(LinearFactory inner) {
  return [this, inner = std::move(inner)](const std::vector<float>& weight, int out_features, int in_features,
                                          const LinearSite& site) -> std::unique_ptr<Linear> {
    in_features_[site] = in_features;
    return std::make_unique<RecordingLinear>(inner(weight, out_features, in_features, site), site, *this);
  };
}

std::span<const float> LinearInputRecorder::inputs(const LinearSite& site) const {
  const auto found = inputs_.find(site);
  if (found == inputs_.end()) return {};
  return found->second;
}

int LinearInputRecorder::rows(const LinearSite& site) const {
  const auto found = in_features_.find(site);
  if (found == in_features_.end() || found->second == 0) return 0;
  return static_cast<int>(inputs(site).size() / static_cast<std::size_t>(found->second));
}

std::vector<LinearSite> LinearInputRecorder::sites() const {
  std::vector<LinearSite> recorded;
  for (const auto& [site, rows] : inputs_) recorded.push_back(site);
  return recorded;
}

}  // namespace step06
