#pragma once
// Part 4 of the step: chunked prefill. Without it, a long prompt runs whole
// in the iteration that admits it, and every sequence decoding beside it
// waits for that one long forward: a stall in each of their streams (a spike
// in inter-token latency). With it, the prompt is cut into chunks under a
// budget of rows per forward, and the decoders get a token every iteration
// at the price of a later first token for the long prompt.
//
// The scenario: the trace arriving as a Poisson stream at a moderate load,
// with every k-th request's prompt replaced by a long one (a document to
// summarize), so long prompts keep arriving while others decode. Served by
// continuous batching without chunks, then with each chunk size.
#include <string>
#include <vector>

#include "llm/model.hpp"
#include "step07_batching/policies.hpp"
#include "step07_batching/measure/replay.hpp"
#include "step07_batching/measure/workload.hpp"

namespace step07 {

struct ChunkedPrefillOptions {
  std::vector<int> chunk_tokens = {16, 32, 64, 128};  // rows per forward (each at least the largest batch)
  int long_prompt_every = 4;          // every k-th request gets the long prompt
  double long_prompt_fraction = 0.75; // its length, as a fraction of the context
  // Arrivals at this fraction of continuous batching's offline requests/s
  // (measured without the long prompts, which add prefill work: 0.3 keeps
  // the server below saturation, so the table shows stalls, not queueing).
  double load_factor = 0.3;
  std::uint64_t seed = 42;
};

struct ChunkedPrefillRow {
  std::string device;
  int chunk_tokens = 0;  // 0: chunked prefill off (whole prompts)
  ServingMetrics metrics;
  OutputCheck check;
};

// The scenario's requests: `requests` with every k-th prompt made long (its
// max_tokens cut to fit the context); the caller gives them arrival times
// (with_arrivals) once it knows the rate.
std::vector<Request> with_long_prompts(std::vector<Request> requests, const ChunkedPrefillOptions& options,
                                       const PromptSource& prompts, int context);

// Continuous batching on `scenario` without chunks, then with each chunk size
// (InputError for a chunk size below limits.max_sequences); `solo`: the
// scenario's solo outputs.
std::vector<ChunkedPrefillRow> compare_chunk_sizes(const std::string& device, llm::Model& model,
                                                   const std::vector<Request>& scenario,
                                                   const std::vector<std::vector<int>>& solo,
                                                   const ServingLimits& limits, const ChunkedPrefillOptions& options);

}  // namespace step07
