// Variant 0: the textbook algorithm, one head at a time.
//   S = Q K^T / sqrt(d)      [Sq, Sk]  written to memory in full
//   P = softmax(mask(S))     [Sq, Sk]  read and written again
//   O = P V                  [Sq, d]   S read a third time
// For Sq = Sk = 4096 that is 64 MiB of scores per head: far more than any
// cache, so the passes over S run at memory speed, and the masked upper
// triangle is computed (and multiplied by zero) anyway.
#include <Eigen/Core>

#include <vector>

#include "step02_flash_attention/cpu_attention.hpp"

namespace step02::cpu {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using StridedRows = Eigen::Map<const RowMajorMatrix, 0, Eigen::OuterStride<>>;
using StridedRowsOut = Eigen::Map<RowMajorMatrix, 0, Eigen::OuterStride<>>;

}  // namespace

void naive_attention(const AttentionProblem& p, const AttentionArgs& args) {
  const int d = p.head_dim;
  // Reused across calls (and heads), so a timed run allocates nothing.
  thread_local RowMajorMatrix scores;  // [Sq, Sk]  S, then P in place
  thread_local RowMajorMatrix keys;    // [Sk, d]   this head's K, contiguous
  thread_local RowMajorMatrix values;  // [Sk, d]   this head's V, contiguous
  scores.resize(p.seqlen_q, p.seqlen_k);
  keys.resize(p.seqlen_k, d);
  values.resize(p.seqlen_k, d);
  const float scale = softmax_scale(d);

  for (int h = 0; h < p.n_heads; ++h) {
    const int kv_head = h / p.group();
    // Gather this head's K and V rows through the view (the cache may be paged).
    for (int t = 0; t < p.seqlen_k; ++t) {
      keys.row(t) = Eigen::Map<const Eigen::RowVectorXf>(args.kv.key_row(t) + kv_head * d, d);
      values.row(t) = Eigen::Map<const Eigen::RowVectorXf>(args.kv.value_row(t) + kv_head * d, d);
    }
    const StridedRows q_head(args.q + h * d, p.seqlen_q, d, Eigen::OuterStride<>(p.q_row()));  // [Sq, d]

    // S = Q K^T * scale: every (query, key) pair, masked or not.
    scores.noalias() = q_head * keys.transpose();
    scores *= scale;

    // Mask + softmax per row. Query i sees keys 0..last; the rest get
    // probability exactly 0 (the mask), a row with no visible key is all 0.
    for (int i = 0; i < p.seqlen_q; ++i) {
      const int visible = p.last_visible_key(i) + 1;
      auto row = scores.row(i);
      if (visible > 0) {
        auto seen = row.head(visible).array();
        seen = (seen - seen.maxCoeff()).exp();  // max subtracted first: exp never overflows
        seen /= seen.sum();
      }
      row.tail(p.seqlen_k - std::max(visible, 0)).setZero();
    }

    // O = P V (the zeros of the mask multiplied too).
    StridedRowsOut out_head(args.out + h * d, p.seqlen_q, d, Eigen::OuterStride<>(p.q_row()));  // [Sq, d]
    out_head.noalias() = scores * values;
  }
}

std::size_t naive_score_bytes(const AttentionProblem& p) {
  return static_cast<std::size_t>(p.seqlen_q) * p.seqlen_k * sizeof(float);
}

void naive_prefill(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past, int n_new,
                   float* out) {
  const PrefillCall call = prefill_call(shape, q, kv, n_past, n_new, out);
  naive_attention(call.problem, call.args);
}

}  // namespace step02::cpu
