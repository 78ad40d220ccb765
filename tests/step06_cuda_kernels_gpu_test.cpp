// Step 06's CUDA kernels (W8A16 / W4A16) against the CPU: for every scheme,
// 1..17 tokens (17 = two launches of 16 and 1), awkward shapes (1, 3 and 100
// output rows; 33, 100, 172, 257 and 4096 input columns where the group fits)
// and the Llama-2-7B shapes that make the kernel split the columns over many
// blocks, both activation paths (fp32, as the model calls it, and fp16)
// against the double-precision product of dequantize(matrix). AWQ input
// scales, the errors at the API edge, the timing entry point, and a whole
// model: the CUDA model with int8 / int4 RTN layers against the CPU model
// built from the same dequantized weights, and the model table's fp16 row.
//
// The kernels poison their outputs with NaN before a launch, and
// llm::compare counts non-finite values as failures: an output the kernel
// never writes cannot pass. Every test skips with the reason where no GPU
// can be present (always in a build without CUDA) and fails where one is
// present but unusable (LLM_REQUIRE_CUDA_DEVICE, tests/test_support.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llm/config.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/linear.hpp"
#include "llm/token_batch.hpp"
#include "llm/weights.hpp"
#include "step06_quantization/cuda_quantized_kernels.hpp"
#include "step06_quantization/measure/model_table.hpp"
#include "step06_quantization/quant_algorithms.hpp"
#include "step06_quantization/quant_format.hpp"
#include "step06_quantization/quantized_layers.hpp"
#include "step06_dequantized_model.hpp"
#include "test_support.hpp"

namespace {

using step06::QuantFormat;
using step06::QuantizedMatrix;

// v rounded to the nearest fp16 value (ties to even), as the kernels round
// activations: 11 significant bits, subnormal steps of 2^-24 below 2^-14,
// inf past the largest (65504).
float round_to_fp16(float v) {
  if (!std::isfinite(v) || v == 0.0f) return v;
  if (std::fabs(v) >= 65520.0f) return std::copysign(INFINITY, v);
  int exponent = 0;
  static_cast<void>(std::frexp(std::fabs(v), &exponent));  // |v| = m 2^exponent, m in [0.5, 1)
  const float ulp = std::ldexp(1.0f, std::max(exponent - 11, -24));
  return std::nearbyint(v / ulp) * ulp;  // the default rounding mode: to nearest, ties to even
}

std::vector<float> rounded_to_fp16(std::vector<float> values) {
  for (float& v : values) v = round_to_fp16(v);
  return values;
}

// A [out, in] layer quantized with RTN: uniform weights in [-1, 1] plus a
// per-row offset (so int4 zero points and scales differ from row to row),
// over sqrt(in) so that y stays O(1) for x in [-1, 1] whatever `in` is: the
// fp16 tolerance's absolute part then means what it says.
QuantizedMatrix random_quantized(const QuantFormat& format, int out, int in, std::uint64_t seed) {
  std::vector<float> weight = llm::testing::random_vector(static_cast<std::size_t>(out) * in, seed);
  const std::vector<float> offsets = llm::testing::random_vector(static_cast<std::size_t>(out), seed + 1, 0.5f);
  const float norm = 1.0f / std::sqrt(static_cast<float>(in));
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i) {
      float& w = weight[static_cast<std::size_t>(o) * in + i];
      w = (w + offsets[static_cast<std::size_t>(o)]) * norm;
    }
  return step06::quantize_rtn({weight, out, in}, format);
}

// y [rows, out] = x [rows, in] . weight^T in double, rounded to float;
// weight = dequantize(matrix) [out, in].
std::vector<float> reference_product(const std::vector<float>& weight, int out, int in, const std::vector<float>& x,
                                     int rows) {
  std::vector<float> y(static_cast<std::size_t>(rows) * out);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      const float* xr = x.data() + static_cast<std::size_t>(r) * in;
      const float* wo = weight.data() + static_cast<std::size_t>(o) * in;
      double sum = 0.0;
      for (int i = 0; i < in; ++i) sum += static_cast<double>(xr[i]) * wo[i];
      y[static_cast<std::size_t>(r) * out + o] = static_cast<float>(sum);
    }
  return y;
}

// The fp16 tolerance (1e-3 absolute + 1e-2 relative) for both paths: the
// tensor cores multiply fp16 activations (the reference gets the same
// rounded x), group scales are stored as fp16 (relative 2^-12 per group,
// about 1e-4 of an O(1) output) and NF4 levels too; the fp16 path also
// rounds y (relative 2^-11).
::testing::AssertionResult close_to_reference(const std::vector<float>& got, const std::vector<float>& reference) {
  const llm::CompareResult result = llm::compare(got, reference, llm::tolerance_for(llm::DType::F16));
  if (result.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << result.summary();
}

// Both paths for 1..max_rows tokens against the reference.
void expect_both_paths_match(const QuantizedMatrix& matrix, int max_rows, std::uint64_t seed) {
  const std::vector<float> weight = step06::dequantize(matrix);
  for (int rows = 1; rows <= max_rows; ++rows) {
    SCOPED_TRACE(::testing::Message() << matrix.format.name() << " [" << matrix.out_features << ", "
                                      << matrix.in_features << "], " << rows << " rows");
    const std::vector<float> x = rounded_to_fp16(
        llm::testing::random_vector(static_cast<std::size_t>(rows) * matrix.in_features, seed + rows));
    const std::vector<float> reference =
        reference_product(weight, matrix.out_features, matrix.in_features, x, rows);
    EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul(matrix, x, rows), reference)) << "fp32 path";
    EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul_fp16(matrix, x, rows), reference)) << "fp16 path";
    if (::testing::Test::HasFailure()) return;  // one failing case says enough
  }
}

const std::vector<std::string>& scheme_names() {
  static const std::vector<std::string> names = {"int8", "int4-g64", "int4-g128", "int4sym-g64", "nf4"};
  return names;
}

class CudaQuantizedKernels : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaQuantizedKernels, AwkwardShapesMatchTheDequantizedProduct) {
  LLM_REQUIRE_CUDA_DEVICE();
  const QuantFormat format = QuantFormat::parse(GetParam());
  std::uint64_t seed = 100;
  for (int out : {1, 3, 100})
    for (int in : {33, 100, 172, 257, 4096}) {
      if (format.group_size > in) continue;  // the group does not fit the layer
      expect_both_paths_match(random_quantized(format, out, in, seed), 17, seed);
      seed += 1000;
      if (HasFailure()) return;
    }
}

// Many output tiles and blocks (1000 rows: 63 tiles, the last one partial,
// in 8 blocks of 8 tiles) with the columns split over many blocks.
TEST_P(CudaQuantizedKernels, ManyBlocksMatchTheDequantizedProduct) {
  LLM_REQUIRE_CUDA_DEVICE();
  const QuantFormat format = QuantFormat::parse(GetParam());
  const QuantizedMatrix matrix = random_quantized(format, 1000, 4096, 7);
  const std::vector<float> weight = step06::dequantize(matrix);
  for (int rows : {1, 8, 9, 16}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    const std::vector<float> x =
        rounded_to_fp16(llm::testing::random_vector(static_cast<std::size_t>(rows) * 4096, 11 + rows));
    const std::vector<float> reference = reference_product(weight, 1000, 4096, x, rows);
    EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul(matrix, x, rows), reference)) << "fp32 path";
    EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul_fp16(matrix, x, rows), reference)) << "fp16 path";
  }
}

INSTANTIATE_TEST_SUITE_P(AllSchemes, CudaQuantizedKernels, ::testing::ValuesIn(scheme_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

// Llama-2-7B's FFN shapes. On an H100 (132 SMs), int4-g128: gate/up (11008
// x 4096) gives 86 row blocks x 4 slices of 8 steps, so every block also
// loads the steps it requests after the barrier; down (4096 x 11008) gives
// 11 slices, the last one short (6 steps of 8). int8: 8 and 22 slices of 8
// steps (the last one of down: 4).
TEST(CudaQuantizedKernelsLlamaShapes, FfnShapesMatchTheDequantizedProduct) {
  LLM_REQUIRE_CUDA_DEVICE();
  struct Shape {
    int out, in;
  };
  for (const Shape shape : {Shape{11008, 4096}, Shape{4096, 11008}})
    for (const std::string& name : {std::string("int4-g128"), std::string("int8")}) {
      const QuantizedMatrix matrix = random_quantized(QuantFormat::parse(name), shape.out, shape.in, 3);
      const std::vector<float> weight = step06::dequantize(matrix);
      for (int rows : {1, 16}) {
        SCOPED_TRACE(::testing::Message() << name << " [" << shape.out << ", " << shape.in << "], " << rows
                                          << " rows");
        const std::vector<float> x =
            rounded_to_fp16(llm::testing::random_vector(static_cast<std::size_t>(rows) * shape.in, 5 + rows));
        const std::vector<float> reference = reference_product(weight, shape.out, shape.in, x, rows);
        EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul_fp16(matrix, x, rows), reference));
        if (rows == 16) EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul(matrix, x, rows), reference));
      }
    }
}

// AWQ: the matrix stores Q(W diag(s)) and the product reads x / s.
// dequantize() folds 1 / s into the columns, so the reference is unchanged;
// the kernel divides x as it stages it (then rounds x / s to fp16, within
// the same tolerance).
TEST(CudaQuantizedKernelsInputScales, ProductDividesXByTheInputScales) {
  LLM_REQUIRE_CUDA_DEVICE();
  for (const std::string& name : {std::string("int4-g64"), std::string("int8")}) {
    for (int in : {172, 4096}) {
      QuantizedMatrix matrix = random_quantized(QuantFormat::parse(name), 100, in, 21);
      const std::vector<float> uniform = llm::testing::random_vector(static_cast<std::size_t>(in), 22, 1.0f);
      matrix.input_scales.resize(static_cast<std::size_t>(in));
      for (int i = 0; i < in; ++i)  // 2^u for u in [-1, 1]: scales in [0.5, 2]
        matrix.input_scales[static_cast<std::size_t>(i)] = std::exp2(uniform[static_cast<std::size_t>(i)]);
      expect_both_paths_match(matrix, 17, 23);
    }
  }
}

TEST(CudaQuantizedKernelsErrors, BadRowsAndSizesAreInputErrors) {
  LLM_REQUIRE_CUDA_DEVICE();
  const QuantizedMatrix matrix = random_quantized(QuantFormat::parse("int4-g64"), 8, 128, 1);
  const std::vector<float> x(256, 0.5f);  // 2 rows of 128
  EXPECT_THROW(step06::cuda_quantized_matmul(matrix, x, 0), llm::InputError);
  EXPECT_THROW(step06::cuda_quantized_matmul(matrix, x, -1), llm::InputError);
  EXPECT_THROW(step06::cuda_quantized_matmul(matrix, x, 3), llm::InputError);  // 256 values are not 3 rows
  EXPECT_THROW(step06::cuda_quantized_matmul_fp16(matrix, x, 0), llm::InputError);
  EXPECT_THROW(step06::cuda_quantized_matmul_fp16(matrix, std::vector<float>(255, 0.5f), 2), llm::InputError);
  EXPECT_THROW(step06::time_cuda_quantized_matmul(matrix, 0, 3, 1), llm::InputError);
  EXPECT_THROW(step06::time_cuda_quantized_matmul(matrix, 1, 0, 1), llm::InputError);
  QuantizedMatrix truncated = matrix;
  truncated.packed.pop_back();  // a code byte short: caught before anything is uploaded
  EXPECT_THROW(step06::cuda_quantized_matmul(truncated, x, 2), llm::InputError);
}

// What a NaN-poisoned output would look like to the check: never a pass.
TEST(CudaQuantizedKernelsErrors, NonFiniteOutputsNeverPass) {
  const std::vector<float> reference = {1.0f, 2.0f, 3.0f};
  EXPECT_FALSE(close_to_reference({1.0f, NAN, 3.0f}, reference));
  EXPECT_FALSE(close_to_reference({1.0f, 2.0f, INFINITY}, reference));
  EXPECT_TRUE(close_to_reference({1.0f, 2.0f, 3.0f}, reference));
}

TEST(CudaQuantizedKernelsTiming, TimesBothProductsAndChecksTheKernel) {
  LLM_REQUIRE_CUDA_DEVICE();
  const QuantizedMatrix matrix = random_quantized(QuantFormat::parse("int4-g128"), 512, 1024, 9);
  for (int rows : {1, 16}) {
    const step06::CudaMatmulTiming timing = step06::time_cuda_quantized_matmul(matrix, rows, 3, 42);
    EXPECT_TRUE(timing.check.ok) << timing.check.summary();
    EXPECT_EQ(timing.check.count, static_cast<std::size_t>(rows) * 512);
    EXPECT_GT(timing.quantized_ms, 0.0);
    EXPECT_GT(timing.cublas_fp16_ms, 0.0);
  }
}

// --- A whole model.

// Every Linear site of the model quantized with RTN.
step06::QuantizedLayers quantize_every_site(const llm::ModelWeights& weights, const QuantFormat& format) {
  step06::ModelQuantization quantization;
  quantization.format = format;
  return step06::quantize_layers(weights, quantization, nullptr);
}

class CudaQuantizedModel : public ::testing::TestWithParam<std::string> {};

// A 20-token prefill (more than 16 rows: two launches per product) with the
// logits of every row, then 5 decode steps of given tokens. The
// CUDA model rounds every Linear's input to fp16, the CPU model does not:
// the fp16 tolerance for a whole model's logits.
TEST_P(CudaQuantizedModel, TinyPresetLogitsMatchTheCpuModelWithDequantizedWeights) {
  LLM_REQUIRE_CUDA_DEVICE();
  const llm::ModelWeights weights = llm::random_weights(llm::find_preset("tiny").config, 42);
  const step06::QuantizedLayers layers = quantize_every_site(weights, QuantFormat::parse(GetParam()));
  const auto gpu = step06::make_cuda_quantized_model(weights, layers);
  const auto cpu = step06::testing::cpu_model_with_dequantized(weights, layers);
  const int vocab = weights.config.vocab_size;
  auto gpu_cache = gpu->make_cache(1, 32);
  auto cpu_cache = cpu->make_cache(1, 32);
  const std::vector<int> prompt = llm::testing::random_tokens(20, vocab, 3);
  const llm::TokenBatch prefill = llm::TokenBatch::prefill(prompt, 0, 0);
  const auto expect_logits_close = [&](const llm::TokenBatch& batch, const std::string& what) {
    const std::span<const float> gpu_span = gpu->forward(batch, *gpu_cache, llm::LogitsFor::AllRows);
    const std::vector<float> gpu_logits(gpu_span.begin(), gpu_span.end());
    const std::span<const float> cpu_span = cpu->forward(batch, *cpu_cache, llm::LogitsFor::AllRows);
    const std::vector<float> cpu_logits(cpu_span.begin(), cpu_span.end());
    ASSERT_EQ(gpu_logits.size(), static_cast<std::size_t>(batch.size()) * vocab) << what;
    const llm::CompareResult result =
        llm::compare(gpu_logits, cpu_logits, llm::model_logits_tolerance(llm::DType::F16));
    EXPECT_TRUE(result.ok) << what << ": " << result.summary();
  };
  expect_logits_close(prefill, "prefill of 20 tokens");
  const std::vector<int> next = llm::testing::random_tokens(5, vocab, 4);
  for (int i = 0; i < 5; ++i)
    expect_logits_close(llm::TokenBatch::single(next[static_cast<std::size_t>(i)], 20 + i, 0),
                        "decode step " + std::to_string(i));
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaQuantizedModel, ::testing::Values("int8", "int4-g64"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

// The model table on the GPU: the fp16 row right after fp32, half its weight
// bytes, its logits within the fp16 tolerance of the CPU's fp32 model; every
// row has a speedup against it (the fp16 row's own is 1).
TEST(CudaModelTable, Fp16RowFollowsFp32AndEveryRowIsTimedAgainstIt) {
  LLM_REQUIRE_CUDA_DEVICE();
  step06::ModelTableOptions options;
  options.devices = {"cuda"};
  options.formats = {QuantFormat::parse("int8")};
  options.quality = false;
  options.int8_kv_rows = false;
  options.prompt = {1};
  options.decode_positions = 12;
  options.repeats = 1;
  const std::vector<step06::ModelRow> rows =
      step06::run_model_table("preset tiny", llm::random_weights(llm::find_preset("tiny").config, 42), options);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].variant.name(), "fp32");
  EXPECT_EQ(rows[1].variant.name(), "fp16");
  EXPECT_EQ(rows[2].variant.name(), "int8 rtn");
  EXPECT_DOUBLE_EQ(rows[1].weight_bytes, 0.5 * rows[0].weight_bytes);
  EXPECT_DOUBLE_EQ(rows[1].speedup_vs_fp16, 1.0);
  for (const step06::ModelRow& row : rows) {
    EXPECT_TRUE(row.ok) << row.variant.name() << ": " << row.check.summary();
    EXPECT_GT(row.speedup_vs_fp16, 0.0) << row.variant.name();
  }
}

}  // namespace
