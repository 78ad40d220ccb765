// Step 07's benchmark: the whole engine serving a short trace under each
// policy (Google Benchmark's counters: output tokens/s, forwards). The
// executable's tables come from main.cpp; this is the bench to profile with.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "llm/harness/benchmark_main.hpp"

#include "llm/config.hpp"
#include "llm/weights.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step07_batching/policies.hpp"
#include "step07_batching/measure/replay.hpp"
#include "step07_batching/measure/workload.hpp"

namespace {

// The tiny preset serving a 64-request trace, all arriving at t = 0.
void serve_trace(benchmark::State& state, const step07::ServingPolicy& policy) {
  static const llm::ModelWeights weights = llm::random_weights(llm::find_preset("tiny").config, 42);
  static const auto model = step05::make_paged_model_on("cpu", weights);
  step07::WorkloadOptions workload;
  workload.lengths.n_requests = 64;
  workload.lengths.context = weights.config.seq_len;
  const step07::PromptSource prompts(nullptr, weights.config.vocab_size, 42);
  const auto requests = step07::make_workload(workload, prompts);
  const auto options = step07::engine_options_for(policy, {}, weights.config.seq_len);
  double tokens = 0, forwards = 0;
  for (auto _ : state) {
    const step07::ReplayResult run = step07::replay(*model, requests, options);
    tokens += static_cast<double>(run.metrics.output_tokens);
    forwards += run.metrics.iterations;
  }
  state.counters["tokens_per_s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["forwards"] = benchmark::Counter(forwards, benchmark::Counter::kAvgIterations);
}

// One benchmark per row of the policy table: step07/cpu/<policy>.
void register_benchmarks() {
  for (const auto& policy : step07::policies())
    benchmark::RegisterBenchmark(fmt::format("step07/cpu/{}", policy.name).c_str(),
                                 [fn = policy.fn](benchmark::State& state) { serve_trace(state, fn); })
        ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_benchmarks(argc, argv, register_benchmarks); }
