#pragma once
// How close a changed model's next-token distributions stay to the original's,
// position by position over the same text: the quality measure for changes
// that are not meant to be exact (pooled KV heads in step 03, quantization in 06).
#include <span>

namespace llm {

struct NextTokenAgreement {
  int positions = 0;             // distributions compared
  double mean_kl = 0.0;          // mean over positions of KL(p_original || p_changed), in nats
  double max_kl = 0.0;           // the worst position
  double top1_agreement = 0.0;   // fraction of positions whose argmax token is the same
};

// reference_logits, candidate_logits: [positions, vocab], the logits of the
// original and of the changed model at the same positions of the same text.
// KL(p || q) = sum_i p_i (log p_i - log q_i), with both log-softmaxes computed
// in double (max subtracted) so tiny probabilities do not underflow to log 0.
NextTokenAgreement compare_next_token_distributions(std::span<const float> reference_logits,
                                                    std::span<const float> candidate_logits, int vocab);

}  // namespace llm
