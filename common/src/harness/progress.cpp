#include "llm/harness/progress.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <utility>

namespace llm {

RunProgress::RunProgress(std::string step, int parts) : step_(std::move(step)), parts_(parts) {}

double RunProgress::seconds_since_begun() const {
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - begun_;
  return elapsed.count();
}

void RunProgress::start(const std::string& what) {
  ++started_;
  fmt::print(stderr, "{}: part {} of {}: {} (at {:.1f} s)\n", step_, started_, parts_, what, seconds_since_begun());
  std::fflush(stderr);
}

void RunProgress::note(const std::string& what) const {
  fmt::print(stderr, "{}:   {} (at {:.1f} s)\n", step_, what, seconds_since_begun());
  std::fflush(stderr);
}

}  // namespace llm
