#include "step04_speculative/speculative_decoder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "llm/errors.hpp"
#include "llm/exercise.hpp"
#include "llm/harness/timer.hpp"
#include "llm/tokenizer.hpp"

namespace step04 {
namespace {

void check_arguments(const llm::Model& target, std::span<const int> prompt, int total_positions, int k) {
  if (k < 1) throw llm::InputError(fmt::format("k (drafts per round) must be at least 1 (got {})", k));
  llm::validate_generation(target.config(), prompt, total_positions);
}

std::span<const float> row(std::span<const float> rows, int index, int vocab) {
  return rows.subspan(static_cast<std::size_t>(index) * static_cast<std::size_t>(vocab),
                      static_cast<std::size_t>(vocab));
}

}  // namespace

SpeculativeDecoder::SpeculativeDecoder(llm::Model& target, Drafter& drafter)
    : target_(target),
      drafter_(drafter),
      rejection_(target.config().vocab_size),
      p_row_(static_cast<std::size_t>(target.config().vocab_size)) {}

int SpeculativeDecoder::accept_greedy(std::span<const float> target_logits, const Draft& draft,
                                      std::vector<int>& emitted) const {
  // BEGIN EXERCISE ex04.3
  const int vocab = target_.config().vocab_size;
  const int n_drafted = static_cast<int>(draft.tokens.size());
  for (int i = 0; i < n_drafted; ++i) {
    // Row i is the target's prediction for the position of draft i.
    const int target_token = llm::argmax(row(target_logits, i, vocab));
    emitted.push_back(target_token);  // equal to the draft, or the correction
    if (target_token != draft.tokens[static_cast<std::size_t>(i)]) return i;
  }
  // Every draft stood: the last row predicts one more token for free.
  emitted.push_back(llm::argmax(row(target_logits, n_drafted, vocab)));
  return n_drafted;
  // END EXERCISE ex04.3
}

int SpeculativeDecoder::accept_sampled(std::span<const float> target_logits, const Draft& draft,
                                       const SamplingSettings& sampling, llm::Sampler& rng,
                                       std::vector<int>& emitted) {
  const int vocab = target_.config().vocab_size;
  const int n_drafted = static_cast<int>(draft.tokens.size());
  for (int i = 0; i < n_drafted; ++i) {
    sampling_distribution(row(target_logits, i, vocab), sampling, p_row_);  // p_i
    const auto q = std::span<const float>(draft.probabilities).subspan(
        static_cast<std::size_t>(i) * static_cast<std::size_t>(vocab), static_cast<std::size_t>(vocab));  // q_i
    const VerifyOutcome outcome = rejection_.verify(p_row_, q, draft.tokens[static_cast<std::size_t>(i)], rng);
    emitted.push_back(outcome.token);
    if (!outcome.accepted) return i;
  }
  // Bonus token: all drafts stood, so the next position is sampled from p directly.
  sampling_distribution(row(target_logits, n_drafted, vocab), sampling, p_row_);
  emitted.push_back(sample_from(p_row_, rng.next_uniform()));
  return n_drafted;
}

// Prefill, exactly as plain decoding: the prompt in one forward, the first
// token from its last row. Afterwards the cache holds every committed token
// but the last one; that invariant holds at the start of every round.
int SpeculativeDecoder::prefill(std::span<const int> prompt, const SamplingSettings& sampling, llm::Sampler& rng) {
  const auto logits = target_.forward(llm::TokenBatch::prefill(prompt, 0, 0), *cache_);
  if (sampling.greedy()) return llm::argmax(logits);
  sampling_distribution(logits, sampling, p_row_);
  return sample_from(p_row_, rng.next_uniform());
}

void SpeculativeDecoder::round(std::vector<int>& context, int k_round, const SamplingSettings& sampling,
                               llm::Sampler& rng, SpeculativeResult& result) {
  SpeculativeStats& stats = result.stats;
  const int n = static_cast<int>(context.size());

  // 1. Draft.
  llm::Stopwatch step;
  draft_.clear();
  if (k_round > 0) drafter_.propose(context, k_round, sampling, rng, draft_);
  stats.draft_ms += step.elapsed_ms();
  const int n_drafted = static_cast<int>(draft_.tokens.size());

  // 2. Verify: rows [last committed, d_1..d_j] at positions n-1..n-1+j; row
  // i's logits are the target's prediction for position n+i.
  step.restart();
  verify_batch_.clear();
  verify_batch_.add(context.back(), n - 1, 0);
  for (int i = 0; i < n_drafted; ++i) verify_batch_.add(draft_.tokens[static_cast<std::size_t>(i)], n + i, 0);
  const auto logits = target_.forward(verify_batch_, *cache_, llm::LogitsFor::AllRows);  // [j+1, vocab]
  stats.verify_ms += step.elapsed_ms();

  // 3. Accept.
  emitted_.clear();
  const int accepted = sampling.greedy() ? accept_greedy(logits, draft_, emitted_)
                                         : accept_sampled(logits, draft_, sampling, rng, emitted_);
  // A round emits the accepted drafts and then one token of the target's own
  // (the correction, or the bonus when every draft stood); a round that
  // emitted nothing would repeat forever.
  if (emitted_.size() != static_cast<std::size_t>(accepted) + 1)
    throw std::logic_error(fmt::format("a speculative round accepted {} of {} drafts but emitted {} tokens (it must "
                                       "emit the accepted drafts and one token of the target's own)",
                                       accepted, n_drafted, emitted_.size()));
  stats.rounds += 1;
  stats.drafted += n_drafted;
  stats.accepted += accepted;
  stats.tested += accepted + (accepted < n_drafted ? 1 : 0);
  stats.draft_steps += draft_.steps;
  stats.drafted_per_round.push_back(n_drafted);
  stats.steps_per_round.push_back(draft_.steps);
  for (int token : emitted_) {
    context.push_back(token);
    result.tokens.push_back(token);
    if (token == llm::Tokenizer::kBos) break;  // BOS ends the text, as in plain decoding
  }

  // 4. Roll back the target's cache, then the drafter's state.
  // BEGIN EXERCISE ex04.3
  // Positions 0..n-1 (committed) and n..n+accepted-1 (the accepted drafts)
  // hold the right K/V; the rejected drafts' rows go. The emitted
  // correction/bonus token is fed at the start of the next round, so the
  // cache again holds every committed token but the last (fewer when a BOS
  // among the accepted drafts ended the text early).
  cache_->truncate(0, static_cast<int>(context.size()) - 1);
  // END EXERCISE ex04.3
  step.restart();
  drafter_.commit(context);  // a drafter with a cache rolls it back the same way (ModelDrafter::commit)
  stats.draft_ms += step.elapsed_ms();
}

SpeculativeResult SpeculativeDecoder::generate(std::span<const int> prompt, int total_positions, int k,
                                               const SamplingSettings& sampling, llm::Sampler& rng) {
  check_arguments(target_, prompt, total_positions, k);
  SpeculativeResult result;
  result.prompt_length = static_cast<int>(prompt.size());
  const int max_new = total_positions - result.prompt_length + 1;
  if (!cache_ || cache_capacity_ < total_positions) {
    cache_ = target_.make_cache(1, total_positions);
    cache_capacity_ = total_positions;
  }
  cache_->clear();
  drafter_.reset(total_positions);

  // context: [n] the committed text, prompt then generated tokens.
  std::vector<int> context(prompt.begin(), prompt.end());
  context.reserve(static_cast<std::size_t>(total_positions) + static_cast<std::size_t>(k) + 1);
  emitted_.reserve(static_cast<std::size_t>(k) + 1);

  llm::Stopwatch phase;
  const int first = prefill(context, sampling, rng);
  context.push_back(first);
  result.tokens.push_back(first);
  result.prefill_ms = phase.elapsed_ms();
  phase.restart();

  while (static_cast<int>(result.tokens.size()) < max_new && result.tokens.back() != llm::Tokenizer::kBos) {
    const int remaining = max_new - static_cast<int>(result.tokens.size());
    // A round emits at most k_round + 1 tokens; this also keeps the last
    // verified position (n - 1 + k_round) inside total_positions.
    const int k_round = std::min(k, remaining - 1);
    round(context, k_round, sampling, rng, result);
  }
  result.decode_ms = phase.elapsed_ms();
  return result;
}

}  // namespace step04
