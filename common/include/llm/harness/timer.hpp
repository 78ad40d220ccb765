#pragma once
// The one timer: warm-up runs, then the median (and min/max, p50/p90/p99) of
// N timed runs.
// GPU code is timed with CUDA events (common/include/llm/cuda/cuda_timer.hpp).
#include <chrono>
#include <functional>
#include <vector>

namespace llm {

struct TimingStats {
  double median_ms = 0.0;
  double min_ms = 0.0;
  double max_ms = 0.0;
  // Percentiles by linear interpolation between the closest ranks (numpy's
  // default, Hyndman-Fan type 7): over the sorted samples x[0..n-1], the
  // p-th percentile sits at rank h = (n - 1) p / 100, and is
  // x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h]).
  // p50 is the median itself (type 7 at 50%); p90/p99 are the tail
  // latencies of serving tables. With few runs the tail is an interpolation
  // between the slowest samples, not a measurement of rare events.
  double p50_ms = 0.0;
  double p90_ms = 0.0;
  double p99_ms = 0.0;
  int runs = 0;

  // Throws InputError when `samples_ms` is empty: no runs, no statistics.
  static TimingStats from_samples(std::vector<double> samples_ms);
};

// Runs `fn` `warmup` times untimed, then `runs` (>= 1) times timed with a steady clock.
// `before_each`, when given, runs untimed before every call of `fn`: to put the
// caches in the state the measured code meets in real use (flush them, or run
// what precedes `fn` in the real loop).
TimingStats time_cpu(const std::function<void()>& fn, int warmup, int runs,
                     const std::function<void()>& before_each = {});

// A steady-clock stopwatch for timing phases inside a run.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  void restart() { start_ = std::chrono::steady_clock::now(); }
  double elapsed_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace llm
