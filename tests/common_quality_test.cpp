// The quality measures steps 03 and 06 share (llm/quality.hpp): KL divergence
// and top-1 agreement of two models' next-token distributions.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "llm/quality.hpp"

namespace llm {
namespace {

TEST(NextTokenAgreement, KlOfAKnownPairAndOfIdenticalLogits) {
  // p = softmax(0, 0) = (1/2, 1/2); q = softmax(ln 3, 0) = (3/4, 1/4):
  // KL(p || q) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3).
  const std::vector<float> p = {0.0f, 0.0f, 0.0f, 5.0f};
  const std::vector<float> q = {std::log(3.0f), 0.0f, 0.0f, 5.0f};
  const auto a = compare_next_token_distributions(p, q, 2);
  EXPECT_EQ(a.positions, 2);
  EXPECT_NEAR(a.max_kl, 0.5 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_NEAR(a.mean_kl, 0.25 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_EQ(a.top1_agreement, 1.0);  // ties go to the first token, as llama2.c
  const auto same = compare_next_token_distributions(p, p, 2);
  EXPECT_EQ(same.mean_kl, 0.0);
  const std::vector<float> flipped = {1.0f, 0.0f, 0.0f, 5.0f};
  const std::vector<float> other = {0.0f, 1.0f, 0.0f, 5.0f};
  EXPECT_EQ(compare_next_token_distributions(flipped, other, 2).top1_agreement, 0.5);
}

}  // namespace
}  // namespace llm
