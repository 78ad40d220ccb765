#include "test_support.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <unistd.h>

#include "llm/harness/compare.hpp"

namespace llm::testing {

std::vector<float> random_vector(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<int> random_tokens(int n, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<int> tokens(static_cast<std::size_t>(n));
  for (int& t : tokens) t = dist(rng);
  return tokens;
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string write_shell_script(const std::string& name, const std::string& body) {
  const std::string path = temp_path(name);
  const std::string script = "#!/bin/sh\n" + body + "\n";
  write_bytes(path, std::vector<char>(script.begin(), script.end()));
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

int count_occurrences(const std::string& text, const std::string& part) {
  int n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

::testing::AssertionResult HasSubstr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

GpuTestGate gpu_test_gate(const ::llm::cuda::DeviceStatus& status, const char* expect_gpu) {
  if (status.usable) return {GpuTestAction::Run, ""};
  const std::string why = ::llm::cuda::unusable_message(status);
  if (!::llm::cuda::no_gpu_present(status.kind))
    return {GpuTestAction::Fail, why + " (a GPU is present, so this fails rather than skips)"};
  const bool expected = expect_gpu != nullptr && std::string(expect_gpu) != "" && std::string(expect_gpu) != "0";
  if (expected) return {GpuTestAction::Fail, why + " (LLM_EXPECT_GPU=" + expect_gpu + ": a GPU must run this test)"};
  return {GpuTestAction::Skip, why};
}

std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("llm_tests_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

void expect_logit_rows_close(const std::vector<float>& got, const std::vector<float>& ref, int vocab,
                             const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const auto row = static_cast<std::size_t>(vocab);
  for (std::size_t r = 0; r * row < got.size(); ++r) {
    const CompareResult result = compare(std::span<const float>(got).subspan(r * row, row),
                                         std::span<const float>(ref).subspan(r * row, row),
                                         model_logits_tolerance(DType::F32));
    EXPECT_TRUE(result.ok) << what << ", logits row " << r << ": " << result.summary();
  }
}

}  // namespace llm::testing
