#include "llm/checkpoint.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <istream>

#include "llm/errors.hpp"

namespace llm {
namespace {

constexpr std::size_t kHeaderInts = 7;

// Tensors in file order, with their element counts; the RoPE tables sit
// between final_norm and the optional classifier.
std::size_t rope_table_floats(const ModelConfig& c) {
  return static_cast<std::size_t>(c.seq_len) * c.head_dim() / 2;
}

std::size_t weight_floats(const ModelConfig& c) {
  // parameter_count() counts the classifier only when separate, as the file does.
  return c.parameter_count() + 2 * rope_table_floats(c);
}

}  // namespace

std::size_t checkpoint_file_bytes(const ModelConfig& config) {
  return kHeaderInts * sizeof(std::int32_t) + weight_floats(config) * sizeof(float);
}

ModelWeights load_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(fmt::format("model file '{}' does not exist or is not a file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot open model file '{}'", path));
  return read_checkpoint(in, path);
}

ModelWeights read_checkpoint(std::istream& in, const std::string& name) {
  // The size first: the header is checked against it before anything is
  // allocated, so a header claiming gigabytes costs nothing.
  const std::istream::pos_type start = in.tellg();
  if (start == std::istream::pos_type(-1) || !in.seekg(0, std::ios::end))
    throw InputError(fmt::format("model file '{}' cannot be read (not a seekable file)", name));
  const std::istream::pos_type end = in.tellg();
  in.seekg(start);
  if (!in || end < start) throw InputError(fmt::format("model file '{}' cannot be read", name));
  const auto file_bytes = static_cast<std::size_t>(end - start);

  std::int32_t header[kHeaderInts];
  if (file_bytes < sizeof(header) || !in.read(reinterpret_cast<char*>(header), sizeof(header)))
    throw InputError(fmt::format("model file '{}' is too short to hold a llama2.c header ({} bytes)",
                                 name, file_bytes));
  ModelConfig c;
  c.dim = header[0];
  c.hidden_dim = header[1];
  c.n_layers = header[2];
  c.n_heads = header[3];
  c.n_kv_heads = header[4];
  // llama2.c's convention: a negative vocab_size means the file carries its own
  // classifier after the RoPE tables; positive means it shares the embedding.
  c.shared_classifier = header[5] > 0;
  c.vocab_size = header[5] == INT32_MIN ? 0 : std::abs(header[5]);
  c.seq_len = header[6];
  try {
    c.validate();
  } catch (const InputError& e) {
    throw InputError(fmt::format("model file '{}': {}", name, e.what()));
  }

  const std::size_t expected = checkpoint_file_bytes(c);
  if (file_bytes != expected) {
    throw InputError(fmt::format(
        "model file '{}' is {}: its header ({}; {} classifier) implies {} bytes, the file has {}",
        name, file_bytes < expected ? "truncated" : "larger than its header says", c.describe(),
        c.shared_classifier ? "shared" : "separate", expected, file_bytes));
  }

  ModelWeights w = ModelWeights::allocate(c);
  auto read = [&](std::vector<float>& t) {
    in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(t.size() * sizeof(float)));
  };
  // llama2.c stores each kind of tensor for all layers together.
  read(w.token_embedding);
  for (auto& l : w.layers) read(l.attention_norm);
  for (auto& l : w.layers) read(l.wq);
  for (auto& l : w.layers) read(l.wk);
  for (auto& l : w.layers) read(l.wv);
  for (auto& l : w.layers) read(l.wo);
  for (auto& l : w.layers) read(l.ffn_norm);
  for (auto& l : w.layers) read(l.w1);
  for (auto& l : w.layers) read(l.w2);
  for (auto& l : w.layers) read(l.w3);
  read(w.final_norm);
  std::vector<float> rope_tables(2 * rope_table_floats(c));  // unused: RoPE is computed
  read(rope_tables);
  if (!c.shared_classifier) read(w.classifier);
  if (!in) throw InputError(fmt::format("model file '{}': read failed", name));
  return w;
}

void save_checkpoint(const ModelWeights& w, const std::string& path) {
  const ModelConfig& c = w.config;
  c.validate();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError(fmt::format("cannot write model file '{}'", path));
  const std::int32_t header[kHeaderInts] = {
      c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
      c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len};
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  auto write = [&](const std::vector<float>& t) {
    out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * sizeof(float)));
  };
  write(w.token_embedding);
  for (const auto& l : w.layers) write(l.attention_norm);
  for (const auto& l : w.layers) write(l.wq);
  for (const auto& l : w.layers) write(l.wk);
  for (const auto& l : w.layers) write(l.wv);
  for (const auto& l : w.layers) write(l.wo);
  for (const auto& l : w.layers) write(l.ffn_norm);
  for (const auto& l : w.layers) write(l.w1);
  for (const auto& l : w.layers) write(l.w2);
  for (const auto& l : w.layers) write(l.w3);
  write(w.final_norm);
  // RoPE tables as llama2.c's legacy export wrote them: cos, then sin, of
  // pos * theta^(-2i/head_dim), [seq_len, head_dim/2] each.
  const int half = c.head_dim() / 2;
  std::vector<float> cos_table(rope_table_floats(c)), sin_table(rope_table_floats(c));
  for (int pos = 0; pos < c.seq_len; ++pos) {
    for (int i = 0; i < half; ++i) {
      const double freq = 1.0 / std::pow(static_cast<double>(c.rope_theta), 2.0 * i / c.head_dim());
      cos_table[static_cast<std::size_t>(pos) * half + i] = static_cast<float>(std::cos(pos * freq));
      sin_table[static_cast<std::size_t>(pos) * half + i] = static_cast<float>(std::sin(pos * freq));
    }
  }
  write(cos_table);
  write(sin_table);
  if (!c.shared_classifier) write(w.classifier);
  if (!out) throw InputError(fmt::format("writing model file '{}' failed", path));
}

}  // namespace llm
