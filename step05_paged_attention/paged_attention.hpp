#pragma once
// PagedAttention on the CPU: attention that reads K/V through a block table
// (which physical block of the pool holds positions 0..B-1, B..2B-1, ...),
// walking a sequence one KV block at a time:
//   1. look the physical block up in the table ONCE per block,
//   2. score the block's keys against the queries,
//   3. fold the scores into an online softmax (running max and sum per query
//      head; the accumulator is rescaled whenever the max grows),
//   4. accumulate the block's V rows weighted by the new probabilities.
// Each KV head's rows are read once for all the query heads of its group
// (GQA, step 03): query head h reads KV head h / (n_heads / n_kv_heads).
//
// A contiguous view (one block per sequence, block_size = capacity) goes
// through the same code: then there is a single lookup and the block is
// walked in tiles of a bounded number of keys: the baseline part 2
// (measure/kernel_overhead.hpp) compares paging with. docs/05, section 5.
// Both functions have exactly the semantics of common's reference kernels
// (llm::cpu::reference_decode_attention / reference_prefill_attention) and
// their hook signatures, so paged_cpu_attention() plugs into llm::CpuModel.
// They read fp32 views only: an int8 view (step 06) is an llm::InputError.
#include <span>

#include "llm/attention.hpp"
#include "llm/kv_cache.hpp"

namespace step05 {

// Decode: one query per sequence, each at the end of its cache.
// q       [n_seqs, n_heads, head_dim]  (already rotated by RoPE)
// kv      [n_seqs] fp32 views (host memory); lengths[s] >= 1 positions valid
// out     [n_seqs, n_heads, head_dim]
// Throws llm::InputError for an int8 view, a view whose kv_dim is not
// n_kv_heads * head_dim, a length < 1, or kv.size() != lengths.size().
void paged_decode_attention(const llm::AttentionShape& shape, const float* q, std::span<const llm::KvView> kv,
                            std::span<const int> lengths, float* out);

// Prefill: n_new queries of one sequence at positions n_past..n_past+n_new-1;
// query i sees keys 0..n_past+i (causal, bottom-right aligned).
// q, out  [n_new, n_heads, head_dim]
// kv      positions 0..n_past+n_new-1 valid
void paged_prefill_attention(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past,
                             int n_new, float* out);

// The CPU model's attention hook with both kernels above.
llm::cpu::AttentionKernels paged_cpu_attention();

}  // namespace step05
