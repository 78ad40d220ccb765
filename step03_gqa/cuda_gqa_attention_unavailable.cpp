// Compiled only when the course is built without CUDA: the CUDA variants and
// CudaDecodeProblem report that, so the CPU-only build links and runs
// unchanged (main.cpp and the tests ask llm::cuda::device_status() first).
#include "llm/errors.hpp"
#include "step03_gqa/cuda_gqa_attention.hpp"

namespace step03 {
namespace {
[[noreturn]] void no_cuda() {
  throw llm::DeviceError("this build has no CUDA support (configure with a CUDA toolkit installed)");
}
}  // namespace

void repeat_kv_decode_attention_cuda(const llm::AttentionShape&, const float*, const llm::KvView&, int, float*,
                                     const CudaDecodeWorkspace&) {
  no_cuda();
}
void group_aware_decode_attention_cuda(const llm::AttentionShape&, const float*, const llm::KvView&, int, float*,
                                       const CudaDecodeWorkspace&) {
  no_cuda();
}

struct CudaDecodeProblem::DeviceState {};

CudaDecodeProblem::CudaDecodeProblem(const llm::AttentionShape&, const llm::KvView&, int, std::span<const float>) {
  no_cuda();
}
CudaDecodeProblem::~CudaDecodeProblem() = default;
std::vector<float> CudaDecodeProblem::run(CudaDecodeAttentionFn, int) { no_cuda(); }
llm::TimingStats CudaDecodeProblem::time(CudaDecodeAttentionFn, int, int, int) { no_cuda(); }

}  // namespace step03
