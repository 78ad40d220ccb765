#pragma once
// NgramDrafter: prompt lookup decoding (Saxena 2023), no model at all. Text
// repeats itself (names, phrases, code, and a small model's loops), so the
// tokens that followed an earlier occurrence of the last n tokens are a
// decent guess for what comes next. One search per round, microseconds.
#include "step04_speculative/drafter.hpp"

namespace step04 {

class NgramDrafter final : public Drafter {
 public:
  // max_n: the longest suffix to match. Shorter suffixes (down to one token)
  // are tried when the longest has no earlier occurrence. vocab_size: the
  // width of the one-hot q rows in sampling mode. Throws InputError when
  // max_n < 1.
  NgramDrafter(int max_n, int vocab_size);

  std::string name() const override;
  bool one_step_per_token() const override { return false; }
  void reset(int) override {}
  // Finds the most recent earlier occurrence of the context's last n tokens
  // and proposes the k tokens that followed it (running on into its own
  // proposal when the occurrence is within k of the end); nothing when no
  // suffix, down to one token, occurred before.
  // In sampling mode each q_i is the one-hot of the proposed token: the
  // proposal is deterministic, and the rejection test then accepts it with
  // probability p(token), exactly as the general rule says.
  void propose(std::span<const int> context, int k, const SamplingSettings& sampling, llm::Sampler& rng,
               Draft& out) override;
  void commit(std::span<const int>) override {}  // no state to roll back

 private:
  int max_n_;
  int vocab_size_;
};

}  // namespace step04
