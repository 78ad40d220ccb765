// The CUDA fp32 baseline against the CPU reference: same logits (fp32
// tolerance) and the same greedy tokens, for prefill, decode, chunked prefill
// and mixed batches, on the tiny preset and on configs with awkward sizes.
// Every test skips with the reason where no GPU can be present (always in a
// CPU-only build) and fails where one is present but unusable
// (LLM_REQUIRE_CUDA_DEVICE, tests/test_support.hpp), except the device-status
// test, which checks that the status and device info are sane with or
// without a GPU.
//
// Only llm/cuda/cuda_runtime_api.hpp is used, so this file also compiles in a
// build without CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/cpu_model.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/device_info.hpp"
#include "llm/harness/model_on_device.hpp"  // compare_dtype
#include "llm/linear.hpp"
#include "llm/sampler.hpp"
#include "llm/tokenizer.hpp"
#include "llm/weights.hpp"
#include "test_support.hpp"
#if defined(LLM_WITH_CUDA)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_timer.hpp"
#include "cublas_beta_probe.hpp"
#include "cuda_model.hpp"  // common/cuda: CudaModel, graphs_captured
#include "half_linear.hpp"  // common/cuda: HalfCudaLinear, its next product's lines
#include "kernels.cuh"     // common/cuda: write_kv_rows
#include "llm/cuda/device_buffer.hpp"
#include "paged_kv_cache_double.hpp"
#endif

namespace llm {
namespace {

using ::llm::testing::random_tokens;

struct ConfigCase {
  std::string name;
  ModelConfig config;
};
// What GoogleTest prints for a parameter (instead of its bytes).
void PrintTo(const ConfigCase& c, std::ostream* os) { *os << c.name << " (" << c.config.describe() << ")"; }

std::vector<ConfigCase> config_cases() {
  return {
      // The default preset: GQA 8/4, head_dim 8.
      {"tiny", find_preset("tiny").config},
      // Nothing a multiple of a tile: GQA 6/2 (group 3), head_dim 16, hidden
      // 200, vocab 300, a separate classifier.
      {"odd", make_config(96, 200, 3, 6, 2, 300, 96, false)},
      // The largest head the kernels take (256), MQA (one KV head).
      {"head256_mqa", make_config(512, 72, 2, 2, 1, 64, 64, true)},
      // Plain multi-head attention (group 1), head_dim 16.
      {"mha", make_config(48, 100, 2, 3, 3, 130, 80, true)},
  };
}

// forward() returns a span valid until the next call: keep a copy.
std::vector<float> run(Model& model, const TokenBatch& batch, KvCache& cache,
                       LogitsFor which = LogitsFor::LastRowOfEachSequence) {
  const std::span<const float> logits = model.forward(batch, cache, which);
  return {logits.begin(), logits.end()};
}

// The last vocab-sized row's argmax.
int last_argmax(const std::vector<float>& logits, int vocab) {
  return argmax(std::span<const float>(logits).subspan(logits.size() - static_cast<std::size_t>(vocab)));
}

// ---------------------------------------------------------------------------
// No GPU needed.

TEST(CudaRuntime, DeviceStatusAndInfoNeverThrow) {
  cuda::DeviceStatus status;
  ASSERT_NO_THROW(status = cuda::device_status());
  DeviceInfo info;
  ASSERT_NO_THROW(cuda::fill_device_info(info));
  EXPECT_EQ(info.cuda_available, status.usable);
  if (!cuda::built_with_cuda()) {
    EXPECT_FALSE(status.usable);
    EXPECT_EQ(status.reason, "built without CUDA");
  }
  if (!status.usable) {
    EXPECT_FALSE(status.reason.empty()) << "an unusable device must say why";
    EXPECT_EQ(info.cuda_note, status.reason);
    EXPECT_THROW(cuda::make_cuda_model(random_weights(find_preset("tiny").config, 1)), DeviceError);
    std::cout << "[ info     ] CUDA not usable here: " << status.reason << "\n";
  } else {
    EXPECT_TRUE(status.reason.empty());
    EXPECT_FALSE(info.gpu_name.empty());
    EXPECT_GT(info.gpu_sm_count, 0);
    EXPECT_GE(info.gpu_compute_capability, 50);
    EXPECT_GT(info.gpu_memory_gib, 0.0);
    EXPECT_FALSE(info.cuda_runtime.empty());
    EXPECT_FALSE(info.cuda_driver.empty());
    std::cout << "[ info     ] " << info.gpu_name << ", " << info.gpu_sm_count << " SMs, sm_"
              << info.gpu_compute_capability << ", driver " << info.cuda_driver << ", runtime " << info.cuda_runtime
              << "\n";
  }
}

// ---------------------------------------------------------------------------
// CUDA against CPU, per config.

class CudaVsCpu : public ::testing::TestWithParam<ConfigCase> {};

// A 37-token prompt (logits of every row), then 20 greedy decode steps: every
// logits row within fp32 tolerance, the same greedy token at every step.
TEST_P(CudaVsCpu, PrefillThenDecodeMatchesCpu) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig& config = GetParam().config;
  const ModelWeights weights = random_weights(config, 20240601);
  CpuModel cpu(weights);
  const auto gpu = cuda::make_cuda_model(weights);
  EXPECT_EQ(gpu->device_name(), "cuda");
  const auto cpu_cache = cpu.make_cache(1, config.seq_len);
  const auto gpu_cache = gpu->make_cache(1, config.seq_len);
  const int vocab = config.vocab_size;

  const std::vector<int> prompt = random_tokens(37, vocab, 7);
  const TokenBatch prefill = TokenBatch::prefill(prompt, 0, 0);
  const auto ref = run(cpu, prefill, *cpu_cache, LogitsFor::AllRows);
  const auto got = run(*gpu, prefill, *gpu_cache, LogitsFor::AllRows);
  llm::testing::expect_logit_rows_close(got, ref, vocab, "prefill");
  EXPECT_EQ(gpu_cache->length(0), 37);

  int cpu_token = last_argmax(ref, vocab);
  ASSERT_EQ(last_argmax(got, vocab), cpu_token) << "greedy token after the prompt";
  for (int step = 0; step < 20; ++step) {
    const int pos = 37 + step;
    const auto ref_step = run(cpu, TokenBatch::single(cpu_token, pos, 0), *cpu_cache);
    const auto got_step = run(*gpu, TokenBatch::single(cpu_token, pos, 0), *gpu_cache);
    llm::testing::expect_logit_rows_close(got_step, ref_step, vocab, "decode step " + std::to_string(step));
    cpu_token = last_argmax(ref_step, vocab);
    ASSERT_EQ(last_argmax(got_step, vocab), cpu_token) << "greedy token at decode step " << step;
  }
}

// The prompt in chunks (queries with n_past > 0 and n_new > 1, as chunked
// prefill and speculative verification send), from a single token up.
TEST_P(CudaVsCpu, ChunkedPrefillMatchesCpu) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig& config = GetParam().config;
  const ModelWeights weights = random_weights(config, 99);
  CpuModel cpu(weights);
  const auto gpu = cuda::make_cuda_model(weights);
  const auto cpu_cache = cpu.make_cache(1, config.seq_len);
  const auto gpu_cache = gpu->make_cache(1, config.seq_len);
  const std::vector<int> prompt = random_tokens(40, config.vocab_size, 11);
  int start = 0;
  for (int chunk : {1, 2, 16, 21}) {  // 40 tokens: a sequence of length 1 first
    const std::vector<int> part(prompt.begin() + start, prompt.begin() + start + chunk);
    const TokenBatch batch = TokenBatch::prefill(part, start, 0);
    llm::testing::expect_logit_rows_close(run(*gpu, batch, *gpu_cache, LogitsFor::AllRows), run(cpu, batch, *cpu_cache, LogitsFor::AllRows),
                      config.vocab_size, "chunk at position " + std::to_string(start));
    start += chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaVsCpu, ::testing::ValuesIn(config_cases()),
                         [](const ::testing::TestParamInfo<ConfigCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------
// Half-precision weights (--dtype fp16 / bf16) against the fp32 CPU model.

struct HalfCase {
  cuda::WeightDtype dtype;
  DType tolerance_dtype;
};

class CudaHalfVsCpu : public ::testing::TestWithParam<ConfigCase> {};

// fp16 and bf16, each with its products of 1..16 rows on either GEMV kernel
// (the CUDA cores' fmaf or the tensor cores' mma); and fp16 with only its
// products of 1 row on the GEMV (--max-gemv-rows 1, the model's default:
// every forward of more rows runs cuBLAS, its norms, SwiGLU and adds folded
// into cuBLAS's path), once more with those as kernels of their own
// (--no-norm-folding). Graphs on.
std::vector<cuda::CudaRunOptions> half_runs_on_every_product_path() {
  std::vector<cuda::CudaRunOptions> runs;
  for (const cuda::HalfGemvKernel gemv : {cuda::HalfGemvKernel::CudaCores, cuda::HalfGemvKernel::TensorCores})
    for (const cuda::WeightDtype dtype : {cuda::WeightDtype::Float16, cuda::WeightDtype::BFloat16}) {
      cuda::CudaRunOptions run;
      run.dtype = dtype;
      run.gemv = gemv;
      run.max_gemv_rows = cuda::kMaxGemvRows;
      runs.push_back(run);
    }
  cuda::CudaRunOptions cublas_from_2_rows;  // the model's default
  cublas_from_2_rows.dtype = cuda::WeightDtype::Float16;
  cublas_from_2_rows.max_gemv_rows = 1;
  runs.push_back(cublas_from_2_rows);
  cuda::CudaRunOptions cublas_unfolded = cublas_from_2_rows;  // its before row: norms and adds as kernels
  cublas_unfolded.fold_norms = false;
  runs.push_back(cublas_unfolded);
  return runs;
}
// "fp16, GEMV on cuda-cores up to 16 rows": a run of the list, in a trace.
std::string half_run_name(const cuda::CudaRunOptions& run) {
  return cuda::to_string(run.dtype) + ", GEMV on " + cuda::to_string(run.gemv) + " up to " +
         std::to_string(run.max_gemv_rows) + " rows" + (run.fold_norms ? "" : ", norms and adds as kernels");
}

// The tokens are the CPU's (teacher-forced), so both models see the same
// inputs however the rounding falls: prefill logits, then 20 decode steps,
// every row within the dtype's model tolerance (compare.hpp).
TEST_P(CudaHalfVsCpu, LogitsWithinTheDtypeTolerance) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig& config = GetParam().config;
  const ModelWeights weights = random_weights(config, 20240601);
  CpuModel cpu(weights);
  const std::vector<int> prompt = random_tokens(37, config.vocab_size, 7);
  const auto cpu_cache = cpu.make_cache(1, config.seq_len);
  std::vector<float> reference = run(cpu, TokenBatch::prefill(prompt, 0, 0), *cpu_cache, LogitsFor::AllRows);
  std::vector<int> continuation;
  for (int step = 0; step < 20; ++step) {
    continuation.push_back(last_argmax(reference, config.vocab_size));
    const auto row = run(cpu, TokenBatch::single(continuation.back(), 37 + step, 0), *cpu_cache);
    reference.insert(reference.end(), row.begin(), row.end());
  }
  for (const HalfCase& half : {HalfCase{cuda::WeightDtype::Float16, DType::F16},
                               HalfCase{cuda::WeightDtype::BFloat16, DType::BF16}}) {
    SCOPED_TRACE(cuda::to_string(half.dtype));
    const auto gpu = cuda::make_cuda_model(weights, {half.dtype, true});
    const auto gpu_cache = gpu->make_cache(1, config.seq_len);
    std::vector<float> got = run(*gpu, TokenBatch::prefill(prompt, 0, 0), *gpu_cache, LogitsFor::AllRows);
    for (int step = 0; step < 20; ++step) {
      const auto row = run(*gpu, TokenBatch::single(continuation[static_cast<std::size_t>(step)], 37 + step, 0),
                           *gpu_cache);
      got.insert(got.end(), row.begin(), row.end());
    }
    const CompareResult check = compare(got, reference, model_logits_tolerance(half.tolerance_dtype));
    EXPECT_TRUE(check.ok) << "max_abs " << check.max_abs_err << ", max_rel " << check.max_rel_err << ", "
                          << check.over_tolerance << " over tolerance, " << check.nan_or_inf << " NaN/Inf";
  }
}

#if defined(LLM_WITH_CUDA)
// The weights the half-precision CUDA model computes with, on the host: every
// matrix rounded to `dtype` (round to nearest even, CUDA's own conversion);
// norms stay fp32, as on the GPU. A shared classifier becomes a separate,
// rounded one: the GPU model keeps an fp32 embedding table for the lookup and
// rounds only the classifier's copy.
float round_to(cuda::WeightDtype dtype, float value) {
  if (dtype == cuda::WeightDtype::Float16) return __half2float(__float2half_rn(value));
  if (dtype == cuda::WeightDtype::BFloat16) return __bfloat162float(__float2bfloat16_rn(value));
  return value;
}
ModelWeights with_rounded_matrices(const ModelWeights& weights, cuda::WeightDtype dtype) {
  ModelWeights rounded = weights;
  auto round_all = [dtype](std::vector<float>& matrix) {
    for (float& value : matrix) value = round_to(dtype, value);
  };
  for (LayerWeights& layer : rounded.layers)
    for (std::vector<float>* matrix : {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.w1, &layer.w2, &layer.w3})
      round_all(*matrix);
  if (rounded.config.shared_classifier) {
    rounded.config.shared_classifier = false;
    rounded.classifier = rounded.token_embedding;
  }
  round_all(rounded.classifier);
  return rounded;
}

// A CPU product that multiplies by x rounded to the half type, as both of
// HalfCudaLinear's paths do (the weights come in already rounded).
class RoundedInputLinear final : public Linear {
 public:
  RoundedInputLinear(const std::vector<float>& weight, int out, int in, cuda::WeightDtype dtype)
      : dense_(weight, out, in), dtype_(dtype) {}
  void forward(const float* x, int rows, float* y) const override {
    std::vector<float> rounded(x, x + static_cast<std::size_t>(rows) * dense_.in_features());
    for (float& value : rounded) value = round_to(dtype_, value);
    dense_.forward(rounded.data(), rows, y);
  }
  int in_features() const override { return dense_.in_features(); }
  int out_features() const override { return dense_.out_features(); }
  std::size_t weight_bytes() const override { return dense_.weight_bytes(); }

 private:
  DenseLinear dense_;
  cuda::WeightDtype dtype_;
};

// The CPU model computing what the half-precision CUDA model computes:
// rounded weights, and every product's x rounded to the same type.
CpuModel cpu_model_with_half_products(const ModelWeights& weights, cuda::WeightDtype dtype) {
  CpuModelOptions options;
  options.linear_factory = [dtype](const std::vector<float>& weight, int out, int in, const LinearSite&) {
    return std::make_unique<RoundedInputLinear>(weight, out, in, dtype);
  };
  return CpuModel(with_rounded_matrices(weights, dtype), options);
}

// compare.hpp's same_rounding_logits_tolerance for the weights' type.
Tolerance same_rounding_tolerance(cuda::WeightDtype dtype) {
  return same_rounding_logits_tolerance(compare_dtype(dtype));
}

// Logits within `tolerance`, row by row, with the worst error printed.
void expect_rows_within(const std::vector<float>& got, const std::vector<float>& ref, int vocab, Tolerance tolerance,
                        const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0.0;
  const auto row = static_cast<std::size_t>(vocab);
  for (std::size_t r = 0; r * row < got.size(); ++r) {
    const CompareResult result = compare(std::span<const float>(got).subspan(r * row, row),
                                         std::span<const float>(ref).subspan(r * row, row), tolerance);
    EXPECT_TRUE(result.ok) << what << ", logits row " << r << ": " << result.summary();
    worst = std::max(worst, result.max_abs_err);
  }
  std::cout << "[ info     ] " << what << ": max abs error " << worst << "\n";
}

// The implementation, apart from the precision: the CPU model on the same
// rounded weights, rounding each product's x as the GPU does. A 13-token
// prompt (the GEMV, or cuBLAS where max_gemv_rows is lower) and 10 decode
// steps (every product the GEMV), then a 37-row prefill (cuBLAS): the same
// tolerance on both paths.
TEST_P(CudaHalfVsCpu, MatchesTheCpuOnTheSameRoundedWeights) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig& config = GetParam().config;
  const ModelWeights weights = random_weights(config, 31337);
  for (const cuda::CudaRunOptions& half : half_runs_on_every_product_path()) {
    const cuda::WeightDtype dtype = half.dtype;
    SCOPED_TRACE(half_run_name(half));
    const Tolerance tolerance = same_rounding_tolerance(dtype);
    CpuModel cpu = cpu_model_with_half_products(weights, dtype);
    const auto gpu = cuda::make_cuda_model(weights, half);
    const auto cpu_cache = cpu.make_cache(2, config.seq_len);
    const auto gpu_cache = gpu->make_cache(2, config.seq_len);
    const std::vector<int> short_prompt = random_tokens(13, config.vocab_size, 3);
    const TokenBatch prefill = TokenBatch::prefill(short_prompt, 0, 0);
    const auto ref = run(cpu, prefill, *cpu_cache, LogitsFor::AllRows);
    expect_rows_within(run(*gpu, prefill, *gpu_cache, LogitsFor::AllRows), ref, config.vocab_size, tolerance,
                       13 <= half.max_gemv_rows ? "13-row prefill (GEMV)" : "13-row prefill (cuBLAS)");
    int token = last_argmax(ref, config.vocab_size);
    for (int pos = 13; pos < 23; ++pos) {
      const auto ref_step = run(cpu, TokenBatch::single(token, pos, 0), *cpu_cache);
      expect_rows_within(run(*gpu, TokenBatch::single(token, pos, 0), *gpu_cache), ref_step, config.vocab_size,
                         tolerance, "decode at " + std::to_string(pos) + " (GEMV)");
      token = last_argmax(ref_step, config.vocab_size);
    }
    const TokenBatch long_prefill = TokenBatch::prefill(random_tokens(37, config.vocab_size, 4), 0, 1);
    expect_rows_within(run(*gpu, long_prefill, *gpu_cache, LogitsFor::AllRows),
                       run(cpu, long_prefill, *cpu_cache, LogitsFor::AllRows), config.vocab_size, tolerance,
                       "37-row prefill (cuBLAS)");
  }
}

// What a serving engine (step 07) needs of the half model: a decode row gives
// the logits it gives alone (the GEMV's path) when it shares a forward with
// another sequence's 20-row prefill, 21 rows that go through cuBLAS. Both
// paths round x alike, so the two differ by the order of fp32 sums, which the
// next products' rounding to half can enlarge (same_rounding_tolerance), not
// by x's rounding itself; here the greedy token is the same.
TEST_P(CudaHalfVsCpu, ADecodeRowGivesItsSoloLogitsInAForwardOfManyRows) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig& config = GetParam().config;
  const ModelWeights weights = random_weights(config, 4242);
  const int vocab = config.vocab_size;
  const std::vector<int> cached = random_tokens(9, vocab, 5);    // sequence 1's prompt
  const std::vector<int> prefill = random_tokens(20, vocab, 6);  // sequence 0's, in the shared forward
  const int next = 11;                                           // sequence 1's decode token
  for (const cuda::CudaRunOptions& half : half_runs_on_every_product_path()) {
    const cuda::WeightDtype dtype = half.dtype;
    SCOPED_TRACE(half_run_name(half));
    const auto gpu = cuda::make_cuda_model(weights, half);
    const auto solo_cache = gpu->make_cache(2, config.seq_len);
    const auto shared_cache = gpu->make_cache(2, config.seq_len);
    for (KvCache* cache : {solo_cache.get(), shared_cache.get()}) run(*gpu, TokenBatch::prefill(cached, 0, 1), *cache);
    const auto solo = run(*gpu, TokenBatch::single(next, 9, 1), *solo_cache);
    TokenBatch shared = TokenBatch::prefill(prefill, 0, 0);
    shared.add(next, 9, 1);
    ASSERT_GT(shared.size(), cuda::kMaxGemvRows) << "the shared forward must take cuBLAS's path";
    const auto both = run(*gpu, shared, *shared_cache);  // last row of each sequence: 0's, then 1's
    const std::vector<float> shared_row(both.begin() + vocab, both.end());
    expect_rows_within(shared_row, solo, vocab, same_rounding_tolerance(dtype), "decode row, alone vs among 21");
    EXPECT_EQ(last_argmax(shared_row, vocab), last_argmax(solo, vocab));
  }
}

// CudaRunOptions::max_gemv_rows reaches every product of the command-line
// model (make_cuda_model, through cuda_linear_factory). With 1 (the
// default), a 5-row run gives the bits of a CudaModel whose factory was made
// for 1 row, and not those of the model with 16, whose GEMV adds the same
// products in another order than cuBLAS does; a single row runs the GEMV,
// norms folded, in both, and gives the same bits. The GEMV's L2 prefetch
// (CudaRunOptions::gemv_prefetch) changes no bit of either, nor do its
// pipelined weight loads (CudaRunOptions::gemv_pipelining) at 1 row and at 3
// (the 4-row bucket, the largest that pipelines).
TEST(CudaModel, MaxGemvRowsSendsLongerProductsToCublas) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig config = make_config(96, 200, 3, 6, 2, 300, 96, false);  // config_cases()'s "odd"
  const ModelWeights weights = random_weights(config, 77);
  cuda::CudaRunOptions gemv_up_to_1;
  gemv_up_to_1.dtype = cuda::WeightDtype::Float16;
  gemv_up_to_1.max_gemv_rows = 1;
  cuda::CudaRunOptions gemv_up_to_16 = gemv_up_to_1;
  gemv_up_to_16.max_gemv_rows = cuda::kMaxGemvRows;
  const auto routed = cuda::make_cuda_model(weights, gemv_up_to_1);
  const auto gemv = cuda::make_cuda_model(weights, gemv_up_to_16);
  cuda::CudaModelOptions spelled_out_options;  // what make_cuda_model builds for gemv_up_to_1
  spelled_out_options.linear_factory =
      cuda::cuda_linear_factory(cuda::WeightDtype::Float16, cuda::HalfGemvKernel::CudaCores, 1);
  spelled_out_options.fusions = cuda::CudaFusions::all();
  cuda::CudaModel spelled_out(weights, spelled_out_options);
  // Each forward on a fresh cache, every row's logits.
  const auto logits = [&config](Model& model, const TokenBatch& batch) {
    const auto cache = model.make_cache(1, config.seq_len);
    return run(model, batch, *cache, LogitsFor::AllRows);
  };
  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const std::vector<int> prompt = random_tokens(5, config.vocab_size, 8);
  const TokenBatch five_rows = TokenBatch::prefill(prompt, 0, 0);
  const std::vector<float> cublas_bits = logits(spelled_out, five_rows);
  EXPECT_TRUE(same_bits(logits(*routed, five_rows), cublas_bits))
      << "make_cuda_model with max_gemv_rows 1 did not run a 5-row forward as the model made for it";
  cuda::CudaRunOptions fp16_defaults;
  fp16_defaults.dtype = cuda::WeightDtype::Float16;
  EXPECT_TRUE(same_bits(logits(*cuda::make_cuda_model(weights, fp16_defaults), five_rows), cublas_bits))
      << "the default model's 5 rows did not run cuBLAS";
  const std::vector<float> gemv_bits = logits(*gemv, five_rows);
  EXPECT_FALSE(same_bits(gemv_bits, cublas_bits))
      << "the model with 16 gave the bits of cuBLAS's path for 5 rows: they did not run the GEMV";
  const TokenBatch one_row = TokenBatch::single(prompt.front(), 0, 0);
  EXPECT_TRUE(same_bits(logits(*routed, one_row), logits(*gemv, one_row))) << "a single row left the GEMV";

  cuda::CudaRunOptions gemv_without_prefetch = gemv_up_to_16;
  gemv_without_prefetch.gemv_prefetch = false;
  const auto without_prefetch = cuda::make_cuda_model(weights, gemv_without_prefetch);
  EXPECT_TRUE(same_bits(logits(*without_prefetch, five_rows), gemv_bits)) << "the prefetch changed the GEMV's bits";
  EXPECT_TRUE(same_bits(logits(*without_prefetch, one_row), logits(*gemv, one_row)));

  cuda::CudaRunOptions gemv_serial_loads = gemv_up_to_16;
  gemv_serial_loads.gemv_pipelining = false;
  const auto serial_loads = cuda::make_cuda_model(weights, gemv_serial_loads);
  const std::vector<int> three_tokens(prompt.begin(), prompt.begin() + 3);
  const TokenBatch three_rows = TokenBatch::prefill(three_tokens, 0, 0);
  EXPECT_TRUE(same_bits(logits(*serial_loads, one_row), logits(*gemv, one_row)))
      << "the pipelined loads changed a row's bits";
  EXPECT_TRUE(same_bits(logits(*serial_loads, three_rows), logits(*gemv, three_rows)))
      << "the pipelined loads changed the bits of 3 rows";
  EXPECT_TRUE(same_bits(logits(*serial_loads, five_rows), gemv_bits));
}
#endif

INSTANTIATE_TEST_SUITE_P(Configs, CudaHalfVsCpu, ::testing::ValuesIn(config_cases()),
                         [](const ::testing::TestParamInfo<ConfigCase>& info) { return info.param.name; });

// stories260K's greedy story from BOS with half weights: how far it stays the
// fp32 story (printed), and that where it leaves it, it does so at a near-tie
// of the fp32 logits (the two tokens within the dtype's logit tolerance), not
// by a wrong computation.
TEST(CudaStories260K, HalfPrecisionKeepsTheGreedyStoryUntilANearTie) {
  LLM_REQUIRE_CUDA_DEVICE();
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  const ModelWeights weights = load_checkpoint(model_path);
  const int vocab = weights.config.vocab_size;
  constexpr int kPositions = 256;
  CpuModel cpu(weights);
  for (const HalfCase& half : {HalfCase{cuda::WeightDtype::Float16, DType::F16},
                               HalfCase{cuda::WeightDtype::BFloat16, DType::BF16}}) {
    SCOPED_TRACE(cuda::to_string(half.dtype));
    const auto gpu = cuda::make_cuda_model(weights, {half.dtype, true});
    const auto cpu_cache = cpu.make_cache(1, kPositions);
    const auto gpu_cache = gpu->make_cache(1, kPositions);
    int token = Tokenizer::kBos;
    int kept = 0;
    for (int pos = 0; pos + 1 < kPositions; ++pos) {
      const auto ref = run(cpu, TokenBatch::single(token, pos, 0), *cpu_cache);
      const auto got = run(*gpu, TokenBatch::single(token, pos, 0), *gpu_cache);
      const int cpu_token = last_argmax(ref, vocab), gpu_token = last_argmax(got, vocab);
      if (cpu_token != gpu_token) {
        const Tolerance tolerance = model_logits_tolerance(half.tolerance_dtype);
        const double gap = ref[static_cast<std::size_t>(cpu_token)] - ref[static_cast<std::size_t>(gpu_token)];
        EXPECT_LE(gap, 2 * (tolerance.abs_tol + tolerance.rel_tol * std::abs(ref[static_cast<std::size_t>(cpu_token)])))
            << "at position " << pos << " the half model left the fp32 story by more than a near-tie";
        break;
      }
      ++kept;
      token = cpu_token;
    }
    std::cout << "[ info     ] " << cuda::to_string(half.dtype) << " weights keep " << kept << " of "
              << kPositions - 1 << " greedy tokens of stories260K's fp32 story\n";
  }
}


// ---------------------------------------------------------------------------
// Batches.

// Two sequences in one batch, one prefilling (10 rows) and one decoding (1
// row), in both orders: the same logits as running them one at a time, and
// as the CPU on the same mixed batch. Then one batched decode of both.
TEST(CudaModel, MixedBatchEqualsSeparateRuns) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig config = make_config(96, 200, 3, 6, 2, 300, 96, false);
  const ModelWeights weights = random_weights(config, 5);
  const int vocab = config.vocab_size;
  CpuModel cpu(weights);
  const auto gpu = cuda::make_cuda_model(weights);
  const std::vector<int> prompt0 = random_tokens(10, vocab, 1);  // sequence 0 prefills these
  const std::vector<int> prompt1 = random_tokens(6, vocab, 2);   // sequence 1 has these cached
  const int next1 = 17, next0 = 23, after1 = 42;

  // One at a time.
  const auto separate_cache = gpu->make_cache(2, 32);
  run(*gpu, TokenBatch::prefill(prompt1, 0, 1), *separate_cache);
  const auto seq0 = run(*gpu, TokenBatch::prefill(prompt0, 0, 0), *separate_cache, LogitsFor::AllRows);
  const auto seq1 = run(*gpu, TokenBatch::single(next1, 6, 1), *separate_cache);
  const auto seq0_next = run(*gpu, TokenBatch::single(next0, 10, 0), *separate_cache);
  const auto seq1_next = run(*gpu, TokenBatch::single(after1, 7, 1), *separate_cache);

  for (const bool decode_first : {false, true}) {
    SCOPED_TRACE(decode_first ? "decode row first" : "decode row last");
    TokenBatch mixed;
    if (decode_first) mixed.add(next1, 6, 1);
    for (int i = 0; i < 10; ++i) mixed.add(prompt0[static_cast<std::size_t>(i)], i, 0);
    if (!decode_first) mixed.add(next1, 6, 1);

    const auto gpu_cache = gpu->make_cache(2, 32);
    const auto cpu_cache = cpu.make_cache(2, 32);
    run(*gpu, TokenBatch::prefill(prompt1, 0, 1), *gpu_cache);
    run(cpu, TokenBatch::prefill(prompt1, 0, 1), *cpu_cache);
    const auto got = run(*gpu, mixed, *gpu_cache, LogitsFor::AllRows);
    llm::testing::expect_logit_rows_close(got, run(cpu, mixed, *cpu_cache, LogitsFor::AllRows), vocab, "mixed batch vs CPU");

    // Rows of sequence 0 and the row of sequence 1, in batch order.
    std::vector<float> expected;
    if (decode_first) expected.insert(expected.end(), seq1.begin(), seq1.end());
    expected.insert(expected.end(), seq0.begin(), seq0.end());
    if (!decode_first) expected.insert(expected.end(), seq1.begin(), seq1.end());
    llm::testing::expect_logit_rows_close(got, expected, vocab, "mixed batch vs separate runs");
    EXPECT_EQ(gpu_cache->length(0), 10);
    EXPECT_EQ(gpu_cache->length(1), 7);

    // Batched decode of both sequences (sequence 1 first).
    TokenBatch decode;
    decode.add(after1, 7, 1);
    decode.add(next0, 10, 0);
    const auto both = run(*gpu, decode, *gpu_cache);
    std::vector<float> both_expected(seq1_next);
    both_expected.insert(both_expected.end(), seq0_next.begin(), seq0_next.end());
    llm::testing::expect_logit_rows_close(both, both_expected, vocab, "batched decode vs separate runs");
    llm::testing::expect_logit_rows_close(both, run(cpu, decode, *cpu_cache), vocab, "batched decode vs CPU");
  }
}

// Contexts longer than the attention kernels' 128 threads per block (each
// thread then scores several keys; the other tests stay under 100 keys), and
// two prefill runs plus a decode row in one batch (the prefill launches share
// the workspace one after the other): the same logits as the CPU.
TEST(CudaModel, LongContextsAndTwoPrefillRunsMatchCpu) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig config = find_preset("tiny").config;  // seq_len 512
  const ModelWeights weights = random_weights(config, 31);
  const int vocab = config.vocab_size;
  CpuModel cpu(weights);
  const auto gpu = cuda::make_cuda_model(weights);
  const auto cpu_cache = cpu.make_cache(3, 400);
  const auto gpu_cache = gpu->make_cache(3, 400);

  // Sequence 0 prefills 300 tokens (its last query sees 300 keys), sequence 1
  // prefills 20, sequence 2 decodes its first token.
  TokenBatch mixed = TokenBatch::prefill(random_tokens(300, vocab, 12), 0, 0);
  const std::vector<int> prompt1 = random_tokens(20, vocab, 13);
  for (int i = 0; i < 20; ++i) mixed.add(prompt1[static_cast<std::size_t>(i)], i, 1);
  mixed.add(5, 0, 2);
  llm::testing::expect_logit_rows_close(run(*gpu, mixed, *gpu_cache, LogitsFor::AllRows),
                                        run(cpu, mixed, *cpu_cache, LogitsFor::AllRows), vocab,
                                        "two prefill runs and a decode row");

  // Batched decode of all three, the longest over 301..303 keys.
  for (int step = 0; step < 3; ++step) {
    TokenBatch decode;
    decode.add(7 + step, 300 + step, 0);
    decode.add(11 + step, 20 + step, 1);
    decode.add(13 + step, 1 + step, 2);
    llm::testing::expect_logit_rows_close(run(*gpu, decode, *gpu_cache), run(cpu, decode, *cpu_cache), vocab,
                                          "batched decode step " + std::to_string(step));
  }
}

// ---------------------------------------------------------------------------
// Errors read the same as on the CPU.

TEST(CudaModel, BadInputsThrowLikeCpu) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig config = find_preset("tiny").config;
  const ModelWeights weights = random_weights(config, 3);
  CpuModel cpu(weights);
  const auto gpu = cuda::make_cuda_model(weights);
  const auto gpu_cache = gpu->make_cache(1, 8);
  const auto cpu_cache = cpu.make_cache(1, 8);

  EXPECT_THROW(gpu->forward(TokenBatch::single(config.vocab_size, 0, 0), *gpu_cache), InputError);
  EXPECT_THROW(gpu->forward(TokenBatch::single(-1, 0, 0), *gpu_cache), InputError);
  try {
    gpu->forward(TokenBatch::single(config.vocab_size, 0, 0), *gpu_cache);
  } catch (const InputError& gpu_error) {
    try {
      cpu.forward(TokenBatch::single(config.vocab_size, 0, 0), *cpu_cache);
    } catch (const InputError& cpu_error) {
      EXPECT_STREQ(gpu_error.what(), cpu_error.what());
    }
  }
  // A CPU cache is not a CUDA cache, and a CUDA cache of another shape does not fit.
  EXPECT_THROW(gpu->forward(TokenBatch::single(1, 0, 0), *cpu_cache), InputError);
  const auto other = cuda::make_cuda_model(random_weights(make_config(96, 200, 3, 6, 2, 300, 96, false), 1));
  EXPECT_THROW(gpu->forward(TokenBatch::single(1, 0, 0), *other->make_cache(1, 8)), InputError);
  // A gap after the cached prefix.
  EXPECT_THROW(gpu->forward(TokenBatch::single(1, 3, 0), *gpu_cache), InputError);

  // The cache holds 8 positions: a 10-token prompt does not fit...
  EXPECT_THROW(gpu->forward(TokenBatch::prefill(random_tokens(10, config.vocab_size, 4), 0, 0), *gpu_cache),
               KvCacheFullError);
  EXPECT_EQ(gpu_cache->length(0), 0) << "a rejected batch must not touch the cache";
  // ...8 do, and the 9th token does not.
  EXPECT_NO_THROW(gpu->forward(TokenBatch::prefill(random_tokens(8, config.vocab_size, 4), 0, 0), *gpu_cache));
  EXPECT_THROW(gpu->forward(TokenBatch::single(1, 8, 0), *gpu_cache), KvCacheFullError);
  EXPECT_EQ(gpu_cache->length(0), 8);
}

#if defined(LLM_WITH_CUDA)
TEST(CudaTimer, TimesAForward) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig config = find_preset("tiny").config;
  const auto gpu = cuda::make_cuda_model(random_weights(config, 8));
  const auto cache = gpu->make_cache(1, config.seq_len);
  const TokenBatch prompt = TokenBatch::prefill(random_tokens(64, config.vocab_size, 9), 0, 0);
  const TimingStats stats = cuda::time_cuda(
      [&] {
        cache->clear();
        gpu->forward(prompt, *cache);
      },
      /*warmup=*/2, /*runs=*/5, /*flush_l2=*/true);
  EXPECT_EQ(stats.runs, 5);
  EXPECT_GT(stats.min_ms, 0.0);
  EXPECT_LE(stats.min_ms, stats.median_ms);
  EXPECT_LE(stats.median_ms, stats.max_ms);
}
#endif

// ---------------------------------------------------------------------------
// The real checkpoint: greedy generation from BOS reproduces llama2.c's run.c
// token ids (the same list as common_smoke_test.cpp) on the GPU too.

const std::vector<int> kRunCGreedyIds = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
    401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
    328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267,
    337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};

TEST(CudaStories260K, GreedyFromBosMatchesLlama2c) {
  LLM_REQUIRE_CUDA_DEVICE();
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  const ModelWeights weights = load_checkpoint(model_path);
  CpuModel cpu(weights);
  const auto gpu = cuda::make_cuda_model(weights);
  const auto cpu_cache = cpu.make_cache(1, weights.config.seq_len);
  const auto gpu_cache = gpu->make_cache(1, weights.config.seq_len);
  const int vocab = weights.config.vocab_size;
  int token = Tokenizer::kBos;
  std::vector<int> generated;
  for (int pos = 0; pos < static_cast<int>(kRunCGreedyIds.size()); ++pos) {
    const auto got = run(*gpu, TokenBatch::single(token, pos, 0), *gpu_cache);
    llm::testing::expect_logit_rows_close(got, run(cpu, TokenBatch::single(token, pos, 0), *cpu_cache), vocab,
                      "position " + std::to_string(pos));
    token = last_argmax(got, vocab);
    generated.push_back(token);
  }
  EXPECT_EQ(generated, kRunCGreedyIds);
}

#if defined(LLM_WITH_CUDA)
// The paged test double (paged_kv_cache_double.hpp) with its pools in GPU
// memory: prepare() uploads the block tables the host bookkeeping changed.
class PagedCudaKvCacheDouble final : public testing::PagedKvCacheBookkeeping {
 public:
  PagedCudaKvCacheDouble(const ModelConfig& config, int num_sequences, int n_blocks, int block_size,
                         KvElement element)
      : PagedKvCacheBookkeeping(config, num_sequences, n_blocks, block_size, element) {
    if (element == KvElement::Float32) {
      keys_.ensure(floats_per_pool());
      values_.ensure(floats_per_pool());
    } else {
      keys_int8_.ensure(floats_per_pool());
      values_int8_.ensure(floats_per_pool());
      key_scales_.ensure(scales_per_pool());
      value_scales_.ensure(scales_per_pool());
    }
    tables_.ensure(host_tables().size());
  }
  std::string device_name() const override { return "cuda"; }
  void prepare() override {
    if (take_tables_changed()) tables_.upload(host_tables());
  }
  // The int8 key pool and its scales, copied to the host (int8 caches only).
  std::vector<std::int8_t> download_keys_int8() const {
    std::vector<std::int8_t> host(keys_int8_.size());
    keys_int8_.download(host);
    return host;
  }
  std::vector<float> download_key_scales() const {
    std::vector<float> host(key_scales_.size());
    key_scales_.download(host);
    return host;
  }
  KvView view(int layer, int sequence) const override {
    auto* self = const_cast<PagedCudaKvCacheDouble*>(this);
    return make_view(self->keys_.data(), self->values_.data(), self->keys_int8_.data(), self->values_int8_.data(),
                     self->key_scales_.data(), self->value_scales_.data(), tables_.data(), layer, sequence);
  }

 private:
  void copy_row(int, std::size_t, std::size_t) override {
    throw InputError("the CUDA paged double does not copy prefixes (the CPU double's tests cover adopt_prefix)");
  }
  cuda::DeviceBuffer<float> keys_, values_;                // fp32 pools [n_layers, n_blocks * block_size, kv_dim]
  cuda::DeviceBuffer<std::int8_t> keys_int8_, values_int8_;  // int8 pools, same shape
  cuda::DeviceBuffer<float> key_scales_, value_scales_;    // [n_layers, n_blocks * block_size, n_kv_heads]
  cuda::DeviceBuffer<std::int32_t> tables_;                // device copy of the block tables
};
#endif

#if defined(LLM_WITH_CUDA)
// Logits of a teacher-forced generation: the prompt in one prefill, then each
// token of `continuation` as one decode row. [1 + continuation.size(), vocab]
std::vector<float> teacher_forced_logits(Model& model, KvCache& cache, const std::vector<int>& prompt,
                                         const std::vector<int>& continuation) {
  std::vector<float> logits = run(model, TokenBatch::prefill(prompt, 0, 0), cache);
  int position = static_cast<int>(prompt.size());
  for (int token : continuation) {
    const std::vector<float> row = run(model, TokenBatch::single(token, position++, 0), cache);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}
#endif

// The KV cache hook on the GPU: a paged cache the CudaModel does not know.
// fp32 rows are exact: the contiguous cache's greedy tokens. int8 rows are
// lossy, so the check is the CPU's int8 cache (below). Not the greedy
// tokens: this prompt's second token wins by 0.07 logits with fp32 rows and
// by 0.015 with int8 rows on the CPU, a near-tie the GPU's int8 rows may flip
// (on an H100 they did, and generation took another path from there).
TEST(CudaKvCacheHook, PagedCacheGeneratesTheContiguousTokensAndInt8MatchesTheCpu) {
  LLM_REQUIRE_CUDA_DEVICE();
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
#if defined(LLM_WITH_CUDA)
  const ModelWeights weights = load_checkpoint(model_path);
  const auto gpu = cuda::make_cuda_model(weights);
  const std::vector<int> prompt = {1, 403, 407, 261, 378, 271, 394, 261, 425, 280, 302};
  constexpr int kPositions = 96;  // crosses many 8-position blocks
  auto contiguous = gpu->make_cache(1, kPositions);
  const std::vector<int> expected = testing::greedy_tokens(*gpu, *contiguous, prompt, kPositions);

  PagedCudaKvCacheDouble paged(gpu->config(), 1, 16, 8, KvElement::Float32);
  EXPECT_EQ(testing::greedy_tokens(*gpu, paged, prompt, kPositions), expected);

  // int8 rows: the same tokens fed to the GPU model with the int8 cache and
  // to the CPU model with the CPU's int8 cache. Both quantize with the same
  // host code (store_int8_head; KvCacheInt8.GpuQuantizesLikeTheHost shows
  // identical inputs give identical codes), but the inputs are not
  // identical: K and V come out of sums in another order, and a value that
  // lands within an ulp of a rounding boundary gets the neighbouring code.
  // Layer 0's K depends only on the token, so there the codes differ by at
  // most one step; deeper layers read attention over the flipped codes, and
  // the difference grows with depth and position. So the logits are allowed
  // the fp16 tolerance plus twice the error int8 rows themselves add
  // (measured on the CPU on the same tokens): a flipped code moves a value by
  // one quantization step, the size of the int8 error itself.
  CpuModel cpu(weights);
  testing::PagedCpuKvCacheDouble cpu_int8(cpu.config(), 1, 16, 8, KvElement::Int8);
  PagedCudaKvCacheDouble gpu_int8(gpu->config(), 1, 16, 8, KvElement::Int8);
  const std::vector<int> continuation(expected.begin(), expected.end() - 1);  // the last token is never fed
  const std::vector<float> cpu_int8_logits = teacher_forced_logits(cpu, cpu_int8, prompt, continuation);
  const auto cpu_fp32_cache = cpu.make_cache(1, kPositions);
  const CompareResult int8_error =
      compare(cpu_int8_logits, teacher_forced_logits(cpu, *cpu_fp32_cache, prompt, continuation), Tolerance{0, 0});
  Tolerance allowance = model_logits_tolerance(DType::F16);
  allowance.abs_tol += 2 * int8_error.max_abs_err;
  const CompareResult check =
      compare(teacher_forced_logits(*gpu, gpu_int8, prompt, continuation), cpu_int8_logits, allowance);
  EXPECT_TRUE(check.ok) << "int8 rows: max_abs " << check.max_abs_err << " (allowed " << allowance.abs_tol
                        << " + relative), " << check.over_tolerance << " over, " << check.nan_or_inf << " NaN/Inf";
  EXPECT_EQ(gpu_int8.length(0), kPositions - 1);
  std::cout << "[ info     ] int8 rows: GPU vs CPU max_abs " << check.max_abs_err << "; int8 vs fp32 on the CPU "
            << int8_error.max_abs_err << "\n";

  // The codes, layer by layer (the pools have the same block tables).
  const std::vector<std::int8_t> gpu_codes = gpu_int8.download_keys_int8();
  const int kv_dim = gpu->config().kv_dim();
  // Pool: codes [n_layers, rows_per_layer, kv_dim].
  const std::size_t rows_per_layer = gpu_codes.size() / static_cast<std::size_t>(gpu->config().n_layers) / kv_dim;
  for (int layer = 0; layer < gpu->config().n_layers; ++layer) {
    const KvView cpu_view = cpu_int8.view(layer, 0);
    std::size_t differing = 0;
    int max_difference = 0;
    for (int pos = 0; pos < gpu_int8.length(0); ++pos) {
      const std::int8_t* gpu_row = gpu_codes.data() + (static_cast<std::size_t>(layer) * rows_per_layer +
                                                       cpu_view.row_index(pos)) * static_cast<std::size_t>(kv_dim);
      for (int i = 0; i < kv_dim; ++i) {
        const int difference = std::abs(static_cast<int>(cpu_view.key_row_int8(pos)[i]) - static_cast<int>(gpu_row[i]));
        differing += difference != 0;
        max_difference = std::max(max_difference, difference);
      }
    }
    std::cout << "[ info     ] layer " << layer << ": " << differing << " of " << gpu_int8.length(0) * kv_dim
              << " int8 K codes differ, at most " << max_difference << " apart\n";
    if (layer == 0) EXPECT_LE(max_difference, 1) << "layer 0's K depends on the token alone";
  }

  // Out of blocks: a KvCacheFullError before anything is written.
  PagedCudaKvCacheDouble small(gpu->config(), 1, 1, 8, KvElement::Float32);
  EXPECT_THROW(gpu->forward(TokenBatch::prefill(prompt, 0, 0), small), KvCacheFullError);
  EXPECT_EQ(small.length(0), 0);
#endif
}

#if defined(LLM_WITH_CUDA)
// ---------------------------------------------------------------------------
// Fusions: each switch alone, none, and all, against the CPU (fp32
// tolerance), on a prefill, a chunk and decode steps, with an fp32 and an
// int8 cache (the fused RoPE + K/V append hands int8 rows to the quantizer).
TEST(CudaFusions, EachFusionMatchesTheCpu) {
  LLM_REQUIRE_CUDA_DEVICE();
  struct Switch {
    std::string name;
    cuda::CudaFusions fusions;
  };
  std::vector<Switch> switches = {{"none", cuda::CudaFusions::none()}, {"all", cuda::CudaFusions::all()}};
  // (norm_in_product needs products that fold: with these fp32 layers it
  // changes nothing. CudaFusions.NormInProductGivesTheUnfoldedBits runs it
  // on half weights.)
  for (int which = 0; which < 4; ++which) {
    cuda::CudaFusions one = cuda::CudaFusions::none();
    bool* flags[] = {&one.qkv_product, &one.gate_up_product, &one.residual_norm, &one.rope_kv_write};
    *flags[which] = true;
    switches.push_back({std::vector<std::string>{"qkv_product", "gate_up_product", "residual_norm",
                                                 "rope_kv_write"}[static_cast<std::size_t>(which)],
                        one});
  }
  for (const ConfigCase& config_case : config_cases()) {
    const ModelConfig& config = config_case.config;
    const ModelWeights weights = random_weights(config, 777);
    CpuModel cpu(weights);
    const std::vector<int> prompt = random_tokens(23, config.vocab_size, 5);
    for (const Switch& fusion : switches) {
      SCOPED_TRACE(config_case.name + ", fusions " + fusion.name);
      cuda::CudaModelOptions options;
      options.fusions = fusion.fusions;
      cuda::CudaModel gpu(weights, options);
      const auto cpu_cache = cpu.make_cache(1, config.seq_len);
      const auto gpu_cache = gpu.make_cache(1, config.seq_len);
      const TokenBatch first = TokenBatch::prefill(std::span<const int>(prompt).first(15), 0, 0);
      const TokenBatch chunk = TokenBatch::prefill(std::span<const int>(prompt).subspan(15), 15, 0);
      for (const TokenBatch* batch : {&first, &chunk})
        llm::testing::expect_logit_rows_close(run(gpu, *batch, *gpu_cache, LogitsFor::AllRows),
                                              run(cpu, *batch, *cpu_cache, LogitsFor::AllRows), config.vocab_size,
                                              "prefill");
      int token = 3;
      for (int pos = 23; pos < 30; ++pos) {
        const auto ref = run(cpu, TokenBatch::single(token, pos, 0), *cpu_cache);
        llm::testing::expect_logit_rows_close(run(gpu, TokenBatch::single(token, pos, 0), *gpu_cache), ref,
                                              config.vocab_size, "decode at " + std::to_string(pos));
        token = last_argmax(ref, config.vocab_size);
      }
      // int8 K/V rows: the same tokens through the CPU's int8 cache.
      testing::PagedCpuKvCacheDouble cpu_int8(config, 1, 8, 8, KvElement::Int8);
      PagedCudaKvCacheDouble gpu_int8(config, 1, 8, 8, KvElement::Int8);
      const TokenBatch all = TokenBatch::prefill(prompt, 0, 0);
      const CompareResult check = compare(run(gpu, all, gpu_int8, LogitsFor::AllRows),
                                          run(cpu, all, cpu_int8, LogitsFor::AllRows), model_logits_tolerance(DType::F16));
      EXPECT_TRUE(check.ok) << "int8 rows: max_rel " << check.max_rel_err << ", " << check.over_tolerance
                            << " over the fp16 tolerance";
    }
  }
}

// ---------------------------------------------------------------------------
// The forwards two CUDA models are compared on, in order, on caches of
// kForwardPathSequences sequences: a 35-token prompt as a 15-row run (a
// short run: the half GEMV where it takes 16 rows) and a 20-row chunk (a
// prefill: cuBLAS), 10 decode steps (the first of a graph key runs eagerly, the rest
// replay graphs), then prompts for sequences 1 and 2 and 4 steps of the
// three decoding together. `forward(batch, which, what)` runs both models on
// `batch`, checks them, and returns the logits it checked.
constexpr int kForwardPathSequences = 3;
template <class Forward>
void run_every_forward_path(const ModelConfig& config, Forward&& forward) {
  const std::vector<int> prompt = random_tokens(35, config.vocab_size, 12);
  forward(TokenBatch::prefill(std::span<const int>(prompt).first(15), 0, 0), LogitsFor::AllRows, "15-row run");
  std::vector<float> last = forward(TokenBatch::prefill(std::span<const int>(prompt).subspan(15), 15, 0),
                                    LogitsFor::AllRows, "20-row chunk");
  int token = last_argmax(last, config.vocab_size);
  for (int pos = 35; pos < 45; ++pos) {
    last = forward(TokenBatch::single(token, pos, 0), LogitsFor::LastRowOfEachSequence,
                   "decode at " + std::to_string(pos));
    token = last_argmax(last, config.vocab_size);
  }
  for (int s = 1; s < kForwardPathSequences; ++s)
    forward(TokenBatch::prefill(random_tokens(4 + s, config.vocab_size, 20 + s), 0, s),
            LogitsFor::LastRowOfEachSequence, "prompt of sequence " + std::to_string(s));
  for (int step = 0; step < 4; ++step) {
    TokenBatch batch;
    for (int s = 0; s < kForwardPathSequences; ++s)
      batch.add((token + s * 7 + step) % config.vocab_size, s == 0 ? 45 + step : 4 + s + step, s);
    forward(batch, LogitsFor::LastRowOfEachSequence, "batch of 3, step " + std::to_string(step));
  }
}

// Two CUDA models of the same weights that differ only where no bit may
// move (`difference` says where, for the message): on every forward path,
// each on a cache of its own, the same logits to the bit.
void expect_the_same_bits_on_every_path(cuda::CudaModel& want_model, cuda::CudaModel& got_model,
                                        const ModelConfig& config, const std::string& difference) {
  const auto want_cache = want_model.make_cache(kForwardPathSequences, config.seq_len);
  const auto got_cache = got_model.make_cache(kForwardPathSequences, config.seq_len);
  run_every_forward_path(config, [&](const TokenBatch& batch, LogitsFor which, const std::string& what) {
    const std::vector<float> want = run(want_model, batch, *want_cache, which);
    const std::vector<float> got = run(got_model, batch, *got_cache, which);
    EXPECT_TRUE(want.size() == got.size() && std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0)
        << what << ": the logits " << difference << " are not the bits without";
    return got;
  });
}

// ---------------------------------------------------------------------------
// norm_in_product folds every RMSNorm, residual add and (with the fused
// gate/up product) SwiGLU into the half products: into the GEMV's launches,
// and past the GEMV's rows into cuBLAS's path (the norm or SwiGLU into the
// kernel that rounds x, the add into cuBLAS's beta = 1). Both compute the
// norm and SwiGLU with the kernels' own formulas and order of additions, and
// cuBLAS's epilogue rounds y + product once, as the add kernel does; so,
// with cuBLAS computing the same product for beta 0 and 1 (asked of it first
// at the model's shapes and each forward's rows, cublas_beta_probe.hpp; from
// a forward where it answers no, the two models' caches may differ in their
// last bits, and only the CPU check stands), the model must give
// the same bits with and without the fold, on every path a forward takes: a
// short run, a long prefill (cuBLAS's path), decode steps replayed from
// graphs, and a batch of three sequences. With fewer products fused
// (separate Q/K/V and gate/up) too. And the folded model still matches the
// CPU model at the dtype's tolerance. Also with fp16 products of 1 row only
// on the GEMV (max_gemv_rows 1, the default): the short run and the batch of
// three then take cuBLAS's path as well.
TEST(CudaFusions, NormInProductGivesTheUnfoldedBits) {
  LLM_REQUIRE_CUDA_DEVICE();
  struct Products {
    cuda::WeightDtype dtype;
    int max_gemv_rows;
  };
  const Products products_cases[] = {{cuda::WeightDtype::Float16, cuda::kMaxGemvRows},
                                     {cuda::WeightDtype::BFloat16, cuda::kMaxGemvRows},
                                     {cuda::WeightDtype::Float16, 1}};
  for (const ConfigCase& config_case : config_cases()) {
    const ModelConfig& config = config_case.config;
    const ModelWeights weights = random_weights(config, 9001);
    CpuModel cpu(weights);
    for (const Products& products : products_cases) {
      const cuda::WeightDtype dtype = products.dtype;
      for (const bool products_fused : {true, false}) {
        SCOPED_TRACE(config_case.name + ", " + cuda::to_string(dtype) + ", GEMV up to " +
                     std::to_string(products.max_gemv_rows) + " rows" + (products_fused ? "" : ", separate products"));
        const auto linear_factory = [&products] {
          return cuda::cuda_linear_factory(products.dtype, cuda::HalfGemvKernel::CudaCores, products.max_gemv_rows);
        };
        cuda::CudaModelOptions unfolded_options;
        unfolded_options.linear_factory = linear_factory();
        unfolded_options.fusions = cuda::CudaFusions::all();
        unfolded_options.fusions.qkv_product = unfolded_options.fusions.gate_up_product = products_fused;
        unfolded_options.fusions.norm_in_product = false;
        cuda::CudaModelOptions folded_options = unfolded_options;
        folded_options.linear_factory = linear_factory();
        folded_options.fusions.norm_in_product = true;
        cuda::CudaModel unfolded(weights, unfolded_options), folded(weights, folded_options);
        const auto unfolded_cache = unfolded.make_cache(kForwardPathSequences, config.seq_len);
        const auto folded_cache = folded.make_cache(kForwardPathSequences, config.seq_len);
        const auto cpu_cache = cpu.make_cache(kForwardPathSequences, config.seq_len);
        // The products the fold adds onto: wo [dim, dim] and w2 [dim, hidden].
        const std::pair<int, int> adding_products[] = {{config.dim, config.dim}, {config.dim, config.hidden_dim}};
        const cuda::HalfType half_type =
            dtype == cuda::WeightDtype::BFloat16 ? cuda::HalfType::BFloat16 : cuda::HalfType::Float16;
        bool same_bits_expected = true;
        const auto expect_same = [&](const TokenBatch& batch, LogitsFor which, const std::string& what) {
          const std::vector<float> want = run(unfolded, batch, *unfolded_cache, which);
          const std::vector<float> got = run(folded, batch, *folded_cache, which);
          if (same_bits_expected && !llm::testing::cublas_adds_onto_its_plain_products(
                                        half_type, products.max_gemv_rows, adding_products, batch.size())) {
            same_bits_expected = false;
            std::cout << "[ info     ] " << what << ": cuBLAS computes another product for beta 1 than for beta 0 at "
                      << batch.size() << " rows; from here on the folded model is checked against the CPU only\n";
          }
          if (same_bits_expected)
            EXPECT_TRUE(want.size() == got.size() &&
                        std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0)
                << what << ": the folded model's logits are not the unfolded model's bits";
          const CompareResult check = compare(got, run(cpu, batch, *cpu_cache, which),
                                              model_logits_tolerance(compare_dtype(dtype)));
          EXPECT_TRUE(check.ok) << what << " vs the CPU: max_abs " << check.max_abs_err << ", "
                                << check.over_tolerance << " over, " << check.nan_or_inf << " NaN/Inf";
          return got;
        };
        run_every_forward_path(config, expect_same);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// merge_in_split_kernel: past 64 keys the split-KV decode attention merges
// its splits in the last split block to finish, not in a merge kernel of
// its own. The merge is the same expression in the same order either way,
// so the model must give the same bits with and without it: decode steps
// across 64, 128 and 256 keys (1, 2, 4 and 8 splits; prefill chunks in
// between), replayed from graphs as the steps run them, then a batch of
// three sequences at about 260, 100 and 5 keys (the short ones with empty
// splits), on an fp32 cache and a paged int8 cache; on the tiny preset and
// on 12 query heads per KV head (two head chunks, each merged by its own
// last block). fp32 products, so the attention is all that differs.
TEST(CudaFusions, MergeInTheSplitKernelGivesTheMergeKernelsBits) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ConfigCase cases[] = {{"tiny", find_preset("tiny").config},
                              {"group12", make_config(192, 200, 2, 12, 1, 300, 320, false)}};
  for (const ConfigCase& config_case : cases) {
    const ModelConfig& config = config_case.config;
    const int vocab = config.vocab_size;
    const ModelWeights weights = random_weights(config, 4242);
    cuda::CudaModelOptions kernel_options;
    kernel_options.fusions = cuda::CudaFusions::all();
    kernel_options.fusions.merge_in_split_kernel = false;
    cuda::CudaModelOptions last_block_options;
    last_block_options.fusions = cuda::CudaFusions::all();
    cuda::CudaModel by_kernel(weights, kernel_options), in_last_block(weights, last_block_options);
    for (const KvElement element : {KvElement::Float32, KvElement::Int8}) {
      SCOPED_TRACE(config_case.name + (element == KvElement::Int8 ? ", paged int8 cache" : ", fp32 cache"));
      const auto make_cache = [&](const cuda::CudaModel& model) -> std::unique_ptr<KvCache> {
        if (element == KvElement::Float32) return model.make_cache(3, config.seq_len);
        constexpr int kBlockSize = 16;
        const int blocks = 3 * ((config.seq_len + kBlockSize - 1) / kBlockSize);
        return std::make_unique<PagedCudaKvCacheDouble>(config, 3, blocks, kBlockSize, KvElement::Int8);
      };
      const std::unique_ptr<KvCache> kernel_cache = make_cache(by_kernel);
      const std::unique_ptr<KvCache> last_block_cache = make_cache(in_last_block);
      const auto expect_same = [&](const TokenBatch& batch, const std::string& what) {
        const std::vector<float> want = run(by_kernel, batch, *kernel_cache);
        const std::vector<float> got = run(in_last_block, batch, *last_block_cache);
        EXPECT_TRUE(want.size() == got.size() &&
                    std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0)
            << what << ": merged in the last split block, the logits are not the merge kernel's bits";
        return got;
      };
      // Sequence 0: a prefill chunk up to each stop, then decode steps across
      // the bucket boundary after it (64, 128, 256 keys).
      struct Stretch {
        int prefill_to, decode_to;
      };
      const Stretch stretches[] = {{60, 70}, {124, 134}, {250, 262}};
      int position = 0, token = 0;
      for (const Stretch& stretch : stretches) {
        const std::vector<int> chunk = random_tokens(stretch.prefill_to - position, vocab, 30 + position);
        token = last_argmax(expect_same(TokenBatch::prefill(chunk, position, 0), "chunk to " +
                                                                                   std::to_string(stretch.prefill_to)),
                            vocab);
        for (position = stretch.prefill_to; position < stretch.decode_to; ++position)
          token = last_argmax(expect_same(TokenBatch::single(token, position, 0),
                                          "decode at " + std::to_string(position)),
                              vocab);
      }
      const int other_prompts[] = {100, 5};  // sequences 1 and 2
      for (int s = 1; s < 3; ++s)
        expect_same(TokenBatch::prefill(random_tokens(other_prompts[s - 1], vocab, 40 + s), 0, s),
                    "prompt of sequence " + std::to_string(s));
      for (int step = 0; step < 4; ++step) {
        TokenBatch batch;
        batch.add(token, position + step, 0);
        for (int s = 1; s < 3; ++s) batch.add((token + 7 * s + step) % vocab, other_prompts[s - 1] + step, s);
        expect_same(batch, "batch of 3, step " + std::to_string(step));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// rope_in_qkv_product: the fused QKV product rotates its Q and K outputs and
// appends K and V to the cache itself (the CUDA-core GEMV in its last
// writes; its tensor-core kernel and cuBLAS's path with rope_and_write_kv
// after them), instead of writing y for that kernel to read. The same table
// entries and the same rotation (device::rotated_pair), so the model must
// give the same bits with and without it on every forward path
// (run_every_forward_path: a short run, a long prefill, decode steps
// replayed from graphs, a batch of three), with the GEMV up to 16 rows and
// up to 1 (the default), in fp16 and bf16, on both GEMV kernels, on a
// contiguous fp32 cache and a paged one (block tables), and on a paged int8
// cache, where the kernel stays (an int8 row's scale needs its whole head).
TEST(CudaFusions, RopeInTheQkvProductGivesTheKernelsBits) {
  LLM_REQUIRE_CUDA_DEVICE();
  struct Products {
    cuda::WeightDtype dtype;
    cuda::HalfGemvKernel gemv;
    int max_gemv_rows;
  };
  const Products products_cases[] = {{cuda::WeightDtype::Float16, cuda::HalfGemvKernel::CudaCores, cuda::kMaxGemvRows},
                                     {cuda::WeightDtype::Float16, cuda::HalfGemvKernel::CudaCores, 1},
                                     {cuda::WeightDtype::BFloat16, cuda::HalfGemvKernel::CudaCores, cuda::kMaxGemvRows},
                                     {cuda::WeightDtype::Float16, cuda::HalfGemvKernel::TensorCores, cuda::kMaxGemvRows}};
  struct Cache {
    std::string name;
    KvElement element;
    int block_size;  // 0: the model's contiguous cache
  };
  const Cache cache_cases[] = {{"fp32 cache", KvElement::Float32, 0},
                               {"paged fp32 cache", KvElement::Float32, 8},
                               {"paged int8 cache", KvElement::Int8, 16}};
  for (const ConfigCase& config_case : config_cases()) {
    const ModelConfig& config = config_case.config;
    const ModelWeights weights = random_weights(config, 5150);
    for (const Products& products : products_cases) {
      const auto linear_factory = [&products] {
        return cuda::cuda_linear_factory(products.dtype, products.gemv, products.max_gemv_rows);
      };
      cuda::CudaModelOptions kernel_options;
      kernel_options.linear_factory = linear_factory();
      kernel_options.fusions = cuda::CudaFusions::all();
      kernel_options.fusions.rope_in_qkv_product = false;
      cuda::CudaModelOptions product_options = kernel_options;
      product_options.linear_factory = linear_factory();
      product_options.fusions.rope_in_qkv_product = true;
      cuda::CudaModel by_kernel(weights, kernel_options), in_product(weights, product_options);
      for (const Cache& cache_case : cache_cases) {
        SCOPED_TRACE(config_case.name + ", " + cuda::to_string(products.dtype) + ", " +
                     cuda::to_string(products.gemv) + " up to " + std::to_string(products.max_gemv_rows) +
                     " rows, " + cache_case.name);
        const auto make_cache = [&](const cuda::CudaModel& model) -> std::unique_ptr<KvCache> {
          if (cache_case.block_size == 0) return model.make_cache(kForwardPathSequences, config.seq_len);
          const int blocks =
              kForwardPathSequences * ((config.seq_len + cache_case.block_size - 1) / cache_case.block_size);
          return std::make_unique<PagedCudaKvCacheDouble>(config, kForwardPathSequences, blocks,
                                                          cache_case.block_size, cache_case.element);
        };
        const std::unique_ptr<KvCache> kernel_cache = make_cache(by_kernel);
        const std::unique_ptr<KvCache> product_cache = make_cache(in_product);
        const auto expect_same = [&](const TokenBatch& batch, LogitsFor which, const std::string& what) {
          const std::vector<float> want = run(by_kernel, batch, *kernel_cache, which);
          const std::vector<float> got = run(in_product, batch, *product_cache, which);
          EXPECT_TRUE(want.size() == got.size() &&
                      std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0)
              << what << ": with RoPE and the K/V append in the QKV product, the logits are not the kernel's bits";
          EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float v) { return std::isfinite(v); })) << what;
          return got;
        };
        run_every_forward_path(config, expect_same);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The int8 K/V append on the GPU (kernels::write_kv_rows) against the host's
// (store_kv_row), on the same fp32 rows: the same codes and the same scales,
// bit for bit. Both run store_int8_head (llm/kv_int8.hpp); this is what makes
// any model-level difference a difference of inputs, not of quantization.
TEST(KvCacheInt8, GpuQuantizesLikeTheHost) {
  LLM_REQUIRE_CUDA_DEVICE();
  const ModelConfig config = make_config(96, 200, 1, 6, 3, 300, 64, false);  // 3 KV heads of 16
  constexpr int kRows = 40;
  const int kv_dim = config.kv_dim();
  testing::PagedCpuKvCacheDouble host(config, 1, 8, 8, KvElement::Int8);
  PagedCudaKvCacheDouble device(config, 1, 8, 8, KvElement::Int8);
  host.reserve(0, 0, kRows);
  device.reserve(0, 0, kRows);
  device.prepare();
  // Rows of very different magnitudes, an all-zero head and exact halves of
  // a step, where rounding decides.
  std::mt19937 random(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> keys(static_cast<std::size_t>(kRows) * kv_dim), values(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const float magnitude = std::pow(10.0f, static_cast<float>(i / kv_dim % 7) - 3.0f);
    keys[i] = magnitude * uniform(random);
    values[i] = magnitude * uniform(random);
  }
  std::fill_n(keys.begin() + 3 * kv_dim, config.head_dim(), 0.0f);
  for (int i = 0; i < config.head_dim(); ++i)
    keys[static_cast<std::size_t>(5 * kv_dim + i)] = (static_cast<float>(i) - 7.5f) * (127.0f / 15.0f);
  std::vector<int> positions(kRows);
  std::vector<KvView> views(kRows, device.view(0, 0));
  for (int r = 0; r < kRows; ++r) {
    positions[static_cast<std::size_t>(r)] = r;
    store_kv_row(host.view(0, 0), r, keys.data() + static_cast<std::size_t>(r) * kv_dim,
                 values.data() + static_cast<std::size_t>(r) * kv_dim);
  }
  const cuda::DeviceBuffer<float> keys_device{std::span<const float>(keys)}, values_device{std::span<const float>(values)};
  const cuda::DeviceBuffer<KvView> views_device{std::span<const KvView>(views)};
  const cuda::DeviceBuffer<int> positions_device{std::span<const int>(positions)};
  cuda::kernels::write_kv_rows(keys_device.data(), values_device.data(), views_device.data(), positions_device.data(),
                               kRows, kv_dim, config.head_dim(), KvElement::Int8, nullptr);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<std::int8_t> codes = device.download_keys_int8();
  const std::vector<float> scales = device.download_key_scales();
  const KvView host_view = host.view(0, 0);
  for (int r = 0; r < kRows; ++r) {
    const std::size_t row = host_view.row_index(r);  // layer 0: the pools' first rows
    EXPECT_EQ(0, std::memcmp(codes.data() + row * kv_dim, host_view.key_row_int8(r), static_cast<std::size_t>(kv_dim)))
        << "codes of row " << r;
    EXPECT_EQ(0, std::memcmp(scales.data() + row * config.n_kv_heads, host_view.key_row_scales(r),
                             sizeof(float) * static_cast<std::size_t>(config.n_kv_heads)))
        << "scales of row " << r;
  }
}

// ---------------------------------------------------------------------------
// CUDA graphs: replaying a captured decode forward runs the same kernels with
// the same arguments as launching them one by one, so the logits must be the
// same bits, token after token, across context buckets (new graphs), for a
// batch of several sequences, and after a prefill in between.
TEST(CudaGraphs, ReplayGivesBitIdenticalLogitsToTheEagerForward) {
  LLM_REQUIRE_CUDA_DEVICE();
  for (const ConfigCase& config_case : config_cases()) {
    SCOPED_TRACE(config_case.name);
    const ModelConfig& config = config_case.config;
    const ModelWeights weights = random_weights(config, 4242);
    cuda::CudaModelOptions graphed_options;
    graphed_options.fusions = cuda::CudaFusions::all();  // as the steps run it
    cuda::CudaModelOptions eager_options = graphed_options;
    eager_options.graphs = false;
    cuda::CudaModel eager(weights, eager_options);
    cuda::CudaModel graphed(weights, graphed_options);
    constexpr int kSequences = 3;
    const int positions = std::min(config.seq_len, 300);  // crosses several context buckets
    const auto eager_cache = eager.make_cache(kSequences, positions);
    const auto graphed_cache = graphed.make_cache(kSequences, positions);
    // Three prompts of different lengths, then decode all three together.
    std::vector<int> next(kSequences), length(kSequences);
    for (int s = 0; s < kSequences; ++s) {
      const std::vector<int> prompt = random_tokens(5 + 7 * s, config.vocab_size, 100 + s);
      const auto want = run(eager, TokenBatch::prefill(prompt, 0, s), *eager_cache);
      const auto got = run(graphed, TokenBatch::prefill(prompt, 0, s), *graphed_cache);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << "prefill " << s;
      next[s] = last_argmax(want, config.vocab_size);
      length[s] = static_cast<int>(prompt.size());
    }
    for (int step = 0; length[kSequences - 1] < positions; ++step) {
      // Every other step decodes one sequence alone (another graph key).
      const int batch_size = step % 2 == 0 ? kSequences : 1;
      TokenBatch batch;
      for (int s = 0; s < batch_size; ++s) batch.add(next[s], length[s], s);
      if (batch_size == 1) batch = TokenBatch::single(next[kSequences - 1], length[kSequences - 1], kSequences - 1);
      const auto want = run(eager, batch, *eager_cache);
      const auto got = run(graphed, batch, *graphed_cache);
      ASSERT_EQ(want.size(), got.size());
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
          << "decode step " << step << " (batch of " << batch_size << ")";
      for (int r = 0; r < batch.size(); ++r) {
        const int s = batch.sequences[static_cast<std::size_t>(r)];
        next[s] = argmax(std::span<const float>(got).subspan(static_cast<std::size_t>(r) * config.vocab_size,
                                                              static_cast<std::size_t>(config.vocab_size)));
        ++length[s];
      }
    }
    EXPECT_GT(graphed.graphs_captured(), 0u) << "the decode forwards never used a graph";
    EXPECT_EQ(eager.graphs_captured(), 0u);
  }
}

// ---------------------------------------------------------------------------
// Programmatic dependent launch (programmatic_launch.cuh): each kernel of a
// forward may start before the one ahead of it has finished, and does
// nothing but ask for its weights until that one has. Started early or not,
// every kernel computes the same values in the same order, so the logits
// must be the same bits with the overlap on and off: on every path a forward
// takes (run_every_forward_path: a short run, a prefill, eager decode, graph
// replays, a batch of three sequences), and with eager forwards only; for
// fp32 (cuBLAS products between our kernels), fp16 with every fusion (the
// GEMV with folded norms after the attention kernels) and fp16 without
// fusions (the small kernels back to back). A kernel that read its input
// before its wait would race with the kernel writing it, and show here as
// logits that change from run to run. On a GPU before sm_90 the two models
// launch alike (the attribute is not used there), and the test compares a
// model with itself; on sm_90 and later it makes sure the build's code can
// overlap there, so that it does not.
TEST(CudaProgrammaticLaunch, OverlappedKernelsGiveTheBitsOfSerialOnes) {
  LLM_REQUIRE_CUDA_DEVICE();
  int device = 0, major = 0;
  LLM_CUDA_CHECK(cudaGetDevice(&device));
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major >= 9)
    ASSERT_TRUE(cuda::kernels::launches_overlap_here())
        << "an sm_" << major << "x GPU, but this build's kernels cannot overlap on it (build them for sm_90 or "
        << "later): the test would compare serial launches with serial launches";
  struct Path {
    const char* name;
    cuda::WeightDtype dtype;
    cuda::CudaFusions fusions;
  };
  const Path paths[] = {{"fp32, fusions", cuda::WeightDtype::Float32, cuda::CudaFusions::all()},
                        {"fp16, fusions", cuda::WeightDtype::Float16, cuda::CudaFusions::all()},
                        {"fp16, no fusions", cuda::WeightDtype::Float16, cuda::CudaFusions::none()}};
  for (const ConfigCase& config_case : config_cases()) {
    const ModelConfig& config = config_case.config;
    const ModelWeights weights = random_weights(config, 5150);
    for (const Path& path : paths) {
      for (const bool graphs : {true, false}) {
        SCOPED_TRACE(config_case.name + ", " + path.name + (graphs ? ", graphs" : ", eager"));
        cuda::CudaModelOptions serial_options;
        serial_options.linear_factory = cuda::cuda_linear_factory(path.dtype);
        serial_options.fusions = path.fusions;
        serial_options.graphs = graphs;
        serial_options.programmatic_launches = false;
        cuda::CudaModelOptions overlapped_options = serial_options;
        overlapped_options.linear_factory = cuda::cuda_linear_factory(path.dtype);
        overlapped_options.programmatic_launches = true;
        cuda::CudaModel serial(weights, serial_options), overlapped(weights, overlapped_options);
        expect_the_same_bits_on_every_path(serial, overlapped, config, "with overlapped launches");
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The next product's first weights asked of L2 by the product before it
// (CudaModelOptions::prefetch_next_product, weight_prefetch.hpp): the model
// hands every product the lines of the one it runs next, in run order (the
// last w2 the classifier's; the classifier none), and the logits are the
// same bits with it and without, on every forward path, with the products
// fused and not, with graphs and eagerly. The layers are recorded as the
// factory makes them, which is the order a forward runs them in.
TEST(CudaNextProductPrefetch, EachProductGetsTheNextOnesLinesAndTheBitsStay) {
  LLM_REQUIRE_CUDA_DEVICE();
  // The command line's switch reaches the model's option (off by default).
  EXPECT_FALSE(cuda::cuda_model_options(cuda::CudaRunOptions{}).prefetch_next_product);
  EXPECT_TRUE(cuda::cuda_model_options(cuda::CudaRunOptions{.gemv_prefetch_next = true}).prefetch_next_product);
  for (const ConfigCase& config_case : config_cases()) {
    const ModelConfig& config = config_case.config;
    const ModelWeights weights = random_weights(config, 5250);
    for (const bool fused : {true, false}) {
      for (const bool graphs : {true, false}) {
        SCOPED_TRACE(config_case.name + (fused ? ", fusions" : ", no fusions") + (graphs ? ", graphs" : ", eager"));
        cuda::CudaModelOptions plain_options;
        plain_options.linear_factory = cuda::cuda_linear_factory(cuda::WeightDtype::Float16);
        plain_options.fusions = fused ? cuda::CudaFusions::all() : cuda::CudaFusions::none();
        plain_options.graphs = graphs;
        cuda::CudaModelOptions prefetching_options = plain_options;
        std::vector<const cuda::HalfCudaLinear*> made;  // in the order the model makes them
        prefetching_options.linear_factory = [&made, half = cuda::cuda_linear_factory(cuda::WeightDtype::Float16)](
                                                 const std::vector<float>& weight, int out, int in,
                                                 const LinearSite& site, cublasHandle_t cublas) {
          std::unique_ptr<cuda::CudaLinear> layer = half(weight, out, in, site, cublas);
          made.push_back(dynamic_cast<const cuda::HalfCudaLinear*>(layer.get()));
          return layer;
        };
        prefetching_options.prefetch_next_product = true;
        cuda::CudaModel plain(weights, plain_options), prefetching(weights, prefetching_options);
        const std::size_t per_layer = fused ? 4 : 7;  // QKV, wo, gate/up, w2 or their seven products
        ASSERT_EQ(made.size(), per_layer * static_cast<std::size_t>(config.n_layers) + 1);
        for (std::size_t p = 0; p < made.size(); ++p) {
          ASSERT_NE(made[p], nullptr);
          const cuda::FirstWeightLines given = made[p]->next_product_lines();
          if (p + 1 == made.size()) {
            EXPECT_EQ(given.lines(), 0) << "the classifier is last: no product after it";
            continue;
          }
          const cuda::FirstWeightLines next = made[p + 1]->first_weight_lines();
          EXPECT_GT(given.lines(), 0) << "product " << p;
          EXPECT_TRUE(given.base == next.base && given.lines() == next.lines())
              << "product " << p << " was not given the lines of product " << p + 1;
        }
        expect_the_same_bits_on_every_path(plain, prefetching, config, "with the next product's prefetch");
      }
    }
  }
}
#endif

}  // namespace
}  // namespace llm
