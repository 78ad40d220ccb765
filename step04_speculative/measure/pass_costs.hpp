#pragma once
// The per-pass costs the speedup formula needs, measured on their own (not
// inside the speculative loop), so the prediction is independent of the run
// it is compared with: one target decode step, one target verification pass
// over j+1 rows for every j, and one drafter step.
#include <span>
#include <vector>

#include "llm/model.hpp"
#include "step04_speculative/drafter.hpp"

namespace step04 {

struct TargetCosts {
  double step_ms = 0.0;            // one 1-row forward: a plain decode step
  std::vector<double> verify_ms;   // [max_k + 1] one forward over j+1 rows (logits for all), j = 0..max_k

  // v(j) = verify_ms[j] / step_ms, the verification cost in target steps.
  std::vector<double> verify_cost_ratio() const;
};

// context: [n] representative committed text (the costs are taken at position
// n-1, e.g. the middle of a generation, since attention grows with position).
// Median of `runs` timings after warm-up; the cache is truncated back after
// each timed forward so every run sees the same state.
TargetCosts measure_target_costs(llm::Model& target, std::span<const int> context, int max_k, int runs);

// One drafter step at the same point: one draft forward for model drafters
// (propose with k = 1 after the context is cached), one lookup of k tokens
// for n-gram lookup.
double measure_draft_step_ms(Drafter& drafter, std::span<const int> context, int k, const SamplingSettings& sampling,
                             int runs);

}  // namespace step04
