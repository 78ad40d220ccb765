// Step 02 on CUDA: every CUDA variant of the step's table against the float64
// reference (of the rounded inputs, for fp16/bf16) on fresh random Q/K/V,
// outputs poisoned with NaN before each run: lengths 1, 7, 33, 129, 1000 and
// tile multiples, causal and not, seqlen_q != seqlen_k, head dims 64 and 128,
// GQA, and large-magnitude logits in fp16 (no overflow, no NaN). Split-KV
// decode gets long caches with one query. Every test skips with the reason
// when no CUDA device is usable (always in a CPU-only build).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_problem.hpp"
#include "cuda_runner.hpp"
#include "half_precision.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/harness/compare.hpp"
#include "reference_attention.hpp"
#include "test_support.hpp"
#include "variants.hpp"

#define LLM_REQUIRE_CUDA_DEVICE()                                                             \
  do {                                                                                        \
    const ::llm::cuda::DeviceStatus llm_status_ = ::llm::cuda::device_status();               \
    if (!llm_status_.usable) GTEST_SKIP() << "no usable CUDA device: " << llm_status_.reason; \
  } while (0)

namespace {

using step02::AttentionProblem;

struct Case {
  std::string name;
  AttentionProblem problem;
  float qk_scale = 2.0f;
  // fp32 limit on max_rel_err. 1e-5 normally; with logits in the hundreds or
  // thousands the float32 rounding of the logit itself (ulp(1000) = 6e-5,
  // summed over d products) moves p = exp(s - m) by ~1e-4 whatever the
  // algorithm, so those cases check "no overflow, no NaN, still close".
  double fp32_limit = 1e-5;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  // 64: the CUDA kernels' query/key tile; 128 = two tiles.
  for (int len : {1, 7, 33, 129, 1000, 64, 128}) {
    for (bool causal : {true, false}) {
      for (int d : {64, 128}) {
        c.push_back({"len" + std::to_string(len) + (causal ? "_causal" : "_full") + "_d" + std::to_string(d),
                     {2, 2, d, len, len, causal}});
      }
    }
  }
  c.push_back({"q7_k129_causal", {2, 2, 64, 7, 129, true}});
  c.push_back({"q33_k1000_causal_d128", {2, 2, 128, 33, 1000, true}});
  c.push_back({"q129_k7_full", {2, 2, 64, 129, 7, false}});
  c.push_back({"q129_k33_causal_empty_rows", {2, 2, 64, 129, 33, true}});
  c.push_back({"gqa4_len129_causal", {8, 2, 64, 129, 129, true}});
  // Decode: one query against a long cache (what split-KV is made for).
  c.push_back({"decode_k1_d64", {4, 4, 64, 1, 1, true}});
  c.push_back({"decode_k5000_d64", {4, 4, 64, 1, 5000, true}});
  c.push_back({"decode_k4097_d128_gqa", {8, 2, 128, 1, 4097, true}});
  // Large logits: |q.k|/sqrt(d) in the thousands. fp16 holds q and k (|x| <= 20
  // < 65504), the scores are accumulated in fp32, and the softmax subtracts the
  // max, so nothing overflows; P in [0, 1] is safe in fp16.
  c.push_back({"large_logits_len129_causal_d64", {2, 2, 64, 129, 129, true}, 20.0f, 1e-3});
  c.push_back({"large_logits_len1000_full_d128", {2, 2, 128, 1000, 1000, false}, 20.0f, 1e-3});
  return c;
}

class CudaVariantTest : public ::testing::TestWithParam<std::tuple<int, Case>> {};

TEST_P(CudaVariantTest, MatchesFloat64Reference) {
  LLM_REQUIRE_CUDA_DEVICE();
  const auto& [id, c] = GetParam();
  const auto& variant = step02::find_variant(id);
  const AttentionProblem& p = c.problem;
  const std::uint64_t seed = 99 + static_cast<std::uint64_t>(p.seqlen_q) * 13 + p.seqlen_k + p.head_dim;
  const auto q = llm::testing::random_vector(p.q_elements(), seed, c.qk_scale);
  const auto k = llm::testing::random_vector(p.kv_elements(), seed + 1, c.qk_scale);
  const auto v = llm::testing::random_vector(p.kv_elements(), seed + 2, 1.0f);
  step02::CudaProblem gpu(p, q, k, v);
  const std::string skip = gpu.skip_reason(variant);
  if (!skip.empty()) GTEST_SKIP() << variant.name << ": " << skip;

  // The reference sees what the variant sees: inputs rounded to its precision.
  const auto dtype = variant.fn.dtype;
  const auto rows = step02::rows_to_check(p, 1 << 30);
  const auto ref = step02::reference_attention_f64(p, step02::rounded_to(q, dtype), step02::rounded_to(k, dtype),
                                                   step02::rounded_to(v, dtype), rows);
  const auto got = gpu.run_once(variant);  // poisoned with NaN first
  const auto r = llm::compare(got, ref, llm::tolerance_for(dtype));
  const double limit = dtype == llm::DType::F32 ? c.fp32_limit : 1e-2;
  EXPECT_EQ(r.nan_or_inf, 0u) << variant.name << " on " << p.describe() << ": " << r.summary();
  EXPECT_LE(r.max_rel_err, limit) << variant.name << " on " << p.describe() << ": " << r.summary();
}

std::vector<int> cuda_variant_ids() {
  std::vector<int> ids;
  for (const auto& v : step02::variants())
    if (v.backend == llm::Backend::Cuda) ids.push_back(v.id);
  return ids;
}

INSTANTIATE_TEST_SUITE_P(step02, CudaVariantTest, ::testing::Combine(::testing::ValuesIn(cuda_variant_ids()),
                                                                     ::testing::ValuesIn(cases())),
                         [](const auto& info) {
                           return step02::find_variant(std::get<0>(info.param)).name + "_" +
                                  std::get<1>(info.param).name;
                         });

// The timer runs and reports positive times (CUDA events around the launches).
TEST(step02CudaTiming, TimesEveryRunnableVariant) {
  LLM_REQUIRE_CUDA_DEVICE();
  const AttentionProblem p{4, 4, 64, 256, 256, true};
  const auto q = llm::testing::random_vector(p.q_elements(), 1, 2.0f);
  const auto k = llm::testing::random_vector(p.kv_elements(), 2, 2.0f);
  const auto v = llm::testing::random_vector(p.kv_elements(), 3, 1.0f);
  step02::CudaProblem gpu(p, q, k, v);
  for (int id : cuda_variant_ids()) {
    const auto& variant = step02::find_variant(id);
    if (!gpu.skip_reason(variant).empty()) continue;
    const auto t = gpu.time(variant, 1, 3);
    EXPECT_GT(t.median_ms, 0.0) << variant.name;
    EXPECT_EQ(t.runs, 3) << variant.name;
  }
}

}  // namespace
