// How device_status() names an unusable CUDA device: which case it is
// (DeviceKind) and the reason in words, with "no usable CUDA device" written
// once however many layers report it. No GPU needed.
#include <gtest/gtest.h>

#include <string>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "test_support.hpp"

namespace {

using llm::cuda::DeviceKind;
using llm::cuda::DeviceStatus;
using llm::testing::HasSubstr;

constexpr const char* kPhrase = llm::testing::kUnusableDevicePhrase;
using llm::testing::count_occurrences;

// ---------------------------------------------------------------------------
// cudaGetDeviceCount's errors, named.

TEST(DeviceCountError, InsufficientDriverWithoutADriverIsNoDriver) {
  const DeviceStatus s = llm::cuda::status_from_device_count_error(35, /*driver_version=*/0, 13000, nullptr);
  EXPECT_FALSE(s.usable);
  EXPECT_EQ(s.kind, DeviceKind::NoDriver);
  EXPECT_EQ(s.reason, "no NVIDIA driver found");  // not "error 35 (... driver version is insufficient ...)"
}

TEST(DeviceCountError, InsufficientDriverWithAnOldDriverIsDriverTooOld) {
  const DeviceStatus s = llm::cuda::status_from_device_count_error(35, /*driver_version=*/12020, 13000, nullptr);
  EXPECT_EQ(s.kind, DeviceKind::DriverTooOld);
  EXPECT_TRUE(HasSubstr(s.reason, "12.2"));
  EXPECT_TRUE(HasSubstr(s.reason, "13.0"));
  EXPECT_TRUE(HasSubstr(s.reason, "update the driver"));
  EXPECT_FALSE(llm::cuda::no_gpu_present(s.kind));
}

TEST(DeviceCountError, NoDeviceNamesCudaVisibleDevicesWhenSet) {
  const DeviceStatus hidden = llm::cuda::status_from_device_count_error(100, 13000, 13000, "");
  EXPECT_EQ(hidden.kind, DeviceKind::NoDevice);
  EXPECT_TRUE(HasSubstr(hidden.reason, "CUDA_VISIBLE_DEVICES=\"\""));
  const DeviceStatus none = llm::cuda::status_from_device_count_error(100, 13000, 13000, nullptr);
  EXPECT_EQ(none.kind, DeviceKind::NoDevice);
  EXPECT_FALSE(HasSubstr(none.reason, "CUDA_VISIBLE_DEVICES"));
  EXPECT_TRUE(llm::cuda::no_gpu_present(none.kind));
}

TEST(DeviceCountError, AnyOtherErrorIsADeviceFailure) {
  const DeviceStatus s = llm::cuda::status_from_device_count_error(999, 13000, 13000, nullptr);
  EXPECT_EQ(s.kind, DeviceKind::DeviceFailed);
  EXPECT_TRUE(HasSubstr(s.reason, "999"));
  EXPECT_FALSE(llm::cuda::no_gpu_present(s.kind));
}

// ---------------------------------------------------------------------------
// The phrase "no usable CUDA device" is written once, by unusable_message().

TEST(UnusableMessage, ReasonsNeverCarryThePhrase) {
  for (const DeviceStatus& s : {llm::cuda::status_from_device_count_error(35, 0, 13000, nullptr),
                                llm::cuda::status_from_device_count_error(35, 12020, 13000, nullptr),
                                llm::cuda::status_from_device_count_error(100, 13000, 13000, ""),
                                llm::cuda::status_from_device_count_error(999, 13000, 13000, nullptr),
                                llm::cuda::device_status()}) {
    EXPECT_EQ(count_occurrences(s.reason, kPhrase), 0) << s.reason;
    if (!s.usable) EXPECT_EQ(count_occurrences(llm::cuda::unusable_message(s), kPhrase), 1);
  }
}

TEST(UnusableMessage, DeviceCudaSaysThePhraseOnce) {
  const DeviceStatus status = llm::cuda::device_status();
  if (status.usable) GTEST_SKIP() << "a CUDA device is usable here: --device cuda is not an error";
  try {
    llm::select_devices("cuda");
    FAIL() << "--device cuda without a usable device must throw";
  } catch (const llm::DeviceError& e) {
    const std::string message = e.what();
    EXPECT_EQ(count_occurrences(message, kPhrase), 1) << message;
    EXPECT_TRUE(HasSubstr(message, status.reason));
  }
}

TEST(UnusableMessage, DeviceStatusKindMatchesTheBuild) {
  const DeviceStatus status = llm::cuda::device_status();
  EXPECT_EQ(status.usable, status.kind == DeviceKind::Usable);
  if (!llm::cuda::built_with_cuda()) EXPECT_EQ(status.kind, DeviceKind::BuiltWithoutCuda);
}

}  // namespace
