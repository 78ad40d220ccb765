#pragma once
// Part 2 of the step: one trace, every serving policy (policies.hpp), on one
// device, with the same model, KV budget and largest batch. Each run's
// tokens are checked against the requests' solo outputs (replay.hpp).
#include <string>
#include <vector>

#include "llm/model.hpp"
#include "step07_batching/policies.hpp"
#include "step07_batching/measure/replay.hpp"

namespace step07 {

struct PolicyRun {
  std::string device;
  int policy_id = 0;
  std::string policy_name;
  ReplayResult replay;  // records, iterations (the occupancy timeline), metrics
  OutputCheck check;    // tokens vs solo
};

// `requests` in arrival order; `solo`: their solo outputs on this device.
// Before the timed runs, the first few requests run once untimed (warm-up:
// caches, the allocator, the GPU's clocks). Each policy runs `repeats` times
// and the run with the median output tokens/s is kept, latencies and all.
std::vector<PolicyRun> compare_policies(const std::string& device, llm::Model& model,
                                        const std::vector<Request>& requests,
                                        const std::vector<std::vector<int>>& solo, const ServingLimits& limits,
                                        const std::vector<int>& policy_ids, int repeats);

// Replays `requests` `repeats` times (>= 1) and returns the run with the
// median output tokens/s (the other parts use it too); `watch` as replay's.
ReplayResult median_replay(llm::Model& model, const std::vector<Request>& requests, const EngineOptions& options,
                           int repeats, const std::vector<std::vector<int>>* watch = nullptr);

// The first few requests of `requests`, all at t = 0, once through the
// continuous policy, untimed.
void warm_up(llm::Model& model, const std::vector<Request>& requests, const ServingLimits& limits);

// The run of `policy_id` in `runs` (nullptr when it did not run).
const PolicyRun* find_policy_run(const std::vector<PolicyRun>& runs, int policy_id);

}  // namespace step07
