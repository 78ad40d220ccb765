#include "step04_speculative/measure/pass_costs.hpp"

#include "llm/harness/timer.hpp"

namespace step04 {

std::vector<double> TargetCosts::verify_cost_ratio() const {
  std::vector<double> ratio;
  for (double ms : verify_ms) ratio.push_back(ms / step_ms);
  return ratio;
}

TargetCosts measure_target_costs(llm::Model& target, std::span<const int> context, int max_k, int runs) {
  const int n = static_cast<int>(context.size());
  auto cache = target.make_cache(1, n + max_k);
  // Cache every committed token but the last, as at the start of a round.
  target.forward(llm::TokenBatch::prefill(context.first(context.size() - 1), 0, 0), *cache);

  TargetCosts costs;
  for (int j = 0; j <= max_k; ++j) {
    llm::TokenBatch batch;  // [j+1 rows] the last committed token, then j stand-in drafts
    batch.add(context.back(), n - 1, 0);
    for (int i = 0; i < j; ++i) batch.add(context[static_cast<std::size_t>(i % n)], n + i, 0);
    const auto which = j == 0 ? llm::LogitsFor::LastRowOfEachSequence : llm::LogitsFor::AllRows;
    const llm::TimingStats t = llm::time_cpu(
        [&] {
          target.forward(batch, *cache, which);
          cache->truncate(0, n - 1);
        },
        /*warmup=*/3, runs);
    costs.verify_ms.push_back(t.median_ms);
  }
  costs.step_ms = costs.verify_ms[0];
  return costs;
}

double measure_draft_step_ms(Drafter& drafter, std::span<const int> context, int k, const SamplingSettings& sampling,
                             int runs) {
  llm::Sampler rng(1, 1.0f, 0.0f, 7);  // a source of uniforms only
  Draft draft;
  const int n = static_cast<int>(context.size());
  const int step_k = drafter.one_step_per_token() ? 1 : k;
  drafter.reset(n + k);
  drafter.propose(context, step_k, sampling, rng, draft);  // caches the context (untimed)
  // Each timed call re-feeds only the last committed token: one forward.
  return llm::time_cpu([&] { drafter.propose(context, step_k, sampling, rng, draft); }, /*warmup=*/3, runs)
      .median_ms;
}

}  // namespace step04
