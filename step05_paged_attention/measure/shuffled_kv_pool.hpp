#pragma once
// The data the kernel-overhead measurement and the tests run on: the same
// K/V rows in two layouts, on the host.
//   contiguous  one block per sequence (llm::CpuKvCache: the cache every
//               step so far used)
//   paged       a pool of small blocks, the blocks of all sequences handed
//               out in a shuffled order, as in a paged cache that has served
//               many requests: a sequence's logical block j+1 is almost never
//               the physical block after its block j, so a kernel that
//               ignores the block table reads wrong rows (and fails), and the
//               paged kernel gets no help from the prefetcher that a
//               contiguous layout would not also get.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "llm/attention.hpp"
#include "llm/config.hpp"
#include "llm/kv_cache.hpp"

namespace step05 {

// A one-layer model config with these attention dims and `capacity`
// positions: enough for llm::CpuKvCache (and the CUDA cache) to size a cache.
llm::ModelConfig one_layer_config(const llm::AttentionShape& shape, int capacity);

// Block tables of n_seqs sequences of blocks_per_sequence logical blocks
// each, over one pool of n_seqs * blocks_per_sequence physical blocks handed
// out in a random order (reproducible from `seed`).
// Returns [n_seqs, blocks_per_sequence]: the physical block of each logical block.
std::vector<std::int32_t> shuffled_block_tables(int n_seqs, int blocks_per_sequence, std::uint64_t seed);

class ShuffledKvPool {
 public:
  // Copies positions 0..capacity-1 of every source view (host memory, fp32,
  // any layout) into a pool of blocks of `block_size` rows, sequence s's
  // logical block j going to physical block tables()[s * blocks_per_sequence() + j]
  // (shuffled_block_tables(sources.size(), ceil(capacity / block_size), seed)).
  // Rows of a last, partial block past `capacity` are zeros. Throws
  // llm::InputError for an int8 source, block_size < 1 or capacity < 1.
  ShuffledKvPool(std::span<const llm::KvView> sources, int capacity, int block_size, std::uint64_t seed);

  int block_size() const { return block_size_; }
  int blocks_per_sequence() const { return blocks_per_sequence_; }
  int n_sequences() const { return n_sequences_; }
  // [n_seqs, blocks_per_sequence] physical block of each logical block.
  std::span<const std::int32_t> tables() const { return tables_; }
  // The view of one sequence (host memory; its pools are the whole pool, its
  // table that sequence's row of tables()).
  llm::KvView view(int sequence) const;
  std::vector<llm::KvView> views() const;  // [n_seqs]
  // Rows in the pool: n_seqs * blocks_per_sequence * block_size.
  std::size_t rows() const { return keys_.size() / static_cast<std::size_t>(kv_dim_); }

 private:
  int n_sequences_;
  int block_size_;
  int blocks_per_sequence_;
  int kv_dim_;
  int head_dim_;  // copied from the sources (KvView::head_dim)
  std::vector<float> keys_;             // [n_seqs * blocks_per_sequence * block_size, kv_dim]
  std::vector<float> values_;           // [n_seqs * blocks_per_sequence * block_size, kv_dim]
  std::vector<std::int32_t> tables_;    // [n_seqs, blocks_per_sequence]
};

}  // namespace step05
