#include "step07_batching/measure/serving_metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "llm/errors.hpp"
#include "llm/harness/timer.hpp"

namespace step07 {

namespace {

Percentiles percentiles_of(std::vector<double> samples) {
  if (samples.empty()) return {};
  const double sum = std::accumulate(samples.begin(), samples.end(), 0.0);
  const double mean = sum / static_cast<double>(samples.size());
  const llm::TimingStats stats = llm::TimingStats::from_samples(std::move(samples));
  return {stats.p50_ms, stats.p90_ms, stats.p99_ms, mean, stats.max_ms};
}

}  // namespace

ServingMetrics summarize_serving(const std::vector<RequestRecord>& records,
                                 const std::vector<IterationRecord>& iterations, int max_sequences) {
  ServingMetrics metrics;
  std::vector<double> ttft, tpot, itl, e2e;  // [requests] / [requests with 2+ tokens] / [gaps] / [requests]
  double first_arrival = 0.0;
  double last_finish = 0.0;
  for (const RequestRecord& record : records) {
    if (record.finish == FinishReason::Cancelled || record.token_ms.empty()) continue;
    if (metrics.requests == 0 || record.arrival_ms < first_arrival) first_arrival = record.arrival_ms;
    last_finish = std::max(last_finish, record.token_ms.back());
    ++metrics.requests;
    metrics.output_tokens += static_cast<long long>(record.generated.size());
    metrics.preemptions += record.preemptions;
    ttft.push_back(record.ttft_ms());
    e2e.push_back(record.token_ms.back() - record.arrival_ms);
    if (record.token_ms.size() >= 2) tpot.push_back(record.tpot_ms());
    for (std::size_t i = 1; i < record.token_ms.size(); ++i) itl.push_back(record.token_ms[i] - record.token_ms[i - 1]);
  }
  if (metrics.requests == 0) throw llm::InputError("no request finished: nothing to summarize");
  metrics.duration_ms = last_finish - first_arrival;
  if (metrics.duration_ms > 0) {
    metrics.output_tokens_per_s = static_cast<double>(metrics.output_tokens) / metrics.duration_ms * 1000.0;
    metrics.requests_per_s = metrics.requests / metrics.duration_ms * 1000.0;
  }
  metrics.ttft_ms = percentiles_of(std::move(ttft));
  metrics.tpot_ms = percentiles_of(std::move(tpot));
  metrics.itl_ms = percentiles_of(std::move(itl));
  metrics.e2e_ms = percentiles_of(std::move(e2e));

  metrics.iterations = static_cast<int>(iterations.size());
  if (!iterations.empty()) {
    double sequences = 0.0, rows = 0.0;
    for (const IterationRecord& iteration : iterations) {
      sequences += iteration.sequences;
      rows += iteration.decode_rows + iteration.prefill_rows;
    }
    metrics.mean_sequences = sequences / metrics.iterations;
    metrics.mean_rows = rows / metrics.iterations;
    metrics.mean_occupancy = metrics.mean_sequences / max_sequences;
  }
  return metrics;
}

std::string format_percentiles(const Percentiles& percentiles) {
  return fmt::format("p50 {:.2f} / p90 {:.2f} / p99 {:.2f} ms", percentiles.p50, percentiles.p90, percentiles.p99);
}

}  // namespace step07
