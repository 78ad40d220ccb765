#include "step04_speculative/model_drafter.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "llm/errors.hpp"
#include "step04_speculative/rejection_sampler.hpp"

namespace step04 {

void check_same_vocabulary(const llm::ModelConfig& draft, const llm::ModelConfig& target,
                           const std::string& draft_name) {
  if (draft.vocab_size != target.vocab_size)
    throw llm::InputError(fmt::format(
        "draft model {} has a vocabulary of {} tokens but the target has {}: a draft model must share the "
        "target's tokenizer (same vocabulary, same ids)",
        draft_name, draft.vocab_size, target.vocab_size));
}

ModelDrafter::ModelDrafter(std::string name, std::unique_ptr<llm::Model> model,
                           const llm::ModelConfig& target_config)
    : name_(std::move(name)), model_(std::move(model)) {
  check_same_vocabulary(model_->config(), target_config, name_);
  q_row_.resize(static_cast<std::size_t>(target_config.vocab_size));
}

void ModelDrafter::reset(int capacity) {
  // A draft checkpoint may have a shorter context than the target; near its
  // end the drafter simply proposes fewer tokens (none at all past it).
  capacity_ = std::min(capacity, model_->config().seq_len);
  if (!cache_ || cache_capacity_ < capacity_) {
    cache_ = model_->make_cache(1, capacity_);
    cache_capacity_ = capacity_;
  }
  cache_->clear();
  fed_.clear();
}

void ModelDrafter::rollback_to(std::span<const int> context, std::size_t limit) {
  std::size_t shared = 0;
  const std::size_t max_shared = std::min({fed_.size(), context.size(), limit});
  while (shared < max_shared && fed_[shared] == context[shared]) ++shared;
  // Rows past `shared` hold K/V of drafts the target rejected (or of tokens
  // that must be fed again): forget them. Nothing is erased; the next forward
  // overwrites those rows, and attention never reads past the length.
  cache_->truncate(0, static_cast<int>(shared));
  fed_.resize(shared);
}

void ModelDrafter::propose(std::span<const int> context, int k, const SamplingSettings& sampling, llm::Sampler& rng,
                           Draft& out) {
  out.clear();
  const int n = static_cast<int>(context.size());
  // Positions fed this round: n-1 (the last committed token) .. n+k-2 (the
  // second-to-last draft; the last draft is sampled but never fed).
  k = std::min(k, capacity_ - n + 1);
  if (k <= 0) return;

  // Catch up: feed every committed token the cache lacks. Usually that is one
  // token (the target's correction or bonus token from the last round); two
  // after a round where every draft was accepted (the last draft and the bonus).
  // The last committed token is always fed again, for its logits.
  rollback_to(context, static_cast<std::size_t>(n - 1));
  std::span<const float> logits;
  const int first_new = static_cast<int>(fed_.size());
  if (n - first_new > 2) {
    // The prompt (first round): one prefill forward.
    const std::vector<int> prompt(context.begin() + first_new, context.end());
    logits = model_->forward(llm::TokenBatch::prefill(prompt, first_new, 0), *cache_);
    fed_.insert(fed_.end(), prompt.begin(), prompt.end());
    ++out.steps;
  } else {
    // One or two tokens: single-row forwards, each costing one draft step (c
    // in the formula). A 2-row forward would cost more than two 1-row ones
    // on a CPU with a tiny model (see v(1) in the executable's output).
    for (int pos = first_new; pos < n; ++pos) {
      logits = model_->forward(llm::TokenBatch::single(context[static_cast<std::size_t>(pos)], pos, 0), *cache_);
      fed_.push_back(context[static_cast<std::size_t>(pos)]);
      ++out.steps;
    }
  }

  for (int i = 0; i < k; ++i) {
    int token;
    if (sampling.greedy()) {
      token = llm::argmax(logits);
    } else {
      // Sample from q and keep q: the rejection test divides by exactly this.
      sampling_distribution(logits, sampling, q_row_);
      token = sample_from(q_row_, rng.next_uniform());
      out.probabilities.insert(out.probabilities.end(), q_row_.begin(), q_row_.end());
    }
    out.tokens.push_back(token);
    if (i + 1 == k) break;  // the last draft needs no forward of its own
    logits = model_->forward(llm::TokenBatch::single(token, n + i, 0), *cache_);
    fed_.push_back(token);
    ++out.steps;
  }
}

void ModelDrafter::commit(std::span<const int> context) { rollback_to(context, context.size()); }

}  // namespace step04
