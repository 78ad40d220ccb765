#include "llm/cpu_ops.hpp"

#include <Eigen/Core>

#include <cmath>

namespace llm::cpu {

void rmsnorm(float* out, const float* x, const float* weight, int size, float eps) {
  float sum_of_squares = 0.0f;
  for (int i = 0; i < size; ++i) sum_of_squares += x[i] * x[i];
  const float inv_rms = 1.0f / std::sqrt(sum_of_squares / static_cast<float>(size) + eps);
  for (int i = 0; i < size; ++i) out[i] = weight[i] * (inv_rms * x[i]);
}

RopeTable::RopeTable(int max_positions, int head_dim, float theta)
    : max_positions_(max_positions), half_(head_dim / 2) {
  cos_.resize(static_cast<std::size_t>(max_positions) * half_);
  sin_.resize(cos_.size());
  for (int pos = 0; pos < max_positions; ++pos) {
    for (int i = 0; i < half_; ++i) {
      // Pair i rotates at frequency theta^(-2i/head_dim): fast for the first
      // pairs, slow for the last. Computed in float, exactly as run.c does.
      const float freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
      const float angle = static_cast<float>(pos) * freq;
      cos_[static_cast<std::size_t>(pos) * half_ + i] = std::cos(angle);
      sin_[static_cast<std::size_t>(pos) * half_ + i] = std::sin(angle);
    }
  }
}

void rope(float* vec, int n_heads, int head_dim, int pos, const RopeTable& table) {
  const float* c = table.cos_row(pos);
  const float* s = table.sin_row(pos);
  for (int h = 0; h < n_heads; ++h) {
    float* head = vec + static_cast<std::size_t>(h) * head_dim;
    for (int i = 0; i < head_dim / 2; ++i) {
      // (x0, x1) as a complex number times e^{i angle}.
      const float x0 = head[2 * i], x1 = head[2 * i + 1];
      head[2 * i] = x0 * c[i] - x1 * s[i];
      head[2 * i + 1] = x0 * s[i] + x1 * c[i];
    }
  }
}

void swiglu(float* gate, const float* up, int size) {
  // silu(g) * up with Eigen's vectorized exp: a scalar expf per element costs
  // more than the FFN's products on a small model.
  Eigen::Map<Eigen::ArrayXf> g(gate, size);
  const Eigen::Map<const Eigen::ArrayXf> u(up, size);
  g = g * (1.0f / (1.0f + (-g).exp())) * u;
}

void add_inplace(float* x, const float* delta, int size) {
  for (int i = 0; i < size; ++i) x[i] += delta[i];
}

}  // namespace llm::cpu
