// Sampling exactness of speculative decoding: with a known target p and draft
// q on a small vocabulary, the tokens the rejection scheme emits are
// distributed as p (chi-square test, fixed seed, many samples), and the same
// test rejects a deliberately wrong rule, so it is shown to have the power to
// fail.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "step04_speculative/rejection_sampler.hpp"

namespace {

using step04::RejectionSampler;
using step04::VerifyOutcome;

// p and q disagree a lot (q over-proposes tokens 0 and 1, under-proposes 3..5),
// so rejections are frequent and a wrong residual shows.
const std::vector<float> kP = {0.05f, 0.10f, 0.15f, 0.20f, 0.25f, 0.25f};
const std::vector<float> kQ = {0.40f, 0.30f, 0.10f, 0.10f, 0.05f, 0.05f};
constexpr int kSamples = 200000;
// Chi-square critical value for 5 degrees of freedom at significance 0.001.
constexpr double kChiSquareCritical = 20.515;

using Rule = std::function<VerifyOutcome(std::span<const float> p, std::span<const float> q, int draft,
                                         llm::Sampler& rng)>;

// Draws the draft from q (exactly the q handed to the rule), applies the rule,
// counts the emitted token.
std::vector<long long> emitted_counts(const std::vector<float>& q, const Rule& rule, std::uint64_t seed) {
  llm::Sampler rng(static_cast<int>(kP.size()), 1.0f, 0.0f, seed);
  std::vector<long long> counts(kP.size(), 0);
  for (int i = 0; i < kSamples; ++i) {
    const int draft = step04::sample_from(q, rng.next_uniform());
    ++counts[static_cast<std::size_t>(rule(kP, q, draft, rng).token)];
  }
  return counts;
}

double chi_square(const std::vector<long long>& counts, const std::vector<float>& expected_p) {
  double chi2 = 0.0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double expected = expected_p[i] * kSamples;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

double total_variation(const std::vector<long long>& counts, const std::vector<float>& p) {
  double tv = 0.0;
  for (std::size_t i = 0; i < counts.size(); ++i) tv += std::abs(static_cast<double>(counts[i]) / kSamples - p[i]);
  return tv / 2.0;
}

Rule correct_rule() {
  auto sampler = std::make_shared<RejectionSampler>(static_cast<int>(kP.size()));
  return [sampler](std::span<const float> p, std::span<const float> q, int draft, llm::Sampler& rng) {
    return sampler->verify(p, q, draft, rng);
  };
}

// The classic mistake: accept with min(1, p/q) as it should, but on rejection
// sample from p itself instead of the residual max(0, p - q). Tokens q
// over-proposes then come out too often (they get both chances).
VerifyOutcome wrong_rule_resample_from_p(std::span<const float> p, std::span<const float> q, int draft,
                                         llm::Sampler& rng) {
  const auto x = static_cast<std::size_t>(draft);
  if (rng.next_uniform() * q[x] < p[x]) return {true, draft};
  return {false, step04::sample_from(p, rng.next_uniform())};
}

TEST(step04RejectionSampler, EmittedTokensFollowTheTargetDistribution) {
  const auto counts = emitted_counts(kQ, correct_rule(), 1234);
  const double chi2 = chi_square(counts, kP);
  EXPECT_LT(chi2, kChiSquareCritical) << "emitted tokens do not follow p";
  EXPECT_LT(total_variation(counts, kP), 0.01);
}

TEST(step04RejectionSampler, TestRejectsAWrongResidual) {
  // Negative control: the same test, same seed and sample count, must fail a
  // rule that is subtly wrong. Otherwise the passing test above proves nothing.
  const auto counts = emitted_counts(kQ, wrong_rule_resample_from_p, 1234);
  const double chi2 = chi_square(counts, kP);
  EXPECT_GT(chi2, kChiSquareCritical) << "the chi-square test cannot tell a wrong rule from the right one";
  EXPECT_GT(total_variation(counts, kP), 0.05);
}

TEST(step04RejectionSampler, TestRejectsAcceptingEveryDraft) {
  // Accepting every draft emits q, not p: the plainest wrong rule.
  const Rule accept_all = [](std::span<const float>, std::span<const float>, int draft, llm::Sampler&) {
    return VerifyOutcome{true, draft};
  };
  EXPECT_GT(chi_square(emitted_counts(kQ, accept_all, 1234), kP), kChiSquareCritical);
}

TEST(step04RejectionSampler, OneHotDraftAsNgramLookupProposes) {
  // A deterministic proposal (n-gram lookup) is q = one-hot: accepted with
  // probability p(x), else drawn from p without x. The result is still p.
  std::vector<float> one_hot(kP.size(), 0.0f);
  one_hot[0] = 1.0f;
  const auto counts = emitted_counts(one_hot, correct_rule(), 99);
  EXPECT_LT(chi_square(counts, kP), kChiSquareCritical);
}

TEST(step04RejectionSampler, IdenticalDistributionsAreAlwaysAccepted) {
  RejectionSampler sampler(static_cast<int>(kP.size()));
  llm::Sampler rng(6, 1.0f, 0.0f, 5);
  for (int i = 0; i < 1000; ++i) {
    const int draft = step04::sample_from(kP, rng.next_uniform());
    const auto outcome = sampler.verify(kP, kP, draft, rng);
    ASSERT_TRUE(outcome.accepted);
    ASSERT_EQ(outcome.token, draft);
  }
}

// The rule itself, for one fixed draft token (exercise ex04.1): accepted
// with probability min(1, p(x)/q(x)), and a rejection draws from max(0, p - q)
// normalized, so it never emits a token where p <= q. Values worked out by
// hand: vocabulary of 5, p(2) = 0.05 against q(2) = 0.20 accepts a quarter of
// the time; the residual is {0, 0.35, 0, 0.25, 0} / 0.6.
TEST(step04RejectionSampler, AcceptanceRateIsTheRatioAndRejectionsDrawTheResidual) {
  const std::vector<float> p = {0.10f, 0.45f, 0.05f, 0.30f, 0.10f};
  const std::vector<float> q = {0.40f, 0.10f, 0.20f, 0.05f, 0.25f};
  RejectionSampler sampler(5);
  llm::Sampler rng(5, 1.0f, 0.0f, 2024);
  constexpr int kTrials = 100000;
  int accepted = 0;
  std::vector<int> rejected_as(5, 0);
  for (int i = 0; i < kTrials; ++i) {
    const VerifyOutcome outcome = sampler.verify(p, q, 2, rng);
    if (outcome.accepted) {
      ASSERT_EQ(outcome.token, 2) << "an accepted draft is emitted as it is";
      ++accepted;
    } else {
      ASSERT_GE(outcome.token, 0);
      ASSERT_LT(outcome.token, 5);
      ++rejected_as[static_cast<std::size_t>(outcome.token)];
    }
  }
  EXPECT_NEAR(static_cast<double>(accepted) / kTrials, 0.25, 0.01) << "accept with probability p(x)/q(x)";
  // Where p <= q the residual is zero: never drawn, the draft itself included.
  EXPECT_EQ(rejected_as[0], 0);
  EXPECT_EQ(rejected_as[2], 0);
  EXPECT_EQ(rejected_as[4], 0);
  const int rejections = kTrials - accepted;
  ASSERT_GT(rejections, 0);
  EXPECT_NEAR(static_cast<double>(rejected_as[1]) / rejections, 0.35 / 0.60, 0.01);
  EXPECT_NEAR(static_cast<double>(rejected_as[3]) / rejections, 0.25 / 0.60, 0.01);

  // p(x) >= q(x): always accepted, whatever the coin.
  for (const int draft : {1, 3}) {
    for (int i = 0; i < 1000; ++i) {
      const VerifyOutcome outcome = sampler.verify(p, q, draft, rng);
      ASSERT_TRUE(outcome.accepted) << "draft " << draft;
      ASSERT_EQ(outcome.token, draft);
    }
  }
}

TEST(step04SamplingDistribution, GreedyIsOneHotOfArgmaxAndTopPKeepsTheNucleus) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f};
  std::vector<float> out(logits.size());
  step04::sampling_distribution(logits, {0.0f, 0.0f}, out);
  EXPECT_EQ(out, (std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f}));

  // softmax(logits) ~ {0.086, 0.638, 0.235, 0.052}: top-p 0.8 keeps ids 1 and 2.
  step04::sampling_distribution(logits, {1.0f, 0.8f}, out);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_NEAR(out[1] + out[2], 1.0f, 1e-6f);
  EXPECT_NEAR(out[1] / out[2], std::exp(1.0f), 1e-4f);

  // No top-p: the full softmax, summing to one.
  step04::sampling_distribution(logits, {0.7f, 1.0f}, out);
  EXPECT_NEAR(std::accumulate(out.begin(), out.end(), 0.0f), 1.0f, 1e-6f);
  EXPECT_GT(out[0], 0.0f);
}

}  // namespace
