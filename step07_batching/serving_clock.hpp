#pragma once
// ServingClock: the time every latency of the step is measured on, in
// milliseconds. It is the steady clock, plus the idle gaps an offline replay
// skips: when the engine has nothing to do until the next request arrives,
// replay jumps the clock to that arrival instead of sleeping, so a trace of
// an hour's arrivals replays in the time its work takes. Work is never
// skipped, only waiting with nothing to run; the server never skips.
#include <chrono>

namespace step07 {

class ServingClock {
 public:
  ServingClock() : start_(std::chrono::steady_clock::now()) {}

  double now_ms() const {
    const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start_;
    return elapsed.count() + skipped_ms_;
  }
  // Jump forward to `time_ms` (no effect when it has passed): an idle gap.
  void skip_to(double time_ms) {
    const double now = now_ms();
    if (time_ms > now) skipped_ms_ += time_ms - now;
  }
  double skipped_ms() const { return skipped_ms_; }

 private:
  std::chrono::steady_clock::time_point start_;
  double skipped_ms_ = 0.0;
};

}  // namespace step07
