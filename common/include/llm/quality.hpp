#pragma once
// How good a model's next-token distributions are: how close a changed model
// stays to the original's, position by position over the same text (for
// changes that are not meant to be exact: pooled KV heads in step 03,
// quantization in 06), and how well a model predicts a text (perplexity).
//
// All of them take logits, not probabilities, and compute the log-softmax in
// double with log-sum-exp (max subtracted), so tiny probabilities do not
// underflow to log 0. Bad input (sizes that do not fit, no positions, a NaN or
// infinite logit, a token out of range) throws llm::InputError: never a
// silent NaN in a quality column.
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
// KL(p || q) = sum_i p_i (log p_i - log q_i); top-1 ties go to the first token
// (llm::argmax, as llama2.c).
NextTokenAgreement compare_next_token_distributions(std::span<const float> reference_logits,
                                                    std::span<const float> candidate_logits, int vocab);

// logits: [positions, vocab], a model's logits at each position of a text;
// next_tokens: [positions], the token that follows each position in the text
// (text[1..], teacher forcing). Perplexity = exp(mean over positions of
// -log p(next token)), with log p(t) = logit_t - log-sum-exp(row): e^(nats per
// token), V for a model that spreads its mass evenly over V tokens, 1 for one
// that is always sure and right.
double perplexity(std::span<const float> logits, std::span<const int> next_tokens, int vocab);

}  // namespace llm
