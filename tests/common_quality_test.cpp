// The quality measures steps 03 and 06 share (llm/quality.hpp): KL divergence
// and top-1 agreement of two models' next-token distributions, and perplexity
// of a model on a text. Hand-computed small cases, the properties that must
// hold on random logits, logits too large for a naive softmax, and bad input
// rejected with InputError (never a silent NaN).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "llm/errors.hpp"
#include "llm/quality.hpp"
#include "test_support.hpp"

namespace llm {
namespace {

using ::llm::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The message of the InputError `call` throws (fails the test if none).
std::string input_error(const std::function<void()>& call) {
  try {
    call();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError thrown";
  return "";
}

// --- KL divergence and top-1 agreement ----------------------------------------------

TEST(NextTokenAgreement, IdenticalDistributionsHaveZeroKlAndFullTop1Agreement) {
  const int vocab = 37;
  const auto logits = testing::random_vector(5 * vocab, 1, 4.0f);  // [5, vocab]
  const NextTokenAgreement a = compare_next_token_distributions(logits, logits, vocab);
  EXPECT_EQ(a.positions, 5);
  EXPECT_EQ(a.mean_kl, 0.0);
  EXPECT_EQ(a.max_kl, 0.0);
  EXPECT_EQ(a.top1_agreement, 1.0);
}

TEST(NextTokenAgreement, KlOfAKnownPairMatchesTheHandComputation) {
  // Position 0: p = softmax(0, 0) = (1/2, 1/2); q = softmax(ln 3, 0) = (3/4, 1/4):
  // KL(p || q) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3). Position 1: the same row, KL 0.
  const std::vector<float> p = {0.0f, 0.0f, 0.0f, 5.0f};  // [2, 2]
  const std::vector<float> q = {std::log(3.0f), 0.0f, 0.0f, 5.0f};
  const NextTokenAgreement a = compare_next_token_distributions(p, q, 2);
  EXPECT_EQ(a.positions, 2);
  EXPECT_NEAR(a.max_kl, 0.5 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_NEAR(a.mean_kl, 0.25 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_EQ(a.top1_agreement, 1.0);  // position 0: p ties, and ties go to the first token, as llama2.c
  // The other way round: KL(q || p) = 3/4 ln(3/2) + 1/4 ln(1/2), not the same number.
  EXPECT_NEAR(compare_next_token_distributions(q, p, 2).max_kl, 0.75 * std::log(1.5) + 0.25 * std::log(0.5), 1e-7);
}

TEST(NextTokenAgreement, KlIsNonNegativeAndShiftInvariantOnRandomLogits) {
  const int vocab = 50;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const auto p = testing::random_vector(3 * vocab, 100 + seed, 6.0f);  // [3, vocab]
    auto q = testing::random_vector(3 * vocab, 200 + seed, 6.0f);
    const NextTokenAgreement a = compare_next_token_distributions(p, q, vocab);
    EXPECT_GT(a.mean_kl, 0.0) << "seed " << seed;
    EXPECT_LE(a.mean_kl, a.max_kl) << "seed " << seed;
    // softmax(x + c) == softmax(x): the same KL when one model's logits shift.
    for (float& x : q) x += 3.0f;
    EXPECT_NEAR(compare_next_token_distributions(p, q, vocab).mean_kl, a.mean_kl, 1e-5) << "seed " << seed;
  }
}

TEST(NextTokenAgreement, Top1AgreementIsTheFractionOfPositionsWithTheSameArgmax) {
  // [4 positions, 3 tokens]: the argmax agrees at positions 0, 2 and 3, not at 1.
  const std::vector<float> reference = {2, 0, 0, /**/ 0, 2, 0, /**/ 0, 0, 2, /**/ 1, 1, 0};
  const std::vector<float> candidate = {5, 1, 1, /**/ 0, 0, 2, /**/ 1, 0, 9, /**/ 3, 3, 3};  // ties: token 0
  EXPECT_EQ(compare_next_token_distributions(reference, candidate, 3).top1_agreement, 0.75);
}

TEST(NextTokenAgreement, LogitsTooLargeForANaiveSoftmaxStayFinite) {
  // exp(1000) overflows even a double; the max-subtracted log-softmax does not.
  const std::vector<float> p = {1000.0f, 1000.0f};
  const std::vector<float> q = {-1000.0f, -1000.0f};
  const NextTokenAgreement a = compare_next_token_distributions(p, q, 2);
  EXPECT_EQ(a.mean_kl, 0.0);  // both uniform
  const std::vector<float> sure = {1000.0f, 0.0f};  // p = (1, e^-1000): KL vs uniform = ln 2
  EXPECT_NEAR(compare_next_token_distributions(sure, q, 2).mean_kl, std::log(2.0), 1e-12);
}

TEST(NextTokenAgreement, RejectsMismatchedSizes) {
  const std::vector<float> six(6, 0.0f), four(4, 0.0f);
  EXPECT_TRUE(HasSubstr(input_error([&] { compare_next_token_distributions(six, four, 2); }), "same positions"));
  EXPECT_TRUE(HasSubstr(input_error([&] { compare_next_token_distributions(six, six, 4); }), "not whole rows"));
  EXPECT_TRUE(HasSubstr(input_error([&] { compare_next_token_distributions(six, six, 0); }), "vocab"));
}

TEST(NextTokenAgreement, RejectsEmptyLogits) {
  const std::vector<float> none;
  EXPECT_TRUE(HasSubstr(input_error([&] { compare_next_token_distributions(none, none, 2); }), "empty"));
}

TEST(NextTokenAgreement, RejectsNanAndInfiniteLogitsOnEitherSide) {
  const std::vector<float> good = {0.0f, 1.0f, 2.0f, 3.0f};  // [2, 2]
  std::vector<float> nan_at_1_0 = good;
  nan_at_1_0[2] = kNaN;
  std::vector<float> inf_at_0_1 = good;
  inf_at_0_1[1] = kInf;
  const std::string nan_message = input_error([&] { compare_next_token_distributions(nan_at_1_0, good, 2); });
  EXPECT_TRUE(HasSubstr(nan_message, "reference_logits at position 1, token 0"));
  EXPECT_TRUE(HasSubstr(nan_message, "finite"));
  EXPECT_TRUE(HasSubstr(input_error([&] { compare_next_token_distributions(good, inf_at_0_1, 2); }),
                        "candidate_logits at position 0, token 1"));
}

// --- perplexity ----------------------------------------------------------------------

TEST(Perplexity, OfAUniformDistributionIsTheVocabSize) {
  for (int vocab : {1, 2, 7, 512}) {
    const int positions = 4;
    const std::vector<float> logits(static_cast<std::size_t>(positions) * vocab, 0.25f);  // every row uniform
    const auto next = testing::random_tokens(positions, vocab, 3);
    EXPECT_NEAR(perplexity(logits, next, vocab), vocab, 1e-9 * vocab) << "vocab " << vocab;
  }
}

TEST(Perplexity, MatchesAHandComputation) {
  // Position 0: p = softmax(ln 3, 0) = (3/4, 1/4), next token 0: -ln p = ln(4/3).
  // Position 1: p = (1/2, 1/2), next token 1: -ln p = ln 2.
  // Perplexity = exp((ln(4/3) + ln 2) / 2) = sqrt(8/3).
  const std::vector<float> logits = {std::log(3.0f), 0.0f, 0.0f, 0.0f};  // [2, 2]
  const std::vector<int> next = {0, 1};
  EXPECT_NEAR(perplexity(logits, next, 2), std::sqrt(8.0 / 3.0), 1e-7);
  // The unlikely token at position 0 instead: exp((ln 4 + ln 2) / 2) = sqrt(8).
  const std::vector<int> unlikely = {1, 1};
  EXPECT_NEAR(perplexity(logits, unlikely, 2), std::sqrt(8.0), 1e-7);
}

TEST(Perplexity, LogitsTooLargeForANaiveSoftmaxStayFinite) {
  const std::vector<float> logits = {1000.0f, 1000.0f, -1000.0f, -1000.0f};  // [2, 2], both rows uniform
  const std::vector<int> next = {0, 1};
  EXPECT_NEAR(perplexity(logits, next, 2), 2.0, 1e-12);
  // A sure and right model: p = 1 - e^-1000, which is 1 in double; perplexity 1.
  const std::vector<float> sure = {1000.0f, 0.0f};
  const std::vector<int> first = {0};
  EXPECT_EQ(perplexity(sure, first, 2), 1.0);
}

TEST(Perplexity, RejectsMismatchedSizesEmptyInputAndTokensOutOfRange) {
  const std::vector<float> logits(6, 0.0f);  // [3, 2]
  const std::vector<int> two = {0, 1}, three = {0, 1, 1}, none;
  const std::vector<float> no_logits;
  EXPECT_TRUE(HasSubstr(input_error([&] { perplexity(logits, two, 2); }), "one next token per position"));
  EXPECT_TRUE(HasSubstr(input_error([&] { perplexity(logits, three, 4); }), "not whole rows"));
  EXPECT_TRUE(HasSubstr(input_error([&] { perplexity(no_logits, none, 2); }), "empty"));
  const std::vector<int> out_of_range = {0, 2, 1};
  EXPECT_TRUE(HasSubstr(input_error([&] { perplexity(logits, out_of_range, 2); }), "next token 2 at position 1"));
  const std::vector<int> negative = {-1, 0, 1};
  EXPECT_TRUE(HasSubstr(input_error([&] { perplexity(logits, negative, 2); }), "out of range"));
}

TEST(Perplexity, RejectsNanAndInfiniteLogits) {
  const std::vector<int> next = {0, 1};
  for (float bad : {kNaN, kInf, -kInf}) {
    std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f};  // [2, 2]
    logits[3] = bad;
    EXPECT_TRUE(HasSubstr(input_error([&] { perplexity(logits, next, 2); }), "logits at position 1, token 1"))
        << bad;
  }
}

}  // namespace
}  // namespace llm
