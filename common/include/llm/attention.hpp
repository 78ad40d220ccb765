#pragma once
// The attention hook: one plain function signature per phase, chosen by the
// caller (AttentionKernels). Queries attend to K/V read through KvView, with
// causal masking aligned bottom-right: the last query sees every key.
#include <span>

#include "llm/kv_cache.hpp"

namespace llm {

struct AttentionShape {
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // K/V heads; query head h reads K/V head h / (n_heads / n_kv_heads)
  int head_dim = 0;
};

namespace cpu {

// Prefill: n_new queries of one sequence at positions n_past..n_past+n_new-1.
// q   [n_new, n_heads, head_dim]  (already rotated by RoPE)
// kv  positions 0..n_past+n_new-1 valid
// out [n_new, n_heads, head_dim]
// Query i sees keys 0..n_past+i (causal, bottom-right aligned).
using PrefillAttentionFn = void (*)(const AttentionShape& shape, const float* q, const KvView& kv,
                                    int n_past, int n_new, float* out);

// Decode: one query for each of n_seqs sequences, each at the end of its cache.
// q       [n_seqs, n_heads, head_dim]
// kv      [n_seqs] views; lengths[s] positions valid (the query is at lengths[s]-1)
// out     [n_seqs, n_heads, head_dim]
using DecodeAttentionFn = void (*)(const AttentionShape& shape, const float* q,
                                   std::span<const KvView> kv, std::span<const int> lengths,
                                   float* out);

// The reference: scores for all visible keys, softmax, weighted sum of V, per
// head, in run.c's arithmetic.
void reference_prefill_attention(const AttentionShape& shape, const float* q, const KvView& kv,
                                 int n_past, int n_new, float* out);
void reference_decode_attention(const AttentionShape& shape, const float* q,
                                std::span<const KvView> kv, std::span<const int> lengths,
                                float* out);

struct AttentionKernels {
  PrefillAttentionFn prefill = reference_prefill_attention;
  DecodeAttentionFn decode = reference_decode_attention;

  // Step 06: whether these kernels read a cache of `element`. The reference
  // kernels read every element type (int8 rows dequantized with their
  // scales); any other kernel is taken to read fp32 rows (key_row), so a
  // model refuses to pair it with an int8 cache instead of reading int8
  // bytes as floats.
  bool reads(KvElement element) const {
    return element == KvElement::Float32 ||
           (prefill == reference_prefill_attention && decode == reference_decode_attention);
  }
};

}  // namespace cpu
}  // namespace llm
