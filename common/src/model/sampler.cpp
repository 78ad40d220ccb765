#include "llm/sampler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "llm/errors.hpp"

namespace llm {

int argmax(std::span<const float> values) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(values.size()); ++i)
    if (values[static_cast<std::size_t>(i)] > values[static_cast<std::size_t>(best)]) best = i;
  return best;
}

void softmax_inplace(std::span<float> values) {
  if (values.empty()) return;
  float max_value = values[0];
  for (float v : values) max_value = std::max(max_value, v);
  float sum = 0.0f;
  for (float& v : values) {
    v = std::exp(v - max_value);  // subtracting the max keeps exp() from overflowing
    sum += v;
  }
  for (float& v : values) v /= sum;
}

Sampler::Sampler(int vocab_size, float temperature, float top_p, std::uint64_t seed)
    : vocab_size_(vocab_size), temperature_(temperature), top_p_(top_p), state_(seed) {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    throw InputError(fmt::format("temperature must be >= 0 (got {})", temperature));
  if (!std::isfinite(top_p)) throw InputError("top-p must be a finite number");
  // xorshift has one bad state: all zeros stays zero forever.
  if (state_ == 0) state_ = 0x9E3779B97F4A7C15ull;
  probabilities_.resize(static_cast<std::size_t>(vocab_size));
  candidates_.reserve(static_cast<std::size_t>(vocab_size));
}

std::uint32_t Sampler::next_u32() {
  // xorshift* (as llama2.c): three shifts, then a multiply to mix the bits.
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return static_cast<std::uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 32);
}

float Sampler::next_uniform() { return static_cast<float>(next_u32() >> 8) / 16777216.0f; }

int Sampler::sample(std::span<const float> logits) {
  if (static_cast<int>(logits.size()) != vocab_size_)
    throw InputError(fmt::format("sampler got {} logits for a vocabulary of {}", logits.size(), vocab_size_));
  if (temperature_ == 0.0f) return argmax(logits);

  for (int i = 0; i < vocab_size_; ++i)
    probabilities_[static_cast<std::size_t>(i)] = logits[static_cast<std::size_t>(i)] / temperature_;
  softmax_inplace(probabilities_);
  const float coin = next_uniform();

  if (top_p_ <= 0.0f || top_p_ >= 1.0f) {
    // Plain sampling: walk the cumulative distribution to the coin.
    float cdf = 0.0f;
    for (int i = 0; i < vocab_size_; ++i) {
      cdf += probabilities_[static_cast<std::size_t>(i)];
      if (coin < cdf) return i;
    }
    return vocab_size_ - 1;  // rounding left the total a hair under 1
  }

  // Top-p: sample from the smallest set of most likely tokens whose mass
  // exceeds top_p. A token below (1 - top_p) / (n - 1) can never be in that
  // set (the others would already sum past top_p), so skip sorting it.
  const float cutoff = (1.0f - top_p_) / static_cast<float>(vocab_size_ - 1);
  candidates_.clear();
  for (int i = 0; i < vocab_size_; ++i)
    if (probabilities_[static_cast<std::size_t>(i)] >= cutoff)
      candidates_.emplace_back(probabilities_[static_cast<std::size_t>(i)], i);
  // The bound does not hold for the most likely token itself: in a nearly flat
  // distribution it can fall below the cutoff too. Then no token passes, and
  // (as every p < cutoff implies top_p < 1/n <= p_max) the nucleus is the most
  // likely token alone.
  if (candidates_.empty()) return argmax(probabilities_);
  std::sort(candidates_.begin(), candidates_.end(),
            [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  float cumulative = 0.0f;
  std::size_t last = candidates_.size() - 1;
  for (std::size_t i = 0; i < candidates_.size(); ++i) {
    cumulative += candidates_[i].first;
    if (cumulative > top_p_) {
      last = i;
      break;
    }
  }
  const float r = coin * cumulative;  // the kept mass, not 1
  float cdf = 0.0f;
  for (std::size_t i = 0; i <= last; ++i) {
    cdf += candidates_[i].first;
    if (r < cdf) return candidates_[i].second;
  }
  return candidates_[last].second;
}

}  // namespace llm
