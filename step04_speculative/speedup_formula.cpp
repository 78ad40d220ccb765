#include "step04_speculative/speedup_formula.hpp"

#include <algorithm>
#include <cmath>

namespace step04 {

double expected_tokens_per_pass(double alpha, int k) {
  if (alpha >= 1.0) return k + 1.0;  // the geometric sum's limit; avoids 0/0
  return (1.0 - std::pow(alpha, k + 1)) / (1.0 - alpha);
}

double textbook_speedup(double alpha, int k, double draft_cost_ratio) {
  return expected_tokens_per_pass(alpha, k) / (k * draft_cost_ratio + 1.0);
}

SpeedupPrediction predict_speedup(double alpha, const std::vector<int>& drafted_per_round,
                                  const std::vector<int>& steps_per_round, double draft_cost_ratio,
                                  const std::vector<double>& verify_cost_ratio) {
  SpeedupPrediction p;
  if (drafted_per_round.empty()) return p;
  for (std::size_t r = 0; r < drafted_per_round.size(); ++r) {
    const int j = drafted_per_round[r];
    p.tokens_per_pass += expected_tokens_per_pass(alpha, j);
    p.draft_cost += steps_per_round[r] * draft_cost_ratio;
    const auto v_index = std::min(static_cast<std::size_t>(j), verify_cost_ratio.size() - 1);
    p.verify_cost += verify_cost_ratio[v_index];
  }
  const auto rounds = static_cast<double>(drafted_per_round.size());
  p.tokens_per_pass /= rounds;
  p.draft_cost /= rounds;
  p.verify_cost /= rounds;
  p.speedup = p.tokens_per_pass / (p.draft_cost + p.verify_cost);
  return p;
}

int best_k(double alpha, double draft_cost_ratio, const std::vector<double>& verify_cost_ratio, int max_k) {
  int best = 1;
  double best_speedup = 0.0;
  for (int k = 1; k <= max_k; ++k) {
    const double v = verify_cost_ratio[std::min(static_cast<std::size_t>(k), verify_cost_ratio.size() - 1)];
    const double s = expected_tokens_per_pass(alpha, k) / (k * draft_cost_ratio + v);
    if (s > best_speedup) {
      best_speedup = s;
      best = k;
    }
  }
  return best;
}

}  // namespace step04
