#include "llm/harness/progress.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <utility>

namespace llm {

RunProgress::RunProgress(std::string step, int parts) : step_(std::move(step)), parts_(parts) {}

void RunProgress::start(const std::string& what) {
  ++started_;
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - begun_;
  fmt::print(stderr, "{}: part {} of {}: {} (at {:.1f} s)\n", step_, started_, parts_, what, elapsed.count());
  std::fflush(stderr);
}

}  // namespace llm
