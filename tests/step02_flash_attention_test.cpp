// Step 02 on the CPU: every CPU variant of the step's table against the
// float64 reference on fresh random Q/K/V (outputs poisoned with NaN before
// each run), over the awkward shapes: lengths 1, 7, 33, 129, 1000 and tile
// multiples, causal and not, seqlen_q != seqlen_k (bottom-right causal, rows
// that see no key), head dims 64 and 128, GQA, large logits; then K/V read
// through a paged KvView, the model's prefill through the attention hook,
// the memory formulas and the fp16/bf16 rounding helpers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "llm/cpu_model.hpp"
#include "llm/harness/compare.hpp"
#include "llm/weights.hpp"
#include "step02_flash_attention/attention_problem.hpp"
#include "step02_flash_attention/cpu_attention.hpp"
#include "step02_flash_attention/half_precision.hpp"
#include "step02_flash_attention/reference_attention.hpp"
#include "step02_flash_attention/variants.hpp"
#include "test_support.hpp"

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
  double fp32_limit = 1e-5;  // Q and K uniform in [-qk_scale, qk_scale]
};

// GoogleTest prints a parameter it has no printer for as its raw bytes, heap
// pointers included, and CTest puts that text in the test's name: the name
// would change on every build. The case's own name is the stable printout.
void PrintTo(const Case& test_case, std::ostream* out) { *out << test_case.name; }

std::vector<Case> cases() {
  const int tile = step02::cpu::kBlockRows;  // 128: a tile multiple, and tile +- 1
  std::vector<Case> c;
  for (int len : {1, 7, 33, 129, 1000, tile, 2 * tile}) {
    for (bool causal : {true, false}) {
      c.push_back({"len" + std::to_string(len) + (causal ? "_causal" : "_full") + "_d64",
                   {2, 2, 64, len, len, causal}});
    }
  }
  c.push_back({"len129_causal_d128", {2, 2, 128, 129, 129, true}});
  c.push_back({"len1000_full_d128", {1, 1, 128, 1000, 1000, false}});
  c.push_back({"tile_minus1_causal", {2, 2, 64, tile - 1, tile - 1, true}});
  // Sq < Sk: new queries after a cached prefix (the last query sees every key).
  c.push_back({"q7_k129_causal", {2, 2, 64, 7, 129, true}});
  c.push_back({"q33_k1000_causal_d128", {2, 2, 128, 33, 1000, true}});
  c.push_back({"q1_k1000_causal", {2, 2, 64, 1, 1000, true}});
  c.push_back({"q129_k7_full", {2, 2, 64, 129, 7, false}});
  // Sq > Sk causal: the first Sq - Sk queries see no key; their output is 0.
  c.push_back({"q129_k33_causal_empty_rows", {2, 2, 64, 129, 33, true}});
  // GQA: 4 query heads on 2 KV heads, 8 on 1.
  c.push_back({"gqa2_len129_causal", {4, 2, 64, 129, 129, true}});
  c.push_back({"gqa8_q33_k200_causal", {8, 1, 64, 33, 200, true}});
  // Large logits (|q.k|/sqrt(d) up to ~1000): a softmax without the max
  // subtraction overflows exp() here.
  c.push_back({"large_logits_len129_causal", {2, 2, 64, 129, 129, true}, 16.0f, 1e-3});
  return c;
}

struct Inputs {
  std::vector<float> q, k, v;
};
Inputs random_inputs(const AttentionProblem& p, std::uint64_t seed, float qk_scale) {
  return {llm::testing::random_vector(p.q_elements(), seed, qk_scale),
          llm::testing::random_vector(p.kv_elements(), seed + 1, qk_scale),
          llm::testing::random_vector(p.kv_elements(), seed + 2, 1.0f)};
}

// Runs a CPU variant on contiguous K/V into a NaN-poisoned output.
std::vector<float> run_cpu(const step02::AttentionVariant& v, const AttentionProblem& p, Inputs& in) {
  const std::int32_t block_zero = 0;
  step02::AttentionArgs args;
  args.q = in.q.data();
  args.kv = step02::contiguous_kv_view(in.k.data(), in.v.data(), p.seqlen_k, p.kv_row(), &block_zero);
  std::vector<float> out(p.q_elements(), std::nanf(""));
  args.out = out.data();
  v.fn.run(p, args);
  return out;
}

std::vector<int> all_rows(const AttentionProblem& p) {
  std::vector<int> rows(static_cast<std::size_t>(p.seqlen_q));
  std::iota(rows.begin(), rows.end(), 0);
  return rows;
}

// fp32 variants: max|got - ref| / max|ref| <= limit (1e-5), nothing NaN.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what,
                  double limit = 1e-5) {
  const auto r = llm::compare(got, ref, llm::tolerance_for(llm::DType::F32));
  EXPECT_EQ(r.nan_or_inf, 0u) << what << ": " << r.summary();
  EXPECT_FALSE(r.size_mismatch) << what;
  EXPECT_LE(r.max_rel_err, limit) << what << ": " << r.summary();
}

class CpuVariantTest : public ::testing::TestWithParam<std::tuple<int, Case>> {};

TEST_P(CpuVariantTest, MatchesFloat64Reference) {
  const auto& [id, c] = GetParam();
  const auto& variant = step02::find_variant(id);
  const AttentionProblem& p = c.problem;
  Inputs in = random_inputs(p, 1234 + static_cast<std::uint64_t>(p.seqlen_q) * 7 + p.seqlen_k, c.qk_scale);
  const auto rows = all_rows(p);
  const auto ref = step02::reference_attention_f64(p, in.q, in.k, in.v, rows);
  const auto got = run_cpu(variant, p, in);
  expect_close(got, ref, variant.name + " on " + p.describe(), c.fp32_limit);
  // A query that sees no key outputs exactly 0.
  for (int i = 0; i < p.seqlen_q; ++i)
    if (p.last_visible_key(i) < 0)
      for (int x = 0; x < p.q_row(); ++x)
        ASSERT_EQ(got[static_cast<std::size_t>(i) * p.q_row() + x], 0.0f) << "row " << i << " sees no key";
}

INSTANTIATE_TEST_SUITE_P(step02, CpuVariantTest,
                         ::testing::Combine(::testing::ValuesIn(llm::variant_ids(step02::variants(),
                                                                                 llm::Backend::Cpu)),
                                            ::testing::ValuesIn(cases())),
                         [](const auto& info) {
                           return step02::find_variant(std::get<0>(info.param)).name + "_" +
                                  std::get<1>(info.param).name;
                         });

// The same K/V scattered over a paged pool (blocks of 16 positions in a
// shuffled order): the variants read through the KvView's block table, so the
// result is the same as with contiguous K/V.
TEST(step02CpuPaged, ReadsKeysAndValuesThroughTheBlockTable) {
  const AttentionProblem p{4, 2, 64, 50, 203, true};
  Inputs in = random_inputs(p, 77, 2.0f);
  constexpr int kBlock = 16;
  const int n_blocks = (p.seqlen_k + kBlock - 1) / kBlock;
  std::vector<std::int32_t> table(static_cast<std::size_t>(n_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(5));
  // pool [n_blocks, kBlock, kv_row]; logical position t lives in physical block table[t / kBlock].
  std::vector<float> key_pool(static_cast<std::size_t>(n_blocks) * kBlock * p.kv_row(), std::nanf(""));
  std::vector<float> value_pool(key_pool.size(), std::nanf(""));
  llm::KvView view;
  view.keys = key_pool.data();
  view.values = value_pool.data();
  view.block_table = table.data();
  view.block_size = kBlock;
  view.kv_dim = p.kv_row();
  for (int t = 0; t < p.seqlen_k; ++t) {
    std::copy_n(in.k.begin() + static_cast<std::ptrdiff_t>(t) * p.kv_row(), p.kv_row(), view.key_row(t));
    std::copy_n(in.v.begin() + static_cast<std::ptrdiff_t>(t) * p.kv_row(), p.kv_row(), view.value_row(t));
  }
  const auto ref = step02::reference_attention_f64(p, in.q, in.k, in.v, all_rows(p));
  for (int id : llm::variant_ids(step02::variants(), llm::Backend::Cpu)) {
    step02::AttentionArgs args;
    args.q = in.q.data();
    args.kv = view;
    std::vector<float> out(p.q_elements(), std::nanf(""));
    args.out = out.data();
    step02::find_variant(id).fn.run(p, args);
    expect_close(out, ref, step02::find_variant(id).name + " through a paged view");
  }
}

// The model's prefill with the step's attention in the hook: same logits as
// the common reference attention, for a whole prompt and for a prompt fed in
// two chunks (the second chunk has n_past > 0: Sq < Sk inside the hook).
TEST(step02CpuModel, PrefillThroughTheHookMatchesTheReferenceModel) {
  llm::ModelConfig config = llm::find_preset("tiny").config;
  const llm::ModelWeights weights = llm::random_weights(config, 11);
  std::vector<int> prompt(300);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> token(3, config.vocab_size - 1);
  for (int& t : prompt) t = token(rng);

  auto run = [&](llm::cpu::PrefillAttentionFn prefill, bool chunked) {
    llm::CpuModel model(weights);
    model.set_attention({prefill, &llm::cpu::reference_decode_attention});
    auto cache = model.make_cache(1, static_cast<int>(prompt.size()));
    if (!chunked) {
      const auto logits = model.forward(llm::TokenBatch::prefill(prompt, 0, 0), *cache, llm::LogitsFor::AllRows);
      return std::vector<float>(logits.begin(), logits.end());
    }
    const std::vector<int> first(prompt.begin(), prompt.begin() + 130), second(prompt.begin() + 130, prompt.end());
    model.forward(llm::TokenBatch::prefill(first, 0, 0), *cache);
    const auto logits = model.forward(llm::TokenBatch::prefill(second, 130, 0), *cache, llm::LogitsFor::AllRows);
    return std::vector<float>(logits.begin(), logits.end());
  };
  for (bool chunked : {false, true}) {
    const auto ref = run(&llm::cpu::reference_prefill_attention, chunked);
    for (auto [name, fn] : {std::pair{"flash", &step02::cpu::flash_prefill},
                            std::pair{"naive", &step02::cpu::naive_prefill}}) {
      const auto got = run(fn, chunked);
      const auto r = llm::compare(got, ref, llm::model_logits_tolerance(llm::DType::F32));
      EXPECT_TRUE(r.ok) << name << (chunked ? " chunked" : " whole") << ": " << r.summary();
    }
  }
}

// "Extra memory for scores": naive grows with Sq * Sk, flash with Sq.
TEST(step02Memory, NaiveIsQuadraticFlashIsLinear) {
  auto problem = [](int n) { return AttentionProblem{8, 8, 64, n, n, true}; };
  EXPECT_EQ(step02::cpu::naive_score_bytes(problem(2048)), 4 * step02::cpu::naive_score_bytes(problem(1024)));
  const auto tile_bytes = static_cast<std::size_t>(step02::cpu::kBlockRows) * step02::cpu::kBlockCols * 4;
  EXPECT_EQ(step02::cpu::flash_score_bytes(problem(2048)) - tile_bytes,
            2 * (step02::cpu::flash_score_bytes(problem(1024)) - tile_bytes));
  EXPECT_LT(step02::cpu::flash_score_bytes(problem(4096)) * 100, step02::cpu::naive_score_bytes(problem(4096)));
}

TEST(step02Problem, FlopsAndVisiblePairs) {
  EXPECT_EQ((AttentionProblem{1, 1, 64, 4, 4, true}.visible_pairs()), 10);   // 1 + 2 + 3 + 4
  EXPECT_EQ((AttentionProblem{1, 1, 64, 2, 5, true}.visible_pairs()), 9);    // 4 + 5: bottom-right
  EXPECT_EQ((AttentionProblem{1, 1, 64, 5, 2, true}.visible_pairs()), 3);    // 0 + 0 + 0 + 1 + 2
  EXPECT_EQ((AttentionProblem{1, 1, 64, 5, 2, false}.visible_pairs()), 10);
  EXPECT_DOUBLE_EQ((AttentionProblem{8, 8, 64, 16, 16, false}.flops()), 4.0 * 16 * 16 * 64 * 8);
}

TEST(step02HalfPrecision, RoundsLikeTheGpu) {
  using namespace step02;
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bff);  // largest half
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(float_to_half_bits(5.9604645e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half_bits(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  EXPECT_EQ(float_to_half_bits(1.0f + 3.0f / 2048), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(std::nanf("")))));
  for (float x : {0.1f, -3.14159f, 1000.5f, 1e-5f, 60000.0f}) {
    EXPECT_NEAR(half_bits_to_float(float_to_half_bits(x)), x, std::fabs(x) * 1e-3f + 6e-8f) << x;
    EXPECT_NEAR(bf16_bits_to_float(float_to_bf16_bits(x)), x, std::fabs(x) * 4e-3f) << x;
  }
}

TEST(step02Variants, TableIsConsistent) {
  const auto& table = step02::variants();
  ASSERT_FALSE(table.empty());
  EXPECT_EQ(table.front().id, 0);
  EXPECT_EQ(table.front().name, "cpu_naive");
  std::vector<int> ids;
  for (const auto& v : table) {
    ids.push_back(v.id);
    EXPECT_FALSE(v.what_changed.empty()) << v.name;
    if (v.backend == llm::Backend::Cpu) EXPECT_NE(v.fn.run, nullptr) << v.name;
    // A 16-bit output is read back as the variant's dtype: it must be one.
    if (v.fn.writes_16bit_output) EXPECT_NE(v.fn.dtype, llm::DType::F32) << v.name;
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end()) << "duplicate variant ids";
}

// Which tensor-core rows exist is decided by what the kernel was compiled
// for (cudaFuncGetAttributes' ptxVersion / binaryVersion), faked here.
TEST(step02KernelImage, Bf16RowNeedsCodeCompiledForSm80NotJustTheCard) {
  using step02::KernelImage;
  using step02::tensor_core_unavailable;
  const std::string bf16 = "bf16 tensor-core mma", fp16 = "fp16 tensor-core mma";
  // A compute_75-only build on an H100: the driver JIT-compiles the
  // compute_75 PTX to sm_90, and that code has no bf16 mma (it would trap).
  const KernelImage jit_from_75{75, 90};
  const std::string why = tensor_core_unavailable(bf16, 80, jit_from_75, 90);
  EXPECT_TRUE(llm::testing::HasSubstr(why, "compiled for compute_75"));
  EXPECT_TRUE(llm::testing::HasSubstr(why, "CMAKE_CUDA_ARCHITECTURES"));
  // ... while its fp16 row runs (sm_75 has the fp16 mma).
  EXPECT_EQ(tensor_core_unavailable(fp16, 75, jit_from_75, 90), "");
  // The default 75;80;90 build: sm_90 SASS on an H100, sm_80 SASS on an
  // sm_86 card, sm_75 SASS on a T4.
  EXPECT_EQ(tensor_core_unavailable(bf16, 80, {90, 90}, 90), "");
  EXPECT_EQ(tensor_core_unavailable(bf16, 80, {80, 80}, 86), "");
  EXPECT_EQ(tensor_core_unavailable(fp16, 75, {75, 75}, 75), "");
  // A T4 has no bf16 mma whatever the build holds.
  EXPECT_TRUE(llm::testing::HasSubstr(tensor_core_unavailable(bf16, 80, {75, 75}, 75), "this GPU is sm_75"));
  // No image for this GPU at all (cudaFuncGetAttributes failed).
  EXPECT_TRUE(llm::testing::HasSubstr(tensor_core_unavailable(fp16, 75, {}, 90), "no kernel image"));
  // A cubin without a PTX version (0): its SASS version decides.
  EXPECT_EQ(tensor_core_unavailable(bf16, 80, {0, 80}, 80), "");
}

TEST(step02Variants, TensorCoreRowsSayWhatTheirKernelWasCompiledFor) {
  for (const auto& v : step02::variants()) {
    if (v.fn.min_compute_capability == 0) continue;
    // A CUDA build must be able to ask the kernel itself (a build without
    // CUDA has neither the kernel nor the question).
    EXPECT_EQ(v.fn.kernel_image != nullptr, v.fn.run != nullptr) << v.name;
  }
}

}  // namespace
