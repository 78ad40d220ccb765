#include "llm/exercise.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

namespace llm {
namespace {

// The source path as the learner sees it, relative to the repository root:
// "../step01_kv_cache/generation.cpp" and "/home/me/course/step01_kv_cache/
// generation.cpp" both give "step01_kv_cache/generation.cpp".
std::string path_in_repository(const std::string& compiled_path) {
  // The course's top-level folders: the last one in the path starts the part
  // a learner recognizes, wherever the copy lives and however the compiler was
  // given the path (absolute by CMake, relative under a compiler cache).
  static constexpr std::array<std::string_view, 4> kTopLevel = {"common/", "step0", "tests/", "fuzz/"};
  std::size_t best = std::string::npos;
  for (const auto folder : kTopLevel) {
    for (std::size_t at = compiled_path.find(folder); at != std::string::npos;
         at = compiled_path.find(folder, at + 1)) {
      const bool starts_a_component = at == 0 || compiled_path[at - 1] == '/';
      if (starts_a_component && (best == std::string::npos || at > best)) best = at;
    }
  }
  return best == std::string::npos ? compiled_path : compiled_path.substr(best);
}

}  // namespace

bool exercise_stubbed(const char* exercise_id) {
  const char* listed = std::getenv("LLM_STUBBED_EXERCISES");
  if (listed == nullptr) return false;
  const std::string_view ids(listed), id(exercise_id);
  for (std::size_t start = 0; start <= ids.size();) {
    const std::size_t comma = std::min(ids.find(',', start), ids.size());
    if (ids.substr(start, comma - start) == id) return true;
    start = comma + 1;
  }
  return false;
}

void exercise_not_done(const char* exercise_id, const char* file, int line) {
  throw ExerciseNotDone(
      exercise_id,
      fmt::format("ExerciseNotDone: exercise {0} is not written yet: write it at {1}:{2} (the stub there). "
                  "Hints: scripts/workshop.py hint {0}; check it: scripts/workshop.py check {0}",
                  exercise_id, path_in_repository(file), line));
}

}  // namespace llm
