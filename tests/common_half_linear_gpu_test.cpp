// HalfCudaLinear (common/cuda/half_linear.hpp): fp16 and bf16 weights, fp32
// activations in memory, against a double-precision host product of the SAME
// rounded weights and the SAME rounded x (rounded here with CUDA's own host
// conversions, round to nearest even: both of the layer's paths multiply
// half weights by x rounded to the half type), so the only differences left
// are the device's fp32 sums:
//   - the GEMV on CUDA cores (rows <= 16): fp32 sums in another order. A
//     sum whose longest chain of additions has D terms is off by at most
//     D 2^-24 of sum |w| |x| (fmaf rounds each product into the sum once);
//     the GEMV's chains are in/8 columns per lane, 3 shuffles, and one add
//     per column slice (at most in/64).
//   - cuBLAS (rows > 16) and the GEMV on tensor cores: fp32 sums in an order
//     (inside the mma) we do not know: in 2^-23 of sum |w| |x| covers any
//     order, even with truncating adds (plus 2^-25 absolute per |w| for
//     fp16, should the tensor cores flush a subnormal x to zero).
// Every GEMV test runs both kernels (HalfGemvKernel).
// Both bounds against one reference also bound how far a row's output moves
// between the two paths: what lets a serving engine batch a decode row with
// prefill rows and still get the row's solo result (half_linear.cu).
// Outputs start as NaN and every row past `rows` must stay NaN: an output
// the layer never writes, or one it writes out of bounds, fails. Every test
// skips with the reason where no GPU can be present (always in a build
// without CUDA) and fails where one is present but unusable
// (LLM_REQUIRE_CUDA_DEVICE, tests/test_support.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "llm/errors.hpp"
#include "test_support.hpp"
#if defined(LLM_WITH_CUDA)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cublas_beta_probe.hpp"
#include "cuda_linear.hpp"
#include "half_linear.hpp"
#include "kernels.cuh"  // rmsnorm, swiglu_from_fused, add_inplace: what forward_fused folds in
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/linear.hpp"
#endif

namespace llm {
namespace {

using ::llm::testing::HasSubstr;
using ::llm::testing::random_vector;

// A layer shape and weight type (plain values, so the list compiles in a
// build without CUDA too).
struct HalfCase {
  bool bf16 = false;
  int out = 0;
  int in = 0;
  bool tensor_cores = false;  // the GEMV's kernel: HalfGemvKernel::TensorCores, else CudaCores
};
void PrintTo(const HalfCase& c, std::ostream* os) {
  *os << (c.bf16 ? "bf16" : "fp16") << " [" << c.out << ", " << c.in << "]"
      << (c.tensor_cores ? " tensor cores" : " CUDA cores");
}
std::string case_name(const ::testing::TestParamInfo<HalfCase>& info) {
  return std::string(info.param.bf16 ? "bf16_" : "fp16_") + std::to_string(info.param.out) + "x" +
         std::to_string(info.param.in) + (info.param.tensor_cores ? "_tensor_cores" : "_cuda_cores");
}
// Each case on both GEMV kernels.
std::vector<HalfCase> on_both_kernels(const std::vector<HalfCase>& cases) {
  std::vector<HalfCase> both;
  for (const bool tensor_cores : {false, true})
    for (HalfCase c : cases) {
      c.tensor_cores = tensor_cores;
      both.push_back(c);
    }
  return both;
}

// TinyLlama's K/V projection and its MLP, then odd widths (the odd model
// configs' 96, 200, 300, 72, 512; in = 100 is not a multiple of 8: padded
// rows), and a tall matrix with enough output blocks that the GEMV does not
// split its columns on an H100 (the others do).
std::vector<HalfCase> half_cases() {
  const std::vector<std::pair<int, int>> shapes = {{256, 2048}, {96, 200}, {300, 96}, {72, 512},
                                                   {5632, 2048}, {20000, 100}};
  std::vector<HalfCase> cases;
  for (const bool bf16 : {false, true})
    for (const auto& [out, in] : shapes) cases.push_back({bf16, out, in});
  return on_both_kernels(cases);
}

#if defined(LLM_WITH_CUDA)

using cuda::DeviceBuffer;
using cuda::HalfActivationScratch;
using cuda::HalfCudaLinear;
using cuda::HalfType;

HalfType half_type(bool bf16) { return bf16 ? HalfType::BFloat16 : HalfType::Float16; }
cuda::HalfGemvKernel gemv_kernel(bool tensor_cores) {
  return tensor_cores ? cuda::HalfGemvKernel::TensorCores : cuda::HalfGemvKernel::CudaCores;
}
// A layer of case c, with its own scratch.
HalfCudaLinear make_layer(const std::vector<float>& weight, const HalfCase& c, cublasHandle_t cublas) {
  return HalfCudaLinear(weight, c.out, c.in, half_type(c.bf16), std::make_shared<HalfActivationScratch>(), cublas,
                        gemv_kernel(c.tensor_cores));
}

// v rounded to the half type and back (round to nearest even; fp16 past
// 65504 is inf), by CUDA's host conversions.
float rounded(float v, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : __half2float(__float2half_rn(v));
}

// x with every value rounded to the half type: what both of the layer's
// paths multiply the weights by.
std::vector<float> rounded_all(std::vector<float> values, bool bf16) {
  for (float& v : values) v = rounded(v, bf16);
  return values;
}

// y [rows, out] = x [rows, in] . W^T in double, and sum_i |w_i| |x_i| per
// output (the scale of every error bound).
struct Reference {
  std::vector<double> y;
  std::vector<double> magnitude;
  std::vector<double> weight_abs_sum;  // sum_i |w_i| per output row
};
Reference reference_product(const std::vector<float>& weight, const std::vector<float>& x, int rows, int out,
                            int in) {
  Reference ref;
  ref.y.assign(static_cast<std::size_t>(rows) * out, 0.0);
  ref.magnitude.assign(ref.y.size(), 0.0);
  ref.weight_abs_sum.assign(static_cast<std::size_t>(out), 0.0);
  for (int o = 0; o < out; ++o) {
    const float* w = weight.data() + static_cast<std::size_t>(o) * in;
    for (int i = 0; i < in; ++i) ref.weight_abs_sum[o] += std::fabs(static_cast<double>(w[i]));
    for (int r = 0; r < rows; ++r) {
      const float* xr = x.data() + static_cast<std::size_t>(r) * in;
      double sum = 0.0, magnitude = 0.0;
      for (int i = 0; i < in; ++i) {
        const double product = static_cast<double>(w[i]) * static_cast<double>(xr[i]);
        sum += product;
        magnitude += std::fabs(product);
      }
      ref.y[static_cast<std::size_t>(r) * out + o] = sum;
      ref.magnitude[static_cast<std::size_t>(r) * out + o] = magnitude;
    }
  }
  return ref;
}

// The error bounds of the header comment, as a fraction of sum |w| |x|.
double gemv_relative_bound(int in) {
  const double chain = std::ceil(in / 8.0) + std::ceil(in / 64.0) + 8.0;
  return chain * std::ldexp(1.0, -24);
}
double gemm_relative_bound(int in) { return in * std::ldexp(1.0, -23); }

std::uint32_t bits_of(float v) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}
// Whether a and b hold the same floats bit for bit (NaNs included).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
constexpr std::uint32_t kPoisonBits = 0xffffffffu;  // a NaN: what cudaMemset(0xff) leaves in a float

// Runs layer.forward on the first `rows` rows of x_dev into a poisoned y
// [max_rows, out] and returns all of y.
std::vector<float> run_forward(const HalfCudaLinear& layer, const DeviceBuffer<float>& x_dev, int rows,
                               DeviceBuffer<float>& y_dev) {
  LLM_CUDA_CHECK(cudaMemset(y_dev.data(), 0xff, y_dev.bytes()));
  layer.forward(x_dev.data(), rows, y_dev.data(), nullptr);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> y(y_dev.size());
  y_dev.download(y);
  return y;
}

// Rows [0, rows) of `got` within the bound of its path; rows past `rows`
// untouched (still poison). A NaN never passes (!(error <= bound)).
::testing::AssertionResult matches_reference(const std::vector<float>& got, const Reference& ref, int rows, int out,
                                             int in, bool bf16, bool tensor_cores) {
  // Sums the tensor cores add: cuBLAS's, or the GEMV's on tensor cores.
  const bool tensor_core_sums = rows > cuda::kMaxGemvRows || tensor_cores;
  const double relative =
      tensor_core_sums ? gemm_relative_bound(in) + gemv_relative_bound(in) : gemv_relative_bound(in);
  int failures = 0;
  std::string first_failures;
  double worst_ratio = 0.0;
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      const std::size_t at = static_cast<std::size_t>(r) * out + o;
      double bound = relative * ref.magnitude[at] + 1e-30;
      if (tensor_core_sums && !bf16) bound += std::ldexp(1.0, -25) * ref.weight_abs_sum[o];  // fp16 subnormal x
      const double error = std::fabs(static_cast<double>(got[at]) - ref.y[at]);
      if (!(error <= bound)) {
        if (++failures <= 5)
          first_failures += " (row " + std::to_string(r) + ", output " + std::to_string(o) + ": got " +
                            std::to_string(got[at]) + ", expected " + std::to_string(ref.y[at]) + ", bound " +
                            std::to_string(bound) + ")";
      } else {
        worst_ratio = std::max(worst_ratio, error / bound);
      }
    }
  for (std::size_t at = static_cast<std::size_t>(rows) * out; at < got.size(); ++at)
    if (bits_of(got[at]) != kPoisonBits) {
      if (++failures <= 5) first_failures += " (written past the rows at element " + std::to_string(at) + ")";
    }
  if (failures > 0)
    return ::testing::AssertionFailure() << failures << " outputs wrong for " << rows << " rows:" << first_failures;
  return ::testing::AssertionSuccess() << "worst error " << worst_ratio << " of the bound";
}

#endif  // LLM_WITH_CUDA

class HalfLinearVsHost : public ::testing::TestWithParam<HalfCase> {};

// Every row count the two paths and the GEMV's buckets meet: 1, 2, 3 (bucket
// 4), 5 (8), 8, 9 (16: speculative decoding's k + 1), 15, 16, then cuBLAS.
TEST_P(HalfLinearVsHost, MatchesTheDoubleProductOfTheRoundedWeights) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  const HalfCase c = GetParam();
  constexpr int kMaxRows = 64;
  const std::uint64_t seed = static_cast<std::uint64_t>(c.out) * 7919u + static_cast<std::uint64_t>(c.in);
  const std::vector<float> weight = random_vector(static_cast<std::size_t>(c.out) * c.in, seed, 0.5f);
  const std::vector<float> x = random_vector(static_cast<std::size_t>(kMaxRows) * c.in, seed + 1, 1.0f);
  std::vector<float> weight_rounded = weight;
  for (float& w : weight_rounded) w = rounded(w, c.bf16);
  // Rows are independent: the first `rows` rows of the 64-row product are
  // the product of the first `rows` rows.
  const Reference ref = reference_product(weight_rounded, rounded_all(x, c.bf16), kMaxRows, c.out, c.in);

  cuda::CublasHandle cublas;
  HalfCudaLinear layer = make_layer(weight, c, cublas.get());
  EXPECT_EQ(layer.gemv_kernel(), gemv_kernel(c.tensor_cores));
  EXPECT_EQ(layer.in_features(), c.in);
  EXPECT_EQ(layer.out_features(), c.out);
  EXPECT_EQ(layer.padded_in_features() % 8, 0);
  EXPECT_EQ(layer.weight_bytes(), static_cast<std::size_t>(c.out) * layer.padded_in_features() * 2);
  if (c.in % 8 == 0) {
    EXPECT_EQ(layer.weight_bytes(), static_cast<std::size_t>(c.out) * c.in * 2);
  }
  std::cout << "[ info     ] " << to_string(layer.type()) << " [" << c.out << ", " << c.in << "], GEMV on "
            << to_string(layer.gemv_kernel()) << ": splits the columns " << layer.gemv_k_splits() << " ways\n";

  // The stored weights are exactly the host's rounding (padding columns zero).
  std::vector<std::uint16_t> stored(static_cast<std::size_t>(c.out) * layer.padded_in_features());
  LLM_CUDA_CHECK(cudaMemcpy(stored.data(), layer.weight_bits(), stored.size() * sizeof(std::uint16_t),
                            cudaMemcpyDeviceToHost));
  int stored_mismatches = 0;
  for (int o = 0; o < c.out; ++o)
    for (int i = 0; i < layer.padded_in_features(); ++i) {
      const std::uint16_t bits = stored[static_cast<std::size_t>(o) * layer.padded_in_features() + i];
      std::uint16_t expected = 0;
      if (i < c.in) {
        const float w = weight[static_cast<std::size_t>(o) * c.in + i];
        expected = c.bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(w)) : __half_as_ushort(__float2half_rn(w));
      }
      stored_mismatches += bits != expected;
    }
  EXPECT_EQ(stored_mismatches, 0) << "device rounding differs from the host's round-to-nearest-even";

  layer.reserve_rows(kMaxRows);
  const DeviceBuffer<float> x_dev{std::span<const float>(x)};
  DeviceBuffer<float> y_dev(static_cast<std::size_t>(kMaxRows) * c.out);
  for (const int rows : {1, 2, 3, 5, 8, 9, 15, 16, 17, 33, 64}) {
    const std::vector<float> y = run_forward(layer, x_dev, rows, y_dev);
    const ::testing::AssertionResult check = matches_reference(y, ref, rows, c.out, c.in, c.bf16, c.tensor_cores);
    EXPECT_TRUE(check) << rows << " rows";
    if (check) std::cout << "[ info     ] " << rows << " rows: " << check.message() << "\n";
  }
  // rows <= 0: nothing is written.
  const std::vector<float> untouched = run_forward(layer, x_dev, 0, y_dev);
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float v) { return bits_of(v) == kPoisonBits; }));
#endif
}

INSTANTIATE_TEST_SUITE_P(Shapes, HalfLinearVsHost, ::testing::ValuesIn(half_cases()), case_name);

class HalfGemvRowOrder : public ::testing::TestWithParam<HalfCase> {};

#if defined(LLM_WITH_CUDA)
// A layer of shape c with random weights, room for kMaxGemvRows rows, and
// kMaxGemvRows rows of random x on the device; the seeds come from
// `seed_base` and the shape, so each test draws inputs of its own.
struct RandomGemvLayer {
  RandomGemvLayer(const HalfCase& c, std::uint64_t seed_base)
      : seed(seed_base + static_cast<std::uint64_t>(c.out) * 31u + static_cast<std::uint64_t>(c.in)),
        layer(make_layer(random_vector(static_cast<std::size_t>(c.out) * c.in, seed, 0.5f), c, cublas.get())),
        x_dev(std::span<const float>(
            random_vector(static_cast<std::size_t>(cuda::kMaxGemvRows) * c.in, seed + 1, 1.0f))),
        y_dev(static_cast<std::size_t>(cuda::kMaxGemvRows) * c.out) {
    layer.reserve_rows(cuda::kMaxGemvRows);
  }
  std::uint64_t seed;
  cuda::CublasHandle cublas;
  HalfCudaLinear layer;
  DeviceBuffer<float> x_dev;  // [kMaxGemvRows, c.in]
  DeviceBuffer<float> y_dev;  // [kMaxGemvRows, c.out]
};
#endif

// A row's outputs do not depend on which rows run with it: the GEMV's order
// of additions is fixed by the shape alone (half_linear.cu), fmaf is
// explicit, and each element of an mma's D is its own dot product, so the
// bits are equal in every bucket (1, 2, 4, 8, 16 on CUDA cores; 8 and 16 on
// tensor cores) and for a row alone.
TEST_P(HalfGemvRowOrder, ARowGivesTheSameBitsAloneOrAmong16) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  const HalfCase c = GetParam();
  constexpr int kRows = cuda::kMaxGemvRows;
  RandomGemvLayer random(c, 1000u);
  HalfCudaLinear& layer = random.layer;
  const DeviceBuffer<float>& x_dev = random.x_dev;
  DeviceBuffer<float>& y_dev = random.y_dev;
  const std::vector<float> all_rows = run_forward(layer, x_dev, kRows, y_dev);
  const auto same_row_bits = [&](const std::vector<float>& got, int got_row, int row) {
    for (int o = 0; o < c.out; ++o)
      if (bits_of(got[static_cast<std::size_t>(got_row) * c.out + o]) !=
          bits_of(all_rows[static_cast<std::size_t>(row) * c.out + o]))
        return false;
    return true;
  };
  for (int rows = 1; rows < kRows; ++rows) {
    const std::vector<float> y = run_forward(layer, x_dev, rows, y_dev);
    for (int r = 0; r < rows; ++r) EXPECT_TRUE(same_row_bits(y, r, r)) << "row " << r << " of " << rows;
  }
  // Each row alone, from its own place in x.
  DeviceBuffer<float> one_y(static_cast<std::size_t>(c.out));
  for (int r = 0; r < kRows; ++r) {
    LLM_CUDA_CHECK(cudaMemset(one_y.data(), 0xff, one_y.bytes()));
    layer.forward(x_dev.data() + static_cast<std::size_t>(r) * c.in, 1, one_y.data(), nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> y(one_y.size());
    one_y.download(y);
    EXPECT_TRUE(same_row_bits(y, 0, r)) << "row " << r << " alone";
  }
#endif
}

#if defined(LLM_WITH_CUDA)
// For each row count: the layer's forward with a measurement switch on, then
// off (set_switch), gives the same bits; the switch is left on, its default.
void expect_the_same_bits_either_way(RandomGemvLayer& random, std::initializer_list<int> row_counts,
                                     const std::function<void(bool)>& set_switch) {
  for (const int rows : row_counts) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    set_switch(true);
    const std::vector<float> on = run_forward(random.layer, random.x_dev, rows, random.y_dev);
    set_switch(false);
    const std::vector<float> off = run_forward(random.layer, random.x_dev, rows, random.y_dev);
    ASSERT_EQ(on.size(), off.size());
    EXPECT_EQ(std::memcmp(on.data(), off.data(), on.size() * sizeof(float)), 0);
    // Not a comparison of two untouched buffers: the rows were written.
    EXPECT_TRUE(std::isfinite(off.front()));
  }
  set_switch(true);
}
#endif

// The GEMV's L2 prefetch of a block's first weights is a hint: with it off
// (a measurement switch, step 01's benchmark) every bucket gives the same
// bits, split columns or not.
TEST_P(HalfGemvRowOrder, TheFirstWeightsPrefetchChangesNoBit) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  RandomGemvLayer random(GetParam(), 2000u);
  HalfCudaLinear& layer = random.layer;
  EXPECT_TRUE(layer.first_weights_prefetch()) << "the prefetch is on by default";
  expect_the_same_bits_either_way(random, {1, 3, 9, cuda::kMaxGemvRows},
                                  [&layer](bool on) { layer.set_first_weights_prefetch(on); });
#endif
}

// The CUDA-core GEMV's pipelined weight loads (1..4 rows, on by default: the
// first batch requested before the wait, each next one before the current
// one is multiplied) multiply the same products in the same order as its
// serial loads: the same bits in every bucket, over split and unsplit
// columns and over slices of several staged chunks of x, where the pipeline
// restarts. The 8- and 16-row buckets never pipeline: the same bits trivially.
TEST_P(HalfGemvRowOrder, PipelinedWeightLoadsChangeNoBit) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  RandomGemvLayer random(GetParam(), 3000u);
  HalfCudaLinear& layer = random.layer;
  EXPECT_TRUE(layer.pipelined_weight_loads()) << "the pipelining is on by default";
  expect_the_same_bits_either_way(random, {1, 2, 3, 4, 9, cuda::kMaxGemvRows},
                                  [&layer](bool on) { layer.set_pipelined_weight_loads(on); });
#endif
}

// [4224, 4200]: 66 output blocks of the CUDA-core kernel, so on a GPU of 132
// SMs its columns are cut into 4 slices of 1088 (17 steps of 64), more than
// the 1024 columns of x the 4-row bucket stages at a time: 2 chunks a slice
// there (3 at 8 rows, 5 at 16).
INSTANTIATE_TEST_SUITE_P(Shapes, HalfGemvRowOrder,
                         ::testing::ValuesIn(on_both_kernels({HalfCase{false, 256, 2048}, HalfCase{true, 256, 2048},
                                                              HalfCase{false, 72, 512}, HalfCase{true, 20000, 100},
                                                              HalfCase{false, 4224, 4200}})),
                         case_name);

class HalfGemvFusions : public ::testing::TestWithParam<HalfCase> {};

// forward_fused folds in what the model otherwise runs as kernels of its own:
// the RMSNorm before a product, SwiGLU before w2 and the residual add after.
// Each must give the bits of those kernels around a plain forward, for every
// row bucket of the GEMV (split and unsplit columns) and past it, on
// cuBLAS's path (21 rows); rows past `rows` stay untouched. The GEMV and the
// kernel that rounds cuBLAS's input reuse the kernels' formulas and, for the
// norm, their order of additions. cuBLAS's add (beta = 1) gives the add
// kernel's bits where cuBLAS computes the same product for beta 0 and 1: its
// epilogue rounds y + product once, as the add kernel does. cuBLAS is asked
// first (cublas_beta_probe.hpp); where it answers no, the folded add is held
// to the bound of two orders of summation instead, and the test says so.
TEST_P(HalfGemvFusions, FoldedNormSwigluAndAddGiveTheBitsOfTheKernels) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  const HalfCase c = GetParam();
  constexpr int kRows = 21;  // the buffers' rows, and a forward past the GEMV's 16 (cuBLAS's path)
  constexpr float kEps = 1e-5f;
  const std::uint64_t seed = 500u + static_cast<std::uint64_t>(c.out) * 13u + static_cast<std::uint64_t>(c.in);
  const std::vector<float> weight = random_vector(static_cast<std::size_t>(c.out) * c.in, seed, 0.5f);
  // x rows of very different scales (the norm divides them out again).
  std::vector<float> x = random_vector(static_cast<std::size_t>(kRows) * c.in, seed + 1, 1.0f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] *= std::ldexp(1.0f, static_cast<int>(i / c.in % 9) - 4);
  const std::vector<float> norm = random_vector(static_cast<std::size_t>(c.in), seed + 2, 2.0f);
  const std::vector<float> gate_up = random_vector(static_cast<std::size_t>(kRows) * 2 * c.in, seed + 3, 3.0f);
  const std::vector<float> residual = random_vector(static_cast<std::size_t>(kRows) * c.out, seed + 4, 1.0f);

  cuda::CublasHandle cublas;
  HalfCudaLinear layer = make_layer(weight, c, cublas.get());
  layer.reserve_rows(kRows);
  const DeviceBuffer<float> x_dev{std::span<const float>(x)}, norm_dev{std::span<const float>(norm)},
      gate_up_dev{std::span<const float>(gate_up)};
  DeviceBuffer<float> input(static_cast<std::size_t>(kRows) * c.in);  // what the kernels hand the plain product
  DeviceBuffer<float> want(static_cast<std::size_t>(kRows) * c.out), got(want.size());
  const auto download = [](const DeviceBuffer<float>& buffer) {
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> host(buffer.size());
    buffer.download(host);
    return host;
  };
  // y starts as NaN (a plain product) or as the residual rows (an add); the
  // rows past `rows` keep what they started with either way.
  const auto start = [&](DeviceBuffer<float>& y, bool accumulate) {
    if (accumulate)
      y.upload(residual);
    else
      LLM_CUDA_CHECK(cudaMemset(y.data(), 0xff, y.bytes()));
  };
  // The folded add against the add kernel's result: the same bits where the
  // add runs the plain product's sums (the GEMV always; cuBLAS where it says
  // so), else within what two orders of summation of the same product can
  // differ by, twice gemm_relative_bound, plus one rounding of the sum.
  // `product_input` is what the product multiplied, [rows, in].
  const auto expect_the_add_kernels_result = [&](const std::vector<float>& got_rows,
                                                 const std::vector<float>& want_rows, int rows,
                                                 const DeviceBuffer<float>& product_input, const std::string& what) {
    if (rows <= cuda::kMaxGemvRows ||
        llm::testing::cublas_adds_onto_its_plain_product(layer, product_input.data(), rows, nullptr)) {
      EXPECT_TRUE(same_bits(got_rows, want_rows)) << what;
      return;
    }
    std::cout << "[ info     ] " << what << ": cuBLAS computes another product for beta 1 than for beta 0 at "
              << rows << " rows; the folded add is held to the bound of two orders of summation\n";
    std::vector<float> input_rows = download(product_input);
    input_rows.resize(static_cast<std::size_t>(rows) * c.in);
    const Reference ref = reference_product(rounded_all(weight, c.bf16), rounded_all(input_rows, c.bf16), rows,
                                            c.out, c.in);
    for (std::size_t at = 0; at < ref.y.size(); ++at) {
      const double got_value = got_rows[at], want_value = want_rows[at];
      double bound = 2.0 * gemm_relative_bound(c.in) * ref.magnitude[at] +
                     std::ldexp(1.0, -23) * std::max(std::fabs(got_value), std::fabs(want_value)) + 1e-30;
      if (!c.bf16) bound += 2.0 * std::ldexp(1.0, -25) * ref.weight_abs_sum[at % c.out];  // fp16 subnormal x
      ASSERT_TRUE(std::fabs(got_value - want_value) <= bound)
          << what << ": output " << at << " " << got_value << " against " << want_value << ", bound " << bound;
    }
    for (std::size_t at = ref.y.size(); at < got_rows.size(); ++at)
      ASSERT_EQ(bits_of(got_rows[at]), bits_of(want_rows[at])) << what << ": rows past " << rows << " changed";
  };
  EXPECT_TRUE(layer.fuses(1));
  EXPECT_TRUE(layer.fuses(cuda::kMaxGemvRows + 1));
  EXPECT_EQ(layer.max_fused_rows(), cuda::kFusesAnyRowCount);
  EXPECT_FALSE(layer.fuses(0));
  for (const int rows : {1, 3, 9, 16, kRows}) {
    SCOPED_TRACE(std::to_string(rows) + " rows, " +
                 (rows > cuda::kMaxGemvRows ? "cuBLAS" : std::to_string(layer.gemv_k_splits()) + " column slices"));
    for (const bool accumulate : {false, true}) {
      // The RMSNorm folded in: rmsnorm then forward (then add_inplace).
      cuda::kernels::rmsnorm(input.data(), x_dev.data(), norm_dev.data(), rows, c.in, kEps, nullptr);
      start(want, accumulate);
      if (accumulate) {
        DeviceBuffer<float> product(want.size());
        layer.forward(input.data(), rows, product.data(), nullptr);
        cuda::kernels::add_inplace(want.data(), product.data(), static_cast<std::size_t>(rows) * c.out, nullptr);
      } else {
        layer.forward(input.data(), rows, want.data(), nullptr);
      }
      start(got, accumulate);
      layer.forward_fused(x_dev.data(), rows, got.data(),
                          cuda::ProductFusion{.input_norm = norm_dev.data(), .norm_eps = kEps, .accumulate = accumulate},
                          nullptr);
      if (accumulate)
        expect_the_add_kernels_result(download(got), download(want), rows, input, "norm folded, with the add");
      else
        EXPECT_TRUE(same_bits(download(got), download(want))) << "norm folded";
    }
    // SwiGLU folded in, with the residual add (w2 in the model).
    cuda::kernels::swiglu_from_fused(input.data(), gate_up_dev.data(), rows, c.in, nullptr);
    DeviceBuffer<float> product(want.size());
    layer.forward(input.data(), rows, product.data(), nullptr);
    start(want, true);
    cuda::kernels::add_inplace(want.data(), product.data(), static_cast<std::size_t>(rows) * c.out, nullptr);
    start(got, true);
    layer.forward_fused(gate_up_dev.data(), rows, got.data(),
                        cuda::ProductFusion{.swiglu_of_gate_up = true, .accumulate = true}, nullptr);
    expect_the_add_kernels_result(download(got), download(want), rows, input, "SwiGLU folded, with the add");
  }
  // What neither path folds: no rows, or two inputs at once.
  EXPECT_THROW(layer.forward_fused(x_dev.data(), 0, got.data(), cuda::ProductFusion{.accumulate = true}, nullptr),
               std::logic_error);
  for (const int rows : {1, kRows})
    EXPECT_THROW(layer.forward_fused(x_dev.data(), rows, got.data(),
                                     cuda::ProductFusion{.input_norm = norm_dev.data(), .swiglu_of_gate_up = true},
                                     nullptr),
                 std::logic_error);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

INSTANTIATE_TEST_SUITE_P(Shapes, HalfGemvFusions, ::testing::ValuesIn(half_cases()), case_name);

// The fp32 layer folds nothing: the model runs the kernels around it.
TEST(DenseCudaLinear, FoldsNothing) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  cuda::CublasHandle cublas;
  const std::vector<float> weight = random_vector(8 * 16, 3, 1.0f);
  const cuda::DenseCudaLinear layer(weight, 8, 16, cublas.get());
  EXPECT_FALSE(layer.fuses(1));
  const DeviceBuffer<float> x(16);
  DeviceBuffer<float> y(8);
  EXPECT_THROW(layer.forward_fused(x.data(), 1, y.data(), cuda::ProductFusion{}, nullptr),
               std::logic_error);
#endif
}

// forward never allocates: past what reserve_rows prepared it throws.
TEST(HalfCudaLinear, ForwardPastTheReservedRowsThrows) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  constexpr int kOut = 96, kIn = 200;
  const std::vector<float> weight = random_vector(static_cast<std::size_t>(kOut) * kIn, 5, 0.5f);
  const std::vector<float> x = random_vector(static_cast<std::size_t>(17) * kIn, 6, 1.0f);
  cuda::CublasHandle cublas;
  HalfCudaLinear layer(weight, kOut, kIn, HalfType::Float16, std::make_shared<HalfActivationScratch>(),
                       cublas.get());
  const DeviceBuffer<float> x_dev{std::span<const float>(x)};
  DeviceBuffer<float> y_dev(static_cast<std::size_t>(17) * kOut);
  layer.reserve_rows(cuda::kMaxGemvRows);
  EXPECT_NO_THROW(layer.forward(x_dev.data(), cuda::kMaxGemvRows, y_dev.data(), nullptr));
  EXPECT_THROW(layer.forward(x_dev.data(), 17, y_dev.data(), nullptr), std::logic_error);
  layer.reserve_rows(17);
  EXPECT_NO_THROW(layer.forward(x_dev.data(), 17, y_dev.data(), nullptr));
  LLM_CUDA_CHECK(cudaDeviceSynchronize());

  // A layer that splits its columns needs scratch for even one row.
  const std::vector<float> kv_weight = random_vector(static_cast<std::size_t>(256) * 2048, 7, 0.5f);
  HalfCudaLinear kv_layer(kv_weight, 256, 2048, HalfType::BFloat16, std::make_shared<HalfActivationScratch>(),
                          cublas.get());
  if (kv_layer.gemv_k_splits() > 1) {
    const DeviceBuffer<float> kv_x(2048);
    DeviceBuffer<float> kv_y(256);
    EXPECT_THROW(kv_layer.forward(kv_x.data(), 1, kv_y.data(), nullptr), std::logic_error);
  }
#endif
}

// gemv_max_rows (CudaRunOptions::max_gemv_rows, --max-gemv-rows): a layer
// built with 1 sends 2..16 rows to cuBLAS, the bits of forward_with_cublas on
// the same rows, with the scratch that reserve_rows(16) grew, and 1 row to
// the GEMV, the bits of a default layer; it folds at every row count, as
// every half layer does. The default layer's GEMV adds those rows' products
// in another order than cuBLAS (its bits differ), so a forward that ignored
// the limit fails here. A limit the GEMV cannot take (0, 17) is refused when the layer is
// made, by the factory's layers too.
TEST(HalfCudaLinear, RowsPastGemvMaxRowsRunCublas) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  const HalfCase c{false, 256, 2048};  // TinyLlama's K/V projection, fp16, CUDA cores
  constexpr int kRows = cuda::kMaxGemvRows;
  const std::vector<float> weight = random_vector(static_cast<std::size_t>(c.out) * c.in, 60, 0.5f);
  const std::vector<float> x = random_vector(static_cast<std::size_t>(kRows) * c.in, 61, 1.0f);
  cuda::CublasHandle cublas;
  HalfCudaLinear gemv_layer = make_layer(weight, c, cublas.get());
  HalfCudaLinear layer(weight, c.out, c.in, HalfType::Float16, std::make_shared<HalfActivationScratch>(), cublas.get(),
                       cuda::HalfGemvKernel::CudaCores, /*gemv_max_rows=*/1);
  EXPECT_EQ(gemv_layer.gemv_max_rows(), cuda::kMaxGemvRows);
  EXPECT_EQ(layer.gemv_max_rows(), 1);
  EXPECT_EQ(layer.max_fused_rows(), cuda::kFusesAnyRowCount);
  EXPECT_TRUE(layer.fuses(2));
  gemv_layer.reserve_rows(kRows);
  layer.reserve_rows(kRows);
  const DeviceBuffer<float> x_dev{std::span<const float>(x)};
  DeviceBuffer<float> y_dev(static_cast<std::size_t>(kRows) * c.out);
  for (const int rows : {2, 5, 9, 16}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    const std::vector<float> routed = run_forward(layer, x_dev, rows, y_dev);
    LLM_CUDA_CHECK(cudaMemset(y_dev.data(), 0xff, y_dev.bytes()));
    layer.forward_with_cublas(x_dev.data(), rows, y_dev.data(), nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> cublas_bits(y_dev.size());
    y_dev.download(cublas_bits);
    EXPECT_TRUE(same_bits(routed, cublas_bits)) << "forward did not run cuBLAS past gemv_max_rows";
    EXPECT_FALSE(same_bits(run_forward(gemv_layer, x_dev, rows, y_dev), cublas_bits))
        << "the default layer's GEMV gave cuBLAS's bits: this test could not tell the two paths apart";
  }
  EXPECT_TRUE(same_bits(run_forward(layer, x_dev, 1, y_dev), run_forward(gemv_layer, x_dev, 1, y_dev)))
      << "1 row did not run the GEMV";
  LLM_CUDA_CHECK(cudaDeviceSynchronize());

  for (const int refused : {0, cuda::kMaxGemvRows + 1}) {
    SCOPED_TRACE("gemv_max_rows " + std::to_string(refused));
    try {
      HalfCudaLinear bad(weight, c.out, c.in, HalfType::Float16, std::make_shared<HalfActivationScratch>(),
                         cublas.get(), cuda::HalfGemvKernel::CudaCores, refused);
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      EXPECT_TRUE(HasSubstr(e.what(), "1.." + std::to_string(cuda::kMaxGemvRows))) << e.what();
      EXPECT_TRUE(HasSubstr(e.what(), "(got " + std::to_string(refused) + ")")) << e.what();
    }
    const cuda::CudaLinearFactory factory =
        cuda::half_cuda_linear_factory(HalfType::BFloat16, cuda::HalfGemvKernel::CudaCores, refused);
    EXPECT_THROW(factory(weight, c.out, c.in, LinearSite{0, LinearRole::Key}, cublas.get()), InputError);
  }
  const cuda::CudaLinearFactory one_row_factory =
      cuda::half_cuda_linear_factory(HalfType::BFloat16, cuda::HalfGemvKernel::CudaCores, 1);
  const std::unique_ptr<cuda::CudaLinear> one_row_layer =
      one_row_factory(weight, c.out, c.in, LinearSite{0, LinearRole::Key}, cublas.get());
  ASSERT_NE(dynamic_cast<const HalfCudaLinear*>(one_row_layer.get()), nullptr);
  EXPECT_EQ(dynamic_cast<const HalfCudaLinear&>(*one_row_layer).gemv_max_rows(), 1);
#endif
}

// fp16 ends at 65504: a weight of 1e6 becomes inf, which the constructor
// refuses, naming the layer. bf16 has fp32's exponent range: 1e6 rounds to
// 999424 (8 significant bits), and both paths compute with it exactly here.
TEST(HalfCudaLinear, WeightsBeyondFp16RangeThrowForFp16Only) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  constexpr int kOut = 8, kIn = 16, kRows = 17;
  std::vector<float> weight(static_cast<std::size_t>(kOut) * kIn, 0.25f);
  weight[3] = 1e6f;  // output 0, column 3
  cuda::CublasHandle cublas;
  try {
    HalfCudaLinear layer(weight, kOut, kIn, HalfType::Float16, std::make_shared<HalfActivationScratch>(),
                         cublas.get());
    ADD_FAILURE() << "a weight of 1e6 was accepted in fp16";
  } catch (const InputError& e) {
    EXPECT_TRUE(HasSubstr(e.what(), "[8, 16]"));
    EXPECT_TRUE(HasSubstr(e.what(), "fp16"));
  }

  const std::vector<float> ones(static_cast<std::size_t>(kRows) * kIn, 1.0f);
  const DeviceBuffer<float> x_dev{std::span<const float>(ones)};
  DeviceBuffer<float> y_dev(static_cast<std::size_t>(kRows) * kOut);
  for (const bool tensor_cores : {false, true}) {
    HalfCudaLinear layer(weight, kOut, kIn, HalfType::BFloat16, std::make_shared<HalfActivationScratch>(),
                         cublas.get(), gemv_kernel(tensor_cores));
    layer.reserve_rows(kRows);
    for (const int rows : {1, kRows}) {
      const std::vector<float> y = run_forward(layer, x_dev, rows, y_dev);
      for (int r = 0; r < rows; ++r) {
        EXPECT_EQ(y[static_cast<std::size_t>(r) * kOut], 999424.0f + 15 * 0.25f)
            << rows << " rows, row " << r << ", GEMV on " << to_string(layer.gemv_kernel());
        for (int o = 1; o < kOut; ++o) EXPECT_EQ(y[static_cast<std::size_t>(r) * kOut + o], 4.0f);
      }
    }
  }

  // A weight that is already not finite is refused in both types.
  std::vector<float> with_nan(static_cast<std::size_t>(kOut) * kIn, 0.25f);
  with_nan[kIn + 1] = std::nanf("");
  EXPECT_THROW(HalfCudaLinear(with_nan, kOut, kIn, HalfType::BFloat16, std::make_shared<HalfActivationScratch>(),
                              cublas.get()),
               InputError);
  // And a matrix of the wrong size.
  EXPECT_THROW(HalfCudaLinear(with_nan, kOut + 1, kIn, HalfType::Float16, std::make_shared<HalfActivationScratch>(),
                              cublas.get()),
               InputError);
#endif
}

// The factory's layers share one scratch: reserving through each and running
// them one after another on one stream gives each its own correct product.
TEST(HalfCudaLinear, FactoryLayersShareTheirScratch) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  EXPECT_EQ(cuda::to_string(HalfType::Float16), "fp16");
  EXPECT_EQ(cuda::to_string(HalfType::BFloat16), "bf16");
  constexpr int kRows = 33;
  const std::vector<std::pair<int, int>> shapes = {{96, 200}, {300, 96}, {72, 512}};
  for (const bool tensor_cores : {false, true})
  for (const bool bf16 : {false, true}) {
    const cuda::CudaLinearFactory factory = cuda::half_cuda_linear_factory(half_type(bf16), gemv_kernel(tensor_cores));
    cuda::CublasHandle cublas;
    std::vector<std::unique_ptr<cuda::CudaLinear>> layers;
    std::vector<Reference> refs;
    std::vector<DeviceBuffer<float>> inputs;
    for (std::size_t l = 0; l < shapes.size(); ++l) {
      const auto [out, in] = shapes[l];
      const std::vector<float> weight = random_vector(static_cast<std::size_t>(out) * in, 40 + l, 0.5f);
      const std::vector<float> x = random_vector(static_cast<std::size_t>(kRows) * in, 50 + l, 1.0f);
      std::vector<float> weight_rounded = weight;
      for (float& w : weight_rounded) w = rounded(w, bf16);
      refs.push_back(reference_product(weight_rounded, rounded_all(x, bf16), kRows, out, in));
      inputs.emplace_back(std::span<const float>(x));
      layers.push_back(factory(weight, out, in, LinearSite{static_cast<int>(l), LinearRole::Query}, cublas.get()));
      const auto* half_layer = dynamic_cast<HalfCudaLinear*>(layers.back().get());
      ASSERT_NE(half_layer, nullptr);
      EXPECT_EQ(half_layer->gemv_kernel(), gemv_kernel(tensor_cores));
    }
    for (const auto& layer : layers) layer->reserve_rows(kRows);
    for (const int rows : {kRows, 5}) {
      // All layers queued back to back, then checked.
      std::vector<DeviceBuffer<float>> outputs;
      for (std::size_t l = 0; l < layers.size(); ++l) {
        outputs.emplace_back(static_cast<std::size_t>(kRows) * shapes[l].first);
        LLM_CUDA_CHECK(cudaMemset(outputs.back().data(), 0xff, outputs.back().bytes()));
      }
      for (std::size_t l = 0; l < layers.size(); ++l)
        layers[l]->forward(inputs[l].data(), rows, outputs[l].data(), nullptr);
      LLM_CUDA_CHECK(cudaDeviceSynchronize());
      for (std::size_t l = 0; l < layers.size(); ++l) {
        std::vector<float> y(outputs[l].size());
        outputs[l].download(y);
        EXPECT_TRUE(matches_reference(y, refs[l], rows, shapes[l].first, shapes[l].second, bf16, tensor_cores))
            << (bf16 ? "bf16" : "fp16") << " layer " << l << ", " << rows << " rows, GEMV on "
            << to_string(gemv_kernel(tensor_cores));
      }
    }
  }
#endif
}

}  // namespace
}  // namespace llm
