#pragma once
// SpeculativeDecoder: the draft-verify loop. Each round
//   1. the drafter proposes up to k tokens d_1..d_k after the committed text;
//   2. ONE target forward over the k+1 rows [last committed token, d_1..d_k]
//      gives the target's distribution at every drafted position and one more;
//   3. drafts are accepted left to right (greedy: while the target's argmax
//      equals the draft; sampling: the rejection test), the first rejected
//      position gets the target's own token instead, and when all k stand the
//      extra row gives one bonus token: 1..k+1 tokens per target pass;
//   4. both KV caches are rolled back past the rejected drafts.
// Decode is memory-bound (every pass streams all weights for a handful of
// FLOPs per byte), so a pass over k+1 rows costs little more than over one.
#include <memory>
#include <span>
#include <vector>

#include "llm/model.hpp"
#include "step04_speculative/drafter.hpp"
#include "step04_speculative/rejection_sampler.hpp"

namespace step04 {

struct SpeculativeStats {
  int rounds = 0;                // decode rounds = target verification passes (prefill excluded)
  long long drafted = 0;         // draft tokens proposed
  long long tested = 0;          // drafts the target examined: accepted ones + the first rejected one per round
  long long accepted = 0;        // drafts that stand
  long long draft_steps = 0;     // drafter forwards (or n-gram lookups)
  std::vector<int> drafted_per_round;  // [rounds] drafts proposed in each round (the k the round used)
  std::vector<int> steps_per_round;    // [rounds] drafter forwards (or lookups) in each round
  double draft_ms = 0.0;         // time inside the drafter (propose + commit)
  double verify_ms = 0.0;        // time inside the target's verification forwards

  // Acceptance rate per drafted token: accepted / tested. Drafts after the
  // first rejection in a round are never examined, so they do not count
  // against alpha (counting them would under-estimate it).
  double alpha() const { return tested ? static_cast<double>(accepted) / static_cast<double>(tested) : 0.0; }
};

struct SpeculativeResult {
  std::vector<int> tokens;  // [n_generated] emitted ids (prompt excluded; ends at BOS if one was emitted)
  int prompt_length = 0;
  double prefill_ms = 0.0;  // the target's prompt forward and the first token (as in plain decoding)
  double decode_ms = 0.0;   // every later token: drafting, verifying, rollback, bookkeeping
  SpeculativeStats stats;
};

class SpeculativeDecoder {
 public:
  SpeculativeDecoder(llm::Model& target, Drafter& drafter);

  // Generates like step01::generate_cached: forwards up to position
  // total_positions - 1 (prompt included), so at most total_positions -
  // prompt_length + 1 tokens, stopping after a BOS. k: drafts per round
  // (>= 1; fewer near the end). `rng` draws every random number (draft
  // sampling, coins, residual and bonus draws) in sampling mode.
  // prompt: [prompt_length] ids, starting with BOS.
  SpeculativeResult generate(std::span<const int> prompt, int total_positions, int k,
                             const SamplingSettings& sampling, llm::Sampler& rng);

  const llm::KvCache& target_cache() const { return *cache_; }  // for the rollback tests

 private:
  // The prompt's forward; returns the first generated token. prompt: [n] ids.
  int prefill(std::span<const int> prompt, const SamplingSettings& sampling, llm::Sampler& rng);
  // One round (steps 1-4 above) with up to k_round drafts after `context`
  // (the committed text, [n] ids): appends the emitted tokens to `context`
  // and result.tokens, and the round's counts and times to result.stats.
  void round(std::vector<int>& context, int k_round, const SamplingSettings& sampling, llm::Sampler& rng,
             SpeculativeResult& result);
  // Accepts drafts against the target's rows and appends the emitted tokens
  // to `emitted`. target_logits: [n_drafted + 1, vocab]. Returns the number
  // of drafts accepted.
  int accept_greedy(std::span<const float> target_logits, const Draft& draft, std::vector<int>& emitted) const;
  int accept_sampled(std::span<const float> target_logits, const Draft& draft, const SamplingSettings& sampling,
                     llm::Sampler& rng, std::vector<int>& emitted);

  llm::Model& target_;
  Drafter& drafter_;
  std::unique_ptr<llm::KvCache> cache_;
  int cache_capacity_ = 0;  // positions per sequence cache_ was made with
  RejectionSampler rejection_;
  std::vector<float> p_row_;  // [vocab] the target's distribution at one position
  Draft draft_;               // reused every round
  std::vector<int> emitted_;  // [<= k+1] the tokens one round emits, reused every round
  llm::TokenBatch verify_batch_;
};

}  // namespace step04
