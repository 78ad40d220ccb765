#include "step05_paged_attention/paged_kv_cache.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "llm/errors.hpp"

namespace step05 {
namespace {

llm::ModelConfig checked(const llm::ModelConfig& config, const PagedKvCacheOptions& options) {
  if (options.block_size < 1)
    throw llm::InputError(fmt::format("block size must be at least 1 (got {})", options.block_size));
  if (options.n_blocks < 1)
    throw llm::InputError(fmt::format("a paged cache needs at least one block (got {})", options.n_blocks));
  return config;
}

}  // namespace

int blocks_for_sequences(int num_sequences, int positions, int block_size) {
  return num_sequences * ((positions + block_size - 1) / block_size);
}

PagedKvCache::PagedKvCache(const llm::ModelConfig& config, const PagedKvCacheOptions& options)
    : llm::KvCache(options.num_sequences),
      n_layers_(checked(config, options).n_layers),
      kv_dim_(config.kv_dim()),
      head_dim_(config.head_dim()),
      element_(options.element),
      // A sequence may hold the whole context: ceil(seq_len / block_size) blocks.
      blocks_(options.n_blocks, options.block_size, options.num_sequences,
              (config.seq_len + options.block_size - 1) / options.block_size) {}

bool PagedKvCache::fits(const llm::ModelConfig& config) const {
  return config.n_layers == n_layers_ && config.kv_dim() == kv_dim_ && config.head_dim() == head_dim_;
}

llm::KvView PagedKvCache::view(int layer, int sequence) const {
  if (layer < 0 || layer >= n_layers_ || sequence < 0 || sequence >= num_sequences())
    throw llm::InputError(fmt::format("no view of layer {} of sequence {} (the cache has {} layers, {} sequences)",
                                      layer, sequence, n_layers_, num_sequences()));
  const Pools pool = pools();
  const std::size_t first_row = static_cast<std::size_t>(layer) * rows_per_layer();  // row 0 of this layer's slice
  llm::KvView v;
  v.element = element_;
  if (element_ == llm::KvElement::Float32) {
    v.keys = pool.keys + first_row * kv_dim_;
    v.values = pool.values + first_row * kv_dim_;
  } else {
    v.keys_int8 = pool.keys_int8 + first_row * kv_dim_;
    v.values_int8 = pool.values_int8 + first_row * kv_dim_;
    v.key_scales = pool.key_scales + first_row * kv_heads();
    v.value_scales = pool.value_scales + first_row * kv_heads();
  }
  v.block_table = pool.tables + static_cast<std::size_t>(sequence) * blocks_.max_blocks_per_sequence();
  v.block_size = blocks_.block_size();
  v.kv_dim = kv_dim_;
  v.head_dim = head_dim_;
  return v;
}

void PagedKvCache::reserve(int sequence, int begin, int end) {
  if (sequence < 0 || sequence >= num_sequences())
    throw llm::InputError(fmt::format("sequence slot {} does not exist (the cache has {})", sequence, num_sequences()));
  // All or nothing: the block manager either hands out every block (and
  // says which shared ones to copy first) or throws with the pool unchanged.
  for (const BlockCopy& copy : blocks_.reserve(sequence, begin, end)) copy_block(copy.from, copy.to);
}

void PagedKvCache::copy_block(int from, int to) {
  const Pools pool = pools();
  const std::size_t rows = static_cast<std::size_t>(blocks_.block_size());
  // Pool `base` holds `width` elements of `element_bytes` per row; a block
  // of one layer is `rows` consecutive rows of that layer's slice.
  const auto copy = [&](const void* base, std::size_t width, std::size_t element_bytes, std::size_t layer_row) {
    if (base == nullptr) return;  // a pool the element type does not use
    const std::size_t row_bytes = width * element_bytes;
    auto* bytes = static_cast<char*>(const_cast<void*>(base));
    copy_bytes(bytes + (layer_row + static_cast<std::size_t>(to) * rows) * row_bytes,
               bytes + (layer_row + static_cast<std::size_t>(from) * rows) * row_bytes, rows * row_bytes);
  };
  const std::size_t dim = static_cast<std::size_t>(kv_dim_), heads = static_cast<std::size_t>(kv_heads());
  for (int layer = 0; layer < n_layers_; ++layer) {
    const std::size_t layer_row = static_cast<std::size_t>(layer) * rows_per_layer();
    if (element_ == llm::KvElement::Float32) {
      copy(pool.keys, dim, sizeof(float), layer_row);
      copy(pool.values, dim, sizeof(float), layer_row);
    } else {
      copy(pool.keys_int8, dim, sizeof(std::int8_t), layer_row);
      copy(pool.values_int8, dim, sizeof(std::int8_t), layer_row);
      copy(pool.key_scales, heads, sizeof(float), layer_row);
      copy(pool.value_scales, heads, sizeof(float), layer_row);
    }
  }
}

void PagedKvCache::truncate(int sequence, int new_length) {
  llm::KvCache::truncate(sequence, new_length);  // checks new_length <= length
  blocks_.truncate(sequence, new_length);
}

void PagedKvCache::adopt_prefix(int sequence, int source, int n_positions) {
  llm::check_adopt_prefix(*this, sequence, source, n_positions);
  // A sequence that is empty by length may still hold blocks reserved by a
  // forward that failed: release them before sharing.
  blocks_.free_sequence(sequence);
  blocks_.fork(source, sequence, n_positions);
  set_length(sequence, n_positions);
}

int PagedKvCache::share_cached_prefix(int sequence, std::span<const int> prompt) {
  if (sequence < 0 || sequence >= num_sequences())
    throw llm::InputError(fmt::format("sequence slot {} does not exist (the cache has {})", sequence, num_sequences()));
  if (length(sequence) != 0)
    throw llm::InputError(fmt::format("sequence {} already holds {} positions (truncate it first)", sequence,
                                      length(sequence)));
  blocks_.free_sequence(sequence);
  // At most prompt.size() - 1 positions: the prompt's last token must go
  // through the model, because its logits are what the request needs next.
  const int max_positions = std::max(0, static_cast<int>(prompt.size()) - 1);
  const int cached = blocks_.share_cached_prefix(sequence, prompt, max_positions);
  set_length(sequence, cached);
  return cached;
}

void PagedKvCache::publish(int sequence, std::span<const int> tokens) {
  const int written = length(sequence);
  if (static_cast<int>(tokens.size()) < written)
    throw llm::InputError(fmt::format("publish: sequence {} holds {} positions but only {} tokens were given",
                                      sequence, written, tokens.size()));
  blocks_.publish_full_blocks(sequence, tokens.first(static_cast<std::size_t>(written)));
}

std::size_t PagedKvCache::rows_per_layer() const {
  return static_cast<std::size_t>(blocks_.n_blocks()) * blocks_.block_size();
}
std::size_t PagedKvCache::values_per_pool() const { return n_layers_ * rows_per_layer() * kv_dim_; }
std::size_t PagedKvCache::scales_per_pool() const { return n_layers_ * rows_per_layer() * kv_heads(); }

std::size_t PagedKvCache::bytes_per_block() const {
  // One position of one layer: K and V rows, in fp32 or in int8 plus a
  // scale per KV head.
  const std::size_t row = element_ == llm::KvElement::Float32
                              ? sizeof(float) * kv_dim_
                              : static_cast<std::size_t>(kv_dim_) + sizeof(float) * kv_heads();
  return 2 * row * n_layers_ * blocks_.block_size();
}

std::size_t PagedKvCache::bytes_allocated() const {
  return bytes_per_block() * static_cast<std::size_t>(blocks_.n_blocks());
}

std::size_t PagedKvCache::bytes_in_use() const {
  // valid[b]: positions of physical block b that hold a valid position of
  // some sequence (the most any of its holders has written into it).
  std::vector<int> valid(static_cast<std::size_t>(blocks_.n_blocks()), 0);
  const int block_size = blocks_.block_size();
  for (int s = 0; s < num_sequences(); ++s) {
    const std::span<const std::int32_t> table = blocks_.block_table(s);
    for (int j = 0; j < static_cast<int>(table.size()); ++j) {
      const int in_block = std::clamp(length(s) - j * block_size, 0, block_size);
      int& slot = valid[static_cast<std::size_t>(table[static_cast<std::size_t>(j)])];
      slot = std::max(slot, in_block);
    }
  }
  std::size_t rows = 0;
  for (const int v : valid) rows += static_cast<std::size_t>(v);
  return bytes_per_block() / static_cast<std::size_t>(block_size) * rows;
}

// ---------------------------------------------------------------------------
// Host memory.

namespace {

class CpuPagedKvCache final : public PagedKvCache {
 public:
  CpuPagedKvCache(const llm::ModelConfig& config, const PagedKvCacheOptions& options) : PagedKvCache(config, options) {
    // Zeroed, like the contiguous caches: a bug that reads an unwritten row
    // reads zeros, the same on every device.
    if (element() == llm::KvElement::Float32) {
      keys_.assign(values_per_pool(), 0.0f);
      values_.assign(values_per_pool(), 0.0f);
    } else {
      keys_int8_.assign(values_per_pool(), 0);
      values_int8_.assign(values_per_pool(), 0);
      key_scales_.assign(scales_per_pool(), 0.0f);
      value_scales_.assign(scales_per_pool(), 0.0f);
    }
  }
  std::string device_name() const override { return "cpu"; }

 private:
  Pools pools() const override {
    // Views write through these pointers; the cache hands them out.
    auto* self = const_cast<CpuPagedKvCache*>(this);
    Pools p;
    p.keys = self->keys_.data();
    p.values = self->values_.data();
    p.keys_int8 = self->keys_int8_.data();
    p.values_int8 = self->values_int8_.data();
    p.key_scales = self->key_scales_.data();
    p.value_scales = self->value_scales_.data();
    p.tables = blocks().all_tables().data();  // the block manager's own array: no copy on the host
    return p;
  }

  void copy_bytes(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }

  std::vector<float> keys_, values_;                  // fp32 pools [n_layers, n_blocks * block_size, kv_dim]
  std::vector<std::int8_t> keys_int8_, values_int8_;  // int8 pools, the same shape
  std::vector<float> key_scales_, value_scales_;      // [n_layers, n_blocks * block_size, n_kv_heads]
};

}  // namespace

std::unique_ptr<PagedKvCache> make_paged_kv_cache(const std::string& device, const llm::ModelConfig& config,
                                                  const PagedKvCacheOptions& options) {
  if (device == "cpu") return std::make_unique<CpuPagedKvCache>(config, options);
  if (device == "cuda") return make_cuda_paged_kv_cache(config, options);
  throw llm::InputError(fmt::format("no paged KV cache for device '{}' (cpu or cuda)", device));
}

}  // namespace step05
