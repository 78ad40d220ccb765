// A build without CUDA: the CUDA variants exist in the table (so --list shows
// them) but nothing can run them.
#include "step02_flash_attention/measure/cuda_runner.hpp"

#include "llm/errors.hpp"

namespace step02 {

struct CudaProblem::Impl {};

CudaProblem::CudaProblem(const AttentionProblem&, std::span<const float>, std::span<const float>,
                         std::span<const float>) {
  throw llm::DeviceError("step02: built without CUDA (configure with -DLLM_CUDA=ON on a machine with nvcc)");
}
CudaProblem::~CudaProblem() = default;
std::string CudaProblem::skip_reason(const AttentionVariant&) const { return "built without CUDA"; }
std::vector<float> CudaProblem::run_once(const AttentionVariant&) {
  throw llm::DeviceError("step02: built without CUDA");
}
llm::TimingStats CudaProblem::time(const AttentionVariant&, int, int) {
  throw llm::DeviceError("step02: built without CUDA");
}
std::unique_ptr<llm::Model> make_cuda_model(const llm::ModelWeights&, CudaModelPrefill) {
  throw llm::DeviceError("step02: built without CUDA");
}

}  // namespace step02
