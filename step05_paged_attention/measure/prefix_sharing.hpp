#pragma once
// Part 3 of the step: N requests that begin with the same system prompt of P
// tokens, each followed by its own question, served through one paged cache
// with and without automatic prefix caching.
//
// Without sharing every request stores and computes the system prompt again.
// With sharing the first request (a miss) computes it and publishes its full
// blocks; every later request (a hit) takes those blocks from the prefix cache
// and prefills only what follows them. Measured: blocks held once all N
// requests are resident, prompt rows the model computed, time to first token
// (the prefill forward) on a hit and on a miss, and the generated tokens,
// which must be identical either way.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "llm/harness/timer.hpp"
#include "llm/model.hpp"

namespace step05 {

struct PrefixSharingOptions {
  int n_requests = 8;
  int system_prompt_tokens = 256;  // P (capped so a request fits the context)
  int question_tokens = 16;        // each request's own tokens after the system prompt
  int generated_tokens = 16;       // greedy tokens per request
  int block_size = 16;
  int repeats = 3;                 // the whole serve is run this many times; TTFT is the median over runs
  std::uint64_t seed = 42;         // the questions' token ids
};

// The requests' prompts: BOS, the system prompt (the model's own greedy
// text from `opening`, so it reads like text), then a question of seeded
// random token ids, different for each request.
std::vector<std::vector<int>> make_shared_prefix_prompts(llm::Model& model, std::span<const int> opening,
                                                         const PrefixSharingOptions& options);

struct PrefixSharingRun {
  bool sharing = false;
  int blocks_used = 0;           // held once every request has generated (all resident at once)
  long long prefill_rows = 0;    // prompt positions the model computed, over all requests
  int cached_positions = 0;      // positions each hit took from the prefix cache
  llm::TimingStats ttft_miss;    // requests that computed their whole prompt
  llm::TimingStats ttft_hit;     // requests that found their prefix cached (runs == 0 without sharing)
  std::vector<std::vector<int>> tokens;  // [n_requests] generated ids
};

struct PrefixSharingResult {
  std::string device;
  int system_prompt_tokens = 0;
  int prompt_tokens = 0;         // per request, BOS and question included
  PrefixSharingRun without_sharing;
  PrefixSharingRun with_sharing;
  bool identical = false;        // every request generated the same tokens both ways
};

// `model` reads a paged cache (variant 1 or 2 of paged_generation.hpp).
PrefixSharingResult run_prefix_sharing(const std::string& device, llm::Model& model,
                                       const std::vector<std::vector<int>>& prompts,
                                       const PrefixSharingOptions& options);

}  // namespace step05
