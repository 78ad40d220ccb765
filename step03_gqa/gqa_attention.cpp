#include "step03_gqa/gqa_attention.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llm/errors.hpp"
#include "llm/exercise.hpp"
#include "step03_gqa/cuda_gqa_attention.hpp"

namespace step03 {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// [rows, head_dim] of one KV head, read in place from the cache: consecutive
// positions are kv_dim floats apart (the other KV heads sit in between).
using CachedRows = Eigen::Map<const RowMajorMatrix, 0, Eigen::OuterStride<>>;

void check_shape(const llm::AttentionShape& s) {
  if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 || s.n_heads % s.n_kv_heads != 0)
    throw llm::InputError("GQA attention needs n_heads a positive multiple of n_kv_heads (got " +
                          std::to_string(s.n_heads) + " query heads, " + std::to_string(s.n_kv_heads) + " KV heads)");
}

// Positions t0.. that sit next to each other in memory: the rest of t0's
// block (the whole sequence when the cache is contiguous).
int contiguous_rows(const llm::KvView& kv, int t0, int n_keys) {
  return std::min(kv.block_size - t0 % kv.block_size, n_keys - t0);
}

// Keys per tile of the two products. The cache stores a position's K (and V)
// rows of all KV heads side by side ([pos, kv_head, head_dim]), so the loops
// walk the cache tile by tile and, inside a tile, KV head by KV head: memory
// is read in address order (what the hardware prefetcher streams best), and a
// tile of one head (64 x 128 floats = 32 KiB) sits in L1/L2 while its whole
// group uses it. On the course's test machine this order was clearly faster
// than "all keys of one head, then the next head", whose stride of kv_dim
// floats between rows defeats the prefetcher.
constexpr int kKeysPerTile = 64;

// scores as a [n_keys, group] column-major matrix of query heads
// first..first+group-1 of a [n_heads, n_keys] row-major buffer: the same
// floats, transposed view, columns n_keys apart.
using ScoreColumns = Eigen::Map<Eigen::MatrixXf, 0, Eigen::OuterStride<>>;

// One sequence's query (all heads) against keys 0..n_keys-1, group-aware.
// q      [n_heads, head_dim]
// scores [n_heads, n_keys] scratch
// out    [n_heads, head_dim]
//
// Both products are written transposed, with the long dimension (keys, or
// head_dim) first: scores^T [rows, group] = K [rows, hd] x Q^T [hd, group]
// and out^T [hd, group] += V^T [hd, rows] x P^T [rows, group]. A row-major
// [group, n] matrix is the same memory as a column-major [n, group] one, so
// nothing is copied; Eigen's product kernel vectorizes along the first
// dimension, which is why it should be the long one. For group 1 both become
// matrix-vector products, exactly what MHA attention does per head.
void attend_grouped(const llm::AttentionShape& s, const float* q, const llm::KvView& kv, int n_keys,
                    std::vector<float>& scores, float* out) {
  const int group = s.n_heads / s.n_kv_heads;  // query heads sharing one KV head
  const int hd = s.head_dim;
  // Divide by sqrt(head_dim) (not multiply by its inverse) as the reference
  // does, so both round the same way.
  const float scale = std::sqrt(static_cast<float>(hd));
  scores.resize(static_cast<std::size_t>(s.n_heads) * n_keys);
  Eigen::Map<RowMajorMatrix> all_scores(scores.data(), s.n_heads, n_keys);  // [n_heads, n_keys]
  // scores[h, t] = q_h . k_t (divided by sqrt(head_dim) just after). Each K
  // row of a head is loaded once and used by all `group` queries:
  // [rows, hd] x [hd, group].
  // BEGIN EXERCISE ex03.1
  auto group_scores = [&](int kv_head) {  // [n_keys, group] view of this KV head's query rows
    return ScoreColumns(scores.data() + static_cast<std::size_t>(kv_head) * group * n_keys, n_keys, group,
                        Eigen::OuterStride<>(n_keys));
  };
  // The query heads of KV head j are j*group .. j*group+group-1: adjacent
  // rows of q (and of out), so they form one [group, head_dim] matrix in place.
  auto group_queries = [&](int kv_head) {  // [group, hd]
    return Eigen::Map<const RowMajorMatrix>(q + static_cast<std::size_t>(kv_head) * group * hd, group, hd);
  };
  for (int t0 = 0; t0 < n_keys;) {
    const int rows = std::min(kKeysPerTile, contiguous_rows(kv, t0, n_keys));
    for (int kv_head = 0; kv_head < s.n_kv_heads; ++kv_head) {
      const CachedRows keys(kv.key_row(t0) + kv_head * hd, rows, hd, Eigen::OuterStride<>(kv.kv_dim));  // [rows, hd]
      group_scores(kv_head).middleRows(t0, rows).noalias() = keys * group_queries(kv_head).transpose();
    }
    t0 += rows;
  }
  // END EXERCISE ex03.1
  all_scores /= scale;
  // Softmax of each query head's row, max subtracted first so exp() never
  // overflows (the reference's arithmetic).
  for (int h = 0; h < s.n_heads; ++h) {
    auto row = all_scores.row(h).array();
    row = (row - row.maxCoeff()).exp();
    row /= row.sum();
  }
  // out[h, :] = sum_t p[h, t] v_t: again each V row read once for the group:
  // out^T [hd, group] += V^T [hd, rows] x P^T [rows, group].
  // BEGIN EXERCISE ex03.1
  std::memset(out, 0, sizeof(float) * static_cast<std::size_t>(s.n_heads) * hd);
  for (int t0 = 0; t0 < n_keys;) {
    const int rows = std::min(kKeysPerTile, contiguous_rows(kv, t0, n_keys));
    for (int kv_head = 0; kv_head < s.n_kv_heads; ++kv_head) {
      const CachedRows values(kv.value_row(t0) + kv_head * hd, rows, hd, Eigen::OuterStride<>(kv.kv_dim));  // [rows, hd]
      Eigen::Map<Eigen::MatrixXf> group_out_t(out + static_cast<std::size_t>(kv_head) * group * hd, hd, group);  // = out rows [group, hd]
      group_out_t.noalias() += values.transpose() * group_scores(kv_head).middleRows(t0, rows);
    }
    t0 += rows;
  }
  // END EXERCISE ex03.1
}

// Copies K and V of positions 0..length-1 into MHA layout: query head h gets
// its own copy of KV head h / group.
// expanded_keys, expanded_values [length, n_heads, head_dim]
void repeat_kv_heads(const llm::AttentionShape& s, const llm::KvView& kv, int length, float* expanded_keys,
                     float* expanded_values) {
  const int group = s.n_heads / s.n_kv_heads;
  const std::size_t hd = static_cast<std::size_t>(s.head_dim);
  const std::size_t row_floats = static_cast<std::size_t>(s.n_heads) * hd;
  for (int t = 0; t < length; ++t) {
    const float* key_row = kv.key_row(t);      // [n_kv_heads, hd]
    const float* value_row = kv.value_row(t);  // [n_kv_heads, hd]
    for (int h = 0; h < s.n_heads; ++h) {
      const std::size_t from = static_cast<std::size_t>(h / group) * hd;
      const std::size_t to = t * row_floats + h * hd;
      std::memcpy(expanded_keys + to, key_row + from, hd * sizeof(float));
      std::memcpy(expanded_values + to, value_row + from, hd * sizeof(float));
    }
  }
}

}  // namespace

void group_aware_decode_attention(const llm::AttentionShape& shape, const float* q, std::span<const llm::KvView> kv,
                                  std::span<const int> lengths, float* out) {
  check_shape(shape);
  thread_local std::vector<float> scores;  // [n_heads, length] reused across calls
  const std::size_t row = static_cast<std::size_t>(shape.n_heads) * shape.head_dim;
  for (std::size_t s = 0; s < kv.size(); ++s) attend_grouped(shape, q + s * row, kv[s], lengths[s], scores, out + s * row);
}

void repeat_kv_decode_attention(const llm::AttentionShape& shape, const float* q, std::span<const llm::KvView> kv,
                                std::span<const int> lengths, float* out) {
  check_shape(shape);
  // The expanded copies are reused across calls (as PyTorch's caching
  // allocator reuses the tensor repeat_kv returns), so a timed call pays for
  // the copy and the reads, not for fresh pages from the OS.
  thread_local std::vector<float> expanded_keys;    // [length, n_heads, head_dim]
  thread_local std::vector<float> expanded_values;  // [length, n_heads, head_dim]
  thread_local std::vector<float> scores;           // [n_heads, length]
  const std::size_t row = static_cast<std::size_t>(shape.n_heads) * shape.head_dim;
  // After the copy every query head has a KV head of its own: plain MHA.
  const llm::AttentionShape mha{shape.n_heads, shape.n_heads, shape.head_dim};
  const std::int32_t single_block = 0;
  for (std::size_t s = 0; s < kv.size(); ++s) {
    const int length = lengths[s];
    const std::size_t floats = static_cast<std::size_t>(length) * row;
    if (expanded_keys.size() < floats) {
      expanded_keys.resize(floats);
      expanded_values.resize(floats);
    }
    repeat_kv_heads(shape, kv[s], length, expanded_keys.data(), expanded_values.data());
    // A view of the copy: one block holding all `length` rows of n_heads*head_dim.
    llm::KvView expanded;
    expanded.keys = expanded_keys.data();
    expanded.values = expanded_values.data();
    expanded.block_table = &single_block;
    expanded.block_size = std::max(length, 1);
    expanded.kv_dim = static_cast<int>(row);
    attend_grouped(mha, q + s * row, expanded, length, scores, out + s * row);
  }
}

const std::vector<llm::Variant<DecodeAttentionFns>>& variants() {
  static const std::vector<llm::Variant<DecodeAttentionFns>> table = {
      {0, "repeat_kv", "expand K/V to every query head, then MHA: reads n_heads copies", llm::Backend::Any,
       {&repeat_kv_decode_attention, &repeat_kv_decode_attention_cuda}},
      {1, "group_aware", "each KV head read once for all the query heads of its group", llm::Backend::Any,
       {&group_aware_decode_attention, &group_aware_decode_attention_cuda}},
  };
  return table;
}

}  // namespace step03
