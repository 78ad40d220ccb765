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
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
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
#include "llm/parallel_for.hpp"
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
// output (the scale of every error bound). Each output on its own, so blocks
// of outputs run on every core (the largest shapes' references are long work
// for one thread); the sums are the same on any number of threads.
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
  constexpr int kBlockOutputs = 64;  // outputs per piece: a small product is one piece, no thread started
  llm::parallel_for(static_cast<std::size_t>((out + kBlockOutputs - 1) / kBlockOutputs), [&](std::size_t block) {
    const int first = static_cast<int>(block) * kBlockOutputs;
    for (int o = first; o < std::min(out, first + kBlockOutputs); ++o) {
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
  });
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

// All of `buffer` on the host, once the work queued before has finished.
std::vector<float> download(const DeviceBuffer<float>& buffer) {
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> host(buffer.size());
  buffer.download(host);
  return host;
}

// Runs layer.forward on the first `rows` rows of x_dev into a poisoned y
// [max_rows, out] and returns all of y.
std::vector<float> run_forward(const HalfCudaLinear& layer, const DeviceBuffer<float>& x_dev, int rows,
                               DeviceBuffer<float>& y_dev) {
  LLM_CUDA_CHECK(cudaMemset(y_dev.data(), 0xff, y_dev.bytes()));
  layer.forward(x_dev.data(), rows, y_dev.data(), nullptr);
  return download(y_dev);
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
  // The column split of before (--no-gemv-wave-fit): other slices where the
  // whole-wave split moved them (on 132 SMs the tensor-core [20000, 100]),
  // the same reference and bound, every row count the GEMV takes.
  const int whole_wave_splits = layer.gemv_k_splits();
  layer.set_whole_wave_split(false);
  layer.reserve_rows(kMaxRows);
  std::cout << "[ info     ] the split of before: " << layer.gemv_k_splits() << " ways (whole waves: "
            << whole_wave_splits << ")\n";
  for (const int rows : {1, 2, 3, 5, 8, 9, 15, 16}) {
    EXPECT_TRUE(matches_reference(run_forward(layer, x_dev, rows, y_dev), ref, rows, c.out, c.in, c.bf16,
                                  c.tensor_cores))
        << rows << " rows, the split of before";
  }
  layer.set_whole_wave_split(true);
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

// The next product's first weights, asked of L2 once a thread's own are read
// (weight_prefetch.hpp; the model's --gemv-prefetch-next), are a hint too:
// the same bits in every bucket with them and without. The next product
// here is a [4224, 4200] layer, whose rows of 8400 bytes start off the
// 128-byte lines (the runs' extra line). Only the CUDA-core kernel has such
// lines and asks for them; the tensor-core kernel gives none and ignores
// what it is given.
TEST_P(HalfGemvRowOrder, TheNextProductsPrefetchChangesNoBit) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  const HalfCase c = GetParam();
  RandomGemvLayer random(c, 3500u);
  HalfCudaLinear& layer = random.layer;
  EXPECT_EQ(layer.next_product_lines().lines(), 0) << "no prefetch by default";
  EXPECT_EQ(layer.first_weight_lines().lines() > 0, !c.tensor_cores);
  const RandomGemvLayer next(HalfCase{c.bf16, 4224, 4200, /*tensor_cores=*/false}, 3600u);
  const cuda::FirstWeightLines next_lines = next.layer.first_weight_lines();
  ASSERT_GT(next_lines.lines(), 0);
  EXPECT_EQ(next_lines.lines_per_run, 5) << "8400-byte rows: a run of 4 lines may touch 5";
  expect_the_same_bits_either_way(random, {1, 2, 4, 9, cuda::kMaxGemvRows}, [&](bool on) {
    layer.set_next_product_lines(on ? next_lines : cuda::FirstWeightLines{});
  });
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

class HalfGemvRopeFold : public ::testing::TestWithParam<HalfCase> {};

#if defined(LLM_WITH_CUDA)
// The fused QKV product of the RoPE fold's test: 6 query heads and 2 KV heads
// (GQA) of 16 values, so out = (6 + 2 x 2) x 16 = 160, not a multiple of 64:
// two whole blocks of 64 CUDA-core outputs and a partial one.
constexpr int kRopeHeads = 6;
constexpr int kRopeKvHeads = 2;
constexpr int kRopeHeadDim = 16;
constexpr int kRopeQWidth = kRopeHeads * kRopeHeadDim;   // 96: Q's columns of a product row
constexpr int kRopeKvDim = kRopeKvHeads * kRopeHeadDim;  // 32: K's columns, then V's
constexpr int kRopeOut = kRopeQWidth + 2 * kRopeKvDim;   // 160
constexpr int kRopeRows = 21;       // the buffers' rows, and a forward past the GEMV's 16 (cuBLAS's path)
constexpr int kRopePositions = 48;  // rows of the RoPE tables, and positions of each sequence in the caches
constexpr int kRopeSequences = 2;

// Product row r appends to sequence rope_sequence(r) at position
// rope_position(r): positions distinct over all rows (17 is prime to 48), out
// of order, position 0 among them (row 11), every one inside the tables.
int rope_sequence(int r) { return r % 3 == 1 ? 1 : 0; }
int rope_position(int r) { return (17 * r + 5) % kRopePositions; }

// Where a cache's rows live: blocks of block_size positions in one pool (K's
// and V's alike), each sequence's blocks listed in its block table.
struct RopeCacheLayout {
  std::string name;
  int block_size = 0;
  int pool_blocks = 0;
  std::vector<std::int32_t> block_tables;  // [kRopeSequences, blocks_per_sequence()] physical blocks
  int blocks_per_sequence() const { return kRopePositions / block_size; }
  int pool_rows() const { return pool_blocks * block_size; }
  // The pool row of (sequence, position), as KvView::row_index finds it.
  int pool_row(int sequence, int position) const {
    return block_tables[static_cast<std::size_t>(sequence * blocks_per_sequence() + position / block_size)] *
               block_size +
           position % block_size;
  }
};
// A contiguous cache (one block of every position per sequence, as the
// model's own cache) and a paged one: blocks of 8 positions, out of order in a
// pool of 14, where blocks 6 and 10 belong to no sequence.
std::vector<RopeCacheLayout> rope_cache_layouts() {
  static_assert(kRopePositions % 8 == 0);
  return {{"contiguous fp32 cache", kRopePositions, kRopeSequences, {0, 1}},
          {"paged fp32 cache", 8, 14, {9, 2, 13, 4, 7, 0, /* sequence 1: */ 5, 11, 1, 12, 3, 8}}};
}

// What one side of the comparison writes, every float NaN (poison) before
// each forward: the product y [kRopeRows, kRopeOut], the rotated queries q
// [kRopeRows, kRopeQWidth], and the cache pools keys and values [pool rows,
// kRopeKvDim], which the layer and the kernel reach through views
// [kRopeRows] (row r's view: its sequence's block table in block_tables_dev).
struct RopeOutputs {
  RopeOutputs(const RopeCacheLayout& layout, const DeviceBuffer<std::int32_t>& block_tables_dev)
      : y(static_cast<std::size_t>(kRopeRows) * kRopeOut),
        q(static_cast<std::size_t>(kRopeRows) * kRopeQWidth),
        keys(static_cast<std::size_t>(layout.pool_rows()) * kRopeKvDim),
        values(keys.size()),
        views(kRopeRows) {
    std::vector<KvView> host_views(kRopeRows);  // [kRopeRows]
    for (int r = 0; r < kRopeRows; ++r) {
      KvView& view = host_views[static_cast<std::size_t>(r)];
      view.keys = keys.data();
      view.values = values.data();
      view.block_table = block_tables_dev.data() + rope_sequence(r) * layout.blocks_per_sequence();
      view.block_size = layout.block_size;
      view.kv_dim = kRopeKvDim;
      view.head_dim = kRopeHeadDim;
      view.element = KvElement::Float32;
    }
    views.upload(host_views);
  }
  void poison() {
    for (DeviceBuffer<float>* buffer : {&y, &q, &keys, &values})
      LLM_CUDA_CHECK(cudaMemset(buffer->data(), 0xff, buffer->bytes()));
  }
  DeviceBuffer<float> y;       // [kRopeRows, kRopeOut]
  DeviceBuffer<float> q;       // [kRopeRows, kRopeQWidth]
  DeviceBuffer<float> keys;    // [pool rows, kRopeKvDim]
  DeviceBuffer<float> values;  // [pool rows, kRopeKvDim]
  DeviceBuffer<KvView> views;  // [kRopeRows]
};

// "1.5 (bits 0x3fc00000)": a float and its bits, for the messages.
std::string float_and_bits(float v) {
  char text[64];
  std::snprintf(text, sizeof text, "%.9g (bits 0x%08x)", static_cast<double>(v), static_cast<unsigned>(bits_of(v)));
  return text;
}

// Column `column` of a row `width` floats wide, by head: a product row of y
// is Q | K | V; a q row is query heads, a cache row KV heads.
std::string rope_column_name(int width, int column) {
  std::string part;
  int in_part = column;
  if (width == kRopeOut) {
    part = column < kRopeQWidth ? "Q " : column < kRopeQWidth + kRopeKvDim ? "K " : "V ";
    in_part = column < kRopeQWidth ? column : (column - kRopeQWidth) % kRopeKvDim;
  }
  return part + "head " + std::to_string(in_part / kRopeHeadDim) + " element " +
         std::to_string(in_part % kRopeHeadDim);
}

// got against want, rows of `width` floats, bit for bit; where they differ,
// says where (the first 6): `what` names the buffer, row_name(row) the row.
::testing::AssertionResult same_bits_by_row(const std::vector<float>& got, const std::vector<float>& want, int width,
                                            const std::string& what, const std::function<std::string(int)>& row_name) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " floats against " << want.size();
  int differences = 0;
  std::string first;
  for (std::size_t at = 0; at < got.size(); ++at) {
    if (bits_of(got[at]) == bits_of(want[at]) || ++differences > 6) continue;
    const auto row = static_cast<int>(at / static_cast<std::size_t>(width));
    const auto column = static_cast<int>(at % static_cast<std::size_t>(width));
    first += "\n    " + row_name(row) + ", " + rope_column_name(width, column) + ": got " + float_and_bits(got[at]) +
             ", expected " + float_and_bits(want[at]);
  }
  if (differences == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << differences << " of " << got.size()
                                       << " floats differ, first:" << first;
}

// Floats of `values` that are not poison.
std::size_t written_floats(const std::vector<float>& values) {
  return static_cast<std::size_t>(
      std::count_if(values.begin(), values.end(), [](float v) { return bits_of(v) != kPoisonBits; }));
}
#endif  // LLM_WITH_CUDA

// forward_fused with fusion.rope: the QKV product's RoPE and K/V append
// folded into its last writes. What the model checks only through its logits
// (CudaFusions.RopeInTheQkvProductGivesTheKernelsBits), here named by buffer,
// row, head and element: q and the K and V cache rows must hold the bits of
// forward then kernels::rope_and_write_kv (what the model runs unfolded),
// and every cache row no product row writes must stay NaN, in a contiguous
// and a paged cache of two sequences, each row at its own position, with and
// without the RMSNorm folded in too (as the model folds both). Where the
// fold runs (the CUDA-core GEMV, 1..16 rows, columns split or not) y must
// stay NaN: the proof that the fold, not a fallback, wrote q and the cache.
// The tensor-core GEMV and cuBLAS's path (21 rows) do not fold: the layer
// writes y (the plain product's bits) and runs rope_and_write_kv itself.
TEST_P(HalfGemvRopeFold, RopeAndKvAppendGiveTheKernelsBits) {
  LLM_REQUIRE_CUDA_DEVICE();
#if defined(LLM_WITH_CUDA)
  const HalfCase c = GetParam();
  ASSERT_EQ(c.out, kRopeOut) << "the cases must be QKV products of this test's heads";
  constexpr float kEps = 1e-5f;
  const std::uint64_t seed = 700u + static_cast<std::uint64_t>(c.in) * 3u + (c.bf16 ? 1u : 0u);
  const std::vector<float> weight = random_vector(static_cast<std::size_t>(c.out) * c.in, seed, 0.5f);
  const std::vector<float> x = random_vector(static_cast<std::size_t>(kRopeRows) * c.in, seed + 1, 1.0f);
  const std::vector<float> norm = random_vector(static_cast<std::size_t>(c.in), seed + 2, 2.0f);
  // Arbitrary table entries, not the cos and sin of real angles: a fold that
  // reads another position's or pair's entry, or swaps cos and sin, changes
  // bits even at position 0.
  const std::size_t table_floats = static_cast<std::size_t>(kRopePositions) * (kRopeHeadDim / 2);
  const std::vector<float> cos_table = random_vector(table_floats, seed + 3, 1.0f);
  const std::vector<float> sin_table = random_vector(table_floats, seed + 4, 1.0f);
  std::vector<int> positions(kRopeRows);  // [kRopeRows]
  for (int r = 0; r < kRopeRows; ++r) positions[static_cast<std::size_t>(r)] = rope_position(r);

  cuda::CublasHandle cublas;
  HalfCudaLinear layer = make_layer(weight, c, cublas.get());
  layer.reserve_rows(kRopeRows);
  // One step of 64 columns (in <= 64) is never split; two or more are on any
  // GPU of 3 SMs or more (3 CUDA-core or 2 tensor-core output blocks, one
  // step a slice while the blocks fit one wave of 2 per SM: choose_column_split).
  EXPECT_EQ(layer.gemv_k_splits() > 1, c.in > 64)
      << "the GEMV splits the columns " << layer.gemv_k_splits() << " ways: this case was meant to "
      << (c.in > 64 ? "" : "not ") << "split them";
  std::cout << "[ info     ] " << to_string(layer.type()) << " [" << c.out << ", " << c.in << "], GEMV on "
            << to_string(layer.gemv_kernel()) << ": splits the columns " << layer.gemv_k_splits() << " ways\n";

  const DeviceBuffer<float> x_dev{std::span<const float>(x)};              // [kRopeRows, in]
  const DeviceBuffer<float> norm_dev{std::span<const float>(norm)};        // [in]
  const DeviceBuffer<float> cos_dev{std::span<const float>(cos_table)};    // [kRopePositions, kRopeHeadDim / 2]
  const DeviceBuffer<float> sin_dev{std::span<const float>(sin_table)};    // [kRopePositions, kRopeHeadDim / 2]
  const DeviceBuffer<int> positions_dev{std::span<const int>(positions)};  // [kRopeRows]
  DeviceBuffer<float> normed(static_cast<std::size_t>(kRopeRows) * c.in);  // [kRopeRows, in]: rmsnorm's output

  for (const RopeCacheLayout& layout : rope_cache_layouts()) {
    ASSERT_EQ(layout.block_tables.size(), static_cast<std::size_t>(kRopeSequences * layout.blocks_per_sequence()));
    // [kRopeSequences, blocks per sequence]
    const DeviceBuffer<std::int32_t> block_tables_dev{std::span<const std::int32_t>(layout.block_tables)};
    RopeOutputs want(layout, block_tables_dev), got(layout, block_tables_dev);
    // Each pool row's (sequence, position), -1 in a block no sequence owns.
    std::vector<int> pool_sequence(static_cast<std::size_t>(layout.pool_rows()), -1);  // [pool rows]
    std::vector<int> pool_position(pool_sequence.size(), -1);                         // [pool rows]
    for (int s = 0; s < kRopeSequences; ++s)
      for (int p = 0; p < kRopePositions; ++p) {
        const auto row = static_cast<std::size_t>(layout.pool_row(s, p));
        pool_sequence[row] = s;
        pool_position[row] = p;
      }

    for (const bool with_norm : {false, true})
      for (const int rows : {1, 3, 9, 16, kRopeRows}) {
        const bool folds = !c.tensor_cores && rows <= layer.gemv_max_rows();
        const std::string path = folds                          ? "folded into the CUDA-core GEMV"
                                 : rows > layer.gemv_max_rows() ? "cuBLAS's path, then the RoPE kernel"
                                                                : "the tensor-core GEMV, then the RoPE kernel";
        SCOPED_TRACE(layout.name + ", " + std::to_string(rows) + " rows, " + path +
                     (with_norm ? ", RMSNorm folded too" : ""));
        // The product row that writes each pool row, -1: none.
        std::vector<int> writer(pool_sequence.size(), -1);  // [pool rows]
        for (int r = 0; r < rows; ++r)
          writer[static_cast<std::size_t>(layout.pool_row(rope_sequence(r), rope_position(r)))] = r;
        const auto pool_row_name = [&](int row) {
          const auto at = static_cast<std::size_t>(row);
          std::string name = "pool row " + std::to_string(row);
          if (pool_sequence[at] < 0) return name + " (in a block no sequence owns: must stay NaN)";
          name += " (sequence " + std::to_string(pool_sequence[at]) + ", position " + std::to_string(pool_position[at]);
          return writer[at] >= 0 ? name + ", written by product row " + std::to_string(writer[at]) + ")"
                                 : name + ", which no product row writes: must stay NaN)";
        };
        const auto product_row_name = [&](int row) {
          return "row " + std::to_string(row) +
                 (row < rows ? " (position " + std::to_string(rope_position(row)) + ", sequence " +
                                   std::to_string(rope_sequence(row)) + ")"
                             : " (past the rows: must stay NaN)");
        };

        want.poison();
        got.poison();
        // What the model runs unfolded: (rmsnorm,) forward, rope_and_write_kv
        // reading the product's Q, K and V columns in place (stride out).
        const float* product_input = x_dev.data();
        if (with_norm) {
          cuda::kernels::rmsnorm(normed.data(), x_dev.data(), norm_dev.data(), rows, c.in, kEps, nullptr);
          product_input = normed.data();
        }
        layer.forward(product_input, rows, want.y.data(), nullptr);
        const cuda::kernels::QkvRows product_columns{want.y.data(), want.y.data() + kRopeQWidth,
                                                     want.y.data() + kRopeQWidth + kRopeKvDim,
                                                     kRopeOut, kRopeOut, kRopeOut};
        cuda::kernels::rope_and_write_kv(product_columns, want.q.data(), nullptr, nullptr, want.views.data(),
                                         positions_dev.data(), rows, kRopeHeads, kRopeKvHeads, kRopeHeadDim,
                                         cos_dev.data(), sin_dev.data(), KvElement::Float32, nullptr);
        // The same, folded into the product.
        const cuda::ProductFusion fusion{.input_norm = with_norm ? norm_dev.data() : nullptr,
                                         .norm_eps = kEps,
                                         .rope = {.q_out = got.q.data(),
                                                  .views = got.views.data(),
                                                  .positions = positions_dev.data(),
                                                  .cos_table = cos_dev.data(),
                                                  .sin_table = sin_dev.data(),
                                                  .n_heads = kRopeHeads,
                                                  .n_kv_heads = kRopeKvHeads,
                                                  .head_dim = kRopeHeadDim}};
        layer.forward_fused(x_dev.data(), rows, got.y.data(), fusion, nullptr);

        const std::vector<float> want_q = download(want.q), want_keys = download(want.keys),
                                 want_values = download(want.values), want_y = download(want.y);
        // Not a comparison of poison with poison: the reference wrote every
        // row's q, K and V (and y), and nothing else.
        const auto rows_floats = [rows](int width) { return static_cast<std::size_t>(rows * width); };
        ASSERT_EQ(written_floats(want_q), rows_floats(kRopeQWidth)) << "the reference's q";
        ASSERT_EQ(written_floats(want_keys), rows_floats(kRopeKvDim)) << "the reference's K cache rows";
        ASSERT_EQ(written_floats(want_values), rows_floats(kRopeKvDim)) << "the reference's V cache rows";
        ASSERT_EQ(written_floats(want_y), rows_floats(kRopeOut)) << "the reference's y";

        EXPECT_TRUE(same_bits_by_row(download(got.q), want_q, kRopeQWidth, "q (rotated queries)", product_row_name));
        EXPECT_TRUE(same_bits_by_row(download(got.keys), want_keys, kRopeKvDim, "K cache", pool_row_name));
        EXPECT_TRUE(same_bits_by_row(download(got.values), want_values, kRopeKvDim, "V cache", pool_row_name));
        if (folds) {
          const std::vector<float> poison(want_y.size(), std::bit_cast<float>(kPoisonBits));
          EXPECT_TRUE(same_bits_by_row(download(got.y), poison, kRopeOut,
                                       "y, which the fold leaves unwritten (written: the fold did not run)",
                                       product_row_name));
        } else {
          EXPECT_TRUE(same_bits_by_row(download(got.y), want_y, kRopeOut,
                                       "y, which the layer writes before it runs rope_and_write_kv",
                                       product_row_name));
        }
      }
  }
#endif
}

// in = 48: one step of 64 columns, never split; 96: two steps, 2 slices;
// 200: four steps (the last of 8 columns), 4 slices on a GPU of 132 SMs (on
// any of 6 or more).
INSTANTIATE_TEST_SUITE_P(Shapes, HalfGemvRopeFold,
                         ::testing::ValuesIn(on_both_kernels({HalfCase{false, 160, 48}, HalfCase{true, 160, 48},
                                                              HalfCase{false, 160, 96}, HalfCase{true, 160, 96},
                                                              HalfCase{false, 160, 200}, HalfCase{true, 160, 200}})),
                         case_name);

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
