#pragma once
// What a result was measured on: the CPU model, and the GPU when one is used.
#include <string>
#include <string_view>

namespace llm {

struct DeviceInfo {
  std::string cpu_model;         // from /proc/cpuinfo
  int cpu_threads = 1;           // threads the CPU rows use
  bool cuda_available = false;   // a CUDA device is visible and usable
  std::string cuda_note;         // why not, when it is not ("built without CUDA", ...)
  std::string gpu_name;
  int gpu_sm_count = 0;
  int gpu_compute_capability = 0;  // 75, 80, 90, ...
  double gpu_memory_gib = 0.0;
  int gpu_sm_clock_mhz = 0;       // the SMs' top (boost) clock
  int gpu_memory_clock_mhz = 0;   // the memory's clock
  int gpu_memory_bus_bits = 0;    // bus width: 2 x clock x bits / 8 = the datasheet bandwidth
  std::string cuda_driver;       // "13.0": the CUDA version the driver supports
  std::string cuda_runtime;      // "13.0"
  std::string nvidia_driver;     // "580.159.04": the kernel driver's release (Linux), "" when unknown
};

DeviceInfo query_device_info();  // never throws: missing pieces are left empty

// The release in the first line of /proc/driver/nvidia/version: the first
// word after "Kernel Module" that starts with a digit ("580.159.04"), "" when
// there is none. Two forms exist:
//   NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  <date>
//   NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ...
std::string nvidia_driver_release(std::string_view version_line);

}  // namespace llm
