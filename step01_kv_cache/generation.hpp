#pragma once
// Step 01's two decode loops over the same Model. They differ in one thing:
// whether the K and V of earlier tokens are kept (KV cache) or recomputed.
#include <functional>
#include <span>
#include <vector>

#include "llm/harness/variant.hpp"
#include "llm/model.hpp"
#include "llm/sampler.hpp"

namespace step01 {

struct GenerationResult {
  std::vector<int> tokens;         // [n_generated] sampled ids (prompt excluded)
  std::vector<float> logits;       // [n_generated, vocab] the logits each token was sampled from
  std::vector<double> token_ms;    // [n_generated] wall time to produce each token
  int prompt_length = 0;           // tokens fed before the first generated one (BOS included)
  double total_ms = 0.0;           // prompt processing + every generated token
  std::size_t kv_bytes_allocated = 0;  // the cache's footprint (0 for recompute: a scratch cache per step)
};

// Runs forwards at positions 0..total_positions-1 (prompt included, as
// llama2.c's -n), so it generates total_positions - prompt_length + 1 tokens,
// or stops early when BOS is sampled (llama2.c: BOS delimits sequences).
// prompt: [prompt_length] ids, starting with BOS.
using GenerateFn = GenerationResult (*)(llm::Model& model, std::span<const int> prompt, int total_positions,
                                        llm::Sampler& sampler);

// No cache: to produce token t the model re-runs positions 0..t-1 from scratch
// (a fresh cache every step), so step t costs O(t) projections and O(t^2)
// attention, and generating n tokens costs O(n^2) projections.
GenerationResult generate_recompute(llm::Model& model, std::span<const int> prompt, int total_positions,
                                    llm::Sampler& sampler);

// KV cache: one forward over the whole prompt (prefill) stores K/V of every
// prompt position; each later step feeds only the newest token, whose query
// reads the cached K/V: O(1) projections per token, O(t) attention.
GenerationResult generate_cached(llm::Model& model, std::span<const int> prompt, int total_positions,
                                 llm::Sampler& sampler);

// The step's variant table (both variants run on every device).
const std::vector<llm::Variant<GenerateFn>>& variants();

// KV-cache bytes by formula: 2 (K and V) x layers x kv_heads x head_dim x
// positions x bytes per value.
std::size_t kv_cache_bytes(int n_layers, int n_kv_heads, int head_dim, long long positions, int bytes_per_value);

// The fewest bytes one cached decode step must read from memory: every
// weight once at `weight_value_bytes` each (4: fp32; 2: fp16/bf16; the
// norms' few fp32 weights are counted the same, a rounding error), the
// embedding table only for its one row unless it is also the classifier,
// plus K and V (fp32) of the `context` positions the new token attends to.
// Time per token can be no shorter than this over the memory bandwidth:
// decode at batch 1 is memory-bound.
std::size_t decode_bytes_per_token(const llm::ModelConfig& config, long long context, int weight_value_bytes = 4);

}  // namespace step01
