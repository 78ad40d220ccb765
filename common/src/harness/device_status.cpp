// The CUDA-free half of device_status() (llm/cuda/cuda_runtime_api.hpp):
// naming why cudaGetDeviceCount failed, and CUDA versions in words. Compiled
// in every build, so the CPU tests check the wording and the kind without a
// GPU or a driver.
#include <fmt/format.h>

#include <string>

#include "llm/cuda/cuda_runtime_api.hpp"

namespace llm::cuda {
namespace {

// The cudaError_t values this file tells apart (runtime.cpp checks that they
// match cuda_runtime_api.h).
constexpr int kInsufficientDriver = 35;  // cudaErrorInsufficientDriver
constexpr int kNoDevice = 100;           // cudaErrorNoDevice

}  // namespace

std::string cuda_version_string(int version) {
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

DeviceStatus status_from_device_count_error(int cuda_error, int driver_version, int runtime_version,
                                            const char* cuda_visible_devices) {
  if (cuda_error == kInsufficientDriver) {
    // The runtime says 35 both when there is no driver at all (it cannot load
    // libcuda) and when the driver is older than the runtime; the driver's
    // version tells which: 0 means none is installed.
    if (driver_version <= 0) return {false, DeviceKind::NoDriver, "no NVIDIA driver found"};
    return {false, DeviceKind::DriverTooOld,
            fmt::format("the NVIDIA driver supports CUDA up to {}, older than this build's CUDA runtime {}; "
                        "update the driver (or build with a CUDA toolkit no newer than {})",
                        cuda_version_string(driver_version), cuda_version_string(runtime_version),
                        cuda_version_string(driver_version))};
  }
  if (cuda_error == kNoDevice) {
    if (cuda_visible_devices != nullptr)
      return {false, DeviceKind::NoDevice,
              fmt::format("no CUDA device visible (CUDA_VISIBLE_DEVICES=\"{}\" hides every device)",
                          cuda_visible_devices)};
    return {false, DeviceKind::NoDevice, "no CUDA device found (the NVIDIA driver sees none)"};
  }
  return {false, DeviceKind::DeviceFailed, fmt::format("cudaGetDeviceCount failed with error {}", cuda_error)};
}

}  // namespace llm::cuda
