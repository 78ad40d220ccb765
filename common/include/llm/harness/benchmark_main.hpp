#pragma once
// The main() of every step's Google Benchmark executable: the step registers
// its benchmarks from its variant table (names like step01/cpu/kv_cache), then
// Google Benchmark parses its own flags (--benchmark_filter=..., ...) and runs.
#include <benchmark/benchmark.h>

#include "llm/harness/device_info.hpp"
#include "llm/harness/results.hpp"

namespace llm {

inline int run_benchmarks(int argc, char** argv, void (*register_benchmarks)()) {
  register_benchmarks();
  // In the output's context (and its JSON): what was measured, on what, as
  // the steps' own JSON says it.
  benchmark::AddCustomContext("commit", git_commit());
  benchmark::AddCustomContext("cpu_model", query_device_info().cpu_model);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace llm
