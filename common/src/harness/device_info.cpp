#include "llm/harness/device_info.hpp"

#include <cctype>
#include <fstream>
#include <sstream>
#include <string>

#include "llm/cuda/cuda_runtime_api.hpp"

namespace llm {

std::string nvidia_driver_release(std::string_view version_line) {
  constexpr std::string_view kMarker = "Kernel Module";
  const auto module = version_line.find(kMarker);
  if (module == std::string_view::npos) return "";
  std::istringstream words{std::string(version_line.substr(module + kMarker.size()))};
  std::string word;
  while (words >> word)
    if (std::isdigit(static_cast<unsigned char>(word.front()))) return word;
  return "";
}

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
  // the CUDA version it supports. Linux writes it in this file.
  if (info.cuda_available) {
    std::ifstream version("/proc/driver/nvidia/version");
    if (std::getline(version, line)) info.nvidia_driver = nvidia_driver_release(line);
  }
  return info;
}

}  // namespace llm
