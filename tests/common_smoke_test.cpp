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

// llama2.c's run.c (temperature 0, -n 256) on stories260K.bin and tok512.bin:
// the 256 token ids it samples after BOS, the whole story it prints.
const std::vector<int> kRunCGreedyIds = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
    401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
    328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267,
    337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426,  13, 438, 310,
    439, 419, 357, 336, 432, 313, 438, 310, 432, 278, 316, 439, 419, 298, 414, 267,
    265, 282, 295, 433, 426, 436, 317, 286, 296, 418, 269, 279, 292, 416, 439, 413,
    409, 416, 327, 263, 415, 294, 267, 400, 426, 338, 336, 432, 313, 442, 391, 267,
    337, 335, 364, 420, 268, 388, 432, 398, 359, 280, 303, 439, 413, 272, 417, 264,
    312, 426, 436,  13, 438, 310, 286, 296, 418, 269, 279, 292, 416, 439, 413, 409,
    416, 327, 263, 415, 294, 267, 400, 426, 338, 336, 432, 313, 442, 439, 423, 262,
    304, 420, 422, 432, 317, 426, 359, 279, 292, 416, 439, 413, 409, 416, 327, 263,
    415, 294, 267, 400, 426, 436,  13, 438, 310, 279, 292, 416, 439, 413, 391, 267,
    281, 421, 427, 311, 357, 432, 384, 358, 336, 432, 313, 442, 439, 423, 262, 304,
    420, 422, 432, 357, 426, 359, 279, 292, 416, 439, 413, 409, 416, 327, 263, 415,
    294, 267, 400, 426, 436, 320, 285, 357, 336, 432, 313, 455, 289, 439, 413, 263,
    304, 420, 422, 432, 317, 426, 410, 448, 411, 280, 303, 281, 421, 427, 364, 426};

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

TEST(Stories260K, GreedyStoryDecodesToLlama2cText) {
  LLM_REQUIRE_MODEL_FILE(tokenizer_path, "tok512.bin");
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_path, 512);
  std::string text;
  int previous = Tokenizer::kBos;
  for (int token : kRunCGreedyIds) {
    text += tokenizer.decode_printable(previous, token);
    previous = token;
  }
  // The opening run.c prints (and the README quotes).
  EXPECT_EQ(text.rfind("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                       "One day, she saw a big, red ball.",
                       0),
            0u)
      << text;
}

}  // namespace
}  // namespace llm
