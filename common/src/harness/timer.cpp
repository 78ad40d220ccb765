#include "llm/harness/timer.hpp"

#include <algorithm>
#include <cmath>

#include "llm/errors.hpp"

namespace llm {
namespace {

// The `percent`-th percentile of `sorted` (ascending, not empty), by linear
// interpolation between the closest ranks (see TimingStats).
double percentile_of_sorted(const std::vector<double>& sorted, double percent) {
  const double rank = static_cast<double>(sorted.size() - 1) * percent / 100.0;
  const std::size_t below = static_cast<std::size_t>(std::floor(rank));
  const std::size_t above = std::min(below + 1, sorted.size() - 1);
  return sorted[below] + (rank - static_cast<double>(below)) * (sorted[above] - sorted[below]);
}

}  // namespace

TimingStats TimingStats::from_samples(std::vector<double> samples_ms) {
  if (samples_ms.empty())
    throw InputError("timing statistics of no samples: time at least one run");
  TimingStats s;
  std::sort(samples_ms.begin(), samples_ms.end());
  const std::size_t n = samples_ms.size();
  // The median resists the outliers (a page fault, another process) that
  // would drag a mean.
  s.median_ms = n % 2 ? samples_ms[n / 2] : 0.5 * (samples_ms[n / 2 - 1] + samples_ms[n / 2]);
  s.min_ms = samples_ms.front();
  s.max_ms = samples_ms.back();
  s.p50_ms = s.median_ms;  // type 7 at 50% is the median; one number, not two roundings of it
  s.p90_ms = percentile_of_sorted(samples_ms, 90.0);
  s.p99_ms = percentile_of_sorted(samples_ms, 99.0);
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
