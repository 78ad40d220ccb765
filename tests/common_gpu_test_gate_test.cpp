// When a GPU test runs, skips or fails (tests/test_support.hpp), decided
// without a GPU from statuses built by hand.
#include <gtest/gtest.h>

#include <string>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "test_support.hpp"

namespace {

using llm::cuda::DeviceKind;
using llm::cuda::DeviceStatus;
using llm::testing::GpuTestAction;
using llm::testing::gpu_test_gate;
using llm::testing::HasSubstr;

constexpr const char* kPhrase = llm::testing::kUnusableDevicePhrase;
using llm::testing::count_occurrences;

DeviceStatus unusable(DeviceKind kind, std::string reason) { return {false, kind, std::move(reason)}; }

// One status of every unusable kind, with the reason device_status() would give.
const DeviceStatus kBuiltWithoutCuda = unusable(DeviceKind::BuiltWithoutCuda, "built without CUDA");
const DeviceStatus kNoDriver = unusable(DeviceKind::NoDriver, "no NVIDIA driver found");
const DeviceStatus kNoDevice = unusable(DeviceKind::NoDevice, "no CUDA device visible (cudaGetDeviceCount returned 0)");
const DeviceStatus kDriverTooOld = unusable(DeviceKind::DriverTooOld, "the NVIDIA driver supports CUDA up to 12.2");
const DeviceStatus kNoKernelImage = unusable(DeviceKind::NoKernelImage, "CUDA device 0 cannot run this build's kernels");
const DeviceStatus kDeviceFailed = unusable(DeviceKind::DeviceFailed, "context creation failed");

TEST(GpuTestGate, RunsWhenTheDeviceIsUsable) {
  const DeviceStatus usable{true, DeviceKind::Usable, ""};
  for (const char* expect : {static_cast<const char*>(nullptr), "", "0", "1"}) {
    const auto gate = gpu_test_gate(usable, expect);
    EXPECT_EQ(gate.action, GpuTestAction::Run);
    EXPECT_TRUE(gate.message.empty());
  }
}

TEST(GpuTestGate, SkipsOnlyWhereNoGpuCanBePresent) {
  for (const DeviceStatus& status : {kBuiltWithoutCuda, kNoDriver, kNoDevice}) {
    for (const char* expect : {static_cast<const char*>(nullptr), "", "0"}) {
      const auto gate = gpu_test_gate(status, expect);
      EXPECT_EQ(gate.action, GpuTestAction::Skip) << status.reason;
      EXPECT_EQ(gate.message, std::string(kPhrase) + ": " + status.reason);
    }
  }
}

TEST(GpuTestGate, FailsWhenAGpuIsPresentButUnusable) {
  // A driver older than the runtime, a build without this card's
  // architecture, a context that cannot be created: a skip would hide them.
  for (const DeviceStatus& status : {kDriverTooOld, kNoKernelImage, kDeviceFailed}) {
    for (const char* expect : {static_cast<const char*>(nullptr), "0", "1"}) {
      const auto gate = gpu_test_gate(status, expect);
      EXPECT_EQ(gate.action, GpuTestAction::Fail) << status.reason;
      EXPECT_TRUE(HasSubstr(gate.message, status.reason));
      EXPECT_TRUE(HasSubstr(gate.message, "a GPU is present"));
      EXPECT_EQ(count_occurrences(gate.message, kPhrase), 1) << gate.message;
    }
  }
}

TEST(GpuTestGate, ExpectGpuTurnsEverySkipIntoAFailure) {
  for (const DeviceStatus& status : {kBuiltWithoutCuda, kNoDriver, kNoDevice}) {
    for (const char* expect : {"1", "yes"}) {
      const auto gate = gpu_test_gate(status, expect);
      EXPECT_EQ(gate.action, GpuTestAction::Fail) << status.reason;
      EXPECT_TRUE(HasSubstr(gate.message, status.reason));
      EXPECT_TRUE(HasSubstr(gate.message, std::string("LLM_EXPECT_GPU=") + expect));
      EXPECT_EQ(count_occurrences(gate.message, kPhrase), 1) << gate.message;
    }
  }
}

}  // namespace
