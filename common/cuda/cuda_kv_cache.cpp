#include "cuda_kv_cache.hpp"

#include <fmt/format.h>

#include <numeric>
#include <vector>

#include "llm/errors.hpp"

namespace llm::cuda {

CudaKvCache::CudaKvCache(const ModelConfig& config, int num_sequences, int capacity)
    : KvCache(num_sequences, capacity), n_layers_(config.n_layers), kv_dim_(config.kv_dim()) {
  if (num_sequences <= 0 || capacity <= 0)
    throw InputError(fmt::format("a KV cache needs at least one sequence and one position (got {} x {})",
                                 num_sequences, capacity));
  const std::size_t floats = static_cast<std::size_t>(n_layers_) * num_sequences * capacity * kv_dim_;
  keys_.ensure(floats);
  values_.ensure(floats);
  // Zeroed like the CPU cache, so a bug that reads an unwritten row reads
  // zeros on both devices instead of garbage on one.
  keys_.zero();
  values_.zero();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_sequences));
  std::iota(ids.begin(), ids.end(), 0);
  block_ids_.ensure(ids.size());
  block_ids_.upload(ids);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets are done before anyone uses the cache
}

KvView CudaKvCache::view(int layer, int sequence) const {
  // As CpuKvCache::view: layer l's pool holds one block per sequence, each
  // `capacity` rows long, so sequence s's single logical block is physical
  // block s, and its block table is the one entry block_ids_[s].
  const std::size_t layer_offset = static_cast<std::size_t>(layer) * num_sequences() * capacity() * kv_dim_;
  KvView v;
  v.keys = const_cast<float*>(keys_.data()) + layer_offset;
  v.values = const_cast<float*>(values_.data()) + layer_offset;
  v.block_table = block_ids_.data() + sequence;
  v.block_size = capacity();
  v.kv_dim = kv_dim_;
  return v;
}

std::size_t CudaKvCache::bytes_allocated() const { return keys_.bytes() + values_.bytes(); }

}  // namespace llm::cuda
