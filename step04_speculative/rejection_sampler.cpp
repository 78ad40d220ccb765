#include "step04_speculative/rejection_sampler.hpp"

#include <algorithm>

#include "llm/exercise.hpp"

namespace step04 {

void sampling_distribution(std::span<const float> logits, const SamplingSettings& sampling, std::span<float> out) {
  const std::size_t vocab = logits.size();
  std::fill(out.begin(), out.end(), 0.0f);
  if (sampling.greedy()) {
    out[static_cast<std::size_t>(llm::argmax(logits))] = 1.0f;
    return;
  }
  for (std::size_t i = 0; i < vocab; ++i) out[i] = logits[i] / sampling.temperature;
  llm::softmax_inplace(out);
  if (sampling.top_p <= 0.0f || sampling.top_p >= 1.0f) return;

  // Nucleus: most likely first (ties by lower id, as llm::Sampler sorts), keep
  // tokens until the kept mass exceeds top_p, zero the rest, renormalize.
  // As in llm::Sampler, a token below (1 - top_p) / (vocab - 1) can never be
  // in the nucleus (the others would already sum past top_p), so only the
  // candidates above that cutoff are sorted: a few instead of the vocabulary.
  const float cutoff = (1.0f - sampling.top_p) / static_cast<float>(vocab - 1);
  thread_local std::vector<int> order;  // [candidates] token ids, most likely first
  order.clear();
  for (std::size_t i = 0; i < vocab; ++i)
    if (out[i] >= cutoff) order.push_back(static_cast<int>(i));
  if (order.empty()) {  // a nearly flat distribution: the nucleus is the argmax alone
    const int best = llm::argmax(out);
    std::fill(out.begin(), out.end(), 0.0f);
    out[static_cast<std::size_t>(best)] = 1.0f;
    return;
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return out[static_cast<std::size_t>(a)] > out[static_cast<std::size_t>(b)] ||
           (out[static_cast<std::size_t>(a)] == out[static_cast<std::size_t>(b)] && a < b);
  });
  float kept = 0.0f;
  std::size_t n_kept = order.size();
  for (std::size_t i = 0; i < order.size(); ++i) {
    kept += out[static_cast<std::size_t>(order[i])];
    if (kept > sampling.top_p) {
      n_kept = i + 1;
      break;
    }
  }
  // Everything outside the first n_kept candidates goes to zero.
  thread_local std::vector<float> nucleus;  // [vocab]
  nucleus.assign(vocab, 0.0f);
  for (std::size_t i = 0; i < n_kept; ++i) {
    const auto id = static_cast<std::size_t>(order[i]);
    nucleus[id] = out[id] / kept;
  }
  std::copy(nucleus.begin(), nucleus.end(), out.begin());
}

int sample_from(std::span<const float> probabilities, float uniform) {
  // Walk the cumulative distribution to the coin. The total may fall a hair
  // under 1 from rounding: then the last token with mass is the answer.
  float cdf = 0.0f;
  int last_with_mass = 0;
  for (std::size_t i = 0; i < probabilities.size(); ++i) {
    if (probabilities[i] <= 0.0f) continue;
    cdf += probabilities[i];
    last_with_mass = static_cast<int>(i);
    if (uniform < cdf) return last_with_mass;
  }
  return last_with_mass;
}

VerifyOutcome RejectionSampler::verify(std::span<const float> p, std::span<const float> q, int draft_token,
                                       llm::Sampler& rng) {
  // BEGIN EXERCISE ex04.1
  const auto x = static_cast<std::size_t>(draft_token);
  // Accept with probability min(1, p(x)/q(x)): compare a coin u in [0,1) with
  // the ratio as u * q(x) < p(x), which needs no division (q(x) > 0 because x
  // was drawn from q).
  const float coin = rng.next_uniform();
  if (coin * q[x] < p[x]) return {true, draft_token};

  // Rejected: draw from the residual max(0, p - q), the mass p has where q
  // proposed too little. It is never empty on a rejection: rejecting x means
  // p(x) < q(x), and since both sum to 1, p exceeds q somewhere else.
  float mass = 0.0f;
  for (std::size_t i = 0; i < p.size(); ++i) {
    residual_[i] = std::max(0.0f, p[i] - q[i]);
    mass += residual_[i];
  }
  if (mass <= 0.0f) return {false, sample_from(p, rng.next_uniform())};  // p == q up to rounding
  for (float& r : residual_) r /= mass;
  return {false, sample_from(residual_, rng.next_uniform())};
  // END EXERCISE ex04.1
}

}  // namespace step04
