#pragma once
// The KV cache hook. Attention never indexes cache memory directly: it reads
// K and V of one layer of one sequence through a KvView, which maps a position
// to a row through a block table. A contiguous cache is the special case of one
// block per sequence as long as the context; a paged cache (step 05) uses small
// blocks; a quantized cache (step 06) adds scales beside the same table.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "llm/config.hpp"

// Functions that run on the host and, compiled by nvcc, in kernels too.
#if defined(__CUDACC__)
#define LLM_HOST_DEVICE __host__ __device__
#else
#define LLM_HOST_DEVICE
#endif

namespace llm {

// K/V rows of one layer of one sequence. Plain data: usable in CUDA kernels.
struct KvView {
  float* keys = nullptr;            // block pool: [n_blocks, block_size, kv_dim]
  float* values = nullptr;          // block pool: [n_blocks, block_size, kv_dim]
  const std::int32_t* block_table = nullptr;  // [ceil(capacity / block_size)] physical block of each logical block
  int block_size = 0;               // positions per block
  int kv_dim = 0;                   // n_kv_heads * head_dim floats per row

  // Offset (in floats) of position `pos`'s row inside the pool.
  LLM_HOST_DEVICE std::size_t row_offset(int pos) const {
    const int block = block_table[pos / block_size];
    return (static_cast<std::size_t>(block) * block_size + pos % block_size) * kv_dim;
  }
  LLM_HOST_DEVICE float* key_row(int pos) const { return keys + row_offset(pos); }
  LLM_HOST_DEVICE float* value_row(int pos) const { return values + row_offset(pos); }
};

// Owns K/V memory for a fixed number of sequence slots. Tracks how many
// positions of each slot hold valid K/V ("length"). Device-specific subclasses
// (host memory here, device memory in common/cuda) implement the storage.
class KvCache {
 public:
  virtual ~KvCache() = default;

  int num_sequences() const { return static_cast<int>(lengths_.size()); }
  int capacity() const { return capacity_; }  // positions per sequence
  int length(int sequence) const { return lengths_.at(static_cast<std::size_t>(sequence)); }

  // Forget positions >= new_length of a sequence (speculative rollback, reuse
  // of a slot). Throws InputError when new_length > length.
  void truncate(int sequence, int new_length);
  void clear();  // every sequence back to length 0

  // Called by the forward before it writes rows: position p of `sequence` may
  // be written when p <= length (no gaps) and p < capacity, else throws
  // KvCacheFullError / InputError. mark_written sets length = p + 1: writing a
  // position forgets every later one (rewriting after a rollback).
  void check_writable(int sequence, int position) const;
  void mark_written(int sequence, int position);

  virtual std::size_t bytes_allocated() const = 0;  // K and V together

 protected:
  // Throws InputError unless there is at least one sequence and one position.
  KvCache(int num_sequences, int capacity);

 private:
  int capacity_;
  std::vector<int> lengths_;  // [num_sequences] valid positions per slot
};

// The layout of a contiguous cache, on either device: per layer, one block of
// `capacity` rows per sequence, so sequence s's single logical block is
// physical block s. It knows sizes and builds views; the cache owns the memory.
class ContiguousKvLayout {
 public:
  ContiguousKvLayout(const ModelConfig& config, int num_sequences, int capacity)
      : n_layers_(config.n_layers), num_sequences_(num_sequences), capacity_(capacity), kv_dim_(config.kv_dim()) {}

  // Floats in the K pool (and in the V pool): layers x sequences x capacity x kv_dim.
  std::size_t floats() const {
    return static_cast<std::size_t>(n_layers_) * num_sequences_ * capacity_ * kv_dim_;
  }
  // The block table of every sequence, side by side: {0, 1, ..., num_sequences-1}.
  std::vector<std::int32_t> block_ids() const;
  // The view of one layer of one sequence, given the pools and block_ids()
  // wherever they live (host or device memory).
  KvView view(float* keys, float* values, const std::int32_t* block_ids, int layer, int sequence) const;
  // True when the cache was shaped for `config` (layers and K/V width): a
  // cache of another model would be read and written out of bounds.
  bool fits(const ModelConfig& config) const { return config.n_layers == n_layers_ && config.kv_dim() == kv_dim_; }

 private:
  int n_layers_;
  int num_sequences_;
  int capacity_;
  int kv_dim_;
};

// Host memory, one contiguous [capacity, kv_dim] buffer per layer and sequence.
class CpuKvCache final : public KvCache {
 public:
  CpuKvCache(const ModelConfig& config, int num_sequences, int capacity);

  KvView view(int layer, int sequence) const;
  std::size_t bytes_allocated() const override;
  bool fits(const ModelConfig& config) const { return layout_.fits(config); }

 private:
  ContiguousKvLayout layout_;
  std::vector<float> keys_;    // [n_layers, num_sequences, capacity, kv_dim]
  std::vector<float> values_;  // [n_layers, num_sequences, capacity, kv_dim]
  std::vector<std::int32_t> block_ids_;  // [num_sequences]: sequence s is block s
};

}  // namespace llm
