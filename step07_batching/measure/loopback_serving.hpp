#pragma once
// Part 5 of the step: the same engine behind a real HTTP server on loopback
// (server.hpp), loaded by the real client (load_client.hpp) with the trace of
// part 2, every token streamed as a server-sent event and timed when it
// reaches the client. Against part 2's in-process continuous run it shows
// what HTTP, JSON and the threads around the engine cost.
#include <string>
#include <vector>

#include "llm/model.hpp"
#include "llm/tokenizer.hpp"
#include "step07_batching/serve/load_client.hpp"
#include "step07_batching/policies.hpp"
#include "step07_batching/measure/replay.hpp"

namespace step07 {

struct LoopbackRun {
  std::string device;
  ServingMetrics served;             // measured by the client
  double in_process_tokens_per_s = 0.0;
  double ratio = 0.0;                // served / in-process output tokens/s (target >= 0.85)
  LoadResult load;                   // sent, unfinished, failed (records moved into `served`)
  OutputCheck check;                 // the streamed tokens vs solo
};

// Starts a server for `model` (continuous batching under `limits`) on a free
// loopback port, replays `requests` through it, stops it.
LoopbackRun serve_over_loopback(const std::string& device, llm::Model& model, const std::string& model_name,
                                const std::vector<Request>& requests, const std::vector<std::vector<int>>& solo,
                                const ServingLimits& limits, double in_process_tokens_per_s);

}  // namespace step07
