#include "llm/kv_cache.hpp"

#include <fmt/format.h>

#include "llm/errors.hpp"

namespace llm {

KvCache::KvCache(int num_sequences, int capacity) : capacity_(capacity) {
  if (num_sequences <= 0 || capacity <= 0)
    throw InputError(fmt::format("a KV cache needs at least one sequence and one position (got {} x {})",
                                 num_sequences, capacity));
  lengths_.assign(static_cast<std::size_t>(num_sequences), 0);
}

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
    : KvCache(num_sequences, capacity),
      layout_(config, num_sequences, capacity),
      keys_(layout_.floats(), 0.0f),
      values_(layout_.floats(), 0.0f),
      block_ids_(layout_.block_ids()) {}

KvView CpuKvCache::view(int layer, int sequence) const {
  return layout_.view(const_cast<float*>(keys_.data()), const_cast<float*>(values_.data()), block_ids_.data(), layer,
                      sequence);
}

std::vector<std::int32_t> ContiguousKvLayout::block_ids() const {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_sequences_));
  for (int s = 0; s < num_sequences_; ++s) ids[static_cast<std::size_t>(s)] = s;
  return ids;
}

KvView ContiguousKvLayout::view(float* keys, float* values, const std::int32_t* block_ids, int layer,
                                int sequence) const {
  const std::size_t layer_offset = static_cast<std::size_t>(layer) * num_sequences_ * capacity_ * kv_dim_;
  KvView v;
  v.keys = keys + layer_offset;
  v.values = values + layer_offset;
  v.block_table = block_ids + sequence;  // a table of one entry: block `sequence`
  v.block_size = capacity_;
  v.kv_dim = kv_dim_;
  return v;
}

std::size_t CpuKvCache::bytes_allocated() const { return (keys_.size() + values_.size()) * sizeof(float); }

}  // namespace llm
