#include "llm/kv_cache.hpp"

#include <fmt/format.h>

#include "llm/errors.hpp"

namespace llm {

void KvCache::truncate(int sequence, int new_length) {
  const int current = length(sequence);
  if (new_length < 0 || new_length > current)
    throw InputError(fmt::format("cannot truncate sequence {} from {} to {} positions", sequence, current,
                                 new_length));
  lengths_[static_cast<std::size_t>(sequence)] = new_length;
}

void KvCache::clear() { std::fill(lengths_.begin(), lengths_.end(), 0); }

void KvCache::check_writable(int sequence, int position) const {
  if (sequence < 0 || sequence >= num_sequences())
    throw InputError(fmt::format("sequence slot {} does not exist (the cache has {})", sequence, num_sequences()));
  if (position < 0) throw InputError(fmt::format("position {} is negative", position));
  if (position >= capacity_)
    throw KvCacheFullError(fmt::format(
        "KV cache full: sequence {} needs position {} but the cache holds {} positions per sequence",
        sequence, position, capacity_));
  if (position > length(sequence))
    throw InputError(fmt::format("sequence {} has {} cached positions; position {} would leave a gap",
                                 sequence, length(sequence), position));
}

void KvCache::mark_written(int sequence, int position) {
  int& len = lengths_.at(static_cast<std::size_t>(sequence));
  // Writing position p makes everything after it stale (rewriting the middle
  // of a sequence, as speculative rollback does, forgets what came after).
  len = position + 1;
}

CpuKvCache::CpuKvCache(const ModelConfig& config, int num_sequences, int capacity)
    : KvCache(num_sequences, capacity), n_layers_(config.n_layers), kv_dim_(config.kv_dim()) {
  if (num_sequences <= 0 || capacity <= 0)
    throw InputError(fmt::format("a KV cache needs at least one sequence and one position (got {} x {})",
                                 num_sequences, capacity));
  const std::size_t floats = static_cast<std::size_t>(n_layers_) * num_sequences * capacity * kv_dim_;
  keys_.assign(floats, 0.0f);
  values_.assign(floats, 0.0f);
  block_ids_.resize(static_cast<std::size_t>(num_sequences));
  for (int s = 0; s < num_sequences; ++s) block_ids_[static_cast<std::size_t>(s)] = s;
}

KvView CpuKvCache::view(int layer, int sequence) const {
  // Layer l's pool holds one block per sequence, each `capacity` rows long, so
  // sequence s's single logical block is physical block s.
  const std::size_t layer_offset = static_cast<std::size_t>(layer) * num_sequences() * capacity() * kv_dim_;
  KvView v;
  v.keys = const_cast<float*>(keys_.data()) + layer_offset;
  v.values = const_cast<float*>(values_.data()) + layer_offset;
  v.block_table = block_ids_.data() + sequence;
  v.block_size = capacity();
  v.kv_dim = kv_dim_;
  return v;
}

std::size_t CpuKvCache::bytes_allocated() const { return (keys_.size() + values_.size()) * sizeof(float); }

}  // namespace llm
