#pragma once
// Calibration recording: the rows every Linear of a model is given during its
// forwards, per site (which layer, which matrix). GPTQ and AWQ
// (quant_algorithms.hpp) fit each layer to the rows it saw; nothing else
// records them, so the recorder lives here and not in common/. It is a
// LinearFactory wrapper: the model's forward is the unchanged one of common/.
#include <map>
#include <span>
#include <vector>

#include "llm/linear.hpp"

namespace step06 {

// Observes the inputs of every Linear of a model during its forwards: the
// calibration data of GPTQ/AWQ. Wrap the model's factory with wrap(); every
// Linear it builds appends the rows it is given to inputs(site).
// The recorder must outlive the model built with it. One thread at a time.
class LinearInputRecorder {
 public:
  llm::LinearFactory wrap(llm::LinearFactory inner);
  // Every row recorded for `site` so far, [rows, in_features] row-major
  // (empty when the site has not run).
  std::span<const float> inputs(const llm::LinearSite& site) const;
  int rows(const llm::LinearSite& site) const;
  std::vector<llm::LinearSite> sites() const;  // the sites that recorded rows, in order
  void clear() { inputs_.clear(); }

 private:
  class RecordingLinear;
  std::map<llm::LinearSite, std::vector<float>> inputs_;  // per site: [recorded rows, in_features]
  std::map<llm::LinearSite, int> in_features_;            // per site built through wrap()
};

}  // namespace step06
