#include "step07_batching/measure/rate_sweep.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "step07_batching/measure/workload.hpp"  // with_arrivals

namespace step07 {

std::vector<RateSweepPoint> sweep_rates(const std::string& device, llm::Model& model,
                                        const std::vector<Request>& requests,
                                        const std::vector<std::vector<int>>& solo, const ServingLimits& limits,
                                        double capacity_requests_per_s, const RateSweepOptions& options) {
  std::vector<RateSweepPoint> points;
  for (const double load : options.load_factors) {
    const double rate = load * capacity_requests_per_s;
    const std::vector<Request> arriving = with_arrivals(requests, rate, options.seed);
    for (const auto& policy : policies()) {
      if (std::find(options.policy_ids.begin(), options.policy_ids.end(), policy.id) == options.policy_ids.end())
        continue;
      RateSweepPoint point;
      point.device = device;
      point.policy_id = policy.id;
      point.policy_name = policy.name;
      point.load_factor = load;
      point.rate_per_s = rate;
      const ReplayResult run =
          replay(model, arriving, engine_options_for(policy.fn, limits, model.config().seq_len), &solo);
      point.metrics = run.metrics;
      point.keeps_up = run.metrics.requests_per_s >= 0.9 * rate;
      point.check = check_replay(model, arriving, run, solo, llm::same_rounding_logits_tolerance(limits.weight_type));
      points.push_back(std::move(point));
    }
  }
  return points;
}

std::string continuous_beats_static_ttft(const std::vector<RateSweepPoint>& points) {
  for (const RateSweepPoint& static_point : points) {
    if (static_point.policy_id != kStatic || !static_point.keeps_up) continue;
    for (const RateSweepPoint& continuous : points) {
      if (continuous.policy_id != kContinuous || continuous.device != static_point.device ||
          continuous.load_factor != static_point.load_factor)
        continue;
      if (continuous.metrics.ttft_ms.p99 >= static_point.metrics.ttft_ms.p99)
        return fmt::format("{} at load {:.2f}: continuous p99 TTFT {:.2f} ms >= static {:.2f} ms",
                           static_point.device, static_point.load_factor, continuous.metrics.ttft_ms.p99,
                           static_point.metrics.ttft_ms.p99);
    }
  }
  return "";
}

}  // namespace step07
