#include "step07_batching/measure/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>

#include "llm/harness/result_rows.hpp"

namespace step07 {

namespace {

// A run's tokens against the solo runs, in a table's tokens column: same;
// explained (check_replay: parted from a solo run only at a near-tie of
// logits rows that agree within the tolerance); DIFFER.
const char* tokens_word(const OutputCheck& check) {
  return !check.ok() ? "DIFFER" : check.explained > 0 ? "explained" : "same";
}

// Under a table: each explained run's count and its first explanation.
void print_explained(const std::string& label, const OutputCheck& check) {
  if (check.ok() && check.explained > 0)
    fmt::print("  {}: {} of {} requests parted from their solo tokens at a near-tie, the first: {}\n", label,
               check.explained, check.expected, check.first_explained);
}

// Static batching's tokens/s on `device` (0 when it did not run).
double static_tokens_per_s(const std::vector<PolicyRun>& runs, const std::string& device) {
  for (const PolicyRun& run : runs)
    if (run.device == device && run.policy_id == kStatic) return run.replay.metrics.output_tokens_per_s;
  return 0.0;
}

template <class Sink>
void put_metrics(Sink&& put, const ServingMetrics& metrics) {
  put("requests", static_cast<long long>(metrics.requests));
  put("output_tokens", metrics.output_tokens);
  put("duration_ms", metrics.duration_ms);
  put("output_tokens_per_s", metrics.output_tokens_per_s);
  put("requests_per_s", metrics.requests_per_s);
  const std::pair<const char*, const Percentiles*> groups[] = {
      {"ttft", &metrics.ttft_ms}, {"tpot", &metrics.tpot_ms}, {"itl", &metrics.itl_ms}, {"e2e", &metrics.e2e_ms}};
  for (const auto& [name, percentiles] : groups) {
    put(fmt::format("{}_p50_ms", name), percentiles->p50);
    put(fmt::format("{}_p90_ms", name), percentiles->p90);
    put(fmt::format("{}_p99_ms", name), percentiles->p99);
    put(fmt::format("{}_mean_ms", name), percentiles->mean);
    put(fmt::format("{}_max_ms", name), percentiles->max);
  }
  put("preemptions", metrics.preemptions);
  put("iterations", static_cast<long long>(metrics.iterations));
  put("mean_sequences", metrics.mean_sequences);
  put("mean_occupancy", metrics.mean_occupancy);
  put("mean_rows", metrics.mean_rows);
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
  for (const auto& [name, stats] : columns)
    fmt::print("{:<8} {:>6.0f} {:>7.1f} {:>7.1f} {:>7.1f} {:>6.0f} {:>7.1f}\n", name, stats->min, stats->p50,
               stats->p90, stats->p99, stats->max, stats->mean);
}

void add_policy_rows(llm::Results& results, const std::vector<PolicyRun>& runs, int timeline_points) {
  llm::JsonTable timeline{"timeline", {}};
  for (const PolicyRun& run : runs) {
    const ServingMetrics& metrics = run.replay.metrics;
    llm::ResultRow row;
    row.device = run.device;
    row.id = run.policy_id;
    row.variant = run.policy_name;
    row.time_ms = metrics.duration_ms;
    const double static_rate = static_tokens_per_s(runs, run.device);
    row.speedup = static_rate > 0 ? metrics.output_tokens_per_s / static_rate : 1.0;
    row.ok = run.check.ok();
    row.throughput_key = "tokens_per_s";
    row.throughput = metrics.output_tokens_per_s;
    row.extra["kind"] = std::string("policy");
    row.extra["speedup_over"] = std::string("static");
    row.extra["identical_requests"] = static_cast<long long>(run.check.identical);
    row.extra["explained_requests"] = static_cast<long long>(run.check.explained);
    row.extra["max_sequences"] = static_cast<long long>(run.replay.max_sequences);
    row.extra["kv_blocks"] = static_cast<long long>(run.replay.kv_blocks);
    row.extra["peak_blocks_used"] = static_cast<long long>(run.replay.peak_blocks_used);
    add_metrics(row.extra, metrics);
    if (!run.check.ok()) llm::report_failed_check(run.device + " " + run.policy_name, run.check.first_difference);
    results.add_row(std::move(row));

    // The occupancy timeline, thinned evenly to at most timeline_points iterations.
    const auto& iterations = run.replay.iterations;
    const std::size_t stride = std::max<std::size_t>(1, (iterations.size() + timeline_points - 1) / timeline_points);
    for (std::size_t i = 0; i < iterations.size(); i += stride) {
      const IterationRecord& iteration = iterations[i];
      timeline.rows.push_back({{"device", run.device},
                               {"policy", run.policy_name},
                               {"start_ms", iteration.start_ms},
                               {"end_ms", iteration.end_ms},
                               {"sequences", static_cast<long long>(iteration.sequences)},
                               {"decode_rows", static_cast<long long>(iteration.decode_rows)},
                               {"prefill_rows", static_cast<long long>(iteration.prefill_rows)},
                               {"waiting", static_cast<long long>(iteration.waiting)},
                               {"blocks_used", static_cast<long long>(iteration.blocks_used)}});
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
    const ServingMetrics& metrics = run.replay.metrics;
    const double static_rate = static_tokens_per_s(runs, run.device);
    fmt::print(
        "{:<6} {:<20} {:>9.0f} {:>7.1f} {:>8.2f}x {:>6.0f}% {:>10.2f} / {:>9.2f} {:>10.3f} / {:>9.3f} {:>9} {:>5} "
        "{:>8}\n",
        run.device, run.policy_name, metrics.output_tokens_per_s, metrics.requests_per_s,
        static_rate > 0 ? metrics.output_tokens_per_s / static_rate : 0.0, 100.0 * metrics.mean_occupancy,
        metrics.ttft_ms.p50, metrics.ttft_ms.p99, metrics.tpot_ms.p50, metrics.tpot_ms.p99, metrics.preemptions,
        metrics.iterations, tokens_word(run.check));
  }
  fmt::print("vs static = output tok/s / static batching's, same device. occup.: sequences per forward / the largest "
             "batch, averaged over forwards. tokens: every request's tokens vs the same request run alone.\n");
  for (const PolicyRun& run : runs) print_explained(run.device + " " + run.policy_name, run.check);
}

void add_rate_sweep(llm::Results& results, const std::vector<RateSweepPoint>& points) {
  llm::JsonTable table{"rate_sweep", {}};
  for (const RateSweepPoint& point : points) {
    llm::JsonObject row = {{"device", point.device},
                           {"policy", point.policy_name},
                           {"id", static_cast<long long>(point.policy_id)},
                           {"load_factor", point.load_factor},
                           {"rate_per_s", point.rate_per_s},
                           {"keeps_up", point.keeps_up},
                           {"identical_tokens", point.check.ok()},
                           {"explained_requests", static_cast<long long>(point.check.explained)}};
    add_metrics(row, point.metrics);
    table.rows.push_back(std::move(row));
    if (!point.check.ok())
      llm::report_failed_check(fmt::format("{} {} at load {:.2f}", point.device, point.policy_name, point.load_factor),
                               point.check.first_difference);
  }
  results.add_table(std::move(table));
}

void print_rate_sweep(const std::vector<RateSweepPoint>& points) {
  if (points.empty()) return;
  fmt::print("\nlatency vs load (Poisson arrivals; load 1.0 = continuous batching's offline requests/s):\n");
  fmt::print("{:<6} {:>5} {:>8} {:<20} {:>8} {:>9} {:>22} {:>20} {:>8} {:>6}\n", "device", "load", "req/s in",
             "policy", "req/s", "tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "keeps up", "tokens");
  for (const RateSweepPoint& point : points)
    fmt::print(
        "{:<6} {:>5.2f} {:>8.1f} {:<20} {:>8.1f} {:>9.0f} {:>10.2f} / {:>9.2f} {:>9.3f} / {:>8.3f} {:>8} {:>6}\n",
        point.device, point.load_factor, point.rate_per_s, point.policy_name, point.metrics.requests_per_s,
        point.metrics.output_tokens_per_s, point.metrics.ttft_ms.p50, point.metrics.ttft_ms.p99,
        point.metrics.tpot_ms.p50, point.metrics.tpot_ms.p99, point.keeps_up ? "yes" : "no",
        tokens_word(point.check));
  for (const RateSweepPoint& point : points)
    print_explained(fmt::format("{} {} at load {:.2f}", point.device, point.policy_name, point.load_factor),
                    point.check);
  const std::string miss = continuous_beats_static_ttft(points);
  fmt::print("target: continuous p99 TTFT below static's at every load static keeps up with: {}\n",
             miss.empty() ? "met" : "missed (" + miss + ")");
}

void add_chunked_prefill(llm::Results& results, const std::vector<ChunkedPrefillRow>& rows) {
  llm::JsonTable table{"chunked_prefill", {}};
  for (const ChunkedPrefillRow& row : rows) {
    const ChunkedPrefillRow* whole = nullptr;  // the same device without chunks
    for (const ChunkedPrefillRow& candidate : rows)
      if (candidate.device == row.device && candidate.chunk_tokens == 0) whole = &candidate;
    llm::ResultRow result;
    result.device = row.device;
    result.id = row.chunk_tokens == 0 ? kContinuous : kContinuousChunked;
    result.variant = row.chunk_tokens == 0 ? "prefill whole" : fmt::format("prefill chunks of {}", row.chunk_tokens);
    result.time_ms = row.metrics.itl_ms.p99;
    result.speedup = whole != nullptr && row.metrics.itl_ms.p99 > 0 ? whole->metrics.itl_ms.p99 / row.metrics.itl_ms.p99
                                                                    : 1.0;
    result.ok = row.check.ok();
    result.throughput_key = "tokens_per_s";
    result.throughput = row.metrics.output_tokens_per_s;
    result.extra["kind"] = std::string("chunked_prefill");
    result.extra["time_is"] = std::string("p99 inter-token latency");
    result.extra["speedup_over"] = std::string("p99 inter-token latency without chunks");
    result.extra["chunk_tokens"] = static_cast<long long>(row.chunk_tokens);
    result.extra["explained_requests"] = static_cast<long long>(row.check.explained);
    add_metrics(result.extra, row.metrics);
    if (!row.check.ok()) llm::report_failed_check(row.device + " " + result.variant, row.check.first_difference);
    results.add_row(std::move(result));

    llm::JsonObject object = {{"device", row.device}, {"chunk_tokens", static_cast<long long>(row.chunk_tokens)}};
    add_metrics(object, row.metrics);
    table.rows.push_back(std::move(object));
  }
  results.add_table(std::move(table));
}

void print_chunked_prefill(const std::vector<ChunkedPrefillRow>& rows, const ChunkedPrefillOptions& options) {
  if (rows.empty()) return;
  fmt::print("\nchunked prefill: every {}th prompt is {:.0f}% of the context, arrivals at load {:.2f}:\n",
             options.long_prompt_every, 100.0 * options.long_prompt_fraction, options.load_factor);
  fmt::print("{:<6} {:>7} {:>9} {:>29} {:>20} {:>22} {:>8} {:>6}\n", "device", "chunk", "tok/s",
             "ITL p50/p99/max ms", "TPOT p50/p99 ms", "TTFT p50/p99 ms", "preempt", "tokens");
  for (const ChunkedPrefillRow& row : rows)
    fmt::print(
        "{:<6} {:>7} {:>9.0f} {:>8.3f} / {:>8.3f} / {:>7.2f} {:>9.3f} / {:>8.3f} {:>10.2f} / {:>9.2f} {:>8} {:>6}\n",
        row.device, row.chunk_tokens == 0 ? std::string("off") : std::to_string(row.chunk_tokens),
        row.metrics.output_tokens_per_s, row.metrics.itl_ms.p50, row.metrics.itl_ms.p99, row.metrics.itl_ms.max,
        row.metrics.tpot_ms.p50, row.metrics.tpot_ms.p99, row.metrics.ttft_ms.p50, row.metrics.ttft_ms.p99,
        row.metrics.preemptions, tokens_word(row.check));
  fmt::print("ITL: every gap between two tokens of a request (a stall shows here); TPOT: each request's mean gap.\n");
  for (const ChunkedPrefillRow& row : rows)
    print_explained(fmt::format("{} chunk {}", row.device, row.chunk_tokens), row.check);
}

namespace {

// The prefix-cache columns of a part 6 row, each through put(key, value).
template <typename Put>
void put_prefix_columns(Put put, const PrefixCachingRow& row) {
  put("prefix_caching", row.prefix_caching);
  put("system_prompt_tokens", static_cast<long long>(row.system_prompt_tokens));
  put("prefill_rows", row.prefill_rows);
  put("rows_computed", row.rows_computed);
  put("prefix_queried_blocks", row.blocks.prefix_queried_blocks);
  put("prefix_hit_blocks", row.blocks.prefix_hit_blocks);
  put("hit_rate", row.hit_rate());
  put("evictions", row.blocks.evictions);
}

}  // namespace

void add_prefix_caching(llm::Results& results, const std::vector<PrefixCachingRow>& rows) {
  llm::JsonTable table{"prefix_caching", {}};
  for (const PrefixCachingRow& row : rows) {
    const PrefixCachingRow* off = nullptr;  // the same device without the cache
    for (const PrefixCachingRow& candidate : rows)
      if (candidate.device == row.device && !candidate.prefix_caching) off = &candidate;
    llm::ResultRow result;
    result.device = row.device;
    result.id = kContinuous;
    result.variant = row.prefix_caching ? "prefix cache on" : "prefix cache off";
    result.time_ms = row.metrics.ttft_ms.p50;
    result.speedup =
        off != nullptr && row.metrics.ttft_ms.p50 > 0 ? off->metrics.ttft_ms.p50 / row.metrics.ttft_ms.p50 : 1.0;
    result.ok = row.check.ok();
    result.throughput_key = "tokens_per_s";
    result.throughput = row.metrics.output_tokens_per_s;
    result.extra["kind"] = std::string("prefix_caching");
    result.extra["time_is"] = std::string("p50 time to first token");
    result.extra["speedup_over"] = std::string("p50 time to first token with the prefix cache off");
    result.extra["explained_requests"] = static_cast<long long>(row.check.explained);
    put_prefix_columns([&](const std::string& key, llm::JsonScalar value) { result.extra[key] = std::move(value); },
                       row);
    add_metrics(result.extra, row.metrics);
    if (!row.check.ok()) llm::report_failed_check(row.device + " " + result.variant, row.check.first_difference);
    results.add_row(std::move(result));

    llm::JsonObject object = {{"device", row.device}};
    put_prefix_columns([&](const std::string& key, llm::JsonScalar value) { object.emplace_back(key, std::move(value)); },
                       row);
    add_metrics(object, row.metrics);
    table.rows.push_back(std::move(object));
  }
  results.add_table(std::move(table));
}

void print_prefix_caching(const std::vector<PrefixCachingRow>& rows) {
  if (rows.empty()) return;
  fmt::print("\nprefix caching: every prompt starts with the same {}-token system prompt:\n",
             rows.front().system_prompt_tokens);
  fmt::print("{:<6} {:>6} {:>9} {:>22} {:>12} {:>10} {:>15} {:>8} {:>6}\n", "device", "cache", "tok/s",
             "TTFT p50/p90 ms", "rows run", "prefill", "hit blocks", "hit rate", "tokens");
  for (const PrefixCachingRow& row : rows)
    fmt::print("{:<6} {:>6} {:>9.0f} {:>10.2f} / {:>9.2f} {:>12} {:>10} {:>7} / {:>5} {:>7.0f}% {:>6}\n", row.device,
               row.prefix_caching ? "on" : "off", row.metrics.output_tokens_per_s, row.metrics.ttft_ms.p50,
               row.metrics.ttft_ms.p90, row.rows_computed, row.prefill_rows, row.blocks.prefix_hit_blocks,
               row.blocks.prefix_queried_blocks, 100.0 * row.hit_rate(), tokens_word(row.check));
  fmt::print("rows run: every row of every forward; prefill: those that sample no token or are more than one; hit "
             "rate: blocks shared from the cache / full prompt blocks the admissions asked for.\n");
  for (const PrefixCachingRow& row : rows)
    print_explained(fmt::format("{} prefix cache {}", row.device, row.prefix_caching ? "on" : "off"), row.check);
}

namespace {

const char* way_name(const ParallelSamplingRow& row) { return row.forked ? "forked" : "independent"; }

// The independent requests' row of the same device and n (nullptr when absent).
const ParallelSamplingRow* independent_of(const std::vector<ParallelSamplingRow>& rows,
                                          const ParallelSamplingRow& row) {
  for (const ParallelSamplingRow& candidate : rows)
    if (candidate.device == row.device && candidate.n == row.n && !candidate.forked) return &candidate;
  return nullptr;
}

// Wall time of the independent requests / this row's: what forking saves.
double over_independent(const std::vector<ParallelSamplingRow>& rows, const ParallelSamplingRow& row) {
  const ParallelSamplingRow* independent = independent_of(rows, row);
  return independent != nullptr && row.wall.median_ms > 0 ? independent->wall.median_ms / row.wall.median_ms : 1.0;
}

// The columns of a part 7 row, each through put(key, value).
template <typename Put>
void put_sampling_columns(Put put, const ParallelSamplingRow& row) {
  put("n", static_cast<long long>(row.n));
  put("way", std::string(way_name(row)));
  put("prompt_tokens", static_cast<long long>(row.prompt_tokens));
  put("generated_per_sample", static_cast<long long>(row.generated));
  put("block_size", static_cast<long long>(row.block_size));
  put("prefill_rows", row.prefill_rows);
  put("rows_computed", row.rows_computed);
  put("peak_blocks", static_cast<long long>(row.peak_blocks));
  put("predicted_peak_blocks", static_cast<long long>(row.predicted_blocks));
  put("copy_on_write", row.copy_on_write);
  put("preemptions", row.preemptions);
  put("output_tokens", row.output_tokens);
  put("wall_ms", row.wall.median_ms);
  put("wall_min_ms", row.wall.min_ms);
  put("wall_max_ms", row.wall.max_ms);
  put("runs", static_cast<long long>(row.wall.runs));
  put("prefill_forwards_ms", row.prefill_ms);
  put("decode_forwards_ms", row.decode_ms);
  put("tokens_per_s", row.tokens_per_s());
  put("greedy_identical", row.greedy.ok());
  // The float's shortest decimal (0.8, not 0.800000011920929).
  put("sampled_temperature", std::stod(fmt::format("{}", row.temperature)));
  put("sampled_identical", row.sampled.identical == row.sampled.expected);
  // Samples that parted from their alone run where the logits explain it
  // (a device that is not batch-invariant: check_sampled_outputs).
  put("sampled_explained", static_cast<long long>(row.sampled.explained));
  put("sampled_ok", row.sampled.ok());
  if (!row.sampled.first_explained.empty()) put("sampled_first_explained", row.sampled.first_explained);
}

}  // namespace

void add_parallel_sampling(llm::Results& results, const std::vector<ParallelSamplingRow>& rows) {
  llm::JsonTable table{"parallel_sampling", {}};
  for (const ParallelSamplingRow& row : rows) {
    llm::ResultRow result;
    result.device = row.device;
    result.id = row.n;
    result.variant = fmt::format("{} n={}", way_name(row), row.n);
    result.time_ms = row.wall.median_ms;
    result.speedup = over_independent(rows, row);
    result.ok = row.ok();
    result.throughput_key = "tokens_per_s";
    result.throughput = row.tokens_per_s();
    result.extra["kind"] = std::string("parallel_sampling");
    result.extra["time_is"] = std::string("wall time of the greedy run, first submit to last token");
    result.extra["speedup_over"] = std::string("n independent requests with the same prompt");
    put_sampling_columns([&](const std::string& key, llm::JsonScalar value) { result.extra[key] = std::move(value); },
                         row);
    if (!row.greedy.ok())
      llm::report_failed_check(row.device + " greedy " + result.variant, row.greedy.first_difference);
    if (!row.sampled.ok())
      llm::report_failed_check(row.device + " sampled " + result.variant + " (sample j vs seed + j alone)",
                               row.sampled.first_difference);
    results.add_row(std::move(result));

    llm::JsonObject object = {{"device", row.device}};
    put_sampling_columns(
        [&](const std::string& key, llm::JsonScalar value) { object.emplace_back(key, std::move(value)); }, row);
    table.rows.push_back(std::move(object));
  }
  results.add_table(std::move(table));
}

void print_parallel_sampling(const std::vector<ParallelSamplingRow>& rows) {
  if (rows.empty()) return;
  const ParallelSamplingRow& first = rows.front();
  fmt::print("\nparallel sampling: n completions of one {}-token prompt, {} tokens each, KV blocks of {} positions, "
             "prefix cache off (greedy runs timed, median of {}):\n",
             first.prompt_tokens, first.generated, first.block_size, first.wall.runs);
  fmt::print("{:<6} {:>3} {:<12} {:>8} {:>9} {:>18} {:>5} {:>8} {:>10} {:>21} {:>9} {:>10} {:>7}\n", "device", "n",
             "way", "prefill", "rows run", "peak / predicted", "CoW", "preempt", "wall ms", "prefill / decode ms",
             "tok/s", "vs indep.", "tokens");
  for (const ParallelSamplingRow& row : rows)
    fmt::print(
        "{:<6} {:>3} {:<12} {:>8} {:>9} {:>8} / {:>7} {:>5} {:>8} {:>10.2f} {:>9.2f} / {:>9.2f} {:>9.0f} {:>9.2f}x "
        "{:>7}\n",
        row.device, row.n, way_name(row), row.prefill_rows, row.rows_computed, row.peak_blocks, row.predicted_blocks,
        row.copy_on_write, row.preemptions, row.wall.median_ms, row.prefill_ms, row.decode_ms, row.tokens_per_s(),
        over_independent(rows, row), !row.ok() ? "DIFFER" : row.sampled.explained > 0 ? "explained" : "same");
  fmt::print("forked: one request with n samples (one prefill; the samples share the prompt's blocks, copy on write); "
             "independent: n requests with the same prompt. peak: the most KV blocks held at once; CoW: blocks "
             "copied on a write to a shared block; prefill / decode ms: the median run's forwards with prefill rows, "
             "and the others. tokens: greedy samples vs the solo run, sampled sample j (T {}) vs "
             "an n = 1 request seeded seed + j; explained: a sampled token differs where the two logits rows agree "
             "within the tolerance of the weights' type and the same coin draws each from its own row (a device whose products "
             "depend on the batch's rows).\n",
             first.temperature);
  for (const ParallelSamplingRow& row : rows)
    if (row.ok() && row.sampled.explained > 0)
      fmt::print("  {} {} n={}: {} of {} samples explained, the first: {}\n", row.device, way_name(row), row.n,
                 row.sampled.explained, row.sampled.expected, row.sampled.first_explained);
}

namespace {

// What serving over HTTP adds per output token, from the two throughputs:
// 1/served - 1/in-process (the events, the JSON on both sides, the threads).
double http_us_per_token(const LoopbackRun& run) {
  if (run.served.output_tokens_per_s <= 0 || run.in_process_tokens_per_s <= 0) return 0.0;
  return 1e6 / run.served.output_tokens_per_s - 1e6 / run.in_process_tokens_per_s;
}

}  // namespace

void add_loopback_rows(llm::Results& results, const std::vector<LoopbackRun>& runs) {
  llm::JsonTable table{"loopback", {}};
  for (const LoopbackRun& run : runs) {
    const bool ok = run.check.ok() && run.load.failed == 0 && run.load.unfinished == 0;
    llm::ResultRow row;
    row.device = run.device;
    row.id = kContinuous;
    row.variant = "continuous over HTTP";
    row.time_ms = run.served.duration_ms;
    row.speedup = run.ratio;
    row.ok = ok;
    row.throughput_key = "tokens_per_s";
    row.throughput = run.served.output_tokens_per_s;
    row.extra["kind"] = std::string("served");
    row.extra["speedup_over"] = std::string("the in-process continuous run's output tokens/s");
    row.extra["explained_requests"] = static_cast<long long>(run.check.explained);
    add_metrics(row.extra, run.served);
    if (!ok)
      llm::report_failed_check(run.device + " served over loopback",
                               run.load.failed > 0 ? run.load.first_failure : run.check.first_difference);
    results.add_row(std::move(row));

    llm::JsonObject object = {{"device", run.device},
                              {"in_process_tokens_per_s", run.in_process_tokens_per_s},
                              {"served_over_in_process", run.ratio},
                              {"http_us_per_token", http_us_per_token(run)},
                              {"sent", static_cast<long long>(run.load.sent)},
                              {"unfinished", static_cast<long long>(run.load.unfinished)},
                              {"failed", static_cast<long long>(run.load.failed)},
                              {"identical_tokens", run.check.ok()},
                              {"explained_requests", static_cast<long long>(run.check.explained)}};
    add_metrics(object, run.served);
    table.rows.push_back(std::move(object));
  }
  results.add_table(std::move(table));
}

void print_loopback(const std::vector<LoopbackRun>& runs) {
  if (runs.empty()) return;
  fmt::print("\nthe same trace served over HTTP on loopback (continuous batching; every token streamed as an event, "
             "timed by the client):\n");
  fmt::print("{:<6} {:>10} {:>12} {:>8} {:>12} {:>22} {:>20} {:>5} {:>6} {:>6}\n", "device", "tok/s", "in-process",
             "ratio", "HTTP us/tok", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "sent", "failed", "tokens");
  for (const LoopbackRun& run : runs)
    fmt::print(
        "{:<6} {:>10.0f} {:>12.0f} {:>7.2f}x {:>12.1f} {:>10.2f} / {:>9.2f} {:>9.3f} / {:>8.3f} {:>5} {:>6} {:>6}\n",
        run.device, run.served.output_tokens_per_s, run.in_process_tokens_per_s, run.ratio, http_us_per_token(run),
        run.served.ttft_ms.p50, run.served.ttft_ms.p99, run.served.tpot_ms.p50, run.served.tpot_ms.p99, run.load.sent,
        run.load.failed, tokens_word(run.check));
  for (const LoopbackRun& run : runs) print_explained(run.device + " over loopback", run.check);
  fmt::print("target: served throughput within 15% of in-process (ratio >= 0.85). HTTP us/tok: 1/served - "
             "1/in-process, what the events, the JSON and the threads add per token; it matters against a forward "
             "that costs tens of microseconds per token, not against one that costs milliseconds.\n");
}

bool print_load(const LoadResult& load, int max_sequences) {
  fmt::print("sent {} requests ({} not sent before the deadline); {} finished, {} unfinished, {} failed\n", load.sent,
             load.not_sent, load.records.size(), load.unfinished, load.failed);
  if (!load.first_failure.empty()) fmt::print("first failure: {}\n", load.first_failure);
  if (!load.records.empty()) {
    const ServingMetrics metrics = summarize_serving(load.records, {}, max_sequences);
    fmt::print("output {:.0f} tok/s, {:.2f} requests/s over {}\n", metrics.output_tokens_per_s, metrics.requests_per_s,
               llm::format_ms(metrics.duration_ms));
    fmt::print("TTFT {}\nTPOT {}\nITL  {}\nE2E  {}\n", format_percentiles(metrics.ttft_ms),
               format_percentiles(metrics.tpot_ms), format_percentiles(metrics.itl_ms),
               format_percentiles(metrics.e2e_ms));
  }
  return load.failed == 0;
}

}  // namespace step07
