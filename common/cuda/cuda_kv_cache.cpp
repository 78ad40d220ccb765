#include "cuda_kv_cache.hpp"

#include <vector>

#include "llm/cuda/cuda_check.hpp"

namespace llm::cuda {

CudaKvCache::CudaKvCache(const ModelConfig& config, int num_sequences, int capacity)
    : KvCache(num_sequences), layout_(config, num_sequences, capacity) {
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

void CudaKvCache::adopt_prefix(int sequence, int source, int n_positions) {
  check_adopt_prefix(*this, sequence, source, n_positions);
  reserve(sequence, 0, n_positions);
  // One contiguous device-to-device copy per layer and pool (the prefix rows
  // are adjacent); cudaMemcpy waits for it, so the rows are there on return.
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(n_positions) * layout_.kv_dim();
  for (int layer = 0; layer < layout_.n_layers(); ++layer) {
    const std::size_t from = layout_.sequence_offset(layer, source), to = layout_.sequence_offset(layer, sequence);
    LLM_CUDA_CHECK(cudaMemcpy(keys_.data() + to, keys_.data() + from, bytes, cudaMemcpyDeviceToDevice));
    LLM_CUDA_CHECK(cudaMemcpy(values_.data() + to, values_.data() + from, bytes, cudaMemcpyDeviceToDevice));
  }
  set_length(sequence, n_positions);
}

std::size_t CudaKvCache::bytes_allocated() const { return keys_.bytes() + values_.bytes(); }

}  // namespace llm::cuda
