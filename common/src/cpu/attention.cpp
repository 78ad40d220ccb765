#include "llm/attention.hpp"

#include <cmath>
#include <cstring>
#include <vector>

namespace llm::cpu {
namespace {

// One query row (all heads) against keys 0..n_keys-1 of a view.
// q      [n_heads, head_dim]
// scores [n_heads, n_keys] scratch
// out    [n_heads, head_dim]
void attend_one_query(const AttentionShape& s, const float* q, const KvView& kv, int n_keys,
                      std::vector<float>& scores, float* out) {
  const int group = s.n_heads / s.n_kv_heads;
  const float scale = std::sqrt(static_cast<float>(s.head_dim));
  scores.resize(static_cast<std::size_t>(s.n_heads) * n_keys);

  // Scores, key-major: each cached row is looked up once for all heads.
  for (int t = 0; t < n_keys; ++t) {
    const float* key_row = kv.key_row(t);  // [n_kv_heads, head_dim]
    for (int h = 0; h < s.n_heads; ++h) {
      const float* qh = q + static_cast<std::size_t>(h) * s.head_dim;
      const float* kh = key_row + static_cast<std::size_t>(h / group) * s.head_dim;
      float dot = 0.0f;
      for (int i = 0; i < s.head_dim; ++i) dot += qh[i] * kh[i];
      scores[static_cast<std::size_t>(h) * n_keys + t] = dot / scale;
    }
  }
  // Softmax of each head's row (max subtracted first: exp never overflows).
  for (int h = 0; h < s.n_heads; ++h) {
    float* row = scores.data() + static_cast<std::size_t>(h) * n_keys;
    float max_score = row[0];
    for (int t = 1; t < n_keys; ++t) max_score = row[t] > max_score ? row[t] : max_score;
    float sum = 0.0f;
    for (int t = 0; t < n_keys; ++t) {
      row[t] = std::exp(row[t] - max_score);
      sum += row[t];
    }
    for (int t = 0; t < n_keys; ++t) row[t] /= sum;
  }
  // Weighted sum of values.
  std::memset(out, 0, sizeof(float) * static_cast<std::size_t>(s.n_heads) * s.head_dim);
  for (int t = 0; t < n_keys; ++t) {
    const float* value_row = kv.value_row(t);
    for (int h = 0; h < s.n_heads; ++h) {
      const float p = scores[static_cast<std::size_t>(h) * n_keys + t];
      const float* vh = value_row + static_cast<std::size_t>(h / group) * s.head_dim;
      float* oh = out + static_cast<std::size_t>(h) * s.head_dim;
      for (int i = 0; i < s.head_dim; ++i) oh[i] += p * vh[i];
    }
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
