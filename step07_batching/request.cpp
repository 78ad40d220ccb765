#include "step07_batching/request.hpp"

#include <utility>

namespace step07 {

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

RequestState::RequestState(Request r, int vocab_size)
    : request(std::move(r)),
      tokens(request.prompt),
      sampler(vocab_size, request.sampling.temperature, request.sampling.top_p, request.sampling.seed) {
  record.id = request.id;
  record.prompt_length = static_cast<int>(request.prompt.size());
  record.arrival_ms = request.arrival_ms;
}

}  // namespace step07
