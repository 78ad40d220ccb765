#pragma once
// Part 3 of the step: latency against load. The trace's requests arrive as a
// Poisson process at rates set as fractions of what continuous batching
// sustains offline (its requests/s in part 2), so the sweep means the same
// on any model and device: 0.25 is a quiet server, 1.0 a saturated one.
// Each policy serves each load; the table is the latency-throughput curve.
//
// "Keeps up": the policy finishes requests at 90% of the offered rate or
// more. Past its capacity the queue grows for as long as the trace lasts and
// its latencies measure the trace's length, not the policy.
#include <string>
#include <vector>

#include "llm/model.hpp"
#include "step07_batching/policies.hpp"
#include "step07_batching/measure/replay.hpp"

namespace step07 {

struct RateSweepOptions {
  std::vector<double> load_factors = {0.25, 0.5, 0.75, 1.0, 1.25};  // x continuous batching's offline requests/s
  std::vector<int> policy_ids = {kStatic, kContinuous};             // (part 4 is chunked prefill's)
  std::uint64_t seed = 42;                                          // the arrival gaps
};

struct RateSweepPoint {
  std::string device;
  int policy_id = 0;
  std::string policy_name;
  double load_factor = 0.0;
  double rate_per_s = 0.0;  // offered requests/s
  ServingMetrics metrics;
  bool keeps_up = false;    // finished requests/s >= 90% of the offered rate
  OutputCheck check;        // tokens vs solo
};

// `requests` (arrival times are replaced), `solo` their solo outputs,
// `capacity_requests_per_s` continuous batching's offline requests/s.
std::vector<RateSweepPoint> sweep_rates(const std::string& device, llm::Model& model,
                                        const std::vector<Request>& requests,
                                        const std::vector<std::vector<int>>& solo, const ServingLimits& limits,
                                        double capacity_requests_per_s, const RateSweepOptions& options);

// The target: at every load where static batching keeps up, continuous
// batching's p99 TTFT is lower. Returns "" when it holds, else the first
// load where it does not (one string per device's sweep).
std::string continuous_beats_static_ttft(const std::vector<RateSweepPoint>& points);

}  // namespace step07
