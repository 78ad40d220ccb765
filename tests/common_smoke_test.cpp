// The real checkpoint test: greedy generation from BOS with stories260K
// reproduces the token ids llama2.c's run.c produces for the same files.
#include <gtest/gtest.h>

#include "llm/checkpoint.hpp"
#include "llm/cpu_model.hpp"
#include "llm/sampler.hpp"
#include "llm/tokenizer.hpp"
#include "test_support.hpp"

namespace llm {
namespace {

// run.c (temperature 0, 256 steps) on stories260K.bin: the first 64 ids after BOS.
const std::vector<int> kRunCGreedyIds = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
    401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
    328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267,
    337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};

TEST(Stories260K, GreedyFromBosMatchesLlama2c) {
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  const ModelWeights weights = load_checkpoint(model_path);
  CpuModel model(weights);
  auto cache = model.make_cache(1, weights.config.seq_len);
  int token = Tokenizer::kBos;
  std::vector<int> generated;
  for (int pos = 0; pos < static_cast<int>(kRunCGreedyIds.size()); ++pos) {
    token = argmax(model.forward(TokenBatch::single(token, pos, 0), *cache));
    generated.push_back(token);
  }
  EXPECT_EQ(generated, kRunCGreedyIds);
}

}  // namespace
}  // namespace llm
