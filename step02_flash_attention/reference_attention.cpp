#include "step02_flash_attention/reference_attention.hpp"

#include <cmath>
#include <limits>

namespace step02 {

std::vector<int> rows_to_check(const AttentionProblem& p, int max_rows) {
  std::vector<int> rows;
  if (p.seqlen_q <= max_rows) {
    for (int i = 0; i < p.seqlen_q; ++i) rows.push_back(i);
    return rows;
  }
  for (int r = 0; r < max_rows; ++r)
    rows.push_back(static_cast<int>(static_cast<long long>(r) * (p.seqlen_q - 1) / (max_rows - 1)));
  return rows;
}

std::vector<float> reference_attention_f64(const AttentionProblem& p, std::span<const float> q,
                                           std::span<const float> k, std::span<const float> v,
                                           std::span<const int> rows) {
  const int d = p.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<float> out(rows.size() * static_cast<std::size_t>(p.q_row()), 0.0f);
  std::vector<double> scores(static_cast<std::size_t>(p.seqlen_k));  // [seqlen_k] one row of S
  std::vector<double> acc(static_cast<std::size_t>(d));              // [head_dim]
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const int i = rows[r];
    const int n_keys = p.last_visible_key(i) + 1;  // keys 0..n_keys-1
    if (n_keys <= 0) continue;                     // sees nothing: output stays 0
    for (int h = 0; h < p.n_heads; ++h) {
      const int kvh = h / p.group();
      const float* qh = q.data() + static_cast<std::size_t>(i) * p.q_row() + static_cast<std::size_t>(h) * d;
      double max_score = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < n_keys; ++j) {
        const float* kj = k.data() + static_cast<std::size_t>(j) * p.kv_row() + static_cast<std::size_t>(kvh) * d;
        double dot = 0.0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(qh[c]) * kj[c];
        scores[j] = dot * scale;
        max_score = std::max(max_score, scores[j]);
      }
      double sum = 0.0;
      for (int j = 0; j < n_keys; ++j) sum += scores[j] = std::exp(scores[j] - max_score);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = 0; j < n_keys; ++j) {
        const float* vj = v.data() + static_cast<std::size_t>(j) * p.kv_row() + static_cast<std::size_t>(kvh) * d;
        for (int c = 0; c < d; ++c) acc[c] += scores[j] * vj[c];
      }
      float* o = out.data() + r * p.q_row() + static_cast<std::size_t>(h) * d;
      for (int c = 0; c < d; ++c) o[c] = static_cast<float>(acc[c] / sum);
    }
  }
  return out;
}

std::vector<float> select_rows(const AttentionProblem& p, std::span<const float> out, std::span<const int> rows) {
  std::vector<float> picked;
  picked.reserve(rows.size() * static_cast<std::size_t>(p.q_row()));
  for (int i : rows) {
    const auto begin = out.begin() + static_cast<std::ptrdiff_t>(i) * p.q_row();
    picked.insert(picked.end(), begin, begin + p.q_row());
  }
  return picked;
}

}  // namespace step02
