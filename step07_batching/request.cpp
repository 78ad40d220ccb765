#include "step07_batching/request.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

namespace step07 {

TokenLogprobs token_logprobs(std::span<const float> logits, float temperature, int token, int k) {
  // log softmax(x / T) = (x / T - max) - log sum exp(x / T - max): the max
  // subtracted first, so that no exp overflows (as softmax_inplace does) and
  // no precision is lost to logits far from zero.
  const float inverse_temperature = temperature > 0.0f ? 1.0f / temperature : 1.0f;
  float max_scaled = -std::numeric_limits<float>::infinity();
  for (const float logit : logits) max_scaled = std::max(max_scaled, logit * inverse_temperature);
  double sum = 0.0;  // double: 32000 terms of very different sizes
  for (const float logit : logits) sum += std::exp(static_cast<double>(logit * inverse_temperature - max_scaled));
  const auto log_sum = static_cast<float>(std::log(sum));
  const auto logprob_of = [&](int id) {
    return (logits[static_cast<std::size_t>(id)] * inverse_temperature - max_scaled) - log_sum;
  };

  TokenLogprobs result;
  result.logprob = logprob_of(token);
  // The k largest by a partial sort of the ids: O(vocab log k), and the
  // first id wins a tie, as argmax does.
  std::vector<int> ids(logits.size());  // [vocab]
  std::iota(ids.begin(), ids.end(), 0);
  const auto top = static_cast<std::ptrdiff_t>(std::min<std::size_t>(static_cast<std::size_t>(k), ids.size()));
  std::partial_sort(ids.begin(), ids.begin() + top, ids.end(), [&](int a, int b) {
    const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la != lb ? la > lb : a < b;
  });
  for (std::ptrdiff_t i = 0; i < top; ++i) result.top.emplace_back(ids[static_cast<std::size_t>(i)], logprob_of(ids[static_cast<std::size_t>(i)]));
  return result;
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::None: break;
  }
  return "none";
}

double RequestRecord::ttft_ms() const { return token_ms.empty() ? 0.0 : token_ms.front() - arrival_ms; }

double RequestRecord::tpot_ms() const {
  if (token_ms.size() < 2) return 0.0;
  return (token_ms.back() - token_ms.front()) / static_cast<double>(token_ms.size() - 1);
}

RequestState::RequestState(Request r, int vocab_size, int sample_index)
    : request(std::move(r)),
      sample(sample_index),
      tokens(request.prompt),
      sampler(vocab_size, request.sampling.temperature, request.sampling.top_p,
              request.sampling.seed + static_cast<std::uint64_t>(sample_index)) {
  record.id = request.id;
  record.sample = sample;
  record.prompt_length = static_cast<int>(request.prompt.size());
  record.arrival_ms = request.arrival_ms;
}

}  // namespace step07
