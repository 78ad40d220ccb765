#pragma once
// Finding the real model files (stories260K.bin, tok512.bin, ...) from the
// test suites and the fuzz targets. No GoogleTest here: the fuzz targets
// link this file alone (fuzz/CMakeLists.txt).
#include <optional>
#include <string>

namespace llm::testing {

// Path of a file in the real-models folder ($LLM_MODELS_DIR, else
// ../shared/models beside the project: LLM_DEFAULT_MODELS_DIR, set by CMake),
// or nullopt when it is absent.
std::optional<std::string> model_file(const std::string& name);

}  // namespace llm::testing
