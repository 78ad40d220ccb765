#pragma once
// The expected-tokens and speedup formulas (Leviathan et al. 2023, section 3).
// If each draft is accepted independently with probability alpha, a round
// with k drafts emits 1 + alpha + alpha^2 + ... + alpha^k tokens on average:
//   E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha)            (k + 1 when alpha = 1)
// A round costs k draft steps and one verification pass. In units of one
// plain decode step of the target (one 1-row forward):
//   c = draft step cost / target step cost
//   v = verification pass cost (k+1 rows) / target step cost
//   speedup = E / (k c + v)
// The paper's form sets v = 1: memory-bound decode makes a pass over k+1 rows
// cost about one pass over a single row. On a CPU with a tiny model v is
// measurably above 1, so the course predicts with the measured v and prints
// the v = 1 "textbook" number beside it.
#include <vector>

namespace step04 {

double expected_tokens_per_pass(double alpha, int k);

// E / (k c + 1): the paper's formula.
double textbook_speedup(double alpha, int k, double draft_cost_ratio);

// The same formula averaged over the rounds of a real run, which do not all
// draft k tokens (the last rounds draft fewer; n-gram lookup drafts 0..k) nor
// run exactly k draft steps:
//   tokens per round  = mean over rounds of E(alpha, j_r)
//   cost per round    = mean over rounds of (steps_r c + v(j_r))
//   speedup           = tokens per round / cost per round
// where j_r is round r's draft count and steps_r the drafter steps it ran:
// j_r forwards for a model drafter, one more after a round whose drafts all
// stood (the last draft and the bonus token must both be fed next round), and
// one lookup for n-gram. For a model drafter drafting k every round with
// alpha < 1 this is close to E(alpha, k) / (k c + v(k)).
struct SpeedupPrediction {
  double tokens_per_pass = 0.0;   // predicted E averaged over rounds
  double draft_cost = 0.0;        // mean draft cost per round, in target steps
  double verify_cost = 0.0;       // mean verification cost per round, in target steps
  double speedup = 0.0;
};
// drafted_per_round, steps_per_round: [rounds], from the run's counts (not its times).
// verify_cost_ratio: [max drafted + 1] v(j) = cost of a (j+1)-row pass / a 1-row pass.
SpeedupPrediction predict_speedup(double alpha, const std::vector<int>& drafted_per_round,
                                  const std::vector<int>& steps_per_round, double draft_cost_ratio,
                                  const std::vector<double>& verify_cost_ratio);

// The k in [1, max_k] that maximizes E(alpha, k) / (k c + v(k)) (exercise 1
// of the docs): more drafts pay only while the next one is likely accepted.
int best_k(double alpha, double draft_cost_ratio, const std::vector<double>& verify_cost_ratio, int max_k);

}  // namespace step04
