#pragma once
// The one timer: warm-up runs, then the median (and min/max) of N timed runs.
// GPU code is timed with CUDA events (common/include/llm/cuda/cuda_timer.hpp).
#include <chrono>
#include <functional>
#include <vector>

namespace llm {

struct TimingStats {
  double median_ms = 0.0;
  double min_ms = 0.0;
  double max_ms = 0.0;
  int runs = 0;

  static TimingStats from_samples(std::vector<double> samples_ms);
};

// Runs `fn` `warmup` times untimed, then `runs` times timed with a steady clock.
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
