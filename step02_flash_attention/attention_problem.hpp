#pragma once
// Step 02's vocabulary: one attention problem (shapes, causal or not), the
// arguments every variant receives, and the formulas the tables print (FLOPs,
// bytes of scores). Shared by the CPU and the CUDA variants.
//
// Layouts (row-major, one token per row, as in the model):
//   Q, O  [seqlen_q, n_heads,    head_dim]
//   K, V  [seqlen_k, n_kv_heads, head_dim]   (fp32 variants read them through a KvView)
// Query head h reads K/V head h / (n_heads / n_kv_heads) (GQA; 1:1 in the tables).
//
// Causal masking is aligned bottom-right, as in the model's prefill: the LAST
// query sees every key, so query i sits at position (seqlen_k - seqlen_q) + i
// and sees keys 0 .. (seqlen_k - seqlen_q) + i. With seqlen_q < seqlen_k that
// is "new tokens after a cached prefix"; with seqlen_q > seqlen_k the first
// seqlen_q - seqlen_k queries see no key at all and their output is defined
// as 0 (FlashAttention does the same).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "llm/attention.hpp"
#include "llm/harness/compare.hpp"
#include "llm/kv_cache.hpp"

namespace step02 {

struct AttentionProblem {
  int n_heads = 1;     // query heads
  int n_kv_heads = 1;  // K/V heads (n_heads % n_kv_heads == 0)
  int head_dim = 64;
  int seqlen_q = 1;    // queries
  int seqlen_k = 1;    // keys (and values)
  bool causal = true;

  int group() const { return n_heads / n_kv_heads; }
  int q_row() const { return n_heads * head_dim; }      // floats per query/output row
  int kv_row() const { return n_kv_heads * head_dim; }  // floats per key/value row
  std::size_t q_elements() const { return static_cast<std::size_t>(seqlen_q) * q_row(); }
  std::size_t kv_elements() const { return static_cast<std::size_t>(seqlen_k) * kv_row(); }

  // Keys query i may see: 0 .. last_visible_key(i) (-1: none). Non-causal:
  // every key.
  int last_visible_key(int i) const {
    return causal ? std::min(seqlen_k - 1, seqlen_k - seqlen_q + i) : seqlen_k - 1;
  }
  // (query, key) pairs that are not masked, per head.
  std::int64_t visible_pairs() const;
  // Useful FLOPs: 2*d for q.k plus 2*d for p*v per visible pair, per head:
  //   4 * head_dim * n_heads * visible_pairs
  // (= 4*Sq*Sk*d*heads without a mask; about half of it when causal and Sq = Sk).
  // Every variant is credited with the same count, so a variant that computes
  // masked scores anyway (the naive ones) shows a lower TFLOP/s.
  double flops() const { return 4.0 * head_dim * n_heads * static_cast<double>(visible_pairs()); }

  std::string describe() const;  // "Sq 1024, Sk 1024, 8 heads (8 KV), d 64, causal"
  void validate() const;         // throws llm::InputError naming the first bad field
};

// What a variant receives. CPU variants get host pointers, CUDA variants
// device pointers (the KvView's pool and block table included); a variant uses
// the inputs of its own precision.
struct AttentionArgs {
  const float* q = nullptr;           // [seqlen_q, n_heads, head_dim] fp32
  llm::KvView kv;                     // K/V fp32: positions 0..seqlen_k-1, rows of kv_row() floats
  const std::uint16_t* q16 = nullptr;  // [seqlen_q, n_heads, head_dim]    fp16 or bf16 bits (16-bit variants)
  const std::uint16_t* k16 = nullptr;  // [seqlen_k, n_kv_heads, head_dim] fp16 or bf16 bits
  const std::uint16_t* v16 = nullptr;  // [seqlen_k, n_kv_heads, head_dim] fp16 or bf16 bits
  float* out = nullptr;               // [seqlen_q, n_heads, head_dim] fp32 (every variant but those below)
  std::uint16_t* out16 = nullptr;     // [seqlen_q, n_heads, head_dim] in the variant's 16-bit type
                                      // (the variants whose AttentionKernel::writes_16bit_output is set)
  void* workspace = nullptr;          // scratch of the variant's workspace_bytes(problem) (device memory on CUDA)
  void* stream = nullptr;             // cudaStream_t for CUDA variants (nullptr: the default stream)
};

// The model's prefill hook as one problem: n_new queries of one sequence at
// positions n_past.. against keys 0..n_past+n_new-1, causal. With Sq = n_new
// and Sk = n_past + n_new, the bottom-right rule gives query i the keys
// 0..Sk-Sq+i = 0..n_past+i: exactly the model's causal mask.
// q, out [n_new, n_heads, head_dim]; kv as the model hands it over.
struct PrefillCall {
  AttentionProblem problem;
  AttentionArgs args;
};
PrefillCall prefill_call(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past,
                         int n_new, float* out);

// A KvView over plain contiguous K and V buffers [seqlen, kv_row]: one block
// as long as the sequence. `block_table` must point at a single 0 (and, for a
// CUDA kernel, be device memory).
llm::KvView contiguous_kv_view(float* keys, float* values, int seqlen, int kv_row, const std::int32_t* block_table);

// Softmax scale 1/sqrt(head_dim), as the model uses it.
float softmax_scale(int head_dim);

}  // namespace step02
