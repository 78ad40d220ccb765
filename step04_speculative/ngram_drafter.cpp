#include "step04_speculative/ngram_drafter.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "llm/errors.hpp"
#include "llm/exercise.hpp"

namespace step04 {

NgramDrafter::NgramDrafter(int max_n, int vocab_size) : max_n_(max_n), vocab_size_(vocab_size) {
  if (max_n < 1) throw llm::InputError(fmt::format("--ngram must be at least 1 (got {})", max_n));
}

std::string NgramDrafter::name() const { return fmt::format("ngram(n={})", max_n_); }

void NgramDrafter::propose(std::span<const int> context, int k, const SamplingSettings& sampling, llm::Sampler&,
                           Draft& out) {
  out.clear();
  out.steps = 1;  // one lookup, whatever it finds
  // BEGIN EXERCISE ex04.2
  const int size = static_cast<int>(context.size());
  for (int n = std::min(max_n_, size - 1); n >= 1 && out.tokens.empty(); --n) {
    const std::span<const int> suffix = context.subspan(static_cast<std::size_t>(size - n));
    // Earlier occurrences start at s <= size - n - 1 (the suffix itself starts
    // at size - n); scan from the most recent backwards.
    for (int s = size - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + s)) continue;
      // Copy what followed, as LZ77 copies a match: when the occurrence is so
      // recent that fewer than k tokens follow it, the copy runs on into the
      // tokens it has just proposed (a loop "a b a b" continues "a b ...").
      const int follow = s + n;  // the first token after the occurrence (< size)
      for (int i = 0; i < k; ++i) {
        const int source = follow + i;
        out.tokens.push_back(source < size ? context[static_cast<std::size_t>(source)]
                                           : out.tokens[static_cast<std::size_t>(source - size)]);
      }
      break;
    }
  }
  // END EXERCISE ex04.2
  if (sampling.greedy()) return;
  out.probabilities.assign(out.tokens.size() * static_cast<std::size_t>(vocab_size_), 0.0f);
  for (std::size_t i = 0; i < out.tokens.size(); ++i)
    out.probabilities[i * static_cast<std::size_t>(vocab_size_) + static_cast<std::size_t>(out.tokens[i])] = 1.0f;
}

}  // namespace step04
