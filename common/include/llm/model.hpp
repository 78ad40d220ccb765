#pragma once
// Model: the interface every step drives. One forward() over a TokenBatch
// writes the batch's K/V into the cache and returns logits; the decode loop
// (plain, speculative, scheduled) lives outside, in the step that teaches it.
#include <memory>
#include <span>
#include <string>

#include "llm/config.hpp"
#include "llm/kv_cache.hpp"
#include "llm/token_batch.hpp"

namespace llm {

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  virtual std::string device_name() const = 0;  // "cpu" or "cuda"

  // A contiguous cache on this model's device: `num_sequences` slots of
  // `capacity` positions. Any other KvCache of the same device and shape
  // (paged, int8) works as well.
  virtual std::unique_ptr<KvCache> make_cache(int num_sequences, int capacity) const = 0;

  // Runs the transformer over `batch`. Rows of one sequence must be in order
  // and contiguous in position, starting at most at the sequence's current
  // cache length. Returns logits in host memory, one row of vocab_size per
  // selected row (see LogitsFor), in batch order. Throws InputError for bad
  // token ids/positions and KvCacheFullError when the cache has no room.
  virtual std::span<const float> forward(const TokenBatch& batch, KvCache& cache,
                                         LogitsFor which = LogitsFor::LastRowOfEachSequence) = 0;
};

// Checks a batch against a config and a cache: token ids in [0, vocab),
// positions inside the context, rows of each sequence contiguous from at most
// its length. Shared by every Model so errors read the same on every device.
void validate_batch(const ModelConfig& config, const TokenBatch& batch, const KvCache& cache);

// Checks, at the start of a forward, that `cache` lives on the model's device
// and fits its config, and that the model's attention kernels read the
// cache's element type (else InputError: another model's cache, or an int8
// cache with fp32-only kernels).
void check_cache(const ModelConfig& config, const std::string& model_device, const KvCache& cache,
                 bool kernels_read_its_elements);

// After validate_batch, before a forward touches the cache: reserves room for
// every sequence's rows (KvCacheFullError when the cache has none) and lets
// the cache prepare (upload block tables).
void reserve_batch(const TokenBatch& batch, KvCache& cache);

// Checks a generation request before any forward: a non-empty prompt (BOS at
// least) that fits the context, and a total of positions (prompt included,
// as llama2.c's -n) between the prompt's length and the context.
void validate_generation(const ModelConfig& config, std::span<const int> prompt, int total_positions);

}  // namespace llm
