#pragma once
// Test doubles of the KV cache hook (llm/kv_cache.hpp): a paged cache whose
// K/V live in small blocks allocated on demand from a shared pool, storing
// fp32 or int8 rows. They prove that the models reach a cache only through
// KvCache (neither knows these types) and are small on purpose: step 05's
// PagedKvCache is the real one (reference counts, copy-on-write, prefix
// caching, eviction); common's tests keep this double so that they depend on
// no step.
//
// PagedKvCacheBookkeeping keeps the block tables, the free list and the
// lengths on the host; a subclass owns the pools on its device.
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "llm/config.hpp"
#include "llm/errors.hpp"
#include "llm/kv_cache.hpp"
#include "llm/model.hpp"
#include "llm/sampler.hpp"
#include "llm/token_batch.hpp"

namespace llm::testing {

class PagedKvCacheBookkeeping : public KvCache {
 public:
  PagedKvCacheBookkeeping(const ModelConfig& config, int num_sequences, int n_blocks, int block_size,
                          KvElement element)
      : KvCache(num_sequences),
        n_layers_(config.n_layers),
        kv_dim_(config.kv_dim()),
        head_dim_(config.head_dim()),
        n_blocks_(n_blocks),
        block_size_(block_size),
        max_blocks_per_sequence_((config.seq_len + block_size - 1) / block_size),
        element_(element),
        tables_(static_cast<std::size_t>(num_sequences) * max_blocks_per_sequence_, -1),
        blocks_held_(static_cast<std::size_t>(num_sequences), 0) {
    // Hand out the highest block first, so logical and physical blocks never
    // coincide by accident.
    for (int b = 0; b < n_blocks; ++b) free_blocks_.push_back(b);
  }

  bool fits(const ModelConfig& config) const override {
    return config.n_layers == n_layers_ && config.kv_dim() == kv_dim_;
  }
  KvElement element() const override { return element_; }

  void reserve(int sequence, int /*begin*/, int end) override {  // never shares a block: nothing to copy
    const int needed = (end + block_size_ - 1) / block_size_;
    int& held = blocks_held_.at(static_cast<std::size_t>(sequence));
    if (needed > max_blocks_per_sequence_)
      throw KvCacheFullError(fmt::format("sequence {} needs {} positions, past the context", sequence, end));
    if (needed - held > static_cast<int>(free_blocks_.size()))
      throw KvCacheFullError(fmt::format("KV cache full: sequence {} needs {} more blocks of {} positions, {} of {} free",
                                         sequence, needed - held, block_size_, free_blocks_.size(), n_blocks_));
    for (; held < needed; ++held) {
      table(sequence)[held] = free_blocks_.back();
      free_blocks_.pop_back();
      tables_changed_ = true;
    }
  }

  void truncate(int sequence, int new_length) override {
    KvCache::truncate(sequence, new_length);
    int& held = blocks_held_.at(static_cast<std::size_t>(sequence));
    const int keep = (new_length + block_size_ - 1) / block_size_;
    for (; held > keep; --held) {
      free_blocks_.push_back(table(sequence)[held - 1]);
      table(sequence)[held - 1] = -1;
      tables_changed_ = true;
    }
  }

  // Copies the rows (a real paged cache would share the full blocks).
  void adopt_prefix(int sequence, int source, int n_positions) override {
    check_adopt_prefix(*this, sequence, source, n_positions);
    reserve(sequence, 0, n_positions);
    for (int layer = 0; layer < n_layers_; ++layer)
      for (int pos = 0; pos < n_positions; ++pos) copy_row(layer, pool_row(source, pos), pool_row(sequence, pos));
    set_length(sequence, n_positions);
  }

  std::size_t bytes_allocated() const override { return bytes_of_rows(static_cast<std::size_t>(n_blocks_) * block_size_); }
  std::size_t bytes_in_use() const override { return bytes_of_rows(static_cast<std::size_t>(total_length())); }
  int free_blocks() const { return static_cast<int>(free_blocks_.size()); }

 protected:
  // Rows in one layer's pool, and the int8 scales per row.
  std::size_t rows_per_layer() const { return static_cast<std::size_t>(n_blocks_) * block_size_; }
  int heads() const { return kv_dim_ / head_dim_; }
  // The view of `sequence` in `layer`, given the pools' base pointers and the
  // table array (wherever they live): every layer's pool is rows_per_layer() rows.
  KvView make_view(float* keys, float* values, std::int8_t* keys_int8, std::int8_t* values_int8, float* key_scales,
                   float* value_scales, const std::int32_t* tables, int layer, int sequence) const {
    const std::size_t layer_rows = static_cast<std::size_t>(layer) * rows_per_layer();
    KvView v;
    v.element = element_;
    if (element_ == KvElement::Float32) {
      v.keys = keys + layer_rows * kv_dim_;
      v.values = values + layer_rows * kv_dim_;
    } else {
      v.keys_int8 = keys_int8 + layer_rows * kv_dim_;
      v.values_int8 = values_int8 + layer_rows * kv_dim_;
      v.key_scales = key_scales + layer_rows * heads();
      v.value_scales = value_scales + layer_rows * heads();
    }
    v.block_table = tables + static_cast<std::size_t>(sequence) * max_blocks_per_sequence_;
    v.block_size = block_size_;
    v.kv_dim = kv_dim_;
    v.head_dim = head_dim_;
    return v;
  }
  // Copies one row (K and V, and scales) of `layer` between pool rows.
  virtual void copy_row(int layer, std::size_t from_row, std::size_t to_row) = 0;
  const std::vector<std::int32_t>& host_tables() const { return tables_; }
  bool take_tables_changed() { return std::exchange(tables_changed_, false); }
  std::size_t floats_per_pool() const { return static_cast<std::size_t>(n_layers_) * rows_per_layer() * kv_dim_; }
  std::size_t scales_per_pool() const { return static_cast<std::size_t>(n_layers_) * rows_per_layer() * heads(); }
  int kv_dim() const { return kv_dim_; }

 private:
  std::int32_t* table(int sequence) { return tables_.data() + static_cast<std::size_t>(sequence) * max_blocks_per_sequence_; }
  std::size_t pool_row(int sequence, int pos) const {
    return static_cast<std::size_t>(tables_[static_cast<std::size_t>(sequence) * max_blocks_per_sequence_ +
                                            pos / block_size_]) * block_size_ + pos % block_size_;
  }
  std::size_t bytes_of_rows(std::size_t rows) const {
    const std::size_t per_row = element_ == KvElement::Float32 ? kv_dim_ * sizeof(float)
                                                               : kv_dim_ + heads() * sizeof(float);
    return 2 * rows * n_layers_ * per_row;
  }

  int n_layers_, kv_dim_, head_dim_, n_blocks_, block_size_, max_blocks_per_sequence_;
  KvElement element_;
  std::vector<std::int32_t> tables_;  // [num_sequences, max_blocks_per_sequence] physical block per logical block
  std::vector<int> blocks_held_;      // [num_sequences]
  std::vector<int> free_blocks_;      // a stack of free physical blocks
  bool tables_changed_ = true;
};

// Host memory: the double the CPU model runs on.
class PagedCpuKvCacheDouble final : public PagedKvCacheBookkeeping {
 public:
  PagedCpuKvCacheDouble(const ModelConfig& config, int num_sequences, int n_blocks, int block_size, KvElement element)
      : PagedKvCacheBookkeeping(config, num_sequences, n_blocks, block_size, element) {
    if (element == KvElement::Float32) {
      keys_.assign(floats_per_pool(), 0.0f);
      values_.assign(floats_per_pool(), 0.0f);
    } else {
      keys_int8_.assign(floats_per_pool(), 0);
      values_int8_.assign(floats_per_pool(), 0);
      key_scales_.assign(scales_per_pool(), 0.0f);
      value_scales_.assign(scales_per_pool(), 0.0f);
    }
  }
  std::string device_name() const override { return "cpu"; }
  KvView view(int layer, int sequence) const override {
    auto* self = const_cast<PagedCpuKvCacheDouble*>(this);  // views may write; the cache hands them out
    return make_view(self->keys_.data(), self->values_.data(), self->keys_int8_.data(), self->values_int8_.data(),
                     self->key_scales_.data(), self->value_scales_.data(), host_tables().data(), layer, sequence);
  }

 private:
  void copy_row(int layer, std::size_t from_row, std::size_t to_row) override {
    const std::size_t base = static_cast<std::size_t>(layer) * rows_per_layer();
    const auto copy = [&](auto& pool, std::size_t width) {
      if (pool.empty()) return;
      std::copy_n(pool.begin() + static_cast<std::ptrdiff_t>((base + from_row) * width), width,
                  pool.begin() + static_cast<std::ptrdiff_t>((base + to_row) * width));
    };
    copy(keys_, kv_dim());
    copy(values_, kv_dim());
    copy(keys_int8_, kv_dim());
    copy(values_int8_, kv_dim());
    copy(key_scales_, static_cast<std::size_t>(heads()));
    copy(value_scales_, static_cast<std::size_t>(heads()));
  }

  std::vector<float> keys_, values_;                // fp32 pools [n_layers, n_blocks * block_size, kv_dim]
  std::vector<std::int8_t> keys_int8_, values_int8_;  // int8 pools, same shape
  std::vector<float> key_scales_, value_scales_;    // [n_layers, n_blocks * block_size, n_kv_heads]
};

// Greedy generation in sequence slot `sequence`: the prompt in one prefill,
// then one decode row per token, until `total_positions` positions. Returns
// the generated tokens (the cache decides nothing else).
inline std::vector<int> greedy_tokens(Model& model, KvCache& cache, const std::vector<int>& prompt,
                                      int total_positions, int sequence = 0) {
  std::span<const float> logits =
      model.forward(TokenBatch::prefill(prompt, cache.length(sequence), sequence), cache);
  std::vector<int> generated;
  for (int pos = cache.length(sequence); pos < total_positions; ++pos) {
    generated.push_back(argmax(logits));
    logits = model.forward(TokenBatch::single(generated.back(), pos, sequence), cache);
  }
  return generated;
}

}  // namespace llm::testing
