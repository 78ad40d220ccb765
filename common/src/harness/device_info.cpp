#include "llm/harness/device_info.hpp"

#include <fstream>
#include <string>

#include "llm/cuda/cuda_runtime_api.hpp"

namespace llm {

DeviceInfo query_device_info() {
  DeviceInfo info;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) info.cpu_model = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  }
  if (info.cpu_model.empty()) info.cpu_model = "unknown CPU";
  info.cpu_threads = 1;  // the CPU reference is single-threaded for stable numbers
  cuda::fill_device_info(info);
  // The NVIDIA kernel driver's release ("580.159.04"): the CUDA API only knows
  // the CUDA version it supports. Linux writes it here:
  //   NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  <date>
  if (info.cuda_available) {
    std::ifstream version("/proc/driver/nvidia/version");
    if (std::getline(version, line)) {
      const auto module = line.find("Kernel Module");
      if (module != std::string::npos) {
        const auto start = line.find_first_not_of(' ', module + 13);
        const auto end = line.find(' ', start);
        if (start != std::string::npos) info.nvidia_driver = line.substr(start, end - start);
      }
    }
  }
  return info;
}

}  // namespace llm
