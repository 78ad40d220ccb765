#pragma once
// Sampler: greedy (temperature 0), temperature, and top-p (nucleus) sampling,
// with llama2.c's xorshift generator so a seed gives the same tokens every run.
#include <cstdint>
#include <span>
#include <vector>

namespace llm {

class Sampler {
 public:
  // temperature 0 means greedy argmax; top_p outside (0, 1) means plain
  // sampling from the whole distribution.
  Sampler(int vocab_size, float temperature, float top_p, std::uint64_t seed);

  // Picks the next token from `logits` [vocab_size]. Non-const: draws a number.
  int sample(std::span<const float> logits);

  // A float in [0, 1) from the generator (exposed for speculative decoding).
  float next_uniform();

 private:
  std::uint32_t next_u32();

  int vocab_size_;
  float temperature_;
  float top_p_;
  std::uint64_t state_;
  std::vector<float> probabilities_;                    // [vocab_size] scratch
  std::vector<std::pair<float, int>> candidates_;       // [vocab_size] top-p scratch
};

// Index of the largest value; the first one on ties (as llama2.c).
int argmax(std::span<const float> values);
// In-place softmax with the max subtracted first (as llama2.c).
void softmax_inplace(std::span<float> values);

}  // namespace llm
