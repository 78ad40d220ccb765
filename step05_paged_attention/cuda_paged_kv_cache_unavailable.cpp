// A build without CUDA: the CUDA paged cache cannot exist.
#include "llm/errors.hpp"
#include "step05_paged_attention/paged_kv_cache.hpp"

namespace step05 {

std::unique_ptr<PagedKvCache> make_cuda_paged_kv_cache(const llm::ModelConfig&, const PagedKvCacheOptions&) {
  throw llm::DeviceError("step05: built without CUDA (configure with -DLLM_CUDA=ON on a machine with nvcc)");
}

}  // namespace step05
