#include "step07_batching/measure/policy_comparison.hpp"

#include <algorithm>

namespace step07 {

ReplayResult median_replay(llm::Model& model, const std::vector<Request>& requests, const EngineOptions& options,
                           int repeats, const std::vector<std::vector<int>>* watch) {
  std::vector<ReplayResult> results;
  for (int i = 0; i < std::max(repeats, 1); ++i) results.push_back(replay(model, requests, options, watch));
  std::sort(results.begin(), results.end(), [](const ReplayResult& a, const ReplayResult& b) {
    return a.metrics.output_tokens_per_s < b.metrics.output_tokens_per_s;
  });
  return std::move(results[results.size() / 2]);
}

void warm_up(llm::Model& model, const std::vector<Request>& requests, const ServingLimits& limits) {
  std::vector<Request> first(requests.begin(), requests.begin() + std::min<std::size_t>(requests.size(), 8));
  for (Request& request : first) request.arrival_ms = 0.0;
  replay(model, first, engine_options_for(policy(kContinuous), limits, model.config().seq_len));
}

std::vector<PolicyRun> compare_policies(const std::string& device, llm::Model& model,
                                        const std::vector<Request>& requests,
                                        const std::vector<std::vector<int>>& solo, const ServingLimits& limits,
                                        const std::vector<int>& policy_ids, int repeats) {
  warm_up(model, requests, limits);
  std::vector<PolicyRun> runs;
  for (const auto& policy : policies()) {
    if (std::find(policy_ids.begin(), policy_ids.end(), policy.id) == policy_ids.end()) continue;
    PolicyRun run;
    run.device = device;
    run.policy_id = policy.id;
    run.policy_name = policy.name;
    run.replay =
        median_replay(model, requests, engine_options_for(policy.fn, limits, model.config().seq_len), repeats, &solo);
    run.check = check_replay(model, requests, run.replay, solo, llm::same_rounding_logits_tolerance(limits.weight_type));
    runs.push_back(std::move(run));
  }
  return runs;
}

const PolicyRun* find_policy_run(const std::vector<PolicyRun>& runs, int policy_id) {
  const auto found =
      std::find_if(runs.begin(), runs.end(), [policy_id](const PolicyRun& run) { return run.policy_id == policy_id; });
  return found == runs.end() ? nullptr : &*found;
}

}  // namespace step07
