#pragma once
// Step 02's CPU variants (single-threaded), and the adapters that plug them
// into the model through the attention hook (llm::cpu::PrefillAttentionFn).
#include <cstddef>

#include "llm/attention.hpp"
#include "step02_flash_attention/attention_problem.hpp"

namespace step02::cpu {

// Variant 0, the naive reference: for each head, materialize the whole score
// matrix S = Q K^T / sqrt(d)  [seqlen_q, seqlen_k], mask it, softmax each row,
// then O = P V. Eigen does the two products. Extra memory: S, Sq*Sk floats
// (one head at a time), plus a contiguous copy of that head's K and V.
void naive_attention(const AttentionProblem& p, const AttentionArgs& args);
std::size_t naive_score_bytes(const AttentionProblem& p);

// Variant 1, FlashAttention: the same result without ever holding S. Queries
// go in blocks of kBlockRows, keys in blocks of kBlockCols; each query row
// keeps a running max m and running sum l of its softmax and an unnormalized
// output that is rescaled by exp(m_old - m_new) whenever the max grows
// (online softmax). The algorithm is plain loops; the two tile products go
// through Eigen like variant 0's. Extra memory: one Br x Bc score tile and
// the running (m, l) of every query row of the head.
inline constexpr int kBlockRows = 128;  // Br: query rows per block
inline constexpr int kBlockCols = 128;  // Bc: keys per block
// 128 x 128: the score tile (64 KiB) plus the Q, K, V and O tiles (32 KiB each
// at d = 64) fit in a core's L2 (1-2 MiB) with room to spare. Smaller tiles
// (64 x 64) were slower on the course's CPU: each tile product then is too
// small for Eigen to run at full speed. The price:
// causal masking skips whole tiles only, so coarser tiles skip a bit less.
void flash_attention(const AttentionProblem& p, const AttentionArgs& args);
std::size_t flash_score_bytes(const AttentionProblem& p);

// The model's hook (causal prefill of n_new queries after n_past cached
// positions), reading K/V from the model's cache through the KvView.
void naive_prefill(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past, int n_new,
                   float* out);
void flash_prefill(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past, int n_new,
                   float* out);

}  // namespace step02::cpu
