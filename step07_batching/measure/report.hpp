#pragma once
// The step's parts as results rows (the JSON, which the docs and the plot
// script read) and as their own printed tables.
#include <vector>

#include "llm/harness/results.hpp"
#include "step05_paged_attention/measure/request_trace.hpp"
#include "step07_batching/measure/chunked_prefill.hpp"
#include "step07_batching/measure/parallel_sampling.hpp"
#include "step07_batching/measure/prefix_caching.hpp"
#include "step07_batching/serve/load_client.hpp"
#include "step07_batching/measure/loopback_serving.hpp"
#include "step07_batching/measure/policy_comparison.hpp"
#include "step07_batching/measure/rate_sweep.hpp"
#include "step07_batching/measure/serving_metrics.hpp"

namespace step07 {

// The latency table's columns as JSON keys ("ttft_p99_ms", ...), shared by
// every part's rows so the plot script reads one schema.
void add_metrics(llm::JsonObject& object, const ServingMetrics& metrics);
void add_metrics(std::map<std::string, llm::JsonScalar>& extra, const ServingMetrics& metrics);

// The trace's lengths (step 05's summary) as a JSON table and a printed line.
void add_trace_table(llm::Results& results, const step05::LengthSummary& lengths, int n_requests);
void print_trace(const step05::LengthSummary& lengths);

// 2. Policies: one row per (device, policy); time = the run's duration,
// throughput = output tokens/s, speedup = tokens/s over static batching's on
// the same device (the comparison the step is about), ok = every request's
// tokens equal its solo tokens. The occupancy timeline of each run goes in
// the JSON table "timeline" (at most `timeline_points` iterations per run).
void add_policy_rows(llm::Results& results, const std::vector<PolicyRun>& runs, int timeline_points = 1500);
void print_policies(const std::vector<PolicyRun>& runs);

// 3. The rate sweep: the JSON table "rate_sweep" (one row per device,
// policy and load, with the latency columns and keeps_up) and the printed
// latency-throughput table; a sweep point whose tokens differ from solo
// fails the run.
void add_rate_sweep(llm::Results& results, const std::vector<RateSweepPoint>& points);
void print_rate_sweep(const std::vector<RateSweepPoint>& points);

// 4. Chunked prefill: results rows (kind "chunked_prefill"; time = p99 ITL,
// speedup = p99 ITL without chunks / with them) and the JSON table
// "chunked_prefill".
void add_chunked_prefill(llm::Results& results, const std::vector<ChunkedPrefillRow>& rows);
void print_chunked_prefill(const std::vector<ChunkedPrefillRow>& rows, const ChunkedPrefillOptions& options);

// 5. Served over loopback: one results row per device (kind "served"; time
// = the run's duration, speedup = served / in-process output tokens/s, ok =
// tokens identical to solo and no request failed) and the JSON table "loopback".
void add_loopback_rows(llm::Results& results, const std::vector<LoopbackRun>& runs);
void print_loopback(const std::vector<LoopbackRun>& runs);

// 6. Prefix caching: results rows (kind "prefix_caching"; time = p50 TTFT,
// speedup = p50 TTFT with the cache off / this row's, ok = tokens identical
// to solo) and the JSON table "prefix_caching".
void add_prefix_caching(llm::Results& results, const std::vector<PrefixCachingRow>& rows);
void print_prefix_caching(const std::vector<PrefixCachingRow>& rows);

// 7. Parallel sampling: results rows (kind "parallel_sampling", variant
// "forked n=N" / "independent n=N", id N; time = the greedy run's median wall
// time, speedup = the independent requests' time / this row's, same device
// and n; ok = greedy samples equal to solo and sampled ones to seed + j
// alone) and the JSON table "parallel_sampling".
void add_parallel_sampling(llm::Results& results, const std::vector<ParallelSamplingRow>& rows);
void print_parallel_sampling(const std::vector<ParallelSamplingRow>& rows);

// --load: what was sent and how it went, then the latency table as the
// client measured it. Returns false when any request failed.
bool print_load(const LoadResult& load, int max_sequences);

}  // namespace step07
