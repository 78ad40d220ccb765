#pragma once
// Drafter: whatever proposes the next few tokens cheaply, for the target model
// to verify in one pass. Three kinds sit behind this one interface:
//   ModelDrafter      a second, smaller checkpoint sharing the vocabulary
//   early exit        the target's own first L layers, then its norm and classifier
//   NgramDrafter      copy what followed the last n tokens earlier in the text
// The speculative decoder (speculative_decoder.hpp) only ever talks to this.
#include <span>
#include <string>
#include <vector>

#include "llm/sampler.hpp"

namespace step04 {

// How tokens are chosen. temperature 0 is greedy (argmax); otherwise the
// distribution is softmax(logits / temperature), cut to the top-p nucleus
// when 0 < top_p < 1 (the same distribution llm::Sampler draws from).
struct SamplingSettings {
  float temperature = 0.0f;
  float top_p = 0.0f;
  bool greedy() const { return temperature == 0.0f; }
};

// What a drafter proposes for one round.
struct Draft {
  std::vector<int> tokens;  // [n_drafted] proposed continuation, n_drafted <= k (may be 0)
  // [n_drafted, vocab] q_i: the distribution token i was drawn from. Filled in
  // sampling mode only; the rejection test needs exactly this q.
  std::vector<float> probabilities;
  int steps = 0;  // drafter work units spent: model forwards, or lookups for n-gram

  void clear() {
    tokens.clear();
    probabilities.clear();
    steps = 0;
  }
};

class Drafter {
 public:
  virtual ~Drafter() = default;

  virtual std::string name() const = 0;
  // Drafters with a model run one forward per drafted token; n-gram lookup
  // proposes all k tokens with one search. Used to state the cost model.
  virtual bool one_step_per_token() const = 0;

  // Starts a new generation of at most `capacity` positions (prompt included).
  virtual void reset(int capacity) = 0;

  // Proposes up to k tokens that continue `context` (every committed token:
  // prompt, then generated). In sampling mode each token is drawn from its q_i
  // with `rng` and q_i is stored in the draft; in greedy mode it is the argmax.
  virtual void propose(std::span<const int> context, int k, const SamplingSettings& sampling, llm::Sampler& rng,
                       Draft& out) = 0;

  // After verification: `context` is the committed text now. A drafter with a
  // KV cache rolls it back past the first token it does not share with
  // `context` (the rejected drafts), exactly as the target's cache is.
  virtual void commit(std::span<const int> context) = 0;
};

}  // namespace step04
