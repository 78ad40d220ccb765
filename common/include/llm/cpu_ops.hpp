#pragma once
// The element-wise and row-wise operations of the transformer on the CPU,
// written as plain loops in the same float arithmetic as llama2.c's run.c, so
// the reference reproduces its greedy text token for token.
#include <span>
#include <vector>

namespace llm::cpu {

// out[i] = weight[i] * x[i] / sqrt(mean(x^2) + eps) over one row of `size`.
void rmsnorm(float* out, const float* x, const float* weight, int size, float eps);

// Table of RoPE rotations: cos/sin of pos * theta^(-2i/head_dim) for every
// position and pair i; computed in float as run.c does.
struct RopeTable {
  RopeTable(int max_positions, int head_dim, float theta);
  const float* cos_row(int pos) const { return cos_.data() + static_cast<std::size_t>(pos) * half_; }
  const float* sin_row(int pos) const { return sin_.data() + static_cast<std::size_t>(pos) * half_; }
  int max_positions() const { return max_positions_; }
  int head_dim() const { return 2 * half_; }

 private:
  int max_positions_;
  int half_;                // head_dim / 2 rotation pairs
  std::vector<float> cos_;  // [max_positions, head_dim/2]
  std::vector<float> sin_;  // [max_positions, head_dim/2]
};

// Rotates adjacent pairs (x[2i], x[2i+1]) of every head of one row by the
// position's angle: vec [n_heads, head_dim].
void rope(float* vec, int n_heads, int head_dim, int pos, const RopeTable& table);

// x[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). In place on gate.
void swiglu(float* gate, const float* up, int size);

// x += delta over `size` values (residual connection).
void add_inplace(float* x, const float* delta, int size);

}  // namespace llm::cpu
