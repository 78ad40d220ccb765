// Google Benchmark for step 01: the cost of producing ONE token at a given
// context length, with and without the KV cache, for every variant in the
// step's table (CPU; the CUDA model too when a device is present).
//   build/bin/step01_kv_cache_bench --benchmark_filter=kv_cache
#include <benchmark/benchmark.h>

#include "llm/harness/benchmark_main.hpp"

#include "llm/cpu_model.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "step01_kv_cache/generation.hpp"

namespace {

const llm::ModelWeights& tiny_weights() {
  static const llm::ModelWeights w = llm::random_weights(llm::find_preset("tiny").config, 42);
  return w;
}

// One new token after `context` tokens. recompute: a forward over all
// context+1 positions from an empty cache; kv_cache: the context is already
// cached, one single-row forward (and a truncate to undo it between runs).
void produce_one_token(benchmark::State& state, llm::Model* model, int variant_id) {
  const int context = static_cast<int>(state.range(0));
  std::vector<int> tokens(static_cast<std::size_t>(context) + 1);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(3 + (i * 37) % 250);
  auto cache = model->make_cache(1, context + 1);
  if (variant_id == 1) {
    model->forward(llm::TokenBatch::prefill(std::span(tokens).first(tokens.size() - 1), 0, 0), *cache);
  }
  const llm::TokenBatch all = llm::TokenBatch::prefill(tokens, 0, 0);
  const llm::TokenBatch last = llm::TokenBatch::single(tokens.back(), context, 0);
  for (auto _ : state) {
    if (variant_id == 0) {
      cache->clear();
      benchmark::DoNotOptimize(model->forward(all, *cache).data());
    } else {
      benchmark::DoNotOptimize(model->forward(last, *cache).data());
      cache->truncate(0, context);
    }
  }
  state.counters["context"] = context;
}

void register_all() {
  static std::vector<std::unique_ptr<llm::Model>> models;
  models.push_back(std::make_unique<llm::CpuModel>(tiny_weights()));
  if (llm::cuda::device_status().usable) models.push_back(llm::cuda::make_cuda_model(tiny_weights()));
  for (auto& model : models) {
    for (const auto& v : step01::variants()) {
      const std::string name = "step01/" + model->device_name() + "/" + v.name;
      benchmark::RegisterBenchmark(name.c_str(), produce_one_token, model.get(), v.id)
          ->Arg(16)->Arg(64)->Arg(256)->Arg(511)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return llm::run_benchmarks(argc, argv, register_all); }
