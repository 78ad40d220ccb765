#include "llm/quality.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

#include "llm/errors.hpp"
#include "llm/sampler.hpp"

namespace llm {
namespace {

// Throws InputError unless `logits` is [positions, vocab] with at least one
// position and every logit finite; returns the number of positions.
// `function` and `name` say in the message which argument of which call.
int checked_positions(std::string_view function, std::string_view name, std::span<const float> logits, int vocab) {
  if (vocab <= 0) throw InputError(fmt::format("{}: vocab must be positive, got {}", function, vocab));
  if (logits.empty()) throw InputError(fmt::format("{}: {} is empty: no positions to measure", function, name));
  if (logits.size() % static_cast<std::size_t>(vocab) != 0)
    throw InputError(fmt::format("{}: {} has {} values, not whole rows of [positions, vocab {}]", function, name,
                                 logits.size(), vocab));
  const auto bad = std::find_if(logits.begin(), logits.end(), [](float x) { return !std::isfinite(x); });
  if (bad != logits.end()) {
    const std::size_t index = static_cast<std::size_t>(bad - logits.begin());
    throw InputError(fmt::format("{}: {} at position {}, token {} is {}: the logits must be finite", function, name,
                                 index / vocab, index % vocab, *bad));
  }
  return static_cast<int>(logits.size() / vocab);
}

// log-sum-exp of one row [vocab], in its two parts: the row's max and
// log(sum_j exp(x_j - max)). Subtracting the max first keeps every exp <= 1
// (no overflow) and one of them == 1 (the sum is >= 1, its log finite).
struct LogSumExp {
  double max = 0.0;
  double log_sum = 0.0;
};

LogSumExp log_sum_exp(std::span<const float> row) {
  LogSumExp lse;
  lse.max = *std::max_element(row.begin(), row.end());
  double sum = 0.0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - lse.max);
  lse.log_sum = std::log(sum);
  return lse;
}

// log p of the token whose logit is `logit`: logit - max - log_sum.
double log_probability(const LogSumExp& lse, float logit) {
  return static_cast<double>(logit) - lse.max - lse.log_sum;
}

// log softmax of one row: row [vocab] -> out [vocab].
void log_softmax(std::span<const float> row, std::vector<double>& out) {
  const LogSumExp lse = log_sum_exp(row);
  out.resize(row.size());
  for (std::size_t i = 0; i < row.size(); ++i) out[i] = log_probability(lse, row[i]);
}

}  // namespace

NextTokenAgreement compare_next_token_distributions(std::span<const float> reference_logits,
                                                    std::span<const float> candidate_logits, int vocab) {
  constexpr std::string_view function = "compare_next_token_distributions";
  if (reference_logits.size() != candidate_logits.size())
    throw InputError(fmt::format("{}: reference_logits has {} values and candidate_logits {}: both must be "
                                 "[positions, vocab] over the same positions",
                                 function, reference_logits.size(), candidate_logits.size()));
  NextTokenAgreement result;
  result.positions = checked_positions(function, "reference_logits", reference_logits, vocab);
  checked_positions(function, "candidate_logits", candidate_logits, vocab);
  std::vector<double> log_p, log_q;  // [vocab] each
  int same_top1 = 0;
  for (int pos = 0; pos < result.positions; ++pos) {
    const auto p_row = reference_logits.subspan(static_cast<std::size_t>(pos) * vocab, vocab);
    const auto q_row = candidate_logits.subspan(static_cast<std::size_t>(pos) * vocab, vocab);
    log_softmax(p_row, log_p);
    log_softmax(q_row, log_q);
    double kl = 0.0;
    for (int i = 0; i < vocab; ++i) kl += std::exp(log_p[i]) * (log_p[i] - log_q[i]);
    kl = std::max(kl, 0.0);  // exact math says >= 0; rounding can give -1e-17
    result.mean_kl += kl;
    result.max_kl = std::max(result.max_kl, kl);
    same_top1 += argmax(p_row) == argmax(q_row);
  }
  result.mean_kl /= result.positions;
  result.top1_agreement = static_cast<double>(same_top1) / result.positions;
  return result;
}

double perplexity(std::span<const float> logits, std::span<const int> next_tokens, int vocab) {
  constexpr std::string_view function = "perplexity";
  const int positions = checked_positions(function, "logits", logits, vocab);
  if (next_tokens.size() != static_cast<std::size_t>(positions))
    throw InputError(fmt::format("{}: logits has {} positions but next_tokens has {} tokens: one next token per "
                                 "position",
                                 function, positions, next_tokens.size()));
  double negative_log_likelihood = 0.0;  // sum over positions, in nats
  for (int pos = 0; pos < positions; ++pos) {
    const int token = next_tokens[static_cast<std::size_t>(pos)];
    if (token < 0 || token >= vocab)
      throw InputError(fmt::format("{}: next token {} at position {} is out of range [0, {})", function, token, pos,
                                   vocab));
    const auto row = logits.subspan(static_cast<std::size_t>(pos) * vocab, vocab);
    negative_log_likelihood -= log_probability(log_sum_exp(row), row[static_cast<std::size_t>(token)]);
  }
  return std::exp(negative_log_likelihood / positions);
}

}  // namespace llm
