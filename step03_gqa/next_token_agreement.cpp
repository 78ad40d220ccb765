#include "step03_gqa/next_token_agreement.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "llm/errors.hpp"
#include "llm/sampler.hpp"

namespace step03 {
namespace {

// log softmax of one row: log p_i = x_i - max - log(sum_j exp(x_j - max)).
// row [vocab] -> out [vocab]
void log_softmax(std::span<const float> row, std::vector<double>& out) {
  const double max = *std::max_element(row.begin(), row.end());
  double sum = 0.0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - max);
  const double log_sum = std::log(sum);
  out.resize(row.size());
  for (std::size_t i = 0; i < row.size(); ++i) out[i] = static_cast<double>(row[i]) - max - log_sum;
}

}  // namespace

NextTokenAgreement compare_next_token_distributions(std::span<const float> reference_logits,
                                                    std::span<const float> candidate_logits, int vocab) {
  if (vocab <= 0 || reference_logits.size() != candidate_logits.size() || reference_logits.size() % vocab != 0)
    throw llm::InputError("compare_next_token_distributions: logits must both be [positions, vocab]");
  NextTokenAgreement result;
  result.positions = static_cast<int>(reference_logits.size() / vocab);
  if (result.positions == 0) return result;
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
    same_top1 += llm::argmax(p_row) == llm::argmax(q_row);
  }
  result.mean_kl /= result.positions;
  result.top1_agreement = static_cast<double>(same_top1) / result.positions;
  return result;
}

}  // namespace step03
