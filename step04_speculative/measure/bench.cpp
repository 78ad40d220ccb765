// Google Benchmark for step 04: the two costs the speedup formula is made of,
// on the tiny preset (CPU; the CUDA model too when a device is present):
//   verify/R   one target forward over R rows (logits for all): v(R-1) = this / verify/1
//   draft/...  one drafter step: an early-exit forward, or an n-gram lookup
//   build/bin/step04_speculative_bench --benchmark_filter=verify
#include <benchmark/benchmark.h>

#include "llm/harness/benchmark_main.hpp"

#include "llm/cpu_model.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "step04_speculative/early_exit_drafter.hpp"
#include "step04_speculative/ngram_drafter.hpp"

namespace {

constexpr int kContext = 128;  // committed tokens before the measured pass

const llm::ModelWeights& tiny_weights() {
  static const llm::ModelWeights w = llm::random_weights(llm::find_preset("tiny").config, 42);
  return w;
}

std::vector<int> context_tokens() {
  std::vector<int> tokens(kContext);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(3 + (i * 37) % 250);
  return tokens;
}

// A target pass over `rows` rows after kContext-1 cached positions (rows = 1:
// a plain decode step; rows = k+1: a verification pass).
void verify_pass(benchmark::State& state, llm::Model* model) {
  const int rows = static_cast<int>(state.range(0));
  const std::vector<int> context = context_tokens();
  auto cache = model->make_cache(1, kContext + rows);
  model->forward(llm::TokenBatch::prefill(std::vector<int>(context.begin(), context.end() - 1), 0, 0), *cache);
  llm::TokenBatch batch;  // [rows]
  for (int i = 0; i < rows; ++i) batch.add(context[static_cast<std::size_t>(i)], kContext - 1 + i, 0);
  for (auto _ : state) {
    benchmark::DoNotOptimize(model->forward(batch, *cache, llm::LogitsFor::AllRows).data());
    cache->truncate(0, kContext - 1);
  }
  state.counters["rows"] = rows;
}

void draft_step(benchmark::State& state, step04::Drafter* drafter) {
  const std::vector<int> context = context_tokens();
  const int k = drafter->one_step_per_token() ? 1 : 4;
  llm::Sampler rng(1, 1.0f, 0.0f, 7);
  step04::Draft draft;
  drafter->reset(kContext + k);
  drafter->propose(context, k, {}, rng, draft);
  for (auto _ : state) {
    drafter->propose(context, k, {}, rng, draft);
    benchmark::DoNotOptimize(draft.tokens.data());
  }
}

void register_all() {
  static std::vector<std::unique_ptr<llm::Model>> models;
  static std::vector<std::unique_ptr<step04::Drafter>> drafters;
  models.push_back(std::make_unique<llm::CpuModel>(tiny_weights()));
  if (llm::cuda::device_status().usable) models.push_back(llm::cuda::make_cuda_model(tiny_weights()));
  for (auto& model : models) {
    const std::string device = model->device_name();
    benchmark::RegisterBenchmark(("step04/" + device + "/verify").c_str(), verify_pass, model.get())
        ->DenseRange(1, 9)
        ->Unit(benchmark::kMicrosecond);
    const step04::ModelFactory factory = [device](const llm::ModelWeights& w) -> std::unique_ptr<llm::Model> {
      if (device == "cpu") return std::make_unique<llm::CpuModel>(w);
      return llm::cuda::make_cuda_model(w);
    };
    for (int layers = 1; layers < tiny_weights().config.n_layers; ++layers) {
      drafters.push_back(step04::make_early_exit_drafter(tiny_weights(), layers, factory));
      benchmark::RegisterBenchmark(("step04/" + device + "/draft/" + drafters.back()->name()).c_str(), draft_step,
                                   drafters.back().get())
          ->Unit(benchmark::kMicrosecond);
    }
  }
  drafters.push_back(std::make_unique<step04::NgramDrafter>(3, tiny_weights().config.vocab_size));
  benchmark::RegisterBenchmark("step04/cpu/draft/ngram(n=3)", draft_step, drafters.back().get())
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_benchmarks(argc, argv, register_all); }
