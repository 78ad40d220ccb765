// Google Benchmark for step 06, one benchmark per row of the variant table:
//   step06/cpu/<format>/<matrix>/rows:N   one product y = x W^T on the small
//                                         preset's matrices (stories15M dims)
//   step06/cpu/<format>/decode            one greedy decode token of the small
//                                         preset with those weights (RTN)
//   build/bin/step06_quantization_bench --benchmark_filter=decode
// Bytes processed are the weight bytes each call reads, so the "bytes_per_second"
// column is the weight bandwidth. Caches are not flushed between iterations
// (Google Benchmark times back-to-back calls); the step's table is the
// flushed measurement.
#include <benchmark/benchmark.h>

#include "llm/harness/benchmark_main.hpp"

#include <fmt/format.h>

#include <memory>
#include <vector>

#include "llm/config.hpp"
#include "llm/cpu_model.hpp"
#include "llm/token_batch.hpp"
#include "llm/weights.hpp"
#include "step06_quantization/cpu_quantized_linear.hpp"
#include "step06_quantization/quant_algorithms.hpp"
#include "step06_quantization/quantized_layers.hpp"
#include "step06_quantization/measure/weight_formats.hpp"

namespace {

const llm::ModelConfig& small_config() { return llm::find_preset("small").config; }

// The small preset's weights, built once for every benchmark.
const llm::ModelWeights& small_weights() {
  static const llm::ModelWeights weights = llm::random_weights(small_config(), 42);
  return weights;
}

// One product of `format` (nullopt: fp32) on `matrix` [out, in] with `rows` rows.
void product(benchmark::State& state, step06::WeightFormat format, const std::vector<float>& matrix,
             int out_features, int in_features) {
  const int rows = static_cast<int>(state.range(0));
  std::unique_ptr<llm::Linear> linear;
  if (format) {
    linear = std::make_unique<step06::QuantizedLinear>(
        step06::quantize_rtn({matrix, out_features, in_features}, *format));
  } else {
    linear = std::make_unique<llm::DenseLinear>(matrix, out_features, in_features);
  }
  std::vector<float> x(static_cast<std::size_t>(rows) * in_features, 0.5f);  // [rows, in]
  std::vector<float> y(static_cast<std::size_t>(rows) * out_features);      // [rows, out]
  for (auto _ : state) {
    linear->forward(x.data(), rows, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<long long>(linear->weight_bytes()));
}

// One decode token of the small preset (position 32 of a 64-position cache):
// the unchanged model with every Linear in `format`.
void decode_token(benchmark::State& state, step06::WeightFormat format) {
  step06::QuantizedLayers layers;
  if (format) {
    step06::ModelQuantization quantization;
    quantization.format = *format;
    layers = step06::quantize_layers(small_weights(), quantization, nullptr);
  }
  llm::CpuModelOptions options;
  options.linear_factory = step06::quantized_linear_factory(layers);
  llm::CpuModel model(small_weights(), options);
  auto cache = model.make_cache(1, 64);
  const std::vector<int> prompt(32, 1);
  model.forward(llm::TokenBatch::prefill(prompt, 0, 0), *cache);
  for (auto _ : state) {
    cache->truncate(0, 32);
    benchmark::DoNotOptimize(model.forward(llm::TokenBatch::single(5, 32, 0), *cache).data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<long long>(model.weight_bytes()));
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                      benchmark::Counter::kIsRate);
}

void register_benchmarks() {
  const llm::ModelConfig& config = small_config();
  struct Matrix {
    const char* name;
    const std::vector<float>* weight;  // [out_features, in_features]
    int out_features, in_features;
  };
  const Matrix matrices[] = {{"w1", &small_weights().layers[0].w1, config.hidden_dim, config.dim},
                             {"classifier", &small_weights().token_embedding, config.vocab_size, config.dim}};
  for (const auto& variant : step06::weight_formats()) {
    if (variant.backend == llm::Backend::Cuda) continue;  // the cuBLAS row is the CUDA kernel table's
    for (const Matrix& matrix : matrices)
      benchmark::RegisterBenchmark(fmt::format("step06/cpu/{}/{}", variant.name, matrix.name).c_str(),
                                   [format = variant.fn, matrix](benchmark::State& state) {
                                     product(state, format, *matrix.weight, matrix.out_features,
                                             matrix.in_features);
                                   })
          ->ArgName("rows")
          ->Arg(1)
          ->Arg(4)
          ->Arg(16);
    benchmark::RegisterBenchmark(fmt::format("step06/cpu/{}/decode", variant.name).c_str(),
                                 [format = variant.fn](benchmark::State& state) { decode_token(state, format); });
  }
}

}  // namespace

int main(int argc, char** argv) { return llm::run_benchmarks(argc, argv, register_benchmarks); }
