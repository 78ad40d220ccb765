#pragma once
// What the CPU side of the course knows about CUDA. Every function here exists
// in every build: without CUDA they report "built without CUDA", so step code
// has no #ifdefs.
#include <cstddef>
#include <memory>
#include <string>

#include "llm/harness/device_info.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"

namespace llm::cuda {

bool built_with_cuda();

struct DeviceStatus {
  bool usable = false;
  std::string reason;  // why not: "built without CUDA", "no CUDA device (driver ...)", ...
};
// Never throws. Any error from cudaGetDeviceCount (on a machine with the
// toolkit but no driver it is 35, "driver version is insufficient") means
// "no device", not a crash.
DeviceStatus device_status();

// Fills the gpu_* and cuda_* fields of `info` when a device is usable.
void fill_device_info(DeviceInfo& info);

// Streaming multiprocessors of the current GPU (read once): what a kernel
// that splits its work to fill the GPU (split-KV decode) sizes its grid by.
// Throws DeviceError when no device is usable.
int sm_count();

// The GPU's practical memory bandwidth ceiling, measured: a device-to-device
// copy of `bytes` (1 GiB by default, far beyond any L2), median of 10 timed
// copies after 3 warm-ups, counting bytes read plus bytes written (GB/s,
// 1e9). Memory-bound kernels are judged as a fraction of this number rather
// than of the datasheet's, which no kernel reaches. Throws DeviceError when
// no device is usable.
double measure_copy_bandwidth_gbps(std::size_t bytes = std::size_t{1} << 30);

// The fp32 baseline transformer on the GPU: own kernels for embedding,
// RMSNorm, RoPE, softmax/attention and SwiGLU, cuBLAS for the products.
// Throws DeviceError when CUDA is not built or no device is usable.
std::unique_ptr<Model> make_cuda_model(const ModelWeights& weights);

}  // namespace llm::cuda
