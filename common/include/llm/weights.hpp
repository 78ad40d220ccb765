#pragma once
// ModelWeights: every tensor of the transformer, fp32, in llama2.c's layout.
// Matrices are row-major [out_features, in_features]: y = W x reads W's rows.
#include <vector>

#include "llm/config.hpp"

namespace llm {

struct LayerWeights {
  std::vector<float> attention_norm;  // [dim]            RMSNorm gain before attention
  std::vector<float> wq;              // [n_heads*head_dim, dim]
  std::vector<float> wk;              // [kv_dim, dim]
  std::vector<float> wv;              // [kv_dim, dim]
  std::vector<float> wo;              // [dim, n_heads*head_dim]
  std::vector<float> ffn_norm;        // [dim]            RMSNorm gain before the FFN
  std::vector<float> w1;              // [hidden_dim, dim]  gate projection
  std::vector<float> w2;              // [dim, hidden_dim]  down projection
  std::vector<float> w3;              // [hidden_dim, dim]  up projection
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> token_embedding;  // [vocab_size, dim]
  std::vector<LayerWeights> layers;    // [n_layers]
  std::vector<float> final_norm;       // [dim]
  std::vector<float> classifier;       // [vocab_size, dim]; empty when shared

  // The classifier matrix [vocab_size, dim]: the embedding when shared.
  const std::vector<float>& classifier_matrix() const {
    return config.shared_classifier ? token_embedding : classifier;
  }
  // Allocates every tensor with its shape (values zero) for `config`.
  static ModelWeights allocate(const ModelConfig& config);
};

// Seeded random weights for a preset. Scaled-normal init (std 1/sqrt(fan_in) for
// matrices, and the output projections scaled down by 1/sqrt(2 x layers) as in
// GPT-2) keeps the residual stream's RMS near 1 at every depth, so logits stay in
// a sane range and fp16 paths are meaningful. Norm gains are 1.
ModelWeights random_weights(const ModelConfig& config, unsigned long long seed);

}  // namespace llm
