#include "step07_batching/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "llm/harness/result_rows.hpp"

namespace step07 {

namespace {

// Static batching's tokens/s on `device` (0 when it did not run).
double static_tokens_per_s(const std::vector<PolicyRun>& runs, const std::string& device) {
  for (const PolicyRun& run : runs)
    if (run.device == device && run.policy_name == "static") return run.replay.metrics.output_tokens_per_s;
  return 0.0;
}

template <class Sink>
void put_metrics(Sink&& put, const ServingMetrics& m) {
  put("requests", static_cast<long long>(m.requests));
  put("output_tokens", m.output_tokens);
  put("duration_ms", m.duration_ms);
  put("output_tokens_per_s", m.output_tokens_per_s);
  put("requests_per_s", m.requests_per_s);
  const std::pair<const char*, const Percentiles*> groups[] = {
      {"ttft", &m.ttft_ms}, {"tpot", &m.tpot_ms}, {"itl", &m.itl_ms}, {"e2e", &m.e2e_ms}};
  for (const auto& [name, p] : groups) {
    put(fmt::format("{}_p50_ms", name), p->p50);
    put(fmt::format("{}_p90_ms", name), p->p90);
    put(fmt::format("{}_p99_ms", name), p->p99);
    put(fmt::format("{}_mean_ms", name), p->mean);
  }
  put("preemptions", m.preemptions);
  put("iterations", static_cast<long long>(m.iterations));
  put("mean_sequences", m.mean_sequences);
  put("mean_occupancy", m.mean_occupancy);
  put("mean_rows", m.mean_rows);
}

}  // namespace

void add_metrics(llm::JsonObject& object, const ServingMetrics& metrics) {
  put_metrics([&](const std::string& key, llm::JsonScalar value) { object.emplace_back(key, std::move(value)); },
              metrics);
}

void add_metrics(std::map<std::string, llm::JsonScalar>& extra, const ServingMetrics& metrics) {
  put_metrics([&](const std::string& key, llm::JsonScalar value) { extra[key] = std::move(value); }, metrics);
}

void add_trace_table(llm::Results& results, const step05::LengthSummary& lengths, int n_requests) {
  llm::JsonTable table{"trace", {}};
  const std::pair<const char*, const step05::LengthStats*> columns[] = {
      {"prompt", &lengths.prompt}, {"output", &lengths.output}, {"total", &lengths.total}};
  for (const auto& [name, stats] : columns)
    table.rows.push_back({{"length", std::string(name)},
                          {"requests", static_cast<long long>(n_requests)},
                          {"min", stats->min},
                          {"p50", stats->p50},
                          {"p90", stats->p90},
                          {"p99", stats->p99},
                          {"max", stats->max},
                          {"mean", stats->mean}});
  results.add_table(std::move(table));
}

void print_trace(const step05::LengthSummary& lengths) {
  fmt::print("\nthe trace: {} requests, context {}; lengths in tokens (log-normal: most short, a few long)\n",
             lengths.requests, lengths.context);
  fmt::print("{:<8} {:>6} {:>7} {:>7} {:>7} {:>6} {:>7}\n", "length", "min", "p50", "p90", "p99", "max", "mean");
  const std::pair<const char*, const step05::LengthStats*> columns[] = {
      {"prompt", &lengths.prompt}, {"output", &lengths.output}, {"total", &lengths.total}};
  for (const auto& [name, s] : columns)
    fmt::print("{:<8} {:>6.0f} {:>7.1f} {:>7.1f} {:>7.1f} {:>6.0f} {:>7.1f}\n", name, s->min, s->p50, s->p90, s->p99,
               s->max, s->mean);
}

void add_policy_rows(llm::Results& results, const std::vector<PolicyRun>& runs, int timeline_points) {
  llm::JsonTable timeline{"timeline", {}};
  for (const PolicyRun& run : runs) {
    const ServingMetrics& m = run.replay.metrics;
    llm::ResultRow row;
    row.device = run.device;
    row.id = run.policy_id;
    row.variant = run.policy_name;
    row.time_ms = m.duration_ms;
    const double static_rate = static_tokens_per_s(runs, run.device);
    row.speedup = static_rate > 0 ? m.output_tokens_per_s / static_rate : 1.0;
    row.ok = run.check.ok();
    row.throughput_key = "tokens_per_s";
    row.throughput = m.output_tokens_per_s;
    row.extra["kind"] = std::string("policy");
    row.extra["speedup_over"] = std::string("static");
    row.extra["identical_requests"] = static_cast<long long>(run.check.identical);
    row.extra["max_sequences"] = static_cast<long long>(run.replay.max_sequences);
    row.extra["kv_blocks"] = static_cast<long long>(run.replay.kv_blocks);
    row.extra["peak_blocks_used"] = static_cast<long long>(run.replay.peak_blocks_used);
    add_metrics(row.extra, m);
    if (!run.check.ok()) llm::report_failed_check(run.device + " " + run.policy_name, run.check.first_difference);
    results.add_row(std::move(row));

    // The occupancy timeline, thinned evenly to at most timeline_points iterations.
    const auto& iterations = run.replay.iterations;
    const std::size_t stride = std::max<std::size_t>(1, (iterations.size() + timeline_points - 1) / timeline_points);
    for (std::size_t i = 0; i < iterations.size(); i += stride) {
      const IterationRecord& it = iterations[i];
      timeline.rows.push_back({{"device", run.device},
                               {"policy", run.policy_name},
                               {"start_ms", it.start_ms},
                               {"end_ms", it.end_ms},
                               {"sequences", static_cast<long long>(it.sequences)},
                               {"decode_rows", static_cast<long long>(it.decode_rows)},
                               {"prefill_rows", static_cast<long long>(it.prefill_rows)},
                               {"waiting", static_cast<long long>(it.waiting)},
                               {"blocks_used", static_cast<long long>(it.blocks_used)}});
    }
  }
  results.add_table(std::move(timeline));
}

void print_policies(const std::vector<PolicyRun>& runs) {
  if (runs.empty()) return;
  fmt::print("\nserving policies on the trace (same model, KV budget of {} blocks, at most {} sequences):\n",
             runs.front().replay.kv_blocks, runs.back().replay.max_sequences);
  fmt::print("{:<6} {:<20} {:>9} {:>7} {:>9} {:>7} {:>22} {:>22} {:>9} {:>5} {:>8}\n", "device", "policy", "tok/s",
             "req/s", "vs static", "occup.", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "preempt", "iters", "tokens");
  for (const PolicyRun& run : runs) {
    const ServingMetrics& m = run.replay.metrics;
    const double static_rate = static_tokens_per_s(runs, run.device);
    fmt::print("{:<6} {:<20} {:>9.0f} {:>7.1f} {:>8.2f}x {:>6.0f}% {:>10.2f} / {:>9.2f} {:>10.3f} / {:>9.3f} {:>9} {:>5} {:>8}\n",
               run.device, run.policy_name, m.output_tokens_per_s, m.requests_per_s,
               static_rate > 0 ? m.output_tokens_per_s / static_rate : 0.0, 100.0 * m.mean_occupancy, m.ttft_ms.p50,
               m.ttft_ms.p99, m.tpot_ms.p50, m.tpot_ms.p99, m.preemptions, m.iterations,
               run.check.ok() ? "same" : "DIFFER");
  }
  fmt::print("occup.: sequences per forward / the largest batch, averaged over forwards. tokens: every request's "
             "tokens vs the same request run alone.\n");
}

}  // namespace step07
