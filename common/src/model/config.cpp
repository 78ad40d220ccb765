#include "llm/config.hpp"

#include <fmt/format.h>

#include "llm/errors.hpp"

namespace llm {

std::size_t ModelConfig::parameter_count() const {
  const std::size_t d = dim, h = hidden_dim, L = n_layers, v = vocab_size;
  const std::size_t q_width = static_cast<std::size_t>(n_heads) * head_dim();
  const std::size_t per_layer = 2 * d                 // two RMSNorm gains
                                + q_width * d         // wq
                                + 2 * kv_dim() * d    // wk, wv
                                + d * q_width         // wo
                                + 3 * h * d;          // w1, w2, w3
  return v * d + L * per_layer + d + (shared_classifier ? 0 : v * d);
}

std::size_t ModelConfig::kv_bytes_per_token(std::size_t bytes_per_value) const {
  return 2 * static_cast<std::size_t>(n_layers) * kv_dim() * bytes_per_value;
}

void ModelConfig::validate() const {
  auto fail = [](const std::string& what) { throw InputError("invalid model config: " + what); };
  if (dim <= 0) fail(fmt::format("dim must be positive (got {})", dim));
  if (hidden_dim <= 0) fail(fmt::format("hidden_dim must be positive (got {})", hidden_dim));
  if (n_layers <= 0) fail(fmt::format("n_layers must be positive (got {})", n_layers));
  if (n_heads <= 0) fail(fmt::format("n_heads must be positive (got {})", n_heads));
  if (n_kv_heads <= 0) fail(fmt::format("n_kv_heads must be positive (got {})", n_kv_heads));
  if (vocab_size <= 0) fail(fmt::format("vocab_size must be non-zero (got {})", vocab_size));
  if (seq_len <= 0) fail(fmt::format("seq_len must be positive (got {})", seq_len));
  if (dim % n_heads != 0) fail(fmt::format("dim {} is not a multiple of n_heads {}", dim, n_heads));
  if (n_heads % n_kv_heads != 0)
    fail(fmt::format("n_heads {} is not a multiple of n_kv_heads {}", n_heads, n_kv_heads));
  if (head_dim() % 2 != 0) fail(fmt::format("head_dim {} must be even for RoPE", head_dim()));
  // Sanity bounds: far above any real Llama, low enough to catch a file that is
  // not a checkpoint at all (its first bytes read as absurd integers).
  if (dim > 65536 || hidden_dim > 262144 || n_layers > 1024 || n_heads > 1024 ||
      vocab_size > 1 << 20 || seq_len > 1 << 20)
    fail("a dimension is implausibly large (is this a llama2.c checkpoint?): " + describe());
}

std::string ModelConfig::describe() const {
  return fmt::format("dim {}, hidden {}, {} layers, {} heads, {} kv heads, head_dim {}, vocab {}, seq_len {}",
                     dim, hidden_dim, n_layers, n_heads, n_kv_heads, dim / (n_heads ? n_heads : 1),
                     vocab_size, seq_len);
}

ModelConfig make_config(int dim, int hidden_dim, int n_layers, int n_heads, int n_kv_heads, int vocab_size,
                        int seq_len, bool shared_classifier) {
  ModelConfig c;
  c.dim = dim;
  c.hidden_dim = hidden_dim;
  c.n_layers = n_layers;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.vocab_size = vocab_size;
  c.seq_len = seq_len;
  c.shared_classifier = shared_classifier;
  return c;
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = {
      {"tiny", "the dims of stories260K (0.26M params; CPU-friendly default)",
       make_config(64, 172, 5, 8, 4, 512, 512, true)},
      {"small", "the dims of stories15M (15M params)", make_config(288, 768, 6, 6, 6, 32000, 256, true)},
      {"medium", "the dims of stories110M (110M params; 440 MB in fp32, larger than CPU caches)",
       make_config(768, 2048, 12, 12, 12, 32000, 1024, true)},
      {"tinyllama-1.1b", "the dims of TinyLlama-1.1B (GQA 32/4; GPU benchmarks)",
       make_config(2048, 5632, 22, 32, 4, 32000, 2048, false)},
      {"llama2-7b", "the dims of Llama-2-7B (MHA 32/32; GPU benchmarks, 27 GB in fp32)",
       make_config(4096, 11008, 32, 32, 32, 32000, 4096, false)},
  };
  return all;
}

const Preset& find_preset(const std::string& name) {
  std::string names;
  for (const auto& p : presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw InputError(fmt::format("unknown preset '{}' (choose one of: {})", name, names));
}

}  // namespace llm
