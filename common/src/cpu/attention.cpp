#include "llm/attention.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "llm/kv_int8.hpp"  // dequantize_int8_row

namespace llm::cpu {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// A [rows, head_dim] slice of cached K or V rows: consecutive rows are kv_dim
// floats apart (the other KV heads sit in between).
using CachedRows = Eigen::Map<const RowMajorMatrix, 0, Eigen::OuterStride<>>;

// Positions t0.. that sit next to each other in memory: the rest of t0's
// block (the whole sequence when the cache is contiguous).
int contiguous_rows(const KvView& kv, int t0, int n_keys) {
  return std::min(kv.block_size - t0 % kv.block_size, n_keys - t0);
}

// Rows t0..t0+rows-1 of K (or V) as fp32, [rows, kv_dim]: the cache's own
// memory for a Float32 view (no copy), else dequantized into `scratch`.
enum class Pool { Keys, Values };
const float* rows_as_float(const KvView& kv, Pool pool, int t0, int rows, std::vector<float>& scratch) {
  if (kv.element == KvElement::Float32) return pool == Pool::Keys ? kv.key_row(t0) : kv.value_row(t0);
  scratch.resize(static_cast<std::size_t>(rows) * kv.kv_dim);
  for (int t = 0; t < rows; ++t) {
    const int pos = t0 + t;
    float* out = scratch.data() + static_cast<std::size_t>(t) * kv.kv_dim;
    if (pool == Pool::Keys)
      dequantize_int8_row(kv.key_row_int8(pos), kv.key_row_scales(pos), kv.kv_dim, kv.head_dim, out);
    else
      dequantize_int8_row(kv.value_row_int8(pos), kv.value_row_scales(pos), kv.kv_dim, kv.head_dim, out);
  }
  return scratch.data();
}

// One query row (all heads) against keys 0..n_keys-1 of a view.
// q      [n_heads, head_dim]
// scores [n_heads, n_keys] scratch
// out    [n_heads, head_dim]
// The two products (K q and V^T p) are Eigen matrix-vector products over each
// run of contiguous cached rows; the softmax in between is written out.
void attend_one_query(const AttentionShape& s, const float* q, const KvView& kv, int n_keys,
                      std::vector<float>& scores, float* out) {
  const int group = s.n_heads / s.n_kv_heads;  // query heads sharing one KV head
  const int hd = s.head_dim;
  const float scale = std::sqrt(static_cast<float>(hd));
  scores.resize(static_cast<std::size_t>(s.n_heads) * n_keys);
  thread_local std::vector<float> dequantized;  // [rows, kv_dim] of an int8 run

  // scores[h, t] = q_h . k_t / sqrt(head_dim), for the rows of each block.
  for (int t0 = 0; t0 < n_keys;) {
    const int rows = contiguous_rows(kv, t0, n_keys);
    const float* k0 = rows_as_float(kv, Pool::Keys, t0, rows, dequantized);  // [rows, kv_dim]
    for (int h = 0; h < s.n_heads; ++h) {
      const CachedRows k(k0 + (h / group) * hd, rows, hd, Eigen::OuterStride<>(kv.kv_dim));  // [rows, hd]
      const Eigen::Map<const Eigen::VectorXf> qh(q + static_cast<std::size_t>(h) * hd, hd);
      Eigen::Map<Eigen::VectorXf> sh(scores.data() + static_cast<std::size_t>(h) * n_keys + t0, rows);
      sh.noalias() = k * qh;
      sh /= scale;
    }
    t0 += rows;
  }
  // Softmax of each head's row; the max is subtracted first so exp() never
  // overflows. Eigen's array exp() is vectorized (a scalar expf per score
  // would cost more than the products).
  for (int h = 0; h < s.n_heads; ++h) {
    Eigen::Map<Eigen::ArrayXf> row(scores.data() + static_cast<std::size_t>(h) * n_keys, n_keys);
    row = (row - row.maxCoeff()).exp();
    row /= row.sum();
  }
  // out_h = sum_t p[h, t] v_t
  std::memset(out, 0, sizeof(float) * static_cast<std::size_t>(s.n_heads) * hd);
  for (int t0 = 0; t0 < n_keys;) {
    const int rows = contiguous_rows(kv, t0, n_keys);
    const float* v0 = rows_as_float(kv, Pool::Values, t0, rows, dequantized);  // [rows, kv_dim]
    for (int h = 0; h < s.n_heads; ++h) {
      const CachedRows v(v0 + (h / group) * hd, rows, hd, Eigen::OuterStride<>(kv.kv_dim));  // [rows, hd]
      const Eigen::Map<const Eigen::VectorXf> ph(scores.data() + static_cast<std::size_t>(h) * n_keys + t0, rows);
      Eigen::Map<Eigen::VectorXf> oh(out + static_cast<std::size_t>(h) * hd, hd);
      oh.noalias() += v.transpose() * ph;
    }
    t0 += rows;
  }
}

}  // namespace

void reference_prefill_attention(const AttentionShape& shape, const float* q, const KvView& kv, int n_past,
                                 int n_new, float* out) {
  thread_local std::vector<float> scores;
  const std::size_t row = static_cast<std::size_t>(shape.n_heads) * shape.head_dim;
  for (int i = 0; i < n_new; ++i) {
    // Causal, bottom-right aligned: query i sits at position n_past + i and
    // sees keys 0..n_past+i.
    attend_one_query(shape, q + i * row, kv, n_past + i + 1, scores, out + i * row);
  }
}

void reference_decode_attention(const AttentionShape& shape, const float* q, std::span<const KvView> kv,
                                std::span<const int> lengths, float* out) {
  thread_local std::vector<float> scores;
  const std::size_t row = static_cast<std::size_t>(shape.n_heads) * shape.head_dim;
  for (std::size_t s = 0; s < kv.size(); ++s) attend_one_query(shape, q + s * row, kv[s], lengths[s], scores, out + s * row);
}

}  // namespace llm::cpu
