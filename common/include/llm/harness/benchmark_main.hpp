#pragma once
// The main() of every step's Google Benchmark executable: the step registers
// its benchmarks from its variant table (names like step01/cpu/kv_cache), then
// Google Benchmark parses its own flags (--benchmark_filter=..., ...) and runs.
#include <benchmark/benchmark.h>

namespace llm {

inline int run_benchmarks(int argc, char** argv, void (*register_benchmarks)()) {
  register_benchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace llm
