#include "model_file.hpp"

#include <cstdlib>
#include <filesystem>
#include <vector>

#ifndef LLM_DEFAULT_MODELS_DIR
#define LLM_DEFAULT_MODELS_DIR "../shared/models"
#endif

namespace llm::testing {

std::optional<std::string> model_file(const std::string& name) {
  std::vector<std::filesystem::path> dirs;
  if (const char* env = std::getenv("LLM_MODELS_DIR")) dirs.emplace_back(env);
  dirs.emplace_back(LLM_DEFAULT_MODELS_DIR);
  for (const auto& dir : dirs) {
    const auto path = dir / name;
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec)) return path.string();
  }
  return std::nullopt;
}

}  // namespace llm::testing
