// Step 02 on CUDA: every CUDA variant of the step's table against the float64
// reference (of the rounded inputs, for fp16/bf16) on fresh random Q/K/V,
// outputs poisoned with NaN before each run: lengths 1, 7, 33, 129, 1000 and
// tile multiples, causal and not, seqlen_q != seqlen_k, head dims 64 and 128,
// GQA, and large-magnitude logits in fp16 (no overflow, no NaN). Split-KV
// decode gets long caches with one query. FA1 also at the small head dims it
// is compiled for (8 = the `tiny` preset); the fused kernels must refuse those
// with an InputError. The FlashAttention-2 ladder (variants 7-12) must also
// give variant 4's bits (or their 16-bit rounding), and its instruction cuts
// (13-16) stay within rounding of the rung before. Then the model: a CudaModel with
// the FA1 kernel in its attention hook against the default CudaModel and the
// CPU reference, every logits row, one prefill and a second chunk after it.
// Every test that needs a GPU skips with the reason where no GPU can be
// present (always in a CPU-only build) and fails where one is present but
// unusable (LLM_REQUIRE_CUDA_DEVICE, tests/test_support.hpp); the argument
// checks run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <random>
#include <span>
#include <string>
#include <ostream>
#include <utility>
#include <vector>

#include "llm/config.hpp"
#include "llm/cpu_model.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/weights.hpp"
#include "step02_flash_attention/attention_problem.hpp"
#include "step02_flash_attention/half_precision.hpp"
#include "step02_flash_attention/measure/cuda_runner.hpp"
#include "step02_flash_attention/reference_attention.hpp"
#include "step02_flash_attention/variants.hpp"
#include "test_support.hpp"
#if defined(LLM_WITH_CUDA)
#include "step02_flash_attention/cuda_model_hooks.hpp"  // uses cudaStream_t: CUDA builds only
#endif

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

// GoogleTest prints a parameter it has no printer for as its raw bytes, heap
// pointers included, and CTest puts that text in the test's name: the name
// would change on every build. The case's own name is the stable printout.
void PrintTo(const Case& test_case, std::ostream* out) { *out << test_case.name; }

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
  // Head dims only FA1 is compiled for (the others refuse them, saying why): the
  // `tiny` preset's 8, and 16, 32, 48 with GQA and n_past > 0 shapes.
  c.push_back({"tiny_heads_len129_causal_d8", {8, 4, 8, 129, 129, true}});
  c.push_back({"q70_k370_causal_d16_gqa", {4, 2, 16, 70, 370, true}});
  c.push_back({"q33_k65_causal_d32_mqa", {2, 1, 32, 33, 65, true}});
  c.push_back({"len100_full_d48", {6, 6, 48, 100, 100, false}});
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

// A case's random Q, K and V: the same for every variant that runs the case.
struct CaseInputs {
  std::vector<float> q, k, v;
};
CaseInputs inputs_of(const Case& c) {
  const AttentionProblem& p = c.problem;
  const std::uint64_t seed = 99 + static_cast<std::uint64_t>(p.seqlen_q) * 13 + p.seqlen_k + p.head_dim;
  return {llm::testing::random_vector(p.q_elements(), seed, c.qk_scale),
          llm::testing::random_vector(p.kv_elements(), seed + 1, c.qk_scale),
          llm::testing::random_vector(p.kv_elements(), seed + 2, 1.0f)};
}

// The float64 reference of a case on its inputs as `dtype` rounds them. Every
// variant of that dtype is checked against the same output, so it is computed
// once per (case, dtype) and kept for the suite's run, instead of once in
// every variant's test.
const std::vector<float>& reference_for(const Case& c, llm::DType dtype) {
  static std::map<std::pair<std::string, llm::DType>, std::vector<float>> references;  // [(case, dtype)]
  const std::pair<std::string, llm::DType> key{c.name, dtype};
  if (const auto found = references.find(key); found != references.end()) return found->second;
  const CaseInputs inputs = inputs_of(c);
  const AttentionProblem& p = c.problem;
  std::vector<float> reference =
      step02::reference_attention_f64(p, step02::rounded_to(inputs.q, dtype), step02::rounded_to(inputs.k, dtype),
                                      step02::rounded_to(inputs.v, dtype), step02::rows_to_check(p, 1 << 30));
  return references.emplace(key, std::move(reference)).first->second;  // stored only once computed
}

TEST_P(CudaVariantTest, MatchesFloat64Reference) {
  LLM_REQUIRE_CUDA_DEVICE();
  const auto& [id, c] = GetParam();
  const auto& variant = step02::find_variant(id);
  const AttentionProblem& p = c.problem;
  const CaseInputs inputs = inputs_of(c);
  step02::CudaProblem gpu(p, inputs.q, inputs.k, inputs.v);
  // A head dim the kernel is not compiled for (FA2 and split-KV: 64 and 128)
  // must be refused with a clear error, never run into garbage: that is the
  // check for those pairs. (A skip here would read as a GPU path that did not run.)
  if (variant.fn.unsupported && variant.fn.unsupported(p)) {
    EXPECT_TRUE(llm::testing::HasSubstr(gpu.skip_reason(variant), "head_dim"));
    EXPECT_THROW(gpu.run_once(variant), llm::InputError) << variant.name << " on " << p.describe();
    return;
  }
  const std::string skip = gpu.skip_reason(variant);
  ASSERT_TRUE(skip.empty()) << variant.name << " could not run on this GPU: " << skip;

  // The reference sees what the variant sees: inputs rounded to its precision.
  const auto dtype = variant.fn.dtype;
  const std::vector<float>& ref = reference_for(c, dtype);
  const auto got = gpu.run_once(variant);  // poisoned with NaN first
  const auto r = llm::compare(got, ref, llm::tolerance_for(dtype));
  const double limit = dtype == llm::DType::F32 ? c.fp32_limit : 1e-2;
  EXPECT_EQ(r.nan_or_inf, 0u) << variant.name << " on " << p.describe() << ": " << r.summary();
  EXPECT_LE(r.max_rel_err, limit) << variant.name << " on " << p.describe() << ": " << r.summary();
}

INSTANTIATE_TEST_SUITE_P(step02, CudaVariantTest,
                         ::testing::Combine(::testing::ValuesIn(llm::variant_ids(step02::variants(),
                                                                                 llm::Backend::Cuda)),
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
  for (int id : llm::variant_ids(step02::variants(), llm::Backend::Cuda)) {
    const auto& variant = step02::find_variant(id);
    if (!gpu.skip_reason(variant).empty()) continue;
    const auto t = gpu.time(variant, 1, 3);
    EXPECT_GT(t.median_ms, 0.0) << variant.name;
    EXPECT_EQ(t.runs, 3) << variant.name;
  }
}

// ---------------------------------------------------------------------------
// The FlashAttention-2 ladder (variants 7-12) changes the speed, not the
// numbers: every rung computes each output row with variant 4's operations in
// variant 4's order. The fragments come by other loads (cp.async, ldmatrix),
// a warp holds more rows, blocks run in another order, and the mask is
// skipped only where it would change nothing. So their fp32 outputs must be
// variant 4's bit for bit, and the 16-bit outputs variant 10's (in bf16:
// variant 5's) rounded to 16 bits. The float64 check above allows an error of
// 1e-2; this one allows none, so a wrong fragment, a missed barrier or a
// mask skipped on one tile too many shows even where it stays "close".
// One exception by design: at d = 128, variants 9-12 take 32-key tiles (the
// registers of 32 rows per warp, v7_v16_cuda_flash2_tuned.cu), a different
// sequence of online-softmax rescales; there only 9 = 10 and 11 = fp16(10).
// Variants 13 and 14 change the arithmetic on purpose (s x scale - m as one
// FFMA, 2^x without exp2f's fix-up below 2^-126; P relative to a stale max,
// up to 2^8), so they cannot give variant 11's bits: each is held to the rung
// before it within half the float64 check's bound. Their rounding moves an
// output by about one fp16 step; a real slip (a missed rescale, a max
// applied to the wrong row) moves it by a factor. Variant 15 changes only
// how K and V are copied: variant 14's bits again.

struct LadderCase {
  std::string name;
  AttentionProblem problem;
};
void PrintTo(const LadderCase& c, std::ostream* out) { *out << c.name; }

std::vector<LadderCase> ladder_cases() {
  std::vector<LadderCase> c;
  for (int d : {64, 128}) {
    const std::string dim = "_d" + std::to_string(d);
    // Many tiles and query blocks (the double buffer's both halves, heavy
    // blocks first), causal and not.
    c.push_back({"len1000_causal" + dim, {4, 4, d, 1000, 1000, true}});
    c.push_back({"len1000_full" + dim, {4, 4, d, 1000, 1000, false}});
    // New queries after a cached prefix: mask-free tiles, then the diagonal.
    c.push_back({"q33_k1000_causal" + dim, {4, 4, d, 33, 1000, true}});
    // Rows that see no key (their output is 0), one block of 128 rows.
    c.push_back({"q129_k33_causal_empty_rows" + dim, {4, 4, d, 129, 33, true}});
    // GQA, a length that is no multiple of any tile, one query.
    c.push_back({"gqa4_len300_causal" + dim, {8, 2, d, 300, 300, true}});
    c.push_back({"decode_k777" + dim, {4, 4, d, 1, 777, true}});
  }
  return c;
}

// Elements whose bits differ (the callers check for NaN first: two NaN
// outputs must never count as equal).
std::size_t bit_differences(const std::vector<float>& got, const std::vector<float>& want) {
  std::size_t differ = got.size() == want.size() ? 0 : std::max(got.size(), want.size());
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    differ += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]);
  return differ;
}
std::size_t non_finite(const std::vector<float>& values) {
  return static_cast<std::size_t>(std::count_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); }));
}

class Flash2LadderTest : public ::testing::TestWithParam<LadderCase> {};

TEST_P(Flash2LadderTest, EveryRungGivesVariant4sBits) {
  LLM_REQUIRE_CUDA_DEVICE();
  const AttentionProblem& p = GetParam().problem;
  const std::uint64_t seed = 4242 + static_cast<std::uint64_t>(p.seqlen_q) * 31 + p.seqlen_k + p.head_dim;
  const auto q = llm::testing::random_vector(p.q_elements(), seed, 2.0f);
  const auto k = llm::testing::random_vector(p.kv_elements(), seed + 1, 2.0f);
  const auto v = llm::testing::random_vector(p.kv_elements(), seed + 2, 1.0f);
  step02::CudaProblem gpu(p, q, k, v);
  std::map<int, std::vector<float>> out;  // variant id -> its output [Sq, q_row], as floats
  for (int id = 4; id <= 16; ++id) {
    if (id == 6) continue;  // split-KV decode: another algorithm
    const auto& variant = step02::find_variant(id);
    const std::string skip = gpu.skip_reason(variant);
    ASSERT_TRUE(skip.empty()) << variant.name << " could not run on this GPU: " << skip;
    out[id] = gpu.run_once(variant);
    ASSERT_EQ(non_finite(out[id]), 0u) << variant.name << " on " << p.describe();
  }
  const bool same_tiles_as_variant4 = p.head_dim == 64;  // see above: d = 128 rows 9+ take 32-key tiles
  EXPECT_EQ(bit_differences(out[7], out[4]), 0u) << "cuda_flash2_async vs cuda_flash2_fp16";
  EXPECT_EQ(bit_differences(out[8], out[4]), 0u) << "cuda_flash2_ldmatrix vs cuda_flash2_fp16";
  if (same_tiles_as_variant4)
    EXPECT_EQ(bit_differences(out[9], out[4]), 0u) << "cuda_flash2_128rows vs cuda_flash2_fp16";
  EXPECT_EQ(bit_differences(out[10], out[9]), 0u) << "cuda_flash2_causal vs cuda_flash2_128rows";
  EXPECT_EQ(bit_differences(out[11], step02::rounded_to(out[10], llm::DType::F16)), 0u)
      << "cuda_flash2_tuned_fp16 vs cuda_flash2_causal rounded to fp16";
  if (same_tiles_as_variant4)
    EXPECT_EQ(bit_differences(out[12], step02::rounded_to(out[5], llm::DType::BF16)), 0u)
        << "cuda_flash2_tuned_bf16 vs cuda_flash2_bf16 rounded to bf16";
  const auto within_half_the_float64_bound = [&p](const std::vector<float>& got, const std::vector<float>& want,
                                                  const char* what) {
    const auto r = llm::compare(got, want, llm::tolerance_for(llm::DType::F16));
    EXPECT_LE(r.max_rel_err, 5e-3) << what << " on " << p.describe() << ": " << r.summary();
  };
  within_half_the_float64_bound(out[13], out[11], "cuda_flash2_fast_softmax vs cuda_flash2_tuned_fp16");
  within_half_the_float64_bound(out[14], out[13], "cuda_flash2_lazy_rescale vs cuda_flash2_fast_softmax");
  EXPECT_EQ(bit_differences(out[15], out[14]), 0u) << "cuda_flash2_hoisted_copies_fp16 vs cuda_flash2_lazy_rescale";
}

INSTANTIATE_TEST_SUITE_P(step02, Flash2LadderTest, ::testing::ValuesIn(ladder_cases()),
                         [](const auto& info) { return info.param.name; });

// A ladder row asked to write where it does not (a 16-bit-output row without
// args.out16, an fp32 one without args.out) says so instead of writing
// through a null pointer.
TEST(step02Flash2Ladder, RefusesAMissingOutput) {
  LLM_REQUIRE_CUDA_DEVICE();
  const AttentionProblem p{2, 2, 64, 64, 64, true};
  step02::AttentionArgs args;  // no inputs either: the check comes before any launch
  EXPECT_THROW(step02::find_variant(11).fn.run(p, args), llm::InputError);
  EXPECT_THROW(step02::find_variant(16).fn.run(p, args), llm::InputError);
  EXPECT_THROW(step02::find_variant(7).fn.run(p, args), llm::InputError);
}

// ---------------------------------------------------------------------------
// The model: FA1 in llm::cuda::CudaModel's attention hook.

struct ModelCase {
  std::string name;
  llm::ModelConfig config;
};
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name << " (" << c.config.describe() << ")"; }

std::vector<ModelCase> model_cases() {
  // head_dim 64 (the Llama kernels' size) with GQA 4/2; the rest small so the
  // CPU reference stays fast. seq_len 512 holds the longest test (300 + 70).
  const llm::ModelConfig head64 = llm::make_config(/*dim=*/256, /*hidden_dim=*/512, /*n_layers=*/2, /*n_heads=*/4,
                                                   /*n_kv_heads=*/2, /*vocab_size=*/300, /*seq_len=*/512,
                                                   /*shared_classifier=*/true);
  return {
      {"tiny", llm::find_preset("tiny").config},  // GQA 8/4, head_dim 8
      {"head64_gqa", head64},
  };
}

// Logits of every row (forward's span is only valid until the next call).
// Every row, not only the last: the last query sees every key, so a causal
// masking bug shows in the other rows first.
std::vector<float> all_rows(llm::Model& model, const llm::TokenBatch& batch, llm::KvCache& cache) {
  const auto logits = model.forward(batch, cache, llm::LogitsFor::AllRows);
  return {logits.begin(), logits.end()};
}

class FlashCudaModelTest : public ::testing::TestWithParam<ModelCase> {};

// For each prompt length n: a prefill of n tokens (n_past = 0), then a second
// chunk of 70 after it (n_past = n), on three models with the same weights.
// n = 1 is a single row, which the model sends to the decode kernel; its
// second chunk is then a prefill after one cached position.
TEST_P(FlashCudaModelTest, MatchesDefaultCudaModelAndCpu) {
  LLM_REQUIRE_CUDA_DEVICE();
  const llm::ModelConfig& config = GetParam().config;
  const llm::ModelWeights weights = llm::random_weights(config, 20240602);
  llm::CpuModel cpu(weights);
  const auto flash = step02::make_cuda_model(weights, step02::CudaModelPrefill::Flash1);
  const auto baseline = step02::make_cuda_model(weights, step02::CudaModelPrefill::Baseline);
  const int vocab = config.vocab_size;
  // 70 > 64: two query blocks of the kernel; not a multiple of a K/V tile.
  constexpr int kSecondChunk = 70;
  for (const int n : {1, 7, 33, 129, 300}) {
    SCOPED_TRACE("prompt of " + std::to_string(n) + " tokens");
    ASSERT_LE(n + kSecondChunk, config.seq_len);
    const auto tokens = llm::testing::random_tokens(n + kSecondChunk, vocab, 1000u + static_cast<unsigned>(n));
    const std::vector<int> first(tokens.begin(), tokens.begin() + n), second(tokens.begin() + n, tokens.end());
    const auto cpu_cache = cpu.make_cache(1, config.seq_len);
    const auto flash_cache = flash->make_cache(1, config.seq_len);
    const auto baseline_cache = baseline->make_cache(1, config.seq_len);
    for (const auto& [chunk, n_past] : {std::pair{&first, 0}, std::pair{&second, n}}) {
      const llm::TokenBatch batch = llm::TokenBatch::prefill(*chunk, n_past, 0);
      const std::string where = std::to_string(chunk->size()) + " rows at n_past " + std::to_string(n_past);
      const auto ref = all_rows(cpu, batch, *cpu_cache);
      const auto base = all_rows(*baseline, batch, *baseline_cache);
      const auto got = all_rows(*flash, batch, *flash_cache);
      llm::testing::expect_logit_rows_close(got, base, vocab, "flash vs default CUDA model, " + where);
      llm::testing::expect_logit_rows_close(got, ref, vocab, "flash CUDA model vs CpuModel, " + where);
      llm::testing::expect_logit_rows_close(base, ref, vocab, "default CUDA model vs CpuModel, " + where);
    }
    EXPECT_EQ(flash_cache->length(0), n + kSecondChunk);
  }
}

INSTANTIATE_TEST_SUITE_P(step02, FlashCudaModelTest, ::testing::ValuesIn(model_cases()),
                         [](const auto& info) { return info.param.name; });

// A head FA1 is not compiled for (12 = dim 96 / 8 heads): an InputError that
// names it, before anything is uploaded, so no GPU is needed. A build
// without CUDA says that instead.
TEST(step02FlashCudaModel, RefusesAHeadDimTheKernelLacks) {
  llm::ModelConfig config = llm::find_preset("tiny").config;
  config.dim = 96;  // 8 heads of 12
  const llm::ModelWeights weights = llm::random_weights(config, 3);
  if (!llm::cuda::built_with_cuda()) {
    EXPECT_THROW(step02::make_cuda_model(weights, step02::CudaModelPrefill::Flash1), llm::DeviceError);
    return;
  }
  try {
    step02::make_cuda_model(weights, step02::CudaModelPrefill::Flash1);
    ADD_FAILURE() << "expected llm::InputError for head_dim 12";
  } catch (const llm::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
}

#if defined(LLM_WITH_CUDA)
// The hook itself, without a GPU: no workspace, the head_dim check, and an
// empty run that returns before touching the device.
TEST(step02FlashPrefillHook, NeedsNoWorkspaceAndChecksTheHead) {
  const llm::AttentionShape good{8, 4, 8}, bad{8, 4, 12};
  EXPECT_EQ(step02::cuda::flash1_prefill_workspace_floats(good, 1000, 2048), 0u);
  const llm::KvView no_cache;
  EXPECT_THROW(step02::cuda::flash1_prefill(bad, nullptr, no_cache, 0, 5, nullptr, nullptr, nullptr),
               llm::InputError);
  EXPECT_NO_THROW(step02::cuda::flash1_prefill(good, nullptr, no_cache, 3, 0, nullptr, nullptr, nullptr));
}
#endif

}  // namespace
