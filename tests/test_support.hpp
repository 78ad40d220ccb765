#pragma once
// Helpers shared by the test suites: finding the real model files, fresh
// random inputs, the rule for tests that need a GPU.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "model_file.hpp"  // model_file(): the real model files

namespace llm::testing {

// Whether this build runs under AddressSanitizer (CI's sanitizer tier, where
// the CPU model runs 10-20x slower): the longest replay tests take smaller
// traces there (step 07's prefix caching and blocks of 1 and 7), with the
// same checks.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// Fresh random values in [-scale, scale]; never all zeros.
std::vector<float> random_vector(std::size_t n, std::uint64_t seed, float scale = 1.0f);

// Random token ids in [0, vocab), reproducible from `seed`.
std::vector<int> random_tokens(int n, int vocab, unsigned seed);

// A file path in the system temp folder unique to this test process.
std::string temp_path(const std::string& name);
// A whole file's bytes, and writing them back (to build truncated or
// corrupted copies of model and tokenizer files).
std::vector<char> read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::vector<char>& bytes);
// An executable shell script in the temp folder (`#!/bin/sh` then `body`):
// a stand-in for an outside program a step runs (run.c, llama-bench).
std::string write_shell_script(const std::string& name, const std::string& body);

// EXPECT_TRUE(HasSubstr(message, "truncated")) with gtest alone (gmock is a
// separate package); on failure it prints both strings.
::testing::AssertionResult HasSubstr(const std::string& text, const std::string& part);

// How many times `part` appears in `text`, without overlaps.
int count_occurrences(const std::string& text, const std::string& part);

// The phrase device messages begin with, owned by llm::cuda::unusable_message:
// tests check that it is written exactly once.
inline constexpr const char* kUnusableDevicePhrase = "no usable CUDA device";

// Expects every vocab-sized row of `got` to match `ref` within the fp32
// tolerance for a whole model's logits (every layer's rounding compounds);
// a failure names `what` and the row.
void expect_logit_rows_close(const std::vector<float>& got, const std::vector<float>& ref, int vocab,
                             const std::string& what);

// What a test that needs a GPU does, from the device status and the value
// of $LLM_EXPECT_GPU (nullptr when unset):
//   Run   a device is usable;
//   Skip  no GPU can be present here (built without CUDA, no NVIDIA driver,
//         no device visible);
//   Fail  a GPU is present but unusable (driver older than the runtime, no
//         kernel image for its architecture, context creation failed), or
//         LLM_EXPECT_GPU is set to anything but "" or "0" and the test would
//         have skipped: on a GPU machine a green run then proves the GPU ran.
// `message` says why (empty for Run).
enum class GpuTestAction { Run, Skip, Fail };
struct GpuTestGate {
  GpuTestAction action = GpuTestAction::Run;
  std::string message;
};
GpuTestGate gpu_test_gate(const ::llm::cuda::DeviceStatus& status, const char* expect_gpu);

}  // namespace llm::testing

// Runs the rest of the test only when a CUDA device is usable; otherwise
// skips or fails it, with the reason, as gpu_test_gate() decides.
#define LLM_REQUIRE_CUDA_DEVICE()                                                                          \
  do {                                                                                                     \
    const ::llm::testing::GpuTestGate llm_gate_ =                                                          \
        ::llm::testing::gpu_test_gate(::llm::cuda::device_status(), std::getenv("LLM_EXPECT_GPU"));        \
    if (llm_gate_.action == ::llm::testing::GpuTestAction::Skip) GTEST_SKIP() << llm_gate_.message;        \
    if (llm_gate_.action == ::llm::testing::GpuTestAction::Fail) FAIL() << llm_gate_.message;              \
  } while (0)

// Skips the current test with a message when the model file is missing.
#define LLM_REQUIRE_MODEL_FILE(var, name)                                                  \
  const auto var##_found = ::llm::testing::model_file(name);                               \
  if (!var##_found) GTEST_SKIP() << "model file " << name                                  \
                                 << " not found (set LLM_MODELS_DIR or place it in "       \
                                    "../shared/models); skipping";                         \
  const std::string var = *var##_found
