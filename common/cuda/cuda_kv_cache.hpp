#pragma once
// CudaKvCache: the KV cache in GPU memory, laid out exactly like CpuKvCache
// (common/src/model/kv_cache.cpp) so the same KvView arithmetic addresses it:
//   keys, values  [n_layers, num_sequences, capacity, kv_dim]
//   block table   {0, 1, ..., num_sequences-1}: sequence s is one block of
//                 `capacity` rows, physical block s of its layer's pool.
// Length bookkeeping (how many positions of each slot are valid) lives on the
// host, in the KvCache base class, as on the CPU.
#include <cstddef>
#include <cstdint>
#include <string>

#include "llm/config.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/kv_cache.hpp"

namespace llm::cuda {

class CudaKvCache final : public KvCache {
 public:
  // Allocates (and zeroes) the device memory; throws InputError for an empty
  // cache and DeviceError when the GPU has no room.
  CudaKvCache(const ModelConfig& config, int num_sequences, int capacity);

  int capacity() const { return layout_.capacity(); }  // positions per sequence
  std::string device_name() const override { return "cuda"; }
  bool fits(const ModelConfig& config) const override { return layout_.fits(config); }
  // K/V of one layer of one sequence. Every pointer in the view (keys, values
  // and block_table) is DEVICE memory: pass the view to a kernel (by value or
  // copied into device memory), never call key_row() on the host.
  KvView view(int layer, int sequence) const override;
  void reserve(int sequence, int /*begin*/, int end) override { layout_.check_room(sequence, end); }
  void adopt_prefix(int sequence, int source, int n_positions) override;  // device-to-device copies
  std::size_t bytes_allocated() const override;
  std::size_t bytes_in_use() const override { return layout_.bytes_of(static_cast<std::size_t>(total_length())); }

 private:
  ContiguousKvLayout layout_;  // the same layout as CpuKvCache, in device memory
  DeviceBuffer<float> keys_;              // [n_layers, num_sequences, capacity, kv_dim]
  DeviceBuffer<float> values_;            // [n_layers, num_sequences, capacity, kv_dim]
  DeviceBuffer<std::int32_t> block_ids_;  // [num_sequences]: sequence s is block s
};

}  // namespace llm::cuda
