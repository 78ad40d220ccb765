#pragma once
// The request trace the step replays: step 05's seeded skewed lengths
// (request_trace.hpp, printed by summarize_lengths), plus what serving needs
// on top: arrival times and prompts as token ids.
//   arrivals: all at t = 0 (offline: throughput) or a Poisson process at a
//             given rate (exponential gaps: latency under load)
//   prompts:  BOS, then a window of a built-in text (encoded with the
//             model's tokenizer when it has one; a model file comes with
//             one), or seeded random ids for a preset with random weights
//   outputs:  max_tokens = the trace's output length, greedy by default
#include <cstdint>
#include <vector>

#include "llm/tokenizer.hpp"
#include "step05_paged_attention/measure/request_trace.hpp"
#include "step07_batching/request.hpp"

namespace step07 {

struct WorkloadOptions {
  step05::TraceOptions lengths;    // n_requests, context, seed, the log-normal medians
  double arrival_rate_per_s = 0.0;  // 0: every request arrives at t = 0; > 0: Poisson at this rate
  SamplingParams sampling;          // every request's (seeds are offset by the request id)
};

// Token ids for prompts: a tokenizer's encoding of the built-in text when
// `tokenizer` has a vocabulary, else seeded ids in [3, vocab_size).
class PromptSource {
 public:
  PromptSource(const llm::Tokenizer* tokenizer, int vocab_size, std::uint64_t seed);
  // [length] ids, BOS first.
  std::vector<int> prompt(int length, std::uint64_t request_seed) const;
  bool from_text() const { return !text_ids_.empty(); }

 private:
  std::vector<int> text_ids_;  // the built-in text, encoded (no BOS); empty: random ids
  int vocab_size_;
  std::uint64_t seed_;
};

// Requests in arrival order, ids 0..n-1. Reproducible from the seed.
// Throws InputError for bad options (step05::make_request_trace's, a negative rate).
std::vector<Request> make_workload(const WorkloadOptions& options, const PromptSource& prompts);

// The same requests arriving as a Poisson process at `rate_per_s` (0: all at
// t = 0), gaps drawn from `seed`: one trace, many loads.
std::vector<Request> with_arrivals(std::vector<Request> requests, double rate_per_s, std::uint64_t seed);

}  // namespace step07
