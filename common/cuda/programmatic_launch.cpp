// The host half of programmatic_launch.cuh: the OverlapLaunches scope and
// the question whether a launch may overlap the kernel before it.
#include <cuda_runtime.h>

#include <map>
#include <utility>

#include "programmatic_launch.cuh"

namespace llm::cuda {
namespace {

// From sm_90 on: griddepcontrol and the launch attribute are Hopper's.
constexpr int kFirstOverlappingArchitecture = 90;

// The innermost open OverlapLaunches scope of this thread (none: nothing
// overlaps).
thread_local OverlapLaunches::State open_scope;

// (device, kernel) -> was the kernel's code for that device compiled for
// sm_90 or later. Per thread, so a launch reads it without a lock; eager
// forwards launch hundreds of kernels a token, and a graph's capture runs
// after an eager forward of the same shape, so no query happens mid-capture.
bool kernel_code_overlaps(int device, const void* kernel) {
  thread_local std::map<std::pair<int, const void*>, bool> answers;
  const auto key = std::make_pair(device, kernel);
  if (const auto found = answers.find(key); found != answers.end()) return found->second;
  cudaFuncAttributes attributes{};
  LLM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  return answers.emplace(key, attributes.ptxVersion >= kFirstOverlappingArchitecture).first->second;
}

}  // namespace

OverlapLaunches::OverlapLaunches(bool enabled) : enclosing_(open_scope) {
  State state;
  if (enabled) {
    int major = 0, minor = 0;
    LLM_CUDA_CHECK(cudaGetDevice(&state.device));
    LLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, state.device));
    LLM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, state.device));
    state.gpu_overlaps = 10 * major + minor >= kFirstOverlappingArchitecture;
  }
  open_scope = state;
}

OverlapLaunches::~OverlapLaunches() { open_scope = enclosing_; }

bool launch_overlaps(const void* kernel) {
  return open_scope.gpu_overlaps && kernel_code_overlaps(open_scope.device, kernel);
}

}  // namespace llm::cuda
