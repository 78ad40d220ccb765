#pragma once
// The oracle: attention in float64 with plain loops, one query row at a time,
// straight from the definition softmax(q K^T / sqrt(d)) V. Slow on purpose
// (no tiling, no tricks); the checks compute it for a sample of query rows
// when a problem is large.
#include <span>
#include <vector>

#include "step02_flash_attention/attention_problem.hpp"

namespace step02 {

// Query rows to check: all of them when seqlen_q <= max_rows, else max_rows
// rows evenly spaced, always including the first and the last.
std::vector<int> rows_to_check(const AttentionProblem& p, int max_rows);

// Reference output of the given query rows, in float64, rounded to float.
// q [seqlen_q, q_row], k and v [seqlen_k, kv_row] (contiguous host memory)
// returns [rows.size(), q_row]; a row that sees no key is 0.
std::vector<float> reference_attention_f64(const AttentionProblem& p, std::span<const float> q,
                                           std::span<const float> k, std::span<const float> v,
                                           std::span<const int> rows);

// The same rows picked out of a full output [seqlen_q, q_row].
std::vector<float> select_rows(const AttentionProblem& p, std::span<const float> out, std::span<const int> rows);

}  // namespace step02
