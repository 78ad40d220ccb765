#pragma once
// Running a trace through the engine, in process, and checking its outputs.
//
// replay(): a fresh engine on a fresh ServingClock. Requests are submitted
// when the clock reaches their arrival; when nothing is left to run, the
// clock jumps to the next arrival (serving_clock.hpp), so an hour of
// arrivals replays in the time its work takes, and every latency is the one
// a client would have seen.
//
// solo_outputs(): each request alone, greedy, through the model's own
// contiguous cache and step 05's one-sequence loop: the reference every
// policy's tokens must equal, token for token.
#include <string>
#include <vector>

#include "llm/model.hpp"
#include "step07_batching/engine.hpp"
#include "step07_batching/request.hpp"
#include "step07_batching/measure/serving_metrics.hpp"

namespace step07 {

struct ReplayResult {
  std::vector<RequestRecord> records;        // [requests] ordered by id
  std::vector<IterationRecord> iterations;   // [forwards] in order
  ServingMetrics metrics;
  int max_sequences = 0;
  int kv_blocks = 0;                         // the pool the engine ran with
  int peak_blocks_used = 0;
  step05::BlockManagerCounters blocks;       // the pool's counters at the end (prefix-cache hits among them)
};

// `requests` in arrival order. Throws what the engine throws (InputError for
// a request that can never run, DeviceError).
ReplayResult replay(llm::Model& model, const std::vector<Request>& requests, const EngineOptions& options);

// [requests] the greedy tokens of each request run alone (max_tokens of them,
// fewer when it generates the end token).
std::vector<std::vector<int>> solo_outputs(llm::Model& model, const std::vector<Request>& requests);

// How a run's tokens compare with the solo ones.
struct OutputCheck {
  int expected = 0;              // requests in the trace
  int requests = 0;              // of those, finished
  int identical = 0;             // finished with exactly their solo tokens
  // Finished with other tokens, each difference explained by the logits
  // (part 7's sampled check on a device whose products depend on the batch's
  // rows: parallel_sampling.cpp); always 0 for check_outputs.
  int explained = 0;
  std::string first_difference;  // "" when all are identical or explained, else which request and where
  std::string first_explained;   // the first explained difference, for the report
  bool ok() const { return identical + explained == expected && requests == expected && first_difference.empty(); }
};
OutputCheck check_outputs(const std::vector<RequestRecord>& records, const std::vector<std::vector<int>>& solo);

}  // namespace step07
