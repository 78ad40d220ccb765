#pragma once
// The KV cache (docs/01_kv_cache.md, section 2): the K and V rows of every
// layer of every sequence, kept so a decode step computes K/V for its new
// token only. Attention never indexes cache memory directly: it reads one
// layer of one sequence through a KvView, and the forward writes through
// store_kv_row.
//
// Reading order. Step 01's cache is contiguous fp32: one [capacity, kv_dim]
// buffer per layer and sequence (CpuKvCache). Read KvView's fp32 rows, the
// KvCache interface and CpuKvCache; the parts marked "step 04", "step 05"
// and "step 06" can wait for those steps: rollback, the block table of the
// paged cache (docs/05_paged_attention.md, section 2) and int8 elements
// (docs/06_quantization.md, section 7; their arithmetic is llm/kv_int8.hpp).
// For a contiguous cache the block table has one entry: block = sequence.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llm/config.hpp"
#include "llm/host_device.hpp"  // LLM_HOST_DEVICE

namespace llm {

// How a cache stores each K/V element.
enum class KvElement : std::uint8_t {
  Float32,  // the rows as the model computed them (every cache until step 06)
  Int8,     // step 06: per (position, KV head) int8 values and one fp32 scale, value = q * scale
};

// K/V rows of one layer of one sequence, as the cache stores them: the hook
// every attention kernel reads through and every forward writes through
// (store_kv_row). Plain data: usable in CUDA kernels. One struct for every
// cache of the course; a contiguous fp32 cache (step 01) uses keys, values
// and a one-entry block table, and leaves the int8 fields null.
struct KvView {
  // Float32 storage (element == Float32; null otherwise). Contiguous cache:
  // the layer's [num_sequences, capacity, kv_dim] rows, a block per sequence.
  float* keys = nullptr;            // block pool: [n_blocks, block_size, kv_dim]
  float* values = nullptr;          // block pool: [n_blocks, block_size, kv_dim]
  // Step 06, int8 storage (element == Int8; null otherwise): the same row
  // layout in int8, and one scale per row and KV head.
  std::int8_t* keys_int8 = nullptr;    // block pool: [n_blocks, block_size, kv_dim]
  std::int8_t* values_int8 = nullptr;  // block pool: [n_blocks, block_size, kv_dim]
  float* key_scales = nullptr;         // [n_blocks, block_size, kv_dim / head_dim]
  float* value_scales = nullptr;       // [n_blocks, block_size, kv_dim / head_dim]
  // Which block of the pool holds each block of the sequence. Contiguous: one
  // entry (the sequence's own block) and block_size = capacity; step 05's
  // paged cache: small blocks anywhere in the pool.
  const std::int32_t* block_table = nullptr;  // [ceil(positions / block_size)] physical block of each logical block
  int block_size = 0;               // positions per block
  int kv_dim = 0;                   // n_kv_heads * head_dim values per row
  int head_dim = 0;                 // values per KV head (the int8 scale granularity; set by every cache)
  KvElement element = KvElement::Float32;

  // The fp32 K and V rows of position `pos` ([kv_dim] floats each). In a
  // contiguous cache: row pos of the sequence's block.
  LLM_HOST_DEVICE float* key_row(int pos) const { return keys + row_offset(pos); }
  LLM_HOST_DEVICE float* value_row(int pos) const { return values + row_offset(pos); }

  // --- step 05: the block table (a contiguous cache's has one entry) ---
  // Row of position `pos` inside the pool (block * block_size + slot).
  LLM_HOST_DEVICE std::size_t row_index(int pos) const {
    const int block = block_table[pos / block_size];
    return static_cast<std::size_t>(block) * block_size + pos % block_size;
  }
  // Offset (in elements) of position `pos`'s row inside the pool.
  LLM_HOST_DEVICE std::size_t row_offset(int pos) const { return row_index(pos) * kv_dim; }

  // --- step 06: int8 rows and their scales ([kv_dim / head_dim] per row) ---
  LLM_HOST_DEVICE std::int8_t* key_row_int8(int pos) const { return keys_int8 + row_offset(pos); }
  LLM_HOST_DEVICE std::int8_t* value_row_int8(int pos) const { return values_int8 + row_offset(pos); }
  LLM_HOST_DEVICE float* key_row_scales(int pos) const { return key_scales + row_index(pos) * (kv_dim / head_dim); }
  LLM_HOST_DEVICE float* value_row_scales(int pos) const {
    return value_scales + row_index(pos) * (kv_dim / head_dim);
  }
};

// Writes one position's K and V rows ([kv_dim] floats each, host memory)
// into a view on the host, in the view's element type. The CUDA twin is
// kernels::write_kv_rows.
void store_kv_row(const KvView& view, int pos, const float* key, const float* value);

// Copies row `pos` of a host view into `key_out` / `value_out` ([kv_dim]
// floats each), dequantizing an int8 row.
void load_kv_row(const KvView& view, int pos, float* key_out, float* value_out);

// The KV cache hook: memory for the K/V rows of a number of sequence slots,
// on one device. The models reach it only through this interface, so a paged
// cache (step 05) or an int8 cache (step 06) plugs in without either model
// knowing its type. A forward, for each sequence of a batch:
//   1. check_writable(s, first position)   no gap after the cached prefix
//   2. reserve(s, first, last position + 1) room for the batch's rows
//   3. prepare(batch)                       once: device copies of block tables
//   4. view(layer, s)                       write the rows (store_kv_row or
//                                           kernels::write_kv_rows), then attend
//   5. mark_written(s, position)            the sequence's length grows
// Lengths (valid positions per sequence) are kept here, on the host.
class KvCache {
 public:
  virtual ~KvCache() = default;

  int num_sequences() const { return static_cast<int>(lengths_.size()); }
  int length(int sequence) const { return lengths_.at(static_cast<std::size_t>(sequence)); }

  // "cpu" or "cuda": where the views' pointers live (a model takes only a
  // cache of its own device).
  virtual std::string device_name() const = 0;
  // True when the cache was shaped for `config` (layers and K/V width): a
  // cache of another model would be read and written out of bounds.
  virtual bool fits(const ModelConfig& config) const = 0;
  // K/V of one layer of one sequence; its pointers are memory of device_name().
  virtual KvView view(int layer, int sequence) const = 0;
  // Makes room for positions 0..end-1 of `sequence`, of which begin..end-1
  // (begin <= length) are about to be written. A contiguous cache checks its
  // capacity. Throws KvCacheFullError, saying how much was asked and how
  // much there is, when it cannot. (Step 05: a paged cache allocates blocks,
  // and copies a block it shares with another sequence before begin..end-1
  // are written into it: copy-on-write, why the cache must know where the
  // writes start.)
  virtual void reserve(int sequence, int begin, int end) = 0;
  // Called once per forward after every reserve and before any view is used
  // on the device: a device cache uploads block tables changed since the last
  // forward. Default: nothing to do.
  virtual void prepare() {}

  // Position `position` of `sequence` may be written when the slot exists and
  // the position leaves no gap (position <= length); else throws InputError.
  // Room is reserve's business. mark_written sets length = position + 1: writing a position
  // forgets every later one (rewriting after a rollback).
  void check_writable(int sequence, int position) const;
  void mark_written(int sequence, int position);
  void clear();  // every sequence back to length 0 (a truncate of each, below)

  virtual std::size_t bytes_allocated() const = 0;  // K and V (and scales) reserved
  virtual std::size_t bytes_in_use() const = 0;     // of those, the bytes holding valid positions

  // --- step 04: rollback ---
  // Forget positions >= new_length of a sequence (speculative rollback, reuse
  // of a slot; a paged cache frees the blocks past it). Throws InputError when
  // new_length > length.
  virtual void truncate(int sequence, int new_length);

  // --- step 05: prefix sharing ---
  // `sequence` (empty) takes over positions 0..n_positions-1 of `source`,
  // which keeps them. A contiguous cache copies the rows; a paged cache
  // shares the blocks. Throws InputError for a non-empty `sequence` or
  // n_positions > length(source), KvCacheFullError when there is no room.
  virtual void adopt_prefix(int sequence, int source, int n_positions) = 0;

  // --- step 06: int8 elements ---
  // How the views store K/V (every view of a cache stores the same way).
  virtual KvElement element() const { return KvElement::Float32; }

 protected:
  // Throws InputError unless there is at least one sequence.
  explicit KvCache(int num_sequences);
  void set_length(int sequence, int new_length) { lengths_.at(static_cast<std::size_t>(sequence)) = new_length; }
  int total_length() const;  // sum of every sequence's length

 private:
  std::vector<int> lengths_;  // [num_sequences] valid positions per slot
};

// The layout of a contiguous cache, on either device: per layer, one block of
// `capacity` rows per sequence, so sequence s's single logical block is
// physical block s. It knows sizes and builds views; the cache owns the memory.
class ContiguousKvLayout {
 public:
  ContiguousKvLayout(const ModelConfig& config, int num_sequences, int capacity);

  int capacity() const { return capacity_; }
  // Floats in the K pool (and in the V pool): layers x sequences x capacity x kv_dim.
  std::size_t floats() const {
    return static_cast<std::size_t>(n_layers_) * num_sequences_ * capacity_ * kv_dim_;
  }
  // Bytes of K and V of `positions` positions in every layer.
  std::size_t bytes_of(std::size_t positions) const {
    return 2 * positions * static_cast<std::size_t>(n_layers_) * kv_dim_ * sizeof(float);
  }
  // The block table of every sequence, side by side: {0, 1, ..., num_sequences-1}.
  std::vector<std::int32_t> block_ids() const;
  // The view of one layer of one sequence, given the pools and block_ids()
  // wherever they live (host or device memory).
  KvView view(float* keys, float* values, const std::int32_t* block_ids, int layer, int sequence) const;
  // Offset (in floats) of row 0 of `sequence` in `layer`, and the floats of
  // one row: what a prefix copy needs.
  std::size_t sequence_offset(int layer, int sequence) const;
  int kv_dim() const { return kv_dim_; }
  int n_layers() const { return n_layers_; }
  bool fits(const ModelConfig& config) const { return config.n_layers == n_layers_ && config.kv_dim() == kv_dim_; }
  // Throws KvCacheFullError unless end <= capacity.
  void check_room(int sequence, int end) const;

 private:
  int n_layers_;
  int num_sequences_;
  int capacity_;
  int kv_dim_;
  int head_dim_;
};

// Host memory, one contiguous [capacity, kv_dim] buffer per layer and sequence.
class CpuKvCache final : public KvCache {
 public:
  CpuKvCache(const ModelConfig& config, int num_sequences, int capacity);

  int capacity() const { return layout_.capacity(); }  // positions per sequence
  std::string device_name() const override { return "cpu"; }
  bool fits(const ModelConfig& config) const override { return layout_.fits(config); }
  KvView view(int layer, int sequence) const override;
  void reserve(int sequence, int /*begin*/, int end) override { layout_.check_room(sequence, end); }
  void adopt_prefix(int sequence, int source, int n_positions) override;
  std::size_t bytes_allocated() const override;
  std::size_t bytes_in_use() const override { return layout_.bytes_of(static_cast<std::size_t>(total_length())); }

 private:
  ContiguousKvLayout layout_;
  std::vector<float> keys_;    // [n_layers, num_sequences, capacity, kv_dim]
  std::vector<float> values_;  // [n_layers, num_sequences, capacity, kv_dim]
  std::vector<std::int32_t> block_ids_;  // [num_sequences]: sequence s is block s
};

// Step 05: checks an adopt_prefix request against the lengths (shared by
// every cache).
void check_adopt_prefix(const KvCache& cache, int sequence, int source, int n_positions);

}  // namespace llm
