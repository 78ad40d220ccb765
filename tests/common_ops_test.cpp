// Every CPU op against a float64 formula written out here, on random inputs
// and odd sizes. Output buffers start as NaN so an element a kernel forgets to
// write fails the comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "llm/attention.hpp"
#include "llm/cpu_ops.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/huge_page_allocator.hpp"
#include "llm/kv_cache.hpp"
#include "llm/linear.hpp"
#include "llm/sampler.hpp"
#include "test_support.hpp"

namespace llm {
namespace {

using testing::random_vector;

const std::vector<int> kSizes = {1, 7, 33, 129, 1000};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> poisoned(std::size_t n) { return std::vector<float>(n, kNaN); }

// got (fp32) against a float64 reference, with the fp32 tolerance.
::testing::AssertionResult matches_f32(const std::vector<float>& got, const std::vector<double>& ref) {
  const std::vector<float> ref_f(ref.begin(), ref.end());
  const CompareResult r = compare(got, ref_f, tolerance_for(DType::F32));
  if (r.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.summary();
}

// --- element-wise and row-wise ops -----------------------------------------

TEST(CpuOps, RmsnormMatchesFloat64) {
  const float eps = 1e-5f;
  for (int n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    const auto x = random_vector(n, 100 + n, 3.0f);
    const auto w = random_vector(n, 200 + n, 2.0f);
    double sum_sq = 0.0;
    for (float v : x) sum_sq += static_cast<double>(v) * v;
    const double inv_rms = 1.0 / std::sqrt(sum_sq / n + eps);
    std::vector<double> ref(n);
    for (int i = 0; i < n; ++i) ref[i] = static_cast<double>(w[i]) * x[i] * inv_rms;
    auto out = poisoned(n);
    cpu::rmsnorm(out.data(), x.data(), w.data(), n, eps);
    EXPECT_TRUE(matches_f32(out, ref));
  }
}

TEST(CpuOps, RmsnormOfZerosIsFiniteThanksToEps) {
  const std::vector<float> x(33, 0.0f), w(33, 1.0f);
  auto out = poisoned(33);
  cpu::rmsnorm(out.data(), x.data(), w.data(), 33, 1e-5f);
  EXPECT_TRUE(matches_f32(out, std::vector<double>(33, 0.0)));
}

TEST(CpuOps, SwigluMatchesFloat64) {
  for (int n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    auto gate = random_vector(n, 300 + n, 8.0f);
    const auto up = random_vector(n, 400 + n, 2.0f);
    std::vector<double> ref(n);
    for (int i = 0; i < n; ++i) {
      const double g = gate[i];
      ref[i] = g / (1.0 + std::exp(-g)) * up[i];
    }
    cpu::swiglu(gate.data(), up.data(), n);
    EXPECT_TRUE(matches_f32(gate, ref));
  }
}

TEST(CpuOps, AddInplaceMatchesFloat64) {
  for (int n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    auto x = random_vector(n, 500 + n);
    const auto delta = random_vector(n, 600 + n);
    std::vector<double> ref(n);
    for (int i = 0; i < n; ++i) ref[i] = static_cast<double>(x[i]) + delta[i];
    cpu::add_inplace(x.data(), delta.data(), n);
    EXPECT_TRUE(matches_f32(x, ref));
  }
}

std::vector<double> softmax_f64(const std::vector<float>& x) {
  double max_value = x[0];
  for (float v : x) max_value = std::max<double>(max_value, v);
  std::vector<double> p(x.size());
  double sum = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) sum += p[i] = std::exp(x[i] - max_value);
  for (double& v : p) v /= sum;
  return p;
}

TEST(CpuOps, SoftmaxMatchesFloat64) {
  for (int n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    auto x = random_vector(n, 700 + n, 10.0f);
    const auto ref = softmax_f64(x);
    softmax_inplace(x);
    EXPECT_TRUE(matches_f32(x, ref));
  }
}

TEST(CpuOps, SoftmaxOfLargeMagnitudesHasNoNaN) {
  for (int n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    // Around +1e4 and -1e4: exp() without the max subtracted overflows.
    auto x = random_vector(n, 800 + n, 20.0f);
    for (int i = 0; i < n; ++i) x[i] += (i % 3 == 0) ? -1e4f : 1e4f;
    const auto ref = softmax_f64(x);
    softmax_inplace(x);
    EXPECT_TRUE(matches_f32(x, ref));
    double sum = 0.0;
    for (float v : x) sum += v;
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
}

TEST(CpuOps, ArgmaxFindsTheLargestAndTheFirstOnTies) {
  for (int n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    const auto x = random_vector(n, 900 + n);
    int best = 0;
    for (int i = 1; i < n; ++i)
      if (x[i] > x[best]) best = i;
    EXPECT_EQ(argmax(x), best);
  }
  EXPECT_EQ(argmax(std::vector<float>{1.0f, 3.0f, 2.0f, 3.0f}), 1);
  EXPECT_EQ(argmax(std::vector<float>(7, 0.5f)), 0);
  EXPECT_EQ(argmax(std::vector<float>{-5.0f, -1.0f, -1.0f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{-1e30f, -std::numeric_limits<float>::infinity(), 4.0f, 4.0f}), 2);
}

// --- RoPE -----------------------------------------------------------------

// The angle of pair i at `pos`: pos * theta^(-2i/head_dim), in float64.
double rope_angle(int pos, int i, int head_dim, double theta) {
  return pos * std::pow(theta, -2.0 * i / head_dim);
}

// RopeTable works in float as run.c does, so its angle at position p is off
// by up to about an ulp of p (measured 1.8e-5 rad at 511, over the plain fp32
// tolerance): allow 2 x p x FLT_EPSILON (1.2e-4 at 511) on top of it.
Tolerance rope_tolerance(int pos) {
  Tolerance t = tolerance_for(DType::F32);
  t.abs_tol += 2.0 * pos * std::numeric_limits<float>::epsilon();
  return t;
}

TEST(CpuOps, RopeTableHoldsCosAndSinOfTheFloat64Angle) {
  const float theta = 10000.0f;
  for (int head_dim : {2, 8, 64}) {
    const cpu::RopeTable table(512, head_dim, theta);
    EXPECT_EQ(table.head_dim(), head_dim);
    EXPECT_EQ(table.max_positions(), 512);
    for (int pos : {0, 1, 7, 511}) {
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", pos " + std::to_string(pos));
      const int half = head_dim / 2;
      std::vector<float> cos_ref(half), sin_ref(half);
      for (int i = 0; i < half; ++i) {
        cos_ref[i] = static_cast<float>(std::cos(rope_angle(pos, i, head_dim, theta)));
        sin_ref[i] = static_cast<float>(std::sin(rope_angle(pos, i, head_dim, theta)));
      }
      const CompareResult c = compare({table.cos_row(pos), static_cast<std::size_t>(half)}, cos_ref, rope_tolerance(pos));
      EXPECT_TRUE(c.ok) << "cos: " << c.summary();
      const CompareResult s = compare({table.sin_row(pos), static_cast<std::size_t>(half)}, sin_ref, rope_tolerance(pos));
      EXPECT_TRUE(s.ok) << "sin: " << s.summary();
    }
  }
}

TEST(CpuOps, RopeRotatesAdjacentPairsOfEveryHead) {
  const double theta = 10000.0;
  for (int head_dim : {8, 64}) {
    const cpu::RopeTable table(512, head_dim, static_cast<float>(theta));
    for (int n_heads : {1, 3, 8}) {
      for (int pos : {0, 1, 511}) {
        SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", heads " + std::to_string(n_heads) + ", pos " +
                     std::to_string(pos));
        auto vec = random_vector(static_cast<std::size_t>(n_heads) * head_dim, 1000 + pos + head_dim + n_heads);
        std::vector<float> ref(vec.size());
        for (int h = 0; h < n_heads; ++h) {
          for (int i = 0; i < head_dim / 2; ++i) {
            const std::size_t a = static_cast<std::size_t>(h) * head_dim + 2 * i;  // pair (2i, 2i+1)
            const double angle = rope_angle(pos, i, head_dim, theta);
            const double x0 = vec[a], x1 = vec[a + 1];
            ref[a] = static_cast<float>(x0 * std::cos(angle) - x1 * std::sin(angle));
            ref[a + 1] = static_cast<float>(x0 * std::sin(angle) + x1 * std::cos(angle));
          }
        }
        cpu::rope(vec.data(), n_heads, head_dim, pos, table);
        const CompareResult r = compare(vec, ref, rope_tolerance(pos));
        EXPECT_TRUE(r.ok) << r.summary();
      }
    }
  }
}

// --- huge-page slabs ----------------------------------------------------------

TEST(HugePageAllocator, MidSizedBuffersShareASlabThatIsFreedWithTheLast) {
  const std::size_t before = huge_pages::slabs_held();
  {
    // Three stories15M-sized matrices (288 x 768 floats = 0.84 MiB each).
    std::vector<HugePageVector<float>> matrices;
    for (int i = 0; i < 3; ++i) matrices.emplace_back(288 * 768, static_cast<float>(i));
    EXPECT_LE(huge_pages::slabs_held(), before + 2);  // shared, not one slab each
    for (const auto& matrix : matrices) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(matrix.data()) % huge_pages::kAlignment, 0u);
      for (std::size_t other = 0; other < matrices.size(); ++other) {
        if (&matrix == &matrices[other]) continue;
        const bool disjoint = matrix.data() + matrix.size() <= matrices[other].data() ||
                              matrices[other].data() + matrices[other].size() <= matrix.data();
        EXPECT_TRUE(disjoint);
      }
    }
    EXPECT_EQ(matrices[2].back(), 2.0f);
    EXPECT_EQ(matrices[0].front(), 0.0f);  // writing the third did not touch the first
  }
  EXPECT_EQ(huge_pages::slabs_held(), before);
}

TEST(HugePageAllocator, ABigBufferGetsItsOwnSlabAndASmallOneNone) {
  const std::size_t before = huge_pages::slabs_held();
  {
    const HugePageVector<float> small(1000, 1.0f);  // 4 KB: ordinary memory
    EXPECT_EQ(huge_pages::slabs_held(), before);
    const HugePageVector<float> big(huge_pages::kSlabBytes / sizeof(float), 3.0f);  // 32 MiB
    EXPECT_EQ(huge_pages::slabs_held(), before + 1);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.data()) % huge_pages::kPageBytes, 0u);
    EXPECT_EQ(big.back() + small.back(), 4.0f);
  }
  EXPECT_EQ(huge_pages::slabs_held(), before);
}

// --- DenseLinear ------------------------------------------------------------

TEST(DenseLinear, MatchesFloat64Matmul) {
  struct Shape {
    int out, in;
  };
  for (const Shape s : {Shape{1, 1}, Shape{7, 33}, Shape{33, 7}, Shape{129, 1000}, Shape{1000, 129}, Shape{1, 129},
                       // 16.8 MB: a huge-page slab of its own (llm/huge_page_allocator.hpp)
                       Shape{4099, 1025}}) {
    const auto weight = random_vector(static_cast<std::size_t>(s.out) * s.in, 1100 + s.out + s.in);
    const DenseLinear linear(weight, s.out, s.in);
    EXPECT_EQ(linear.out_features(), s.out);
    EXPECT_EQ(linear.in_features(), s.in);
    EXPECT_EQ(linear.weight_bytes(), weight.size() * sizeof(float));
    for (int rows : {1, 5}) {
      SCOPED_TRACE(std::to_string(rows) + " rows x [" + std::to_string(s.out) + ", " + std::to_string(s.in) + "]");
      const auto x = random_vector(static_cast<std::size_t>(rows) * s.in, 1200 + rows + s.in);
      std::vector<double> ref(static_cast<std::size_t>(rows) * s.out);
      for (int r = 0; r < rows; ++r)
        for (int o = 0; o < s.out; ++o) {
          double dot = 0.0;
          for (int i = 0; i < s.in; ++i)
            dot += static_cast<double>(weight[static_cast<std::size_t>(o) * s.in + i]) * x[static_cast<std::size_t>(r) * s.in + i];
          ref[static_cast<std::size_t>(r) * s.out + o] = dot;
        }
      auto y = poisoned(ref.size());
      linear.forward(x.data(), rows, y.data());
      EXPECT_TRUE(matches_f32(y, ref));
    }
  }
}

TEST(DenseLinear, RejectsAWeightOfTheWrongSize) {
  EXPECT_THROW(DenseLinear(std::vector<float>(20), 4, 6), InputError);
}

TEST(DenseLinear, FactoryBuildsADenseLinear) {
  const auto weight = random_vector(6, 1300);
  const auto linear = dense_linear_factory()(weight, 2, 3, {0, LinearRole::Query});
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->out_features(), 2);
  EXPECT_EQ(linear->in_features(), 3);
  const std::vector<float> x = {1.0f, 0.0f, 0.0f};
  auto y = poisoned(2);
  linear->forward(x.data(), 1, y.data());
  EXPECT_EQ(y, (std::vector<float>{weight[0], weight[3]}));  // first column of W
}

// --- attention ----------------------------------------------------------------

// A config whose only role is to size a CpuKvCache for the attention shape.
ModelConfig cache_config(const AttentionShape& s, int n_layers) {
  ModelConfig c;
  c.dim = s.n_heads * s.head_dim;
  c.hidden_dim = 1;
  c.n_layers = n_layers;
  c.n_heads = s.n_heads;
  c.n_kv_heads = s.n_kv_heads;
  c.vocab_size = 1;
  c.seq_len = 1;
  return c;
}

// Writes random K and V rows for positions 0..n_valid-1 of a view, and NaN in
// the rest up to `capacity`: a kernel reading past the causal window fails.
void fill_view(const KvView& view, int n_valid, int capacity, std::uint64_t seed) {
  for (int pos = 0; pos < capacity; ++pos) {
    const auto k = random_vector(view.kv_dim, seed + 2 * pos);
    const auto v = random_vector(view.kv_dim, seed + 2 * pos + 1);
    for (int i = 0; i < view.kv_dim; ++i) {
      view.key_row(pos)[i] = pos < n_valid ? k[i] : kNaN;
      view.value_row(pos)[i] = pos < n_valid ? v[i] : kNaN;
    }
  }
}

// Naive float64 attention of one query row (all heads) at keys 0..n_keys-1.
void naive_attention(const AttentionShape& s, const float* q, const KvView& kv, int n_keys, double* out) {
  const int group = s.n_heads / s.n_kv_heads;
  for (int h = 0; h < s.n_heads; ++h) {
    const float* qh = q + static_cast<std::size_t>(h) * s.head_dim;
    const int kv_head = h / group;
    std::vector<double> scores(n_keys);
    double max_score = -INFINITY;
    for (int t = 0; t < n_keys; ++t) {
      const float* k = kv.key_row(t) + static_cast<std::size_t>(kv_head) * s.head_dim;
      double dot = 0.0;
      for (int i = 0; i < s.head_dim; ++i) dot += static_cast<double>(qh[i]) * k[i];
      scores[t] = dot / std::sqrt(static_cast<double>(s.head_dim));
      max_score = std::max(max_score, scores[t]);
    }
    double sum = 0.0;
    for (double& p : scores) sum += p = std::exp(p - max_score);
    double* oh = out + static_cast<std::size_t>(h) * s.head_dim;
    for (int i = 0; i < s.head_dim; ++i) {
      double acc = 0.0;
      for (int t = 0; t < n_keys; ++t)
        acc += scores[t] / sum * kv.value_row(t)[static_cast<std::size_t>(kv_head) * s.head_dim + i];
      oh[i] = acc;
    }
  }
}

const std::vector<int> kGqaRatios = {1, 2, 4, 8};
const std::vector<int> kHeadDims = {8, 64};

TEST(ReferenceAttention, PrefillMatchesNaiveFloat64) {
  constexpr int kCapacity = 48;
  for (int ratio : kGqaRatios) {
    for (int head_dim : kHeadDims) {
      const AttentionShape shape{2 * ratio, 2, head_dim};
      // Two layers and two sequences: the view of (layer 1, sequence 1) must
      // not alias anything else.
      const CpuKvCache cache(cache_config(shape, 2), 2, kCapacity);
      const KvView view = cache.view(1, 1);
      const std::size_t row = static_cast<std::size_t>(shape.n_heads) * head_dim;
      for (int n_new : {1, 7, 33}) {
        for (int n_past : {0, 1, 13}) {
          SCOPED_TRACE("GQA " + std::to_string(ratio) + ", head_dim " + std::to_string(head_dim) + ", n_new " +
                       std::to_string(n_new) + ", n_past " + std::to_string(n_past));
          fill_view(view, n_past + n_new, kCapacity, 1400 + n_new + n_past);
          const auto q = random_vector(n_new * row, 1500 + n_new + n_past, 2.0f);
          std::vector<double> ref(n_new * row);
          for (int i = 0; i < n_new; ++i)  // query i sits at n_past + i and sees keys 0..n_past+i
            naive_attention(shape, q.data() + i * row, view, n_past + i + 1, ref.data() + i * row);
          auto out = poisoned(ref.size());
          cpu::reference_prefill_attention(shape, q.data(), view, n_past, n_new, out.data());
          EXPECT_TRUE(matches_f32(out, ref));
        }
      }
    }
  }
}

TEST(ReferenceAttention, DecodeMatchesNaiveFloat64ForSequencesOfDifferentLengths) {
  constexpr int kCapacity = 40;
  const std::vector<int> lengths = {1, 7, 33, 40};
  for (int ratio : kGqaRatios) {
    for (int head_dim : kHeadDims) {
      SCOPED_TRACE("GQA " + std::to_string(ratio) + ", head_dim " + std::to_string(head_dim));
      const AttentionShape shape{2 * ratio, 2, head_dim};
      const CpuKvCache cache(cache_config(shape, 2), static_cast<int>(lengths.size()), kCapacity);
      const std::size_t row = static_cast<std::size_t>(shape.n_heads) * head_dim;
      std::vector<KvView> views;
      for (std::size_t s = 0; s < lengths.size(); ++s) {
        views.push_back(cache.view(1, static_cast<int>(s)));
        fill_view(views.back(), lengths[s], kCapacity, 1600 + 100 * s);
      }
      const auto q = random_vector(lengths.size() * row, 1700 + ratio + head_dim, 2.0f);
      std::vector<double> ref(q.size());
      for (std::size_t s = 0; s < lengths.size(); ++s)
        naive_attention(shape, q.data() + s * row, views[s], lengths[s], ref.data() + s * row);
      auto out = poisoned(ref.size());
      cpu::reference_decode_attention(shape, q.data(), views, lengths, out.data());
      EXPECT_TRUE(matches_f32(out, ref));
    }
  }
}

TEST(ReferenceAttention, ASingleKeyReturnsItsValue) {
  // Softmax over one key is 1: every head returns its KV head's value row.
  const AttentionShape shape{8, 2, 8};
  const CpuKvCache cache(cache_config(shape, 1), 1, 4);
  const KvView view = cache.view(0, 0);
  fill_view(view, 1, 4, 1800);
  const auto q = random_vector(64, 1801, 5.0f);
  auto out = poisoned(64);
  cpu::reference_prefill_attention(shape, q.data(), view, 0, 1, out.data());
  std::vector<double> ref(64);
  for (int h = 0; h < 8; ++h)
    for (int i = 0; i < 8; ++i) ref[h * 8 + i] = view.value_row(0)[(h / 4) * 8 + i];
  EXPECT_TRUE(matches_f32(out, ref));
}

}  // namespace
}  // namespace llm
