#pragma once
// Step 03's two decode-attention variants on the CPU, both in the shape of
// common's hook llm::cpu::DecodeAttentionFn (one query per sequence, K/V read
// through llm::KvView), so either can be plugged into llm::CpuModel.
//
// With grouped-query attention, `group = n_heads / n_kv_heads` query heads
// share one K/V head: query head h reads KV head h / group. The two variants
// compute the same numbers and differ only in how often they read the cache:
//
//   repeat_kv    copies every KV head `group` times into an MHA-shaped buffer
//                [length, n_heads, head_dim] (HF transformers' `repeat_kv`),
//                then runs plain per-head attention on it. It reads n_heads
//                copies of K and V, exactly as much as MHA: the saving of GQA
//                is thrown away (and the copy costs extra on top).
//   group_aware  for each KV head, loads its K rows once and scores all the
//                `group` query heads of that head against them as one small
//                product [group, head_dim] x [head_dim, rows]; the same for V.
//                Bytes read from the cache: n_kv_heads / n_heads of MHA's.
#include <span>
#include <vector>

#include "llm/attention.hpp"
#include "llm/harness/variant.hpp"
#include "llm/kv_cache.hpp"

namespace step03 {

// q    [n_seqs, n_heads, head_dim]  (already rotated by RoPE)
// kv   [n_seqs] views; lengths[s] positions valid (the query sits at lengths[s]-1)
// out  [n_seqs, n_heads, head_dim]
void repeat_kv_decode_attention(const llm::AttentionShape& shape, const float* q, std::span<const llm::KvView> kv,
                                std::span<const int> lengths, float* out);
void group_aware_decode_attention(const llm::AttentionShape& shape, const float* q,
                                  std::span<const llm::KvView> kv, std::span<const int> lengths, float* out);

// The CUDA twins live in cuda_gqa_attention.hpp (same names, device memory).
// A variant is one row with a function per device; in a build without CUDA the
// CUDA functions throw llm::DeviceError.
struct CudaDecodeWorkspace;
// One sequence on the GPU. q, out [n_heads, head_dim] and kv's pointers are
// device memory; `length` positions of kv are valid.
using CudaDecodeAttentionFn = void (*)(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv,
                                       int length, float* out, const CudaDecodeWorkspace& workspace);

struct DecodeAttentionFns {
  llm::cpu::DecodeAttentionFn cpu;
  CudaDecodeAttentionFn cuda;
};

// The step's variant table: id 0 repeat_kv (the naive baseline), id 1 group_aware.
const std::vector<llm::Variant<DecodeAttentionFns>>& variants();

}  // namespace step03
