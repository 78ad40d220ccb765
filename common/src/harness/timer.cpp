#include "llm/harness/timer.hpp"

#include <algorithm>

namespace llm {

TimingStats TimingStats::from_samples(std::vector<double> samples_ms) {
  TimingStats s;
  if (samples_ms.empty()) return s;
  std::sort(samples_ms.begin(), samples_ms.end());
  const std::size_t n = samples_ms.size();
  // The median resists the outliers (a page fault, another process) that
  // would drag a mean.
  s.median_ms = n % 2 ? samples_ms[n / 2] : 0.5 * (samples_ms[n / 2 - 1] + samples_ms[n / 2]);
  s.min_ms = samples_ms.front();
  s.max_ms = samples_ms.back();
  s.runs = static_cast<int>(n);
  return s;
}

TimingStats time_cpu(const std::function<void()>& fn, int warmup, int runs,
                     const std::function<void()>& before_each) {
  for (int i = 0; i < warmup; ++i) {
    if (before_each) before_each();
    fn();
  }
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(runs));
  for (int i = 0; i < runs; ++i) {
    if (before_each) before_each();
    Stopwatch watch;
    fn();
    samples.push_back(watch.elapsed_ms());
  }
  return TimingStats::from_samples(std::move(samples));
}

}  // namespace llm
