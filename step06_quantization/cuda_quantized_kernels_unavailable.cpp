// A build without CUDA: the CUDA entry points exist (so the step's code has
// no #ifdefs) but every call says that nothing can run them.
#include "llm/errors.hpp"
#include "step06_quantization/cuda_quantized_kernels.hpp"

namespace step06 {
namespace {
[[noreturn]] void no_cuda() {
  throw llm::DeviceError("step06: built without CUDA (configure with -DLLM_CUDA=ON on a machine with nvcc)");
}
}  // namespace

std::vector<float> cuda_quantized_matmul(const QuantizedMatrix&, std::span<const float>, int, CudaQuantizedKernel) {
  no_cuda();
}

std::vector<float> cuda_quantized_matmul_fp16(const QuantizedMatrix&, std::span<const float>, int, CudaQuantizedKernel) {
  no_cuda();
}

CudaMatmulTiming time_cuda_quantized_matmul(const QuantizedMatrix&, int, int, std::uint64_t) { no_cuda(); }

std::unique_ptr<llm::Model> make_cuda_quantized_model(const llm::ModelWeights&, const QuantizedLayers&,
                                                      const CudaQuantizedModelOptions&) {
  no_cuda();
}

}  // namespace step06
