#pragma once
// The rejection scheme that makes speculative sampling exact (Leviathan et al.
// 2023; Chen et al. 2023). For a draft token x drawn from the drafter's q:
//   accept x with probability min(1, p(x) / q(x));
//   on rejection, draw from the residual r(y) = max(0, p(y) - q(y)) / Z.
// The emitted token is then distributed exactly as p, whatever q is
// (docs/04_speculative.md has the proof). p and q are full distributions over
// the vocabulary: temperature and top-p are applied to both before the test.
#include <span>
#include <vector>

#include "llm/sampler.hpp"
#include "step04_speculative/drafter.hpp"

namespace step04 {

// out [vocab] = the distribution a token is sampled from under `sampling`:
// softmax(logits / temperature), restricted to the top-p nucleus (the
// smallest set of most likely tokens whose mass exceeds top_p) and
// renormalized. Greedy (temperature 0) gives the one-hot of the argmax.
void sampling_distribution(std::span<const float> logits, const SamplingSettings& sampling, std::span<float> out);

// The token whose cumulative-probability interval holds `uniform` in [0, 1).
int sample_from(std::span<const float> probabilities, float uniform);

struct VerifyOutcome {
  bool accepted = false;  // the draft token stands
  int token = -1;         // the draft token when accepted, else the residual's draw
};

class RejectionSampler {
 public:
  explicit RejectionSampler(int vocab_size) : residual_(static_cast<std::size_t>(vocab_size)) {}

  // One draft position. p [vocab]: the target's distribution there; q [vocab]:
  // the distribution `draft_token` was drawn from. Draws one or two uniforms
  // from `rng` (the coin, then the residual draw on rejection).
  VerifyOutcome verify(std::span<const float> p, std::span<const float> q, int draft_token, llm::Sampler& rng);

 private:
  std::vector<float> residual_;  // [vocab] max(0, p - q), normalized
};

}  // namespace step04
