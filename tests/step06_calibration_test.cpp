// Step 06 (quantization), calibration recording: the LinearInputRecorder
// wraps the factory of the unchanged CpuModel and sees the input rows of
// every layer and role of stories260K in one forward, the rows each matrix
// really reads (GPTQ and AWQ fit each layer to them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/cpu_model.hpp"
#include "llm/linear.hpp"
#include "llm/token_batch.hpp"
#include "llm/weights.hpp"
#include "step06_quantization/linear_input_recorder.hpp"
#include "test_support.hpp"

namespace step06 {
namespace {

using llm::LinearRole;
using llm::LinearSite;

// Prompt: BOS then a few story tokens' worth of ids (any ids in the vocabulary).
const std::vector<int> kPrompt = {1, 403, 407, 261, 378, 271, 394, 261, 425, 280, 302};

TEST(LinearInputRecorder, SeesEveryLayerAndRoleOfStories260KInOneForward) {
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  const llm::ModelWeights weights = llm::load_checkpoint(model_path);
  const llm::ModelConfig& c = weights.config;
  LinearInputRecorder recorder;
  llm::CpuModelOptions options;
  options.linear_factory = recorder.wrap(llm::dense_linear_factory());
  llm::CpuModel model(weights, options);
  auto cache = model.make_cache(1, 32);
  model.forward(llm::TokenBatch::prefill(kPrompt, 0, 0), *cache);

  const int rows = static_cast<int>(kPrompt.size());
  EXPECT_EQ(recorder.sites().size(), static_cast<std::size_t>(7 * c.n_layers + 1));
  for (int layer = 0; layer < c.n_layers; ++layer) {
    for (LinearRole role : {LinearRole::Query, LinearRole::Key, LinearRole::Value, LinearRole::Output,
                            LinearRole::Gate, LinearRole::Up, LinearRole::Down}) {
      const LinearSite site{layer, role};
      SCOPED_TRACE(site.name());
      EXPECT_EQ(recorder.rows(site), rows);
      for (float x : recorder.inputs(site)) ASSERT_TRUE(std::isfinite(x));
    }
    // Q, K and V read the same normalized rows; so do the gate and up projections.
    const auto same = [&](LinearRole a, LinearRole b) {
      const auto x = recorder.inputs({layer, a}), y = recorder.inputs({layer, b});
      return std::equal(x.begin(), x.end(), y.begin(), y.end());
    };
    EXPECT_TRUE(same(LinearRole::Query, LinearRole::Key));
    EXPECT_TRUE(same(LinearRole::Query, LinearRole::Value));
    EXPECT_TRUE(same(LinearRole::Gate, LinearRole::Up));
    EXPECT_FALSE(same(LinearRole::Query, LinearRole::Gate));
  }
  EXPECT_EQ(recorder.rows({-1, LinearRole::Classifier}), 1);  // logits of the last row only

  // A second forward appends; clear() forgets.
  model.forward(llm::TokenBatch::single(kPrompt.back(), rows, 0), *cache);
  EXPECT_EQ(recorder.rows({0, LinearRole::Query}), rows + 1);
  recorder.clear();
  EXPECT_EQ(recorder.rows({0, LinearRole::Query}), 0);
}

}  // namespace
}  // namespace step06
