// Google Benchmark for step 01: the cost of producing ONE token at a given
// context length, with and without the KV cache, for every variant in the
// step's table (CPU; the CUDA model too when a device is present).
//   build/bin/step01_kv_cache_bench --benchmark_filter=kv_cache
// And the matrix-vector product that decode is made of, three ways, over the
// `small` preset's 58 MiB of matrices (docs/01_kv_cache.md, section 5.2):
//   build/bin/step01_kv_cache_bench --benchmark_filter=matvec
// On a GPU, the CUDA model's fp16 products alone, on TinyLlama's and
// Llama-2-7B's shapes, 1 to 64 rows, through each GEMV kernel and through
// cuBLAS: where the GEMV's time grows with its rows, and where cuBLAS
// overtakes it (docs/01_kv_cache.md, section 5.6):
//   build/bin/step01_kv_cache_bench --benchmark_filter=half_product
// And TinyLlama's 88 decode products of a token back to back in a CUDA
// graph, each kernel launched after the one before has finished or with
// programmatic dependent launch, with and without the GEMV's L2 prefetch of
// its first weights (docs/01_kv_cache.md, section 5.7), and with each
// product asking L2 for the next one's first weights (section 5.13):
//   build/bin/step01_kv_cache_bench --benchmark_filter=half_product_chain
#include <Eigen/Core>
#include <benchmark/benchmark.h>

#include <algorithm>

#include "llm/harness/benchmark_main.hpp"

#include "llm/cpu_model.hpp"
#include "llm/cuda/cuda_timer.hpp"
#include "llm/huge_page_allocator.hpp"
#include "llm/linear.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "step01_kv_cache/generation.hpp"
#if defined(LLM_WITH_CUDA)
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda_linear.hpp"  // CublasHandle
#include "cuda_stream.hpp"
#include "half_linear.hpp"
#include "programmatic_launch.cuh"  // OverlapLaunches (its host side)
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/device_buffer.hpp"
#endif

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

// Every matrix a decode step of the `small` preset multiplies (6 layers of
// wq wk wv wo w1 w2 w3, then the 32000 x 288 classifier), stored as `Storage`.
template <class Storage>
struct MatrixSet {
  struct Matrix {
    Storage weight;  // [out, in] row-major
    int out, in;
  };
  std::vector<Matrix> matrices;
  double bytes = 0;
  int widest_in = 0, widest_out = 0;  // the sizes x and y must hold

  MatrixSet() {
    const llm::ModelConfig c = llm::find_preset("small").config;
    const auto add = [&](int out, int in) {
      matrices.push_back({Storage(static_cast<std::size_t>(out) * in, 0.01f), out, in});
      bytes += static_cast<double>(out) * in * sizeof(float);
      widest_in = std::max(widest_in, in);
      widest_out = std::max(widest_out, out);
    };
    for (int l = 0; l < c.n_layers; ++l) {  // the shapes of llm/weights.hpp's LayerWeights
      add(c.dim, c.dim);                      // wq
      add(c.kv_dim(), c.dim);                 // wk
      add(c.kv_dim(), c.dim);                 // wv
      add(c.dim, c.dim);                      // wo
      add(c.hidden_dim, c.dim);               // w1
      add(c.dim, c.hidden_dim);               // w2
      add(c.hidden_dim, c.dim);               // w3
    }
    add(c.vocab_size, c.dim);
  }
};

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// y = W x for every matrix of the set. EigenGeneral: Eigen's matrix-vector
// product, which walks several rows of W side by side. Otherwise
// llm::matvec_row_by_row, DenseLinear's own decode product: one dot product
// per row, so W is read front to back as one stream (what llama2.c's matmul
// does too).
template <class Storage, bool EigenGeneral>
void matvec(benchmark::State& state) {
  static const MatrixSet<Storage> set;
  std::vector<float> x(static_cast<std::size_t>(set.widest_in), 1.0f), y(static_cast<std::size_t>(set.widest_out));
  for (auto _ : state) {
    for (const auto& m : set.matrices) {
      if constexpr (EigenGeneral) {
        const Eigen::Map<const RowMajor> w(m.weight.data(), m.out, m.in);
        Eigen::Map<Eigen::VectorXf>(y.data(), m.out).noalias() = w * Eigen::Map<const Eigen::VectorXf>(x.data(), m.in);
      } else {
        llm::matvec_row_by_row(m.weight.data(), m.out, m.in, x.data(), y.data());
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * set.bytes));
}

#if defined(LLM_WITH_CUDA)
// --- The fp16 products alone -------------------------------------------------

// One product of a decode layer (the fused shapes the CUDA model runs:
// llm/weights.hpp's matrices with CudaFusions on), or the classifier.
struct ProductShape {
  std::string name;  // e.g. "tinyllama-1.1b/qkv"
  int out = 0;
  int in = 0;
};
// A decode layer's four products, in the order a token runs them.
std::vector<ProductShape> layer_product_shapes(const llm::ModelConfig& c) {
  return {{"qkv", c.dim + 2 * c.kv_dim(), c.dim},
          {"wo", c.dim, c.dim},
          {"gate_up", 2 * c.hidden_dim, c.dim},
          {"w2", c.dim, c.hidden_dim}};
}
std::vector<ProductShape> product_shapes() {
  std::vector<ProductShape> shapes;
  for (const char* preset : {"tinyllama-1.1b", "llama2-7b"}) {
    const llm::ModelConfig c = llm::find_preset(preset).config;
    const std::string prefix = std::string(preset) + "/";
    for (ProductShape shape : layer_product_shapes(c)) {
      shape.name = prefix + shape.name;
      shapes.push_back(shape);
    }
    shapes.push_back({prefix + "classifier", c.vocab_size, c.dim});
  }
  return shapes;
}

// fp32 weights [shape.out, shape.in] whose values do not matter to a
// product's time (small, and finite in fp16).
std::vector<float> timing_weights(const ProductShape& shape) {
  std::vector<float> weight(static_cast<std::size_t>(shape.out) * static_cast<std::size_t>(shape.in));
  for (std::size_t i = 0; i < weight.size(); ++i) weight[i] = 0.001f * static_cast<float>(i % 17) - 0.008f;
  return weight;
}

// GemvCudaCoresSerialLoads: the CUDA-core GEMV with its weight loads not
// pipelined (HalfCudaLinear::set_pipelined_weight_loads(false)), the before
// row of that pipelining, at the row counts it applies to (1..4).
enum class ProductPath { GemvCudaCores, GemvCudaCoresSerialLoads, GemvTensorCores, Cublas };
const char* path_name(ProductPath path) {
  switch (path) {
    case ProductPath::GemvCudaCores: return "gemv_cuda_cores";
    case ProductPath::GemvCudaCoresSerialLoads: return "gemv_cuda_cores_serial_loads";
    case ProductPath::GemvTensorCores: return "gemv_tensor_cores";
    case ProductPath::Cublas: break;
  }
  return "cublas";
}

// The layer a benchmark multiplies by: one at a time on the device (the
// classifier of Llama-2-7B is 262 MB of fp16), made when a benchmark of
// another shape or kernel first asks, with fp16 weights whose values do not
// matter to the time.
llm::cuda::HalfCudaLinear& half_layer(const ProductShape& shape, llm::cuda::HalfGemvKernel kernel) {
  static llm::cuda::CublasHandle cublas;
  static std::string current_key;
  static std::unique_ptr<llm::cuda::HalfCudaLinear> current;
  const std::string key = shape.name + "/" + llm::cuda::to_string(kernel);
  if (key != current_key) {
    current.reset();  // free the previous layer before making the next
    current = std::make_unique<llm::cuda::HalfCudaLinear>(timing_weights(shape), shape.out, shape.in,
                                                          llm::cuda::HalfType::Float16,
                                                          std::make_shared<llm::cuda::HalfActivationScratch>(),
                                                          cublas.get(), kernel);
    current->reserve_rows(64);  // the largest row count below; grows the cuBLAS path's x scratch too
    current_key = key;
  }
  return *current;
}

// y [rows, out] = x [rows, in] . W^T for `rows` = state.range(0): one
// benchmark iteration is the median of 15 runs after 3 warm-ups, each timed
// with CUDA events after an L2 flush (the weights come from HBM, as in a
// model whose other layers evicted them). bytes_per_second counts the
// weights, the traffic that matters at decode.
void half_product(benchmark::State& state, const ProductShape& shape, ProductPath path) {
  const int rows = static_cast<int>(state.range(0));
  const auto kernel = path == ProductPath::GemvTensorCores ? llm::cuda::HalfGemvKernel::TensorCores
                                                           : llm::cuda::HalfGemvKernel::CudaCores;
  llm::cuda::HalfCudaLinear& layer = half_layer(shape, kernel);
  layer.set_pipelined_weight_loads(path != ProductPath::GemvCudaCoresSerialLoads);
  std::vector<float> x_host(static_cast<std::size_t>(rows) * static_cast<std::size_t>(shape.in), 0.5f);
  const llm::cuda::DeviceBuffer<float> x{std::span<const float>(x_host)};
  llm::cuda::DeviceBuffer<float> y(static_cast<std::size_t>(rows) * static_cast<std::size_t>(shape.out));
  const auto multiply = [&] {
    if (path == ProductPath::Cublas)
      layer.forward_with_cublas(x.data(), rows, y.data(), nullptr);
    else
      layer.forward(x.data(), rows, y.data(), nullptr);
  };
  for (auto _ : state)
    state.SetIterationTime(llm::cuda::time_cuda(multiply, /*warmup=*/3, /*runs=*/15).median_ms / 1e3);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(layer.weight_bytes()));
  state.counters["rows"] = rows;
}

void register_half_products() {
  for (const ProductShape& shape : product_shapes())
    // cuBLAS and the serial loads beside the CUDA-core GEMV: the three share
    // a layer (half_layer).
    for (const ProductPath path : {ProductPath::GemvCudaCores, ProductPath::GemvCudaCoresSerialLoads,
                                   ProductPath::Cublas, ProductPath::GemvTensorCores}) {
      const std::string name = std::string("step01/half_product/") + path_name(path) + "/" + shape.name;
      auto* bench = benchmark::RegisterBenchmark(name.c_str(), half_product, shape, path);
      // The GEMV's row buckets and speculative decoding's 9 rows; cuBLAS from
      // 1 row to a batch past the GEMV's 16; the serial loads where the
      // pipelined ones apply.
      const std::vector<int> rows = path == ProductPath::Cublas ? std::vector<int>{1, 2, 4, 8, 9, 16, 17, 32, 64}
                                    : path == ProductPath::GemvCudaCoresSerialLoads ? std::vector<int>{1, 2, 4}
                                                                                     : std::vector<int>{1, 2, 4, 8, 9, 16};
      for (const int r : rows) bench->Arg(r);
      bench->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
    }
}

// --- A token's products back to back ---------------------------------------

// TinyLlama-1.1B's decode products in the order a token runs them: per layer
// the fused QKV product, wo, gate/up and w2 (the CUDA model's fused shapes),
// for all 22 layers, one row, each reading the output of the one before (wo
// reads the QKV row's first dim values, w2 the gate/up row's first
// hidden_dim): 88 GEMV launches and the 87 boundaries between them, with no
// attention, norm or RoPE kernel in between. Each layer has weights of its
// own (2 GB in all), so the chain reads from HBM as a token does.
struct ProductChain {
  std::vector<std::unique_ptr<llm::cuda::HalfCudaLinear>> products;  // [n_layers * 4], in run order
  llm::cuda::DeviceBuffer<float> qkv, proj, gate_up, down;  // [q + 2 kv], [dim], [2 hidden], [dim]
  std::size_t weight_bytes = 0;
};
ProductChain& product_chain() {
  static ProductChain chain = [] {
    const llm::ModelConfig c = llm::find_preset("tinyllama-1.1b").config;
    static llm::cuda::CublasHandle cublas;
    const auto scratch = std::make_shared<llm::cuda::HalfActivationScratch>();
    const std::vector<ProductShape> shapes = layer_product_shapes(c);
    // One host copy per shape; every layer rounds its own device copy from it.
    std::vector<std::vector<float>> host_weights;
    for (const ProductShape& shape : shapes) host_weights.push_back(timing_weights(shape));
    ProductChain made;
    for (int layer = 0; layer < c.n_layers; ++layer)
      for (std::size_t p = 0; p < shapes.size(); ++p) {
        made.products.push_back(std::make_unique<llm::cuda::HalfCudaLinear>(
            host_weights[p], shapes[p].out, shapes[p].in, llm::cuda::HalfType::Float16, scratch, cublas.get()));
        made.products.back()->reserve_rows(1);
        made.weight_bytes += made.products.back()->weight_bytes();
      }
    made.qkv = llm::cuda::DeviceBuffer<float>(static_cast<std::size_t>(shapes[0].out));
    made.proj = llm::cuda::DeviceBuffer<float>(static_cast<std::size_t>(c.dim));
    made.gate_up = llm::cuda::DeviceBuffer<float>(static_cast<std::size_t>(shapes[2].out));
    const std::vector<float> first_input(static_cast<std::size_t>(c.dim), 0.5f);
    made.down = llm::cuda::DeviceBuffer<float>(std::span<const float>(first_input));
    return made;
  }();
  return chain;
}

// How the chain's launches may overlap: serially or with programmatic
// dependent launch (as the model launches the kernels after its first,
// programmatic_launch.cuh), whether each GEMV block asks L2 for its first
// weights before its wait (the model does unless --no-gemv-prefetch), and
// whether it requests its next batch of weights before it multiplies the
// current one (unless --no-gemv-pipelining). Off is a measurement only: the
// prefetch off separates what the overlap does from what the prefetch during
// the overlap does; the pipelining off is its before row. And whether each
// product asks L2 for the next one's first weights once its own are read
// (the model's --gemv-prefetch-next, off by default: this chain measures it
// between nothing but GEMVs).
struct ChainLaunches {
  bool programmatic = false;
  bool prefetch_first_weights = true;
  bool pipelined_weight_loads = true;
  bool prefetch_next_product = false;
};

// The chain's 88 launches on `stream`: the first as any launch, every later
// one programmatic when `launches.programmatic`.
void enqueue_product_chain(ProductChain& chain, ChainLaunches launches, cudaStream_t stream) {
  for (std::size_t p = 0; p < chain.products.size(); ++p) {
    llm::cuda::HalfCudaLinear& product = *chain.products[p];
    product.set_first_weights_prefetch(launches.prefetch_first_weights);
    product.set_pipelined_weight_loads(launches.pipelined_weight_loads);
    const bool has_next = p + 1 < chain.products.size();
    product.set_next_product_lines(launches.prefetch_next_product && has_next
                                       ? chain.products[p + 1]->first_weight_lines()
                                       : llm::cuda::FirstWeightLines{});
  }
  // Product p reads inputs[p % 4] and writes outputs[p % 4].
  const float* const inputs[4] = {chain.down.data(), chain.qkv.data(), chain.proj.data(), chain.gate_up.data()};
  float* const outputs[4] = {chain.qkv.data(), chain.proj.data(), chain.gate_up.data(), chain.down.data()};
  chain.products.front()->forward(inputs[0], 1, outputs[0], stream);
  const llm::cuda::OverlapLaunches overlap(launches.programmatic);
  for (std::size_t p = 1; p < chain.products.size(); ++p)
    chain.products[p]->forward(inputs[p % 4], 1, outputs[p % 4], stream);
}

// One benchmark iteration: the median of 15 replays of the chain's CUDA
// graph after 3 warm-ups, L2 flushed before each (time_cuda). The chain runs
// once eagerly first (CUDA loads a kernel's code at its first launch, which
// a capture may not do). bytes_per_second counts the weights.
void half_product_chain(benchmark::State& state, ChainLaunches launches) {
  ProductChain& chain = product_chain();
  const llm::cuda::CudaStream stream;
  enqueue_product_chain(chain, launches, stream.get());
  stream.synchronize();
  cudaGraph_t graph = nullptr;
  LLM_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  enqueue_product_chain(chain, launches, stream.get());
  LLM_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
  cudaGraphExec_t replay = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&replay, graph, 0);
  static_cast<void>(cudaGraphDestroy(graph));
  LLM_CUDA_CHECK(instantiated);
  const auto run = [&] { LLM_CUDA_CHECK(cudaGraphLaunch(replay, stream.get())); };
  for (auto _ : state)
    state.SetIterationTime(llm::cuda::time_cuda(run, /*warmup=*/3, /*runs=*/15).median_ms / 1e3);
  static_cast<void>(cudaGraphExecDestroy(replay));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(chain.weight_bytes));
  state.counters["launches"] = static_cast<double>(chain.products.size());
}

// Serial and programmatic launches, each as the model's kernels run (the
// GEMV's L2 prefetch and pipelined loads), without the prefetch (names
// ending _no_prefetch), without the pipelining (_no_pipelining), and with
// each product asking L2 for the next one's first weights (_prefetch_next).
void register_half_product_chains() {
  const ChainLaunches model_kernels;
  for (const auto& [suffix, loads] :
       {std::pair{"", model_kernels}, std::pair{"_no_prefetch", ChainLaunches{.prefetch_first_weights = false}},
        std::pair{"_no_pipelining", ChainLaunches{.pipelined_weight_loads = false}},
        std::pair{"_prefetch_next", ChainLaunches{.prefetch_next_product = true}}})
    for (const bool programmatic : {false, true}) {
      const std::string name = std::string("step01/half_product_chain/tinyllama-1.1b/") +
                               (programmatic ? "programmatic_launch" : "serial_launch") + suffix;
      ChainLaunches launches = loads;
      launches.programmatic = programmatic;
      benchmark::RegisterBenchmark(name.c_str(), half_product_chain, launches)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMicrosecond);
    }
}
#endif

void register_all() {
  benchmark::RegisterBenchmark("step01/matvec/eigen_general/4KiB_pages", matvec<std::vector<float>, true>)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("step01/matvec/one_row_at_a_time/4KiB_pages", matvec<std::vector<float>, false>)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("step01/matvec/one_row_at_a_time/huge_pages", matvec<llm::HugePageVector<float>, false>)
      ->Unit(benchmark::kMillisecond);

  static std::vector<std::unique_ptr<llm::Model>> models;
  models.push_back(std::make_unique<llm::CpuModel>(tiny_weights()));
  if (llm::cuda::device_status().usable) {
    models.push_back(llm::cuda::make_cuda_model(tiny_weights()));
#if defined(LLM_WITH_CUDA)
    register_half_products();
    register_half_product_chains();
#endif
  }
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
