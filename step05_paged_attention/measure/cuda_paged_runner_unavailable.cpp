// A build without CUDA: the CUDA entry points exist (so the step's code has
// no #ifdefs) but every call says that nothing can run them.
#include "llm/errors.hpp"
#include "step05_paged_attention/measure/cuda_paged_runner.hpp"

namespace step05 {
namespace {
[[noreturn]] void no_cuda() {
  throw llm::DeviceError("step05: built without CUDA (configure with -DLLM_CUDA=ON on a machine with nvcc)");
}
}  // namespace

std::unique_ptr<llm::Model> make_cuda_paged_model(const llm::ModelWeights&) { no_cuda(); }

struct CudaKvLayouts::Impl {};

CudaKvLayouts::CudaKvLayouts(const llm::AttentionShape&, int, int) { no_cuda(); }
CudaKvLayouts::~CudaKvLayouts() = default;
void CudaKvLayouts::upload_sequence(int, std::span<const float>, std::span<const float>) { no_cuda(); }
void CudaKvLayouts::add_paged_layout(int, std::span<const std::int32_t>) { no_cuda(); }
std::vector<float> CudaKvLayouts::decode(CudaDecodeKernel, int, std::span<const float>, std::span<const int>,
                                         std::span<const int>) {
  no_cuda();
}
llm::TimingStats CudaKvLayouts::time_decode(CudaDecodeKernel, int, std::span<const float>, std::span<const int>, int,
                                            int) {
  no_cuda();
}
std::vector<float> CudaKvLayouts::prefill(int, int, std::span<const float>, int, int) { no_cuda(); }

}  // namespace step05
