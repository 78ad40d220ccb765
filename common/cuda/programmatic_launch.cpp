// The host half of programmatic_launch.cuh: the OverlapLaunches scope and
// the question whether a launch may overlap the kernel before it.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "programmatic_launch.cuh"

namespace llm::cuda {
namespace {

// The innermost open OverlapLaunches scope of this thread (false: none).
thread_local bool overlap_scope_open = false;

// From sm_90 on: griddepcontrol and the launch attribute are Hopper's.
constexpr int kFirstOverlappingArchitecture = 90;

// (device, kernel) -> may it overlap, asked of the runtime once: eager
// forwards launch hundreds of kernels a token, and a graph's capture runs
// after an eager forward of the same shape, so no query happens mid-capture.
bool query_overlaps(int device, const void* kernel) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, bool> answers;
  const std::lock_guard lock(mutex);
  const auto key = std::make_pair(device, kernel);
  if (const auto found = answers.find(key); found != answers.end()) return found->second;
  int major = 0, minor = 0;
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  cudaFuncAttributes attributes{};
  LLM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const bool overlaps = 10 * major + minor >= kFirstOverlappingArchitecture &&
                        attributes.ptxVersion >= kFirstOverlappingArchitecture;
  answers.emplace(key, overlaps);
  return overlaps;
}

}  // namespace

OverlapLaunches::OverlapLaunches(bool enabled) : enclosing_(overlap_scope_open) { overlap_scope_open = enabled; }

OverlapLaunches::~OverlapLaunches() { overlap_scope_open = enclosing_; }

bool launch_overlaps(const void* kernel) {
  if (!overlap_scope_open) return false;
  int device = 0;
  LLM_CUDA_CHECK(cudaGetDevice(&device));
  return query_overlaps(device, kernel);
}

}  // namespace llm::cuda
