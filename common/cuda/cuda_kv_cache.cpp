#include "cuda_kv_cache.hpp"

#include <vector>

#include "llm/cuda/cuda_check.hpp"

namespace llm::cuda {

CudaKvCache::CudaKvCache(const ModelConfig& config, int num_sequences, int capacity)
    : KvCache(num_sequences, capacity), layout_(config, num_sequences, capacity) {
  keys_.ensure(layout_.floats());
  values_.ensure(layout_.floats());
  // Zeroed like the CPU cache, so a bug that reads an unwritten row reads
  // zeros on both devices instead of garbage on one.
  keys_.zero();
  values_.zero();
  const std::vector<std::int32_t> ids = layout_.block_ids();
  block_ids_.ensure(ids.size());
  block_ids_.upload(ids);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets are done before anyone uses the cache
}

KvView CudaKvCache::view(int layer, int sequence) const {
  // Every pointer is device memory (see the header).
  return layout_.view(const_cast<float*>(keys_.data()), const_cast<float*>(values_.data()), block_ids_.data(), layer,
                      sequence);
}

std::size_t CudaKvCache::bytes_allocated() const { return keys_.bytes() + values_.bytes(); }

}  // namespace llm::cuda
