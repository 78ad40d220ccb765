// Google Benchmark for step 05:
//   step05/block_manager/...   the bookkeeping: a sequence growing block by
//                              block and freed (the cost a scheduler pays per
//                              token), and a prefix-cache hit
//   step05/cpu/<layout>/...    one CPU decode-attention call, 32 query heads,
//                              8 KV heads, head_dim 128, over the same K/V
//                              contiguous or in shuffled blocks of 16
//   step05/memory_replay/...   part 1's replay of one policy
//   build/bin/step05_paged_attention_bench --benchmark_filter=block_manager
// Caches are not flushed between iterations (Google Benchmark times
// back-to-back calls); the executable's table is the flushed measurement.
#include <benchmark/benchmark.h>

#include "llm/harness/benchmark_main.hpp"

#include <memory>
#include <numeric>
#include <vector>

#include "llm/kv_cache.hpp"
#include "llm/harness/random_fill.hpp"
#include "step05_paged_attention/block_manager.hpp"
#include "step05_paged_attention/measure/memory_replay.hpp"
#include "step05_paged_attention/paged_attention.hpp"
#include "step05_paged_attention/measure/shuffled_kv_pool.hpp"

namespace {

// A sequence of `positions` grown one position at a time (a reserve per
// decode step, as the model calls it), then freed.
void grow_and_free(benchmark::State& state) {
  const int block_size = static_cast<int>(state.range(0));
  const int positions = 4096;
  step05::BlockManager blocks(positions / block_size + 1, block_size, 1, positions / block_size + 1);
  for (auto _ : state) {
    for (int end = 1; end <= positions; ++end) benchmark::DoNotOptimize(blocks.reserve(0, end - 1, end));
    blocks.free_sequence(0);
  }
  state.SetItemsProcessed(state.iterations() * positions);
}

// A 1024-token prompt whose first 1008 positions (63 blocks of 16) are cached.
void prefix_hit(benchmark::State& state) {
  const int block_size = 16;
  std::vector<int> prompt(1024);
  std::iota(prompt.begin(), prompt.end(), 3);
  step05::BlockManager blocks(256, block_size, 2, 64);
  blocks.reserve(0, 0, 1024);
  blocks.publish_full_blocks(0, prompt);
  for (auto _ : state) {
    benchmark::DoNotOptimize(blocks.share_cached_prefix(1, prompt, 1023));
    blocks.free_sequence(1);
  }
}

// One decode call over `context` positions of K/V, contiguous or paged.
struct DecodeProblem {
  llm::AttentionShape shape{32, 8, 128};
  std::unique_ptr<llm::CpuKvCache> contiguous;
  std::unique_ptr<step05::ShuffledKvPool> paged;
  std::vector<float> query, out;  // [n_heads, head_dim] each
};
DecodeProblem make_decode_problem(int context) {
  DecodeProblem p;
  const llm::ModelConfig config = step05::one_layer_config(p.shape, context);
  p.contiguous = std::make_unique<llm::CpuKvCache>(config, 1, context);
  const llm::KvView view = p.contiguous->view(0, 0);
  llm::fill_uniform(view.keys, static_cast<std::size_t>(context) * config.kv_dim(), 1);
  llm::fill_uniform(view.values, static_cast<std::size_t>(context) * config.kv_dim(), 2);
  p.paged = std::make_unique<step05::ShuffledKvPool>(std::span<const llm::KvView>(&view, 1), context, 16, 3);
  p.query.resize(static_cast<std::size_t>(p.shape.n_heads) * p.shape.head_dim);
  llm::fill_uniform(p.query.data(), p.query.size(), 4);
  p.out.resize(p.query.size());
  return p;
}

void decode(benchmark::State& state, bool paged) {
  const int context = static_cast<int>(state.range(0));
  DecodeProblem p = make_decode_problem(context);
  const llm::KvView view = paged ? p.paged->view(0) : p.contiguous->view(0, 0);
  for (auto _ : state) {
    step05::paged_decode_attention(p.shape, p.query.data(), std::span<const llm::KvView>(&view, 1),
                                   std::span<const int>(&context, 1), p.out.data());
    benchmark::ClobberMemory();
  }
  // K and V of every position: what the call must read.
  state.SetBytesProcessed(state.iterations() * 2LL * context * p.shape.n_kv_heads * p.shape.head_dim * 4);
}

void memory_replay(benchmark::State& state) {
  const step05::ModelDims model{"Llama-2-7B", 4096, 512 * 1024};
  step05::TraceOptions trace;
  trace.context = model.context;
  const auto requests = step05::make_request_trace(trace);
  const int block_size = static_cast<int>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(step05::replay_trace(requests, model, 8, block_size));
}

void register_benchmarks() {
  benchmark::RegisterBenchmark("step05/block_manager/grow_and_free", grow_and_free)->Arg(1)->Arg(16)->Arg(64);
  benchmark::RegisterBenchmark("step05/block_manager/prefix_hit", prefix_hit);
  for (const bool paged : {false, true})
    benchmark::RegisterBenchmark(paged ? "step05/cpu/paged_b16/decode" : "step05/cpu/contiguous/decode",
                                 [paged](benchmark::State& state) { decode(state, paged); })
        ->Arg(1024)
        ->Arg(4096)
        ->Arg(16384)
        ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("step05/memory_replay/llama2_7b", memory_replay)
      ->Arg(0)
      ->Arg(16)
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_benchmarks(argc, argv, register_benchmarks); }
