// Step 06's CUDA kernels (W8A16 / W4A16) against the CPU, each check for
// both tensor-core kernels (the one-shot split-K kernel and the persistent
// pipelined one) and, on the int4 schemes, the int4 decode GEMV: for every
// scheme, 1..17 tokens (17 = two launches of 16 and 1),
// awkward shapes (1, 3 and 100 output rows, fewer than one row block, whose
// K range the persistent kernel spreads over up to 64 blocks; 33, 100, 172,
// 257 and 4096 input columns where the group fits; 1000 rows, a partial last
// row block), the Llama-2-7B shapes and an 11008 x 11008 one (which
// the persistent kernel stages in more than one segment), 65536 x 64 (a
// block's units span more row blocks than a row has steps), both activation
// paths (fp32, as the model calls it, and fp16: copied as it is when
// in_features % 8 == 0, through registers otherwise) against the
// double-precision product of dequantize(matrix). AWQ input scales, NaN in
// x, the persistent kernel's results bitwise equal from call to call, the
// errors at the API edge, the timing entry point (both kernels and
// cuBLAS), and a whole model: the CUDA model with int8 / int4 RTN layers
// against the CPU model built from the same dequantized weights (with the
// decode GEMV and the fused launches, and each without), the folds changing
// no bit of its logits, and the model table's fp16 row.
//
// The kernels poison their outputs with NaN before a launch, and
// llm::compare counts non-finite values as failures: an output the kernel
// never writes cannot pass. Every test skips with the reason where no GPU
// can be present (always in a build without CUDA) and fails where one is
// present but unusable (LLM_REQUIRE_CUDA_DEVICE, tests/test_support.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "llm/config.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/linear.hpp"
#include "llm/parallel_for.hpp"
#include "llm/token_batch.hpp"
#include "llm/weights.hpp"
#include "step06_quantization/cuda_quantized_kernels.hpp"
#include "step06_quantization/measure/model_table.hpp"
#include "step06_quantization/quant_algorithms.hpp"
#include "step06_quantization/quant_format.hpp"
#include "step06_quantization/quantized_layers.hpp"
#include "step06_dequantized_model.hpp"
#include "test_support.hpp"
#if defined(LLM_WITH_CUDA)
#include "step06_quantization/int4_decode_gemv.cuh"  // Int4DecodeGemv: its constructor's checks
#endif

namespace step06 {
// How GoogleTest prints a test's kernel parameter.
void PrintTo(CudaQuantizedKernel kernel, std::ostream* out) {
  switch (kernel) {
    case CudaQuantizedKernel::OneShotSplitK: *out << "OneShotSplitK"; return;
    case CudaQuantizedKernel::PersistentPipelined: *out << "PersistentPipelined"; return;
    case CudaQuantizedKernel::Int4DecodeGemv: *out << "Int4DecodeGemv"; return;
  }
}
}  // namespace step06

namespace {

using step06::CudaQuantizedKernel;
using step06::QuantFormat;
using step06::QuantizedMatrix;

const std::vector<CudaQuantizedKernel>& both_kernels() {
  static const std::vector<CudaQuantizedKernel> kernels = {CudaQuantizedKernel::OneShotSplitK,
                                                           CudaQuantizedKernel::PersistentPipelined};
  return kernels;
}

std::string kernel_name(CudaQuantizedKernel kernel) {
  switch (kernel) {
    case CudaQuantizedKernel::OneShotSplitK: return "one_shot";
    case CudaQuantizedKernel::PersistentPipelined: return "persistent";
    case CudaQuantizedKernel::Int4DecodeGemv: return "int4_gemv";
  }
  return "unknown";
}

// The int4 decode GEMV takes fp32 activations only (it rounds them to fp16
// itself): its checks skip the fp16 path.
bool has_fp16_path(CudaQuantizedKernel kernel) { return kernel != CudaQuantizedKernel::Int4DecodeGemv; }

// "int4-g64" -> "int4_g64": test names take no '-'.
std::string test_name(std::string name) {
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}

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

// A random [out, in] layer: uniform weights in [-1, 1] plus a per-row
// offset (so int4 zero points and scales differ from row to row), over
// sqrt(in) so that y stays O(1) for x in [-1, 1] whatever `in` is: the fp16
// tolerance's absolute part then means what it says. random_quantized: the
// same layer quantized with RTN.
std::vector<float> random_layer(int out, int in, std::uint64_t seed) {
  std::vector<float> weight = llm::testing::random_vector(static_cast<std::size_t>(out) * in, seed);
  const std::vector<float> offsets = llm::testing::random_vector(static_cast<std::size_t>(out), seed + 1, 0.5f);
  const float norm = 1.0f / std::sqrt(static_cast<float>(in));
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i) {
      float& w = weight[static_cast<std::size_t>(o) * in + i];
      w = (w + offsets[static_cast<std::size_t>(o)]) * norm;
    }
  return weight;
}

// A layer quantized with RTN, and the fp32 matrix it stands for.
struct RtnCodesAndWeights {
  QuantizedMatrix matrix;
  std::vector<float> weight;  // [out, in] dequantize(matrix)
};

// quantize_rtn and dequantize of a [out, in] layer, a block of rows per piece
// on every core: the largest shapes' host work is most of this suite's time
// on a GPU machine. RTN rounds each row on its own, so the blocks stacked
// (stack_rows) hold the codes quantize_rtn gives the whole layer.
RtnCodesAndWeights quantize_rtn_by_row_blocks(const std::vector<float>& layer, int out, int in,
                                              const QuantFormat& format) {
  constexpr int kBlockRows = 256;
  const std::size_t blocks = static_cast<std::size_t>((out + kBlockRows - 1) / kBlockRows);
  std::vector<QuantizedMatrix> quantized(blocks);  // [blocks] each [up to kBlockRows, in]
  RtnCodesAndWeights result;
  result.weight.resize(static_cast<std::size_t>(out) * in);
  llm::parallel_for(blocks, [&](std::size_t block) {
    const int first = static_cast<int>(block) * kBlockRows;
    const int rows = std::min(kBlockRows, out - first);
    const std::size_t offset = static_cast<std::size_t>(first) * in, count = static_cast<std::size_t>(rows) * in;
    quantized[block] = step06::quantize_rtn({std::span(layer).subspan(offset, count), rows, in}, format);
    const std::vector<float> weight = step06::dequantize(quantized[block]);
    std::copy(weight.begin(), weight.end(), result.weight.begin() + static_cast<std::ptrdiff_t>(offset));
  });
  std::vector<const QuantizedMatrix*> stacked;  // [blocks]
  for (const QuantizedMatrix& matrix : quantized) stacked.push_back(&matrix);
  result.matrix = step06::stack_rows(stacked);
  return result;
}

QuantizedMatrix random_quantized(const QuantFormat& format, int out, int in, std::uint64_t seed) {
  return quantize_rtn_by_row_blocks(random_layer(out, in, seed), out, in, format).matrix;
}

// y [rows, out] = x [rows, in] . weight^T in double, rounded to float;
// weight = dequantize(matrix) [out, in]. Each weight row is read once for
// all x rows (while it is in cache), into four interleaved partial sums (four
// independent chains of adds instead of one); blocks of outputs on every
// core: the reference of the largest shapes is part of the host's share of
// the GPU check's test time.
std::vector<float> reference_product(const std::vector<float>& weight, int out, int in, const std::vector<float>& x,
                                     int rows) {
  constexpr int kChains = 4;
  constexpr int kBlockOutputs = 64;  // outputs per piece: a small product is one piece, no thread started
  std::vector<float> y(static_cast<std::size_t>(rows) * out);
  const std::size_t blocks = static_cast<std::size_t>((out + kBlockOutputs - 1) / kBlockOutputs);
  llm::parallel_for(blocks, [&](std::size_t block) {
    const int first = static_cast<int>(block) * kBlockOutputs;
    for (int o = first; o < std::min(out, first + kBlockOutputs); ++o) {
      const float* wo = weight.data() + static_cast<std::size_t>(o) * in;
      for (int r = 0; r < rows; ++r) {
        const float* xr = x.data() + static_cast<std::size_t>(r) * in;
        double partial[kChains] = {};
        int i = 0;
        for (; i + kChains <= in; i += kChains)
          for (int chain = 0; chain < kChains; ++chain)
            partial[chain] += static_cast<double>(xr[i + chain]) * wo[i + chain];
        for (; i < in; ++i) partial[0] += static_cast<double>(xr[i]) * wo[i];
        const double sum = (partial[0] + partial[1]) + (partial[2] + partial[3]);
        y[static_cast<std::size_t>(r) * out + o] = static_cast<float>(sum);
      }
    }
  });
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

// Both paths of `kernel` for each of `batches` (token counts) against the reference.
void expect_both_paths_match(const QuantizedMatrix& matrix, const std::vector<int>& batches, std::uint64_t seed,
                             CudaQuantizedKernel kernel) {
  const std::vector<float> weight = step06::dequantize(matrix);
  for (const int rows : batches) {
    SCOPED_TRACE(::testing::Message() << matrix.format.name() << " [" << matrix.out_features << ", "
                                      << matrix.in_features << "], " << rows << " rows, " << kernel_name(kernel));
    const std::vector<float> x = rounded_to_fp16(
        llm::testing::random_vector(static_cast<std::size_t>(rows) * matrix.in_features, seed + rows));
    const std::vector<float> reference =
        reference_product(weight, matrix.out_features, matrix.in_features, x, rows);
    EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul(matrix, x, rows, kernel), reference))
        << "fp32 path";
    if (has_fp16_path(kernel))
      EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul_fp16(matrix, x, rows, kernel), reference))
          << "fp16 path";
    if (::testing::Test::HasFailure()) return;  // one failing case says enough
  }
}

// a and b hold the same floats, bit for bit.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// 1 .. max_rows tokens.
std::vector<int> one_to(int max_rows) {
  std::vector<int> batches(static_cast<std::size_t>(max_rows));
  for (int rows = 1; rows <= max_rows; ++rows) batches[static_cast<std::size_t>(rows - 1)] = rows;
  return batches;
}

const std::vector<std::string>& scheme_names() {
  static const std::vector<std::string> names = {"int8", "int4-g64", "int4-g128", "int4sym-g64", "nf4"};
  return names;
}

// (scheme, kernel): every check below runs for both kernels.
class CudaQuantizedKernels : public ::testing::TestWithParam<std::tuple<std::string, CudaQuantizedKernel>> {
 protected:
  QuantFormat format() const { return QuantFormat::parse(std::get<0>(GetParam())); }
  CudaQuantizedKernel kernel() const { return std::get<1>(GetParam()); }
};

// The suite's matrices are quantized a block of rows at a time: the blocks
// stacked must be the matrix quantize_rtn gives the whole layer, and the
// weights dequantize gives it (a host check: it runs without a GPU too).
// 600 rows: two whole blocks and a partial one; 100 columns: rows padded
// to whole groups.
TEST(QuantizeRtnByRowBlocks, GivesTheWholeLayersCodesAndWeights) {
  constexpr int kRows = 600;
  for (const int columns : {96, 100}) {
    const std::vector<float> layer = random_layer(kRows, columns, 5);
    for (const std::string& name : {std::string("int8"), std::string("int4-g32"), std::string("nf4")}) {
      SCOPED_TRACE(name + ", " + std::to_string(columns) + " columns");
      const QuantizedMatrix whole = step06::quantize_rtn({layer, kRows, columns}, QuantFormat::parse(name));
      const RtnCodesAndWeights blocks = quantize_rtn_by_row_blocks(layer, kRows, columns, QuantFormat::parse(name));
      EXPECT_EQ(blocks.matrix.out_features, kRows);
      EXPECT_EQ(blocks.matrix.padded_in, whole.padded_in);
      EXPECT_TRUE(blocks.matrix.packed == whole.packed);
      EXPECT_TRUE(blocks.matrix.scales == whole.scales);
      EXPECT_TRUE(blocks.matrix.zeros == whole.zeros);
      EXPECT_EQ(blocks.weight, step06::dequantize(whole));
    }
  }
}

// Rows 1, 3 and 100 are fewer than one row block of 128: with 4096 columns
// the persistent kernel spreads the one row block's steps (32 of 4-bit, 64
// of int8) over as many blocks, all but the last of which hand their partial
// sums to it.
TEST_P(CudaQuantizedKernels, AwkwardShapesMatchTheDequantizedProduct) {
  LLM_REQUIRE_CUDA_DEVICE();
  std::uint64_t seed = 100;
  for (int out : {1, 3, 100})
    for (int in : {33, 100, 172, 257, 4096}) {
      if (format().group_size > in) continue;  // the group does not fit the layer
      expect_both_paths_match(random_quantized(format(), out, in, seed), one_to(17), seed, kernel());
      seed += 1000;
      if (HasFailure()) return;
    }
}

// Many output tiles and blocks (1000 rows: 63 tiles, the last one partial,
// in 8 row blocks of 8 tiles) with the columns split over many blocks.
TEST_P(CudaQuantizedKernels, ManyBlocksMatchTheDequantizedProduct) {
  LLM_REQUIRE_CUDA_DEVICE();
  expect_both_paths_match(random_quantized(format(), 1000, 4096, 7), {1, 8, 9, 16}, 11, kernel());
}

// 65536 rows of 64 columns (a format whose group is wider: one group's
// columns): 512 row blocks of one step each, so a block of the persistent
// kernel walks several row blocks and its staged x wraps around the row (a
// segment holds more units than a row has steps).
TEST_P(CudaQuantizedKernels, ManyRowBlocksOfOneStepMatchTheDequantizedProduct) {
  LLM_REQUIRE_CUDA_DEVICE();
  const int columns = std::max(64, format().group_size);
  expect_both_paths_match(random_quantized(format(), 65536, columns, 17), {1, 5, 16}, 19, kernel());
}

// A NaN in x makes its token's outputs NaN, all of them, and no other
// token's: the MMA multiplies each token's column on its own, and a
// token past the batch never reads another's values.
TEST_P(CudaQuantizedKernels, NanInXGivesNanOnlyInItsRow) {
  LLM_REQUIRE_CUDA_DEVICE();
  const int out = 300, in = 4096, rows = 3;
  const QuantizedMatrix matrix = random_quantized(format(), out, in, 29);
  std::vector<float> x = rounded_to_fp16(llm::testing::random_vector(static_cast<std::size_t>(rows) * in, 31));
  x[static_cast<std::size_t>(in) + 1234] = NAN;  // token 1
  const std::vector<float> weight = step06::dequantize(matrix);
  for (const bool fp16 : {false, true}) {
    if (fp16 && !has_fp16_path(kernel())) continue;
    SCOPED_TRACE(fp16 ? "fp16 path" : "fp32 path");
    const std::vector<float> y = fp16 ? step06::cuda_quantized_matmul_fp16(matrix, x, rows, kernel())
                                      : step06::cuda_quantized_matmul(matrix, x, rows, kernel());
    ASSERT_EQ(y.size(), static_cast<std::size_t>(rows) * out);
    int nan_outputs = 0;
    for (int o = 0; o < out; ++o) nan_outputs += std::isnan(y[static_cast<std::size_t>(out) + o]) ? 1 : 0;
    EXPECT_EQ(nan_outputs, out) << "token 1 holds the NaN";
    for (const int token : {0, 2}) {
      const std::vector<float> x_token(x.begin() + static_cast<std::ptrdiff_t>(token) * in,
                                       x.begin() + static_cast<std::ptrdiff_t>(token + 1) * in);
      const std::vector<float> y_token(y.begin() + static_cast<std::ptrdiff_t>(token) * out,
                                       y.begin() + static_cast<std::ptrdiff_t>(token + 1) * out);
      EXPECT_TRUE(close_to_reference(y_token, reference_product(weight, out, in, x_token, 1))) << "token " << token;
    }
  }
}

std::string scheme_and_kernel(const ::testing::TestParamInfo<std::tuple<std::string, CudaQuantizedKernel>>& info) {
  return test_name(std::get<0>(info.param)) + "_" + kernel_name(std::get<1>(info.param));
}
INSTANTIATE_TEST_SUITE_P(AllSchemes, CudaQuantizedKernels,
                         ::testing::Combine(::testing::ValuesIn(scheme_names()), ::testing::ValuesIn(both_kernels())),
                         scheme_and_kernel);
// The int4 decode GEMV on the int4 schemes: groups of 32 (a vector is one
// group), 64 and 128, asymmetric and symmetric. 1..17 rows run 4 at a time.
INSTANTIATE_TEST_SUITE_P(Int4DecodeGemv, CudaQuantizedKernels,
                         ::testing::Combine(::testing::Values("int4-g32", "int4-g64", "int4-g128", "int4sym-g64"),
                                            ::testing::Values(CudaQuantizedKernel::Int4DecodeGemv)),
                         scheme_and_kernel);

// Llama-2-7B's FFN shapes and a square 11008 x 11008, each quantized once
// and run through both kernels. On an H100 (132 SMs), int4-g128: the
// one-shot kernel gives gate/up (11008 x 4096) 86 row blocks x 4 slices of
// 8 steps, so every block also loads the steps it requests after the
// barrier; down (4096 x 11008) 11 slices, the last one short (6 steps of 8).
// int8: 8 and 22 slices of 8 steps (the last one of down: 4). The
// persistent kernel gives both FFN shapes 2752 units over 264 blocks, 10 or
// 11 each, most row blocks split between 3 or 4 blocks; 11008 x 11008 has
// 28 units per block, more than one segment's tables hold, so its blocks
// stage x and the scales twice.
// The int4 decode GEMV (int4-g128) runs at 1, 2 and 16 rows: its 1-, 2- and
// 4-row kernels (16 rows are four launches of 4), which stage x in chunks of
// 4096, 2048 and 1024 columns. A slice longer than a chunk takes the loops
// from one chunk to the next (a later chunk's first batch is loaded after
// its staging), and a slice that is not whole 512-column batches ends its
// last chunk on a partial batch. It runs with both column splits (the
// whole-wave one and --no-gemv-wave-fit's), whose slices differ. On 132 SMs
// (H100 SXM, H200), whole waves: 11008 x 4096 in 1536, 1536 and 1024 columns;
// 4096 x 11008 in 3 of 2816 and one of 2560; 11008 x 11008 in 3840, 3840 and
// 3328. Chunks per slice, shape by shape:
//   4 rows: 2 and 1;  3;  4
//   2 rows: 1;  2;  2
//   1 row:  1;  1;  1
// The split of before: 11008 x 4096 in 2 of 2048 columns; 4096 x 11008 in
// 4 of 2304 and one of 1792; 11008 x 11008 in 5632 and 5376:
//   4 rows: 2;  3 (1024 + 1024 + 256) and 2 (1024 + 768);  6 (the last 512 or 256)
//   2 rows: 1;  2 (2048 + 256) and 1;  3 (2048 + 2048 + 1536 or 1280)
//   1 row:  1;  1;  2 (4096 + 1536 or 1280)
TEST(CudaQuantizedKernelsLargeShapes, BothKernelsMatchTheDequantizedProduct) {
  LLM_REQUIRE_CUDA_DEVICE();
  struct Shape {
    int out, in;
  };
  for (const Shape shape : {Shape{11008, 4096}, Shape{4096, 11008}, Shape{11008, 11008}}) {
    const std::vector<float> layer = random_layer(shape.out, shape.in, 3);  // one draw, both formats
    for (const std::string& name : {std::string("int4-g128"), std::string("int8")}) {
      const RtnCodesAndWeights quantized =
          quantize_rtn_by_row_blocks(layer, shape.out, shape.in, QuantFormat::parse(name));
      const QuantizedMatrix& matrix = quantized.matrix;
      const std::vector<float>& weight = quantized.weight;
      const bool runs_int4_gemv = matrix.format.bits() == 4;
      for (int rows : {1, 2, 16}) {
        // 2 rows for the int4 decode GEMV's 2-row kernel only: the tensor-core
        // kernels and int8 pay no third reference.
        const bool runs_tensor_core_kernels = rows != 2;
        if (!runs_tensor_core_kernels && !runs_int4_gemv) continue;
        const std::vector<float> x =
            rounded_to_fp16(llm::testing::random_vector(static_cast<std::size_t>(rows) * shape.in, 5 + rows));
        const std::vector<float> reference = reference_product(weight, shape.out, shape.in, x, rows);
        if (runs_tensor_core_kernels)
          for (const CudaQuantizedKernel kernel : both_kernels()) {
            SCOPED_TRACE(::testing::Message() << name << " [" << shape.out << ", " << shape.in << "], " << rows
                                              << " rows, " << kernel_name(kernel));
            EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul_fp16(matrix, x, rows, kernel), reference));
            if (rows == 16)
              EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul(matrix, x, rows, kernel), reference));
          }
        if (runs_int4_gemv)
          for (const bool whole_wave_split : {true, false}) {
            SCOPED_TRACE(::testing::Message() << name << " [" << shape.out << ", " << shape.in << "], " << rows
                                              << " rows, int4_gemv, "
                                              << (whole_wave_split ? "whole-wave split" : "the split of before"));
            EXPECT_TRUE(close_to_reference(step06::cuda_quantized_matmul(matrix, x, rows,
                                                                         CudaQuantizedKernel::Int4DecodeGemv,
                                                                         whole_wave_split),
                                           reference));
          }
      }
    }
  }
}

// The persistent kernel's y is the same, bit for bit, from call to call:
// each row block's pieces are added in block order, whatever order the
// blocks finish in. Shapes where every row block is split between blocks
// (100 x 4096: one row block over 32 blocks) or most are (11008 x 4096).
TEST(CudaQuantizedKernelsPersistent, ResultsAreBitwiseReproducible) {
  LLM_REQUIRE_CUDA_DEVICE();
  struct Shape {
    int out, in;
  };
  for (const Shape shape : {Shape{100, 4096}, Shape{11008, 4096}})
    for (const std::string& name : {std::string("int4-g64"), std::string("int8")}) {
      const std::vector<float> layer = random_layer(shape.out, shape.in, 37);
      const RtnCodesAndWeights quantized =
          quantize_rtn_by_row_blocks(layer, shape.out, shape.in, QuantFormat::parse(name));
      const QuantizedMatrix& matrix = quantized.matrix;
      const std::vector<float>& weight = quantized.weight;
      for (int rows : {1, 16}) {
        SCOPED_TRACE(::testing::Message() << name << " [" << shape.out << ", " << shape.in << "], " << rows
                                          << " rows");
        const std::vector<float> x =
            rounded_to_fp16(llm::testing::random_vector(static_cast<std::size_t>(rows) * shape.in, 41 + rows));
        const std::vector<float> first = step06::cuda_quantized_matmul(matrix, x, rows);
        EXPECT_TRUE(same_bits(first, step06::cuda_quantized_matmul(matrix, x, rows))) << "fp32 path";
        const std::vector<float> first_fp16 = step06::cuda_quantized_matmul_fp16(matrix, x, rows);
        EXPECT_TRUE(same_bits(first_fp16, step06::cuda_quantized_matmul_fp16(matrix, x, rows))) << "fp16 path";
        // And not trivially: the outputs are finite and within tolerance.
        EXPECT_TRUE(close_to_reference(first, reference_product(weight, shape.out, shape.in, x, rows)));
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
      for (const CudaQuantizedKernel kernel : both_kernels()) expect_both_paths_match(matrix, one_to(17), 23, kernel);
      if (matrix.format.bits() == 4)
        expect_both_paths_match(matrix, one_to(5), 23, CudaQuantizedKernel::Int4DecodeGemv);
    }
  }
}

#if defined(LLM_WITH_CUDA)
// One wrong size each in the int4-g64 [8, 128] matrix of the errors tests
// (groups of 64 columns, 2 a row: 512 code bytes, 16 scales, 16 zero
// points), and what check_gpu_quantized_matrix's refusal then says was given
// and expected.
struct BadSize {
  const char* what;
  void (*spoil)(QuantizedMatrix&);
  const char* given;
  const char* expected;
};
const std::vector<BadSize>& bad_sizes() {
  static const char* const kExpectedBuffers = "expected 512, 16, 16 and 0 or 128";
  static const std::vector<BadSize> sizes = {
      {"a code byte short", [](QuantizedMatrix& m) { m.packed.pop_back(); }, "has 511 code bytes", kExpectedBuffers},
      {"a scale short", [](QuantizedMatrix& m) { m.scales.pop_back(); }, " 15 scales", kExpectedBuffers},
      {"no zero points", [](QuantizedMatrix& m) { m.zeros.clear(); }, " 0 zero points", kExpectedBuffers},
      {"127 input scales", [](QuantizedMatrix& m) { m.input_scales.assign(127, 1.0f); }, " 127 input scales",
       kExpectedBuffers},
      {"padded_in 144", [](QuantizedMatrix& m) { m.padded_in = 144; }, "padded to 144 columns",
       "expected groups of 64 columns, 2 a row, padded to 128"},
      {"in_features 129", [](QuantizedMatrix& m) { m.in_features = 129; }, "[8, 129] has groups of 64 columns, 2 a row",
       "expected groups of 64 columns, 3 a row, padded to 192"},
  };
  return sizes;
}
#endif

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
  // The int4 decode GEMV: int4 schemes and fp32 activations only.
  constexpr CudaQuantizedKernel kGemv = CudaQuantizedKernel::Int4DecodeGemv;
  EXPECT_THROW(step06::cuda_quantized_matmul(truncated, x, 2, kGemv), llm::InputError);
  EXPECT_THROW(step06::cuda_quantized_matmul_fp16(matrix, x, 2, kGemv), llm::InputError);
  for (const char* format : {"int8", "nf4"})
    EXPECT_THROW(step06::cuda_quantized_matmul(random_quantized(QuantFormat::parse(format), 8, 128, 1), x, 2, kGemv),
                 llm::InputError)
        << format;
#if defined(LLM_WITH_CUDA)
  // Int4DecodeGemv built directly, without cuda_quantized_matmul's checks
  // before it: one wrong size each, refused before anything is uploaded.
  EXPECT_NO_THROW(static_cast<void>(step06::Int4DecodeGemv(matrix)));
  for (const BadSize& bad_size : bad_sizes()) {
    QuantizedMatrix spoiled = matrix;
    bad_size.spoil(spoiled);
    EXPECT_THROW(static_cast<void>(step06::Int4DecodeGemv(spoiled)), llm::InputError) << bad_size.what;
  }
#endif
}

#if defined(LLM_WITH_CUDA)
// The check the int4 decode GEMV's constructor and the tensor-core kernels'
// host side run before any device work: host code, so it runs without a GPU.
TEST(CudaQuantizedKernelsErrors, InconsistentSizesSayWhatWasGivenAndExpected) {
  const QuantizedMatrix matrix = random_quantized(QuantFormat::parse("int4-g64"), 8, 128, 1);
  EXPECT_NO_THROW(step06::check_gpu_quantized_matrix(matrix, "the product"));
  for (const BadSize& bad_size : bad_sizes()) {
    SCOPED_TRACE(bad_size.what);
    QuantizedMatrix spoiled = matrix;
    bad_size.spoil(spoiled);
    try {
      step06::check_gpu_quantized_matrix(spoiled, "the product");
      ADD_FAILURE() << "no InputError";
    } catch (const llm::InputError& error) {
      EXPECT_TRUE(llm::testing::HasSubstr(error.what(), "the product: "));
      EXPECT_TRUE(llm::testing::HasSubstr(error.what(), bad_size.given));
      EXPECT_TRUE(llm::testing::HasSubstr(error.what(), bad_size.expected));
    }
  }
}
#endif

// What a NaN-poisoned output would look like to the check: never a pass.
TEST(CudaQuantizedKernelsErrors, NonFiniteOutputsNeverPass) {
  const std::vector<float> reference = {1.0f, 2.0f, 3.0f};
  EXPECT_FALSE(close_to_reference({1.0f, NAN, 3.0f}, reference));
  EXPECT_FALSE(close_to_reference({1.0f, 2.0f, INFINITY}, reference));
  EXPECT_TRUE(close_to_reference({1.0f, 2.0f, 3.0f}, reference));
}

// Both tensor-core kernels and cuBLAS at every row count; the int4 decode
// GEMV at 1..4 rows of an int4 format, and not at 16 rows or for int8.
TEST(CudaQuantizedKernelsTiming, TimesEveryKernelAndCublasAndChecksEachKernel) {
  LLM_REQUIRE_CUDA_DEVICE();
  for (const char* format : {"int4-g128", "int8"}) {
    const QuantizedMatrix matrix = random_quantized(QuantFormat::parse(format), 512, 1024, 9);
    for (int rows : {1, 4, 16}) {
      SCOPED_TRACE(::testing::Message() << format << ", " << rows << " rows");
      const step06::CudaMatmulTiming timing = step06::time_cuda_quantized_matmul(matrix, rows, 3, 42);
      EXPECT_TRUE(timing.check.ok) << timing.check.summary();
      EXPECT_EQ(timing.check.count, static_cast<std::size_t>(rows) * 512);
      EXPECT_TRUE(timing.one_shot_check.ok) << timing.one_shot_check.summary();
      EXPECT_EQ(timing.one_shot_check.count, static_cast<std::size_t>(rows) * 512);
      EXPECT_GT(timing.quantized_ms, 0.0);
      EXPECT_GT(timing.one_shot_ms, 0.0);
      EXPECT_GT(timing.cublas_fp16_ms, 0.0);
      if (matrix.format.bits() == 4 && rows <= 4) {
        EXPECT_TRUE(timing.int4_gemv_check.ok) << timing.int4_gemv_check.summary();
        EXPECT_EQ(timing.int4_gemv_check.count, static_cast<std::size_t>(rows) * 512);
        EXPECT_GT(timing.int4_gemv_ms, 0.0);
      } else {
        EXPECT_EQ(timing.int4_gemv_ms, 0.0);
      }
    }
  }
}

// --- A whole model.

// Every Linear site of the model quantized with RTN.
step06::QuantizedLayers quantize_every_site(const llm::ModelWeights& weights, const QuantFormat& format) {
  step06::ModelQuantization quantization;
  quantization.format = format;
  return step06::quantize_layers(weights, quantization, nullptr);
}

// How a model test builds its CUDA model: the defaults (the int4 decode
// GEMV and every fusion), without the fusions, or with the persistent
// kernel at decode too.
step06::CudaQuantizedModelOptions model_setup(const std::string& name) {
  step06::CudaQuantizedModelOptions options;
  if (name == "unfused") options.run.fusions = false;
  if (name == "persistent_kernel") options.int4_decode_gemv = false;
  return options;
}

// (format, setup).
class CudaQuantizedModel : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// A 20-token prefill (more than 16 rows: two launches per product) with the
// logits of every row, then 5 decode steps of given tokens. The
// CUDA model rounds every Linear's input to fp16, the CPU model does not:
// the fp16 tolerance for a whole model's logits.
TEST_P(CudaQuantizedModel, TinyPresetLogitsMatchTheCpuModelWithDequantizedWeights) {
  LLM_REQUIRE_CUDA_DEVICE();
  const auto& [format, setup] = GetParam();
  const llm::ModelWeights weights = llm::random_weights(llm::find_preset("tiny").config, 42);
  const step06::QuantizedLayers layers = quantize_every_site(weights, QuantFormat::parse(format));
  const auto gpu = step06::make_cuda_quantized_model(weights, layers, model_setup(setup));
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

INSTANTIATE_TEST_SUITE_P(Formats, CudaQuantizedModel,
                         ::testing::Combine(::testing::Values("int8", "int4-g64", "int4sym-g32"),
                                            ::testing::Values("defaults", "unfused", "persistent_kernel")),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
                           return test_name(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
                         });

// The int4 decode GEMV folds the norms, SwiGLU, the residual adds and RoPE
// + the K/V append into its launches with the bits of the kernels it
// replaces (the same formulas in the same order), and its load switches
// move no sum: decode logits with its two load switches off, and with the
// next product's first weights asked of L2 (--gemv-prefetch-next), are the
// defaults' to the bit. The prefill (20 rows: the persistent kernel, nothing
// folded) is the same in all of them.
TEST(CudaQuantizedModelFolds, FoldsAndLoadSwitchesChangeNoBitOfTheDecodeLogits) {
  LLM_REQUIRE_CUDA_DEVICE();
  const llm::ModelWeights weights = llm::random_weights(llm::find_preset("tiny").config, 42);
  const int vocab = weights.config.vocab_size;
  const std::vector<int> prompt = llm::testing::random_tokens(20, vocab, 3);
  const std::vector<int> next = llm::testing::random_tokens(5, vocab, 4);
  // [5 decode steps, vocab]: each step's logits, after the same prefill.
  const auto decode_logits = [&](llm::Model& model) {
    auto cache = model.make_cache(1, 32);
    static_cast<void>(model.forward(llm::TokenBatch::prefill(prompt, 0, 0), *cache));
    std::vector<float> logits;
    for (int i = 0; i < 5; ++i) {
      const std::span<const float> step =
          model.forward(llm::TokenBatch::single(next[static_cast<std::size_t>(i)], 20 + i, 0), *cache);
      logits.insert(logits.end(), step.begin(), step.end());
    }
    return logits;
  };
  for (const std::string format : {"int4-g64", "int4sym-g32"}) {
    SCOPED_TRACE(format);
    const step06::QuantizedLayers layers = quantize_every_site(weights, QuantFormat::parse(format));
    // What the product before an int4 one asks L2 for: the first batch of
    // codes (up to 256 bytes; the tiny preset's rows have 32) of every slice
    // of every row, as the GEMV's own split cuts them.
    const step06::Int4DecodeGemv first_gemv(layers.matrices.begin()->second);
    const llm::cuda::FirstWeightLines first_lines = first_gemv.first_weight_lines();
    EXPECT_GT(first_lines.lines(), 0);
    EXPECT_EQ(first_lines.rows, first_gemv.out_features());
    EXPECT_EQ(first_lines.slices, first_gemv.k_splits());
    const std::vector<float> folded = decode_logits(*step06::make_cuda_quantized_model(weights, layers));
    ASSERT_EQ(folded.size(), static_cast<std::size_t>(5) * vocab);
    for (const float logit : folded) ASSERT_TRUE(std::isfinite(logit));
    step06::CudaQuantizedModelOptions kernels_between;
    kernels_between.run.fold_norms = false;
    kernels_between.run.fold_rope = false;
    EXPECT_TRUE(same_bits(decode_logits(*step06::make_cuda_quantized_model(weights, layers, kernels_between)), folded))
        << "the norms, adds, SwiGLU and RoPE as kernels of their own";
    step06::CudaQuantizedModelOptions serial_loads;
    serial_loads.run.gemv_prefetch = false;
    serial_loads.run.gemv_pipelining = false;
    EXPECT_TRUE(same_bits(decode_logits(*step06::make_cuda_quantized_model(weights, layers, serial_loads)), folded))
        << "no L2 prefetch, no pipelined loads";
    step06::CudaQuantizedModelOptions next_prefetched;
    next_prefetched.run.gemv_prefetch_next = true;
    EXPECT_TRUE(same_bits(decode_logits(*step06::make_cuda_quantized_model(weights, layers, next_prefetched)), folded))
        << "the next product's first weights asked of L2";
    step06::CudaQuantizedModelOptions eager;
    eager.run.graphs = false;
    eager.run.programmatic_launches = false;
    EXPECT_TRUE(same_bits(decode_logits(*step06::make_cuda_quantized_model(weights, layers, eager)), folded))
        << "no graphs, no programmatic launches";
  }
}

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
