// The CUDA build's answers to llm/cuda/cuda_runtime_api.hpp: is there a GPU
// we can use, and what is it. (make_cuda_model is in cuda_model.cpp.)
// Without CUDA, common/src/harness/cuda_unavailable.cpp answers instead.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdlib>
#include <exception>
#include <string>

#include "kernels.cuh"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/cuda/cuda_timer.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/errors.hpp"

namespace llm::cuda {
namespace {

std::string describe_error(cudaError_t error) {
  return fmt::format("error {} ({}: {})", static_cast<int>(error), cudaGetErrorName(error), cudaGetErrorString(error));
}

static_assert(cudaErrorInsufficientDriver == 35 && cudaErrorNoDevice == 100,
              "status_from_device_count_error (device_status.cpp) names these two errors by value");

// A CUDA version as CUDA encodes it (13000 for 13.0), read with `query`:
// cudaRuntimeGetVersion (this build's runtime) or cudaDriverGetVersion (the
// installed driver's; 0 when there is no driver, as the runtime could not
// load libcuda). 0 if it cannot be read.
int read_cuda_version(cudaError_t (*query)(int*)) {
  int version = 0;
  if (query(&version) != cudaSuccess) version = 0;
  static_cast<void>(cudaGetLastError());
  return version;
}

DeviceStatus failed(DeviceKind kind, std::string reason) { return {false, kind, std::move(reason)}; }

DeviceStatus query_status() {
  int count = 0;
  const cudaError_t count_error = cudaGetDeviceCount(&count);
  if (count_error != cudaSuccess) {
    // Never a crash. Without a driver it is 35 (cudaErrorInsufficientDriver,
    // "CUDA driver version is insufficient for CUDA runtime version") and the
    // driver's version is 0: "no NVIDIA driver found"; 35 with a driver is a
    // driver older than the runtime; with CUDA_VISIBLE_DEVICES="" it is 100
    // (cudaErrorNoDevice).
    static_cast<void>(cudaGetLastError());  // clear it so later calls start clean
    DeviceStatus status = status_from_device_count_error(
        static_cast<int>(count_error), read_cuda_version(cudaDriverGetVersion),
        read_cuda_version(cudaRuntimeGetVersion), std::getenv("CUDA_VISIBLE_DEVICES"));
    // Any other error: its CUDA name and text, which the CUDA-free half
    // (device_status.cpp) has only as a number.
    if (status.kind == DeviceKind::DeviceFailed)
      status.reason = "cudaGetDeviceCount failed with " + describe_error(count_error);
    return status;
  }
  if (count == 0) return failed(DeviceKind::NoDevice, "no CUDA device visible (cudaGetDeviceCount returned 0)");

  // A GPU is there; can this binary run kernels on it? A card older than the
  // architectures the build compiled for (CMAKE_CUDA_ARCHITECTURES) has no
  // kernel image, and every launch would fail. Asking for one kernel's
  // attributes finds out up front (and creates the context, so a broken
  // driver or an exclusive-process GPU in use shows up here too).
  int device = 0;
  cudaDeviceProp props{};
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return failed(DeviceKind::DeviceFailed, "cudaGetDevice failed with " + describe_error(e));
  }
  if (const cudaError_t e = cudaGetDeviceProperties(&props, device); e != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    return failed(DeviceKind::DeviceFailed, "cudaGetDeviceProperties failed with " + describe_error(e));
  }
  if (const cudaError_t e = kernels::probe_kernel_image(); e != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction)
      return failed(DeviceKind::NoKernelImage,
                    fmt::format("CUDA device {} ({}, compute capability {}.{}) cannot run this build's kernels: {}. "
                                "Rebuild with -DCMAKE_CUDA_ARCHITECTURES={}{} (or native)",
                                device, props.name, props.major, props.minor, describe_error(e), props.major,
                                props.minor));
    return failed(DeviceKind::DeviceFailed, fmt::format("CUDA device {} ({}, compute capability {}.{}) failed when "
                                                        "this build's kernels were loaded (context creation): {}",
                                                        device, props.name, props.major, props.minor,
                                                        describe_error(e)));
  }
  return {true, DeviceKind::Usable, ""};
}

}  // namespace

bool built_with_cuda() { return true; }

DeviceStatus device_status() {
  try {
    return query_status();
  } catch (const std::exception& e) {  // fmt or an allocation: still never throw
    return failed(DeviceKind::DeviceFailed, std::string("could not query the CUDA device: ") + e.what());
  }
}

void fill_device_info(DeviceInfo& info) {
  try {
    const DeviceStatus status = device_status();
    info.cuda_available = status.usable;
    info.cuda_note = status.reason;
    // Versions are useful even without a device ("driver 0.0": no driver).
    if (const int runtime = read_cuda_version(cudaRuntimeGetVersion); runtime > 0)
      info.cuda_runtime = cuda_version_string(runtime);
    if (const int driver = read_cuda_version(cudaDriverGetVersion); driver > 0)
      info.cuda_driver = cuda_version_string(driver);
    if (!status.usable) return;

    int device = 0;
    cudaDeviceProp props{};
    if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&props, device) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return;  // never throws: the pieces we could not read stay empty
    }
    info.gpu_name = props.name;
    info.gpu_sm_count = props.multiProcessorCount;
    info.gpu_compute_capability = props.major * 10 + props.minor;
    info.gpu_memory_gib = static_cast<double>(props.totalGlobalMem) / static_cast<double>(1ull << 30);
    // kHz in the attributes (cudaDeviceProp lost its clock fields in CUDA 13).
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) == cudaSuccess) info.gpu_sm_clock_mhz = khz / 1000;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess)
      info.gpu_memory_clock_mhz = khz / 1000;
    if (cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess)
      info.gpu_memory_bus_bits = bits;
    static_cast<void>(cudaGetLastError());
  } catch (const std::exception& e) {
    info.cuda_available = false;
    info.cuda_note = std::string("could not query the CUDA device: ") + e.what();
  }
}

int sm_count() {
  static const int count = [] {
    int device = 0, sms = 0;
    LLM_CUDA_CHECK(cudaGetDevice(&device));
    LLM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
  }();
  return count;
}

int compute_capability() {
  static const int capability = [] {
    int device = 0, major = 0, minor = 0;
    LLM_CUDA_CHECK(cudaGetDevice(&device));
    LLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    LLM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major * 10 + minor;
  }();
  return capability;
}

double measure_copy_bandwidth_gbps(std::size_t bytes) {
  const DeviceStatus status = device_status();
  if (!status.usable) throw DeviceError("cannot measure the copy bandwidth: " + unusable_message(status));
  // Two buffers of `bytes`, filled so the copy moves real data (never time
  // untouched memory).
  DeviceBuffer<unsigned char> source(bytes), destination(bytes);
  LLM_CUDA_CHECK(cudaMemset(source.data(), 0x5A, bytes));
  const TimingStats stats = time_cuda(
      [&] { LLM_CUDA_CHECK(cudaMemcpyAsync(destination.data(), source.data(), bytes, cudaMemcpyDeviceToDevice)); },
      /*warmup=*/3, /*runs=*/10, /*flush_l2=*/false);  // 1 GiB is 20x an H100's L2: nothing to flush
  return 2.0 * static_cast<double>(bytes) / (stats.median_ms * 1e-3) / 1e9;
}

}  // namespace llm::cuda
