// Google Benchmark for step 03: one decode-attention call (one new token
// against `context` cached positions) for 32 query heads, head_dim 128, with
// 32 / 8 / 4 / 1 KV heads, for every variant of the step's table on the CPU
// (and on CUDA when a device is present).
//   build/bin/step03_gqa_bench --benchmark_filter=group_aware
// Unlike the executable, caches are not flushed between iterations here:
// Google Benchmark times back-to-back calls, so small caches may sit in the
// CPU's last-level cache. The executable's table is the flushed measurement.
#include <benchmark/benchmark.h>

#include "llm/harness/benchmark_main.hpp"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <span>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/harness/random_fill.hpp"
#include "llm/kv_cache.hpp"
#include "step03_gqa/cuda_gqa_attention.hpp"
#include "step03_gqa/gqa_attention.hpp"
#include "step03_gqa/measure/decode_attention_sweep.hpp"

namespace {

constexpr int kQueryHeads = 32;
constexpr int kHeadDim = 128;

// One cache per KV-head count, long enough for the longest context; filled once.
struct Problem {
  llm::AttentionShape shape;
  std::unique_ptr<llm::CpuKvCache> cache;
  std::vector<float> query;  // [n_heads, head_dim]
  std::unique_ptr<step03::CudaDecodeProblem> device;
};

Problem& problem(int kv_heads, int capacity) {
  static std::map<int, Problem> problems;
  Problem& p = problems[kv_heads];
  if (!p.cache) {
    llm::ModelConfig c;
    c.dim = kQueryHeads * kHeadDim;
    c.n_layers = 1;
    c.n_heads = kQueryHeads;
    c.n_kv_heads = kv_heads;
    c.seq_len = capacity;
    p.shape = {kQueryHeads, kv_heads, kHeadDim};
    p.cache = std::make_unique<llm::CpuKvCache>(c, 1, capacity);
    const llm::KvView view = p.cache->view(0, 0);
    llm::fill_uniform(view.keys, static_cast<std::size_t>(capacity) * c.kv_dim(), 1);
    llm::fill_uniform(view.values, static_cast<std::size_t>(capacity) * c.kv_dim(), 2);
    p.query.resize(static_cast<std::size_t>(kQueryHeads) * kHeadDim);
    llm::fill_uniform(p.query.data(), p.query.size(), 3);
    if (llm::cuda::device_status().usable)
      p.device = std::make_unique<step03::CudaDecodeProblem>(p.shape, view, capacity, p.query);
  }
  return p;
}

constexpr int kMaxContext = 16384;

void cpu_decode(benchmark::State& state, llm::cpu::DecodeAttentionFn fn, int kv_heads) {
  const int context = static_cast<int>(state.range(0));
  Problem& p = problem(kv_heads, kMaxContext);
  const llm::KvView view_array[1] = {p.cache->view(0, 0)};
  const int length_array[1] = {context};
  const std::span<const llm::KvView> views(view_array);  // [1] one sequence
  const std::span<const int> lengths(length_array);      // [1]
  std::vector<float> out(p.query.size());  // [n_heads, head_dim]
  for (auto _ : state) {
    fn(p.shape, p.query.data(), views, lengths, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  // Bytes of the cache this call must read.
  state.SetBytesProcessed(state.iterations() * 2LL * context * kv_heads * kHeadDim * 4);
}

void cuda_decode(benchmark::State& state, step03::CudaDecodeAttentionFn fn, int kv_heads) {
  const int context = static_cast<int>(state.range(0));
  Problem& p = problem(kv_heads, kMaxContext);
  for (auto _ : state) {
    const llm::TimingStats t = p.device->time(fn, context, 0, 1);
    state.SetIterationTime(t.median_ms / 1000.0);
  }
  state.SetBytesProcessed(state.iterations() * 2LL * context * kv_heads * kHeadDim * 4);
}

void register_all() {
  const bool gpu = llm::cuda::device_status().usable;
  for (const auto& v : step03::variants()) {
    for (const int kv : {32, 8, 4, 1}) {
      const std::string suffix = fmt::format("{}/q{}_kv{}", v.name, kQueryHeads, kv);
      benchmark::RegisterBenchmark(("step03/cpu/" + suffix).c_str(), cpu_decode, v.fn.cpu, kv)
          ->Arg(1024)->Arg(4096)->Arg(kMaxContext)->Unit(benchmark::kMillisecond);
      if (gpu)
        benchmark::RegisterBenchmark(("step03/cuda/" + suffix).c_str(), cuda_decode, v.fn.cuda, kv)
            ->Arg(1024)->Arg(4096)->Arg(kMaxContext)->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return llm::run_benchmarks(argc, argv, register_all); }
