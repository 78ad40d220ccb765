#include "llm/weights.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "llm/parallel_for.hpp"

namespace llm {
namespace {

// Models of 2^24 parameters and more (the GPU presets; every model the CPU
// results were measured on is smaller) have their tensors zeroed and filled
// on every core.
bool set_up_on_every_core(const ModelConfig& config) {
  return config.parameter_count() >= (std::size_t{1} << 24);
}

}  // namespace

ModelWeights ModelWeights::allocate(const ModelConfig& c) {
  c.validate();
  const std::size_t d = c.dim, h = c.hidden_dim, v = c.vocab_size;
  const std::size_t q_width = static_cast<std::size_t>(c.n_heads) * c.head_dim();
  const std::size_t kv = c.kv_dim();
  ModelWeights w;
  w.config = c;
  w.layers.resize(static_cast<std::size_t>(c.n_layers));
  // Every tensor and its size. [tensors]
  std::vector<std::pair<std::vector<float>*, std::size_t>> tensors = {{&w.token_embedding, v * d},
                                                                     {&w.final_norm, d}};
  if (!c.shared_classifier) tensors.push_back({&w.classifier, v * d});
  for (auto& layer : w.layers) {
    tensors.push_back({&layer.attention_norm, d});
    tensors.push_back({&layer.wq, q_width * d});
    tensors.push_back({&layer.wk, kv * d});
    tensors.push_back({&layer.wv, kv * d});
    tensors.push_back({&layer.wo, d * q_width});
    tensors.push_back({&layer.ffn_norm, d});
    tensors.push_back({&layer.w1, h * d});
    tensors.push_back({&layer.w2, d * h});
    tensors.push_back({&layer.w3, h * d});
  }
  // Zeroing is the first touch of every page, which the OS backs with memory
  // one page fault at a time: a GPU preset's gigabytes are zeroed on every core.
  parallel_for(
      tensors.size(), [&](std::size_t index) { tensors[index].first->assign(tensors[index].second, 0.0f); },
      set_up_on_every_core(c) ? 0 : 1);
  return w;
}

ModelWeights random_weights(const ModelConfig& config, unsigned long long seed) {
  ModelWeights w = ModelWeights::allocate(config);
  // The matrices to fill, in a fixed order, each with its standard deviation.
  struct Fill {
    std::vector<float>* tensor;
    double stddev;
  };
  std::vector<Fill> fills;
  const double d = config.dim, h = config.hidden_dim;
  // Residual branches add into the stream 2 x n_layers times; scaling their
  // output projections by 1/sqrt(2 n_layers) keeps the stream's variance O(1).
  const double residual_scale = 1.0 / std::sqrt(2.0 * config.n_layers);
  // The final RMSNorm hands the classifier a row of RMS 1, so logits have std
  // (classifier std) x sqrt(dim). Untied: embedding rows of RMS 1 and a
  // classifier of std 1/sqrt(dim) (logit std ~1). Tied (the same matrix does
  // both jobs): std 2/sqrt(dim), logit std ~2, peaked but not one-hot.
  fills.push_back({&w.token_embedding, config.shared_classifier ? 2.0 / std::sqrt(d) : 1.0});
  for (auto& layer : w.layers) {
    std::fill(layer.attention_norm.begin(), layer.attention_norm.end(), 1.0f);
    std::fill(layer.ffn_norm.begin(), layer.ffn_norm.end(), 1.0f);
    fills.push_back({&layer.wq, 1.0 / std::sqrt(d)});
    fills.push_back({&layer.wk, 1.0 / std::sqrt(d)});
    fills.push_back({&layer.wv, 1.0 / std::sqrt(d)});
    fills.push_back({&layer.wo, residual_scale / std::sqrt(d)});
    fills.push_back({&layer.w1, 1.0 / std::sqrt(d)});
    fills.push_back({&layer.w3, 1.0 / std::sqrt(d)});
    fills.push_back({&layer.w2, residual_scale / std::sqrt(h)});
  }
  std::fill(w.final_norm.begin(), w.final_norm.end(), 1.0f);
  if (!config.shared_classifier) fills.push_back({&w.classifier, 1.0 / std::sqrt(d)});

  auto fill_normal = [](std::vector<float>& tensor, double stddev, std::mt19937_64& rng) {
    std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
    for (auto& x : tensor) x = dist(rng);
  };
  // Models below 2^24 parameters (every model the CPU results were measured
  // on) draw all matrices from one stream, in order, on one thread.
  if (!set_up_on_every_core(config)) {
    std::mt19937_64 rng(seed);
    for (const Fill& fill : fills) fill_normal(*fill.tensor, fill.stddev, rng);
    return w;
  }
  // Larger models (the GPU presets: one thread fills a 7B model's 6.7e9 values
  // in about two minutes) give every matrix its own stream, seeded by (seed,
  // its index), and fill the matrices in parallel; the values do not depend
  // on the number of threads.
  parallel_for(fills.size(), [&](std::size_t index) {
    std::seed_seq stream_seed{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                              static_cast<std::uint32_t>(index)};
    std::mt19937_64 rng(stream_seed);
    fill_normal(*fills[index].tensor, fills[index].stddev, rng);
  });
  return w;
}

}  // namespace llm
