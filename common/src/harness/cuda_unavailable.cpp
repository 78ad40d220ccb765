// Compiled only when the course is built without CUDA: every CUDA entry point
// reports that, so CPU-only builds link and run unchanged.
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"

namespace llm::cuda {

bool built_with_cuda() { return false; }

DeviceStatus device_status() { return {false, DeviceKind::BuiltWithoutCuda, "built without CUDA"}; }

void fill_device_info(DeviceInfo& info) {
  info.cuda_available = false;
  info.cuda_note = "built without CUDA";
}

int sm_count() { throw DeviceError("this build has no CUDA support (configure with a CUDA toolkit installed)"); }

int compute_capability() {
  throw DeviceError("this build has no CUDA support (configure with a CUDA toolkit installed)");
}

double measure_copy_bandwidth_gbps(std::size_t) {
  throw DeviceError("this build has no CUDA support (configure with a CUDA toolkit installed)");
}

std::unique_ptr<Model> make_cuda_model(const ModelWeights&, const CudaRunOptions&) {
  throw DeviceError("this build has no CUDA support (configure with a CUDA toolkit installed)");
}

}  // namespace llm::cuda
