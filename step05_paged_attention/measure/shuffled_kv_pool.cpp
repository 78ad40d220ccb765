#include "step05_paged_attention/measure/shuffled_kv_pool.hpp"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "llm/errors.hpp"

namespace step05 {

llm::ModelConfig one_layer_config(const llm::AttentionShape& shape, int capacity) {
  llm::ModelConfig c;
  c.dim = shape.n_heads * shape.head_dim;  // so that head_dim() = dim / n_heads
  c.hidden_dim = 1;
  c.n_layers = 1;
  c.n_heads = shape.n_heads;
  c.n_kv_heads = shape.n_kv_heads;
  c.vocab_size = 1;
  c.seq_len = capacity;
  return c;
}

std::vector<std::int32_t> shuffled_block_tables(int n_seqs, int blocks_per_sequence, std::uint64_t seed) {
  if (n_seqs < 1 || blocks_per_sequence < 1)
    throw llm::InputError("shuffled_block_tables: needs at least one sequence of one block (got " +
                          std::to_string(n_seqs) + " x " + std::to_string(blocks_per_sequence) + ")");
  std::vector<std::int32_t> tables(static_cast<std::size_t>(n_seqs) * blocks_per_sequence);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), std::mt19937_64(seed));
  return tables;
}

ShuffledKvPool::ShuffledKvPool(std::span<const llm::KvView> sources, int capacity, int block_size,
                               std::uint64_t seed)
    : n_sequences_(static_cast<int>(sources.size())), block_size_(block_size) {
  if (sources.empty() || capacity < 1 || block_size < 1)
    throw llm::InputError("ShuffledKvPool: needs sources, capacity >= 1 and block_size >= 1 (got " +
                          std::to_string(sources.size()) + " sources, capacity " + std::to_string(capacity) +
                          ", block_size " + std::to_string(block_size) + ")");
  kv_dim_ = sources.front().kv_dim;
  head_dim_ = sources.front().head_dim;
  for (const llm::KvView& source : sources)
    if (source.element != llm::KvElement::Float32 || source.kv_dim != kv_dim_)
      throw llm::InputError("ShuffledKvPool: every source must be an fp32 view of the same kv_dim");
  blocks_per_sequence_ = (capacity + block_size - 1) / block_size;
  tables_ = shuffled_block_tables(n_sequences_, blocks_per_sequence_, seed);
  const std::size_t row_floats = static_cast<std::size_t>(kv_dim_);
  keys_.assign(tables_.size() * block_size * row_floats, 0.0f);
  values_.assign(keys_.size(), 0.0f);
  for (int s = 0; s < n_sequences_; ++s) {
    const llm::KvView& source = sources[static_cast<std::size_t>(s)];
    const std::int32_t* table = tables_.data() + static_cast<std::size_t>(s) * blocks_per_sequence_;
    for (int pos = 0; pos < capacity; ++pos) {
      const std::size_t row = static_cast<std::size_t>(table[pos / block_size]) * block_size + pos % block_size;
      std::copy_n(source.key_row(pos), row_floats, keys_.begin() + static_cast<std::ptrdiff_t>(row * row_floats));
      std::copy_n(source.value_row(pos), row_floats, values_.begin() + static_cast<std::ptrdiff_t>(row * row_floats));
    }
  }
}

llm::KvView ShuffledKvPool::view(int sequence) const {
  if (sequence < 0 || sequence >= n_sequences_)
    throw llm::InputError("ShuffledKvPool: no sequence " + std::to_string(sequence) + " (the pool holds " +
                          std::to_string(n_sequences_) + ")");
  auto* self = const_cast<ShuffledKvPool*>(this);  // views carry mutable pointers; the kernels only read them
  llm::KvView v;
  v.keys = self->keys_.data();
  v.values = self->values_.data();
  v.block_table = tables_.data() + static_cast<std::size_t>(sequence) * blocks_per_sequence_;
  v.block_size = block_size_;
  v.kv_dim = kv_dim_;
  v.head_dim = head_dim_;
  return v;
}

std::vector<llm::KvView> ShuffledKvPool::views() const {
  std::vector<llm::KvView> all;
  for (int s = 0; s < n_sequences_; ++s) all.push_back(view(s));
  return all;
}

}  // namespace step05
