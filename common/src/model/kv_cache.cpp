#include "llm/kv_cache.hpp"

#include <fmt/format.h>

#include <cstring>
#include <numeric>

#include "llm/errors.hpp"
#include "llm/kv_int8.hpp"  // store_int8_head, dequantize_int8_row

namespace llm {

void store_kv_row(const KvView& view, int pos, const float* key, const float* value) {
  const auto row_bytes = sizeof(float) * static_cast<std::size_t>(view.kv_dim);
  if (view.element == KvElement::Float32) {
    std::memcpy(view.key_row(pos), key, row_bytes);
    std::memcpy(view.value_row(pos), value, row_bytes);
    return;
  }
  // Int8: each KV head of the row gets its own scale.
  for (int head = 0; head < view.kv_dim / view.head_dim; ++head) store_int8_head(view, pos, head, key, value);
}

void load_kv_row(const KvView& view, int pos, float* key_out, float* value_out) {
  const auto row_bytes = sizeof(float) * static_cast<std::size_t>(view.kv_dim);
  if (view.element == KvElement::Float32) {
    std::memcpy(key_out, view.key_row(pos), row_bytes);
    std::memcpy(value_out, view.value_row(pos), row_bytes);
    return;
  }
  dequantize_int8_row(view.key_row_int8(pos), view.key_row_scales(pos), view.kv_dim, view.head_dim, key_out);
  dequantize_int8_row(view.value_row_int8(pos), view.value_row_scales(pos), view.kv_dim, view.head_dim, value_out);
}

KvCache::KvCache(int num_sequences) {
  if (num_sequences <= 0)
    throw InputError(fmt::format("a KV cache needs at least one sequence (got {})", num_sequences));
  lengths_.assign(static_cast<std::size_t>(num_sequences), 0);
}

void KvCache::truncate(int sequence, int new_length) {
  const int current = length(sequence);
  if (new_length < 0 || new_length > current)
    throw InputError(fmt::format("cannot truncate sequence {} from {} to {} positions", sequence, current,
                                 new_length));
  set_length(sequence, new_length);
}

void KvCache::clear() {
  for (int s = 0; s < num_sequences(); ++s) truncate(s, 0);
}

int KvCache::total_length() const { return std::accumulate(lengths_.begin(), lengths_.end(), 0); }

void KvCache::check_writable(int sequence, int position) const {
  if (sequence < 0 || sequence >= num_sequences())
    throw InputError(fmt::format("sequence slot {} does not exist (the cache has {})", sequence, num_sequences()));
  if (position < 0) throw InputError(fmt::format("position {} is negative", position));
  if (position > length(sequence))
    throw InputError(fmt::format("sequence {} has {} cached positions; position {} would leave a gap",
                                 sequence, length(sequence), position));
}

void KvCache::mark_written(int sequence, int position) {
  // Writing position p makes everything after it stale (rewriting the middle
  // of a sequence, as speculative rollback does, forgets what came after).
  set_length(sequence, position + 1);
}

void check_adopt_prefix(const KvCache& cache, int sequence, int source, int n_positions) {
  const int n = cache.num_sequences();
  if (sequence < 0 || sequence >= n || source < 0 || source >= n || sequence == source)
    throw InputError(fmt::format("adopt_prefix: sequences {} and {} must be two different slots of {}", sequence,
                                 source, n));
  if (cache.length(sequence) != 0)
    throw InputError(fmt::format("adopt_prefix: sequence {} already holds {} positions (truncate it first)",
                                 sequence, cache.length(sequence)));
  if (n_positions < 0 || n_positions > cache.length(source))
    throw InputError(fmt::format("adopt_prefix: sequence {} holds {} positions, {} asked", source,
                                 cache.length(source), n_positions));
}

ContiguousKvLayout::ContiguousKvLayout(const ModelConfig& config, int num_sequences, int capacity)
    : n_layers_(config.n_layers),
      num_sequences_(num_sequences),
      capacity_(capacity),
      kv_dim_(config.kv_dim()),
      head_dim_(config.head_dim()) {
  if (capacity <= 0) throw InputError(fmt::format("a KV cache needs at least one position (got {})", capacity));
}

std::vector<std::int32_t> ContiguousKvLayout::block_ids() const {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_sequences_));
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

std::size_t ContiguousKvLayout::sequence_offset(int layer, int sequence) const {
  return (static_cast<std::size_t>(layer) * num_sequences_ + sequence) * capacity_ * kv_dim_;
}

KvView ContiguousKvLayout::view(float* keys, float* values, const std::int32_t* block_ids, int layer,
                                int sequence) const {
  const std::size_t layer_offset = sequence_offset(layer, 0);
  KvView v;
  v.keys = keys + layer_offset;
  v.values = values + layer_offset;
  v.block_table = block_ids + sequence;  // a table of one entry: block `sequence`
  v.block_size = capacity_;
  v.kv_dim = kv_dim_;
  v.head_dim = head_dim_;
  return v;
}

void ContiguousKvLayout::check_room(int sequence, int end) const {
  if (end > capacity_)
    throw KvCacheFullError(fmt::format(
        "KV cache full: sequence {} needs {} positions but the cache holds {} positions per sequence", sequence, end,
        capacity_));
}

CpuKvCache::CpuKvCache(const ModelConfig& config, int num_sequences, int capacity)
    : KvCache(num_sequences),
      layout_(config, num_sequences, capacity),
      keys_(layout_.floats(), 0.0f),
      values_(layout_.floats(), 0.0f),
      block_ids_(layout_.block_ids()) {}

KvView CpuKvCache::view(int layer, int sequence) const {
  return layout_.view(const_cast<float*>(keys_.data()), const_cast<float*>(values_.data()), block_ids_.data(), layer,
                      sequence);
}

void CpuKvCache::adopt_prefix(int sequence, int source, int n_positions) {
  check_adopt_prefix(*this, sequence, source, n_positions);
  reserve(sequence, 0, n_positions);
  // One contiguous copy per layer and pool: the prefix rows are adjacent.
  const std::size_t floats = static_cast<std::size_t>(n_positions) * layout_.kv_dim();
  for (int layer = 0; layer < layout_.n_layers(); ++layer) {
    const std::size_t from = layout_.sequence_offset(layer, source), to = layout_.sequence_offset(layer, sequence);
    std::memcpy(keys_.data() + to, keys_.data() + from, floats * sizeof(float));
    std::memcpy(values_.data() + to, values_.data() + from, floats * sizeof(float));
  }
  set_length(sequence, n_positions);
}

std::size_t CpuKvCache::bytes_allocated() const { return (keys_.size() + values_.size()) * sizeof(float); }

}  // namespace llm
