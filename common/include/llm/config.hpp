#pragma once
// ModelConfig: the hyper-parameters of a Llama-style transformer, in the order
// llama2.c's checkpoint header stores them, plus the presets the course ships.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace llm {

struct ModelConfig {
  int dim = 0;          // width of the residual stream
  int hidden_dim = 0;   // width of the SwiGLU feed-forward layer
  int n_layers = 0;
  int n_heads = 0;      // query heads
  int n_kv_heads = 0;   // key/value heads; n_heads % n_kv_heads == 0 (GQA when <)
  int vocab_size = 0;
  int seq_len = 0;      // the longest context the model supports
  bool shared_classifier = true;  // classifier re-uses the token embedding
  float rope_theta = 10000.0f;    // RoPE base frequency (llama2.c: 10000)
  float norm_eps = 1e-5f;         // RMSNorm epsilon (llama2.c: 1e-5)

  int head_dim() const { return dim / n_heads; }
  int kv_dim() const { return head_dim() * n_kv_heads; }       // width of K (and V) per token
  int kv_group() const { return n_heads / n_kv_heads; }        // query heads per KV head

  // Parameters in the weight matrices and vectors (the classifier counted once
  // when it is shared with the embedding).
  std::size_t parameter_count() const;
  // Bytes of K and V for one token over all layers: 2 x layers x kv_dim x bytes.
  std::size_t kv_bytes_per_token(std::size_t bytes_per_value = sizeof(float)) const;

  // Throws InputError with a message naming the first impossible value.
  void validate() const;
  std::string describe() const;  // one line: "dim 64, hidden 172, 5 layers, ..."
};

// A config from its dimensions, in the checkpoint header's order.
ModelConfig make_config(int dim, int hidden_dim, int n_layers, int n_heads, int n_kv_heads, int vocab_size,
                        int seq_len, bool shared_classifier);

// A built-in model: seeded random weights with real models' shapes.
struct Preset {
  std::string name;
  std::string description;
  ModelConfig config;
};

// tiny (default; the dims of stories260K), small (stories15M dims), medium
// (stories110M dims), tinyllama-1.1b and llama2-7b (GPU benchmarks).
const std::vector<Preset>& presets();
// Throws InputError listing the valid names when `name` is unknown.
const Preset& find_preset(const std::string& name);

}  // namespace llm
