// Google Benchmark for step 02: every variant of the step's table on causal
// prefill shapes (8 heads, d 64 and 128, 256..4096 tokens), CPU always and
// CUDA when a device is usable (CUDA rows use CUDA-event time, manual timing).
//   build/bin/step02_flash_attention_bench --benchmark_filter='cpu_flash/.*/2048'
// Counter "TFLOP" (shown as TFLOP/s: a rate) uses the same formula as the executable:
//   4 * d * heads * visible (query, key) pairs per run.
#include <benchmark/benchmark.h>

#include "llm/harness/benchmark_main.hpp"

#include <cmath>
#include <memory>
#include <vector>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "step02_flash_attention/attention_problem.hpp"
#include "step02_flash_attention/measure/cuda_runner.hpp"
#include "step02_flash_attention/variants.hpp"

namespace {

using step02::AttentionProblem;

struct HostInputs {
  std::vector<float> q, k, v, out;
};

HostInputs make_inputs(const AttentionProblem& p) {
  HostInputs in{std::vector<float>(p.q_elements()), std::vector<float>(p.kv_elements()),
                std::vector<float>(p.kv_elements()), std::vector<float>(p.q_elements())};
  // Deterministic, non-zero, in the range the executable uses.
  for (std::size_t i = 0; i < in.q.size(); ++i) in.q[i] = 2.0f * std::sin(0.37f * static_cast<float>(i));
  for (std::size_t i = 0; i < in.k.size(); ++i) in.k[i] = 2.0f * std::cos(0.11f * static_cast<float>(i));
  for (std::size_t i = 0; i < in.v.size(); ++i) in.v[i] = std::sin(0.05f * static_cast<float>(i) + 1.0f);
  return in;
}

void run_cpu(benchmark::State& state, const step02::AttentionVariant* variant, int head_dim) {
  const int n = static_cast<int>(state.range(0));
  const AttentionProblem p{8, 8, head_dim, n, n, true};
  HostInputs in = make_inputs(p);
  const std::int32_t block_zero = 0;
  step02::AttentionArgs args;
  args.q = in.q.data();
  args.kv = step02::contiguous_kv_view(in.k.data(), in.v.data(), n, p.kv_row(), &block_zero);
  args.out = in.out.data();
  for (auto _ : state) {
    variant->fn.run(p, args);
    benchmark::DoNotOptimize(in.out.data());
  }
  state.counters["TFLOP"] = benchmark::Counter(p.flops() / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["score_bytes"] = static_cast<double>(variant->fn.score_bytes ? variant->fn.score_bytes(p) : 0);
}

void run_cuda(benchmark::State& state, const step02::AttentionVariant* variant, int head_dim) {
  const int n = static_cast<int>(state.range(0));
  const AttentionProblem p{8, 8, head_dim, n, n, true};
  HostInputs in = make_inputs(p);
  step02::CudaProblem gpu(p, in.q, in.k, in.v);
  if (const auto why = gpu.skip_reason(*variant); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  for (auto _ : state) state.SetIterationTime(gpu.time(*variant, 0, 1).median_ms / 1e3);
  state.counters["TFLOP"] = benchmark::Counter(p.flops() / 1e12, benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  const bool cuda = llm::cuda::device_status().usable;
  for (const auto& v : step02::variants()) {
    if (v.fn.for_decode || !v.fn.run) continue;  // decode kernels: see the executable's decode table
    if (v.backend == llm::Backend::Cuda && !cuda) continue;
    for (int d : {64, 128}) {
      const std::string name = "step02/" + v.name + "/d" + std::to_string(d);
      auto* b = v.backend == llm::Backend::Cpu ? benchmark::RegisterBenchmark(name.c_str(), run_cpu, &v, d)
                                               : benchmark::RegisterBenchmark(name.c_str(), run_cuda, &v, d);
      b->Arg(256)->Arg(1024)->Arg(2048)->Arg(4096)->Unit(benchmark::kMillisecond);
      if (v.backend == llm::Backend::Cuda) b->UseManualTime();
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return llm::run_benchmarks(argc, argv, register_all); }
