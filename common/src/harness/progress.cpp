#include "llm/harness/progress.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <utility>

namespace llm {

RunProgress::RunProgress(std::string step, int parts) : step_(std::move(step)), parts_(parts) {}

void RunProgress::start(const std::string& what) {
  ++started_;
  fmt::print(stderr, "{}: part {} of {}: {}\n", step_, started_, parts_, what);
  std::fflush(stderr);
}

}  // namespace llm
