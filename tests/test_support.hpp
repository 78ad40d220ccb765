#pragma once
// Helpers shared by the test suites: finding the real model files, fresh
// random inputs, skipping without a GPU.
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace llm::testing {

// Path of a file in the real-models folder ($LLM_MODELS_DIR, else
// ../shared/models beside the project), or nullopt when it is absent.
std::optional<std::string> model_file(const std::string& name);

// Fresh random values in [-scale, scale]; never all zeros.
std::vector<float> random_vector(std::size_t n, std::uint64_t seed, float scale = 1.0f);

// A file path in the system temp folder unique to this test process.
std::string temp_path(const std::string& name);

// Expects every vocab-sized row of `got` to match `ref` within the fp32
// tolerance for a whole model's logits (every layer's rounding compounds);
// a failure names `what` and the row.
void expect_logit_rows_close(const std::vector<float>& got, const std::vector<float>& ref, int vocab,
                             const std::string& what);

}  // namespace llm::testing

// Skips the current test with a message when the model file is missing.
#define LLM_REQUIRE_MODEL_FILE(var, name)                                                  \
  const auto var##_found = ::llm::testing::model_file(name);                               \
  if (!var##_found) GTEST_SKIP() << "model file " << name                                  \
                                 << " not found (set LLM_MODELS_DIR or place it in "       \
                                    "../shared/models); skipping";                         \
  const std::string var = *var##_found
