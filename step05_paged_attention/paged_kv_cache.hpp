#pragma once
// PagedKvCache: the KV cache hook (llm/kv_cache.hpp) with K/V in fixed-size
// blocks handed out on demand by a BlockManager. The models reach it through
// KvCache only, so the unchanged CPU and CUDA models generate through it.
//
// Memory, per pool (K and V; for int8 also their scales):
//   [n_layers, n_blocks * block_size, kv_dim]
// Physical block b of layer l is rows b*B .. b*B+B-1 of layer l's slice, and a
// sequence's block table (one for all layers) says which b holds its logical
// block j. A view of (layer, sequence) is that layer's slice plus the
// sequence's table: exactly what KvView::row_index reads.
//
// What a paged cache adds to the hook, for the callers that know tokens:
//   share_cached_prefix(seq, prompt)  a new request takes the cached blocks of
//                                     its prompt's longest cached prefix
//   publish(seq, tokens)              after a forward: its full blocks become
//                                     reusable by later requests
//   fork(parent, child)               the child shares every block; the next
//                                     write into a shared block copies it
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "llm/config.hpp"
#include "llm/kv_cache.hpp"
#include "step05_paged_attention/block_manager.hpp"

namespace step05 {

struct PagedKvCacheOptions {
  int num_sequences = 1;  // sequence slots
  int n_blocks = 0;       // physical blocks in the pool (each holds block_size positions of every layer)
  int block_size = 16;    // positions per block
  llm::KvElement element = llm::KvElement::Float32;
};

// Physical blocks that hold `positions` positions for each of `num_sequences`
// sequences at once (what a contiguous cache of that capacity reserves).
int blocks_for_sequences(int num_sequences, int positions, int block_size);

class PagedKvCache : public llm::KvCache {
 public:
  // --- The KvCache hook --------------------------------------------------
  bool fits(const llm::ModelConfig& config) const override;
  llm::KvElement element() const override { return element_; }
  llm::KvView view(int layer, int sequence) const override;
  // Blocks for 0..end-1 (KvCacheFullError with the numbers when the pool is
  // short, the pool unchanged), then the copies of shared blocks that
  // begin..end-1 will write (copy-on-write).
  void reserve(int sequence, int begin, int end) override;
  void truncate(int sequence, int new_length) override;  // releases the blocks past new_length
  // Shares the source's blocks (no K/V copied); the partly filled last
  // block is copied on the first write into it.
  void adopt_prefix(int sequence, int source, int n_positions) override;
  std::size_t bytes_allocated() const override;  // the whole pool
  // Rows that hold a valid position of some sequence, each physical row
  // counted once however many sequences share it.
  std::size_t bytes_in_use() const override;

  // --- What paging adds ----------------------------------------------------
  // `sequence` (empty) takes the cached blocks of the longest cached prefix
  // of `prompt`, leaving at least its last token to compute (its logits are
  // the next token's distribution). Returns the positions now cached: the
  // prefill starts there. 0 on a miss.
  int share_cached_prefix(int sequence, std::span<const int> prompt);
  // `tokens` are the tokens of positions 0..length(sequence)-1 (at least):
  // enters the sequence's full blocks into the prefix cache.
  void publish(int sequence, std::span<const int> tokens);
  // `child` (empty) shares everything `parent` holds.
  void fork(int parent, int child) { adopt_prefix(child, parent, length(parent)); }

  const BlockManager& blocks() const { return blocks_; }
  int block_size() const { return blocks_.block_size(); }
  // K and V (and scales) of one block in every layer.
  std::size_t bytes_per_block() const;

 protected:
  PagedKvCache(const llm::ModelConfig& config, const PagedKvCacheOptions& options);

  // Base pointers of the device's pools (null for the element type not
  // stored) and of its block tables ([num_sequences, max_blocks_per_sequence],
  // BlockManager::all_tables() in the device's memory).
  struct Pools {
    float* keys = nullptr;
    float* values = nullptr;
    std::int8_t* keys_int8 = nullptr;
    std::int8_t* values_int8 = nullptr;
    float* key_scales = nullptr;
    float* value_scales = nullptr;
    const std::int32_t* tables = nullptr;
  };
  virtual Pools pools() const = 0;
  // Copies `bytes` within the device's memory (dst and src never overlap):
  // copy_block's one device-specific step.
  virtual void copy_bytes(void* dst, const void* src, std::size_t bytes) = 0;

  // Pool sizes, for the device classes.
  std::size_t values_per_pool() const;  // n_layers * n_blocks * block_size * kv_dim
  std::size_t scales_per_pool() const;  // n_layers * n_blocks * block_size * n_kv_heads
  std::size_t rows_per_layer() const;   // n_blocks * block_size
  int n_layers() const { return n_layers_; }
  int kv_dim() const { return kv_dim_; }
  int kv_heads() const { return kv_dim_ / head_dim_; }

 private:
  // Copy-on-write of one block: every layer's rows (and scales) of physical
  // block `from` over block `to`, in every pool the element type uses.
  void copy_block(int from, int to);

  int n_layers_;
  int kv_dim_;
  int head_dim_;
  llm::KvElement element_;
  BlockManager blocks_;  // the tables, reference counts and prefix cache (host memory)
};

// A paged cache on `device` ("cpu" or "cuda") for a model of `config`. Throws
// InputError for bad options (no blocks, block_size < 1), DeviceError when
// the device is not available (CUDA not built, no GPU, out of memory).
std::unique_ptr<PagedKvCache> make_paged_kv_cache(const std::string& device, const llm::ModelConfig& config,
                                                  const PagedKvCacheOptions& options);

// The CUDA one (cuda_paged_kv_cache.cpp; in a build without CUDA, a
// DeviceError saying so).
std::unique_ptr<PagedKvCache> make_cuda_paged_kv_cache(const llm::ModelConfig& config,
                                                       const PagedKvCacheOptions& options);

}  // namespace step05
