#pragma once
// Reading and writing llama2.c's legacy (version 0) checkpoint format:
//   header: 7 x int32  dim, hidden_dim, n_layers, n_heads, n_kv_heads,
//                      vocab_size (negative: separate classifier), seq_len
//   then fp32 tensors: token_embedding, attention_norm (all layers), wq, wk, wv,
//   wo, ffn_norm, w1, w2, w3, final_norm, freq_cis_real, freq_cis_imag
//   (seq_len x head_dim/2 each, unused: RoPE is computed), [classifier].
#include <cstddef>
#include <istream>
#include <string>

#include "llm/weights.hpp"

namespace llm {

// The exact file size (bytes) the header implies; the loader demands equality.
std::size_t checkpoint_file_bytes(const ModelConfig& config);

// Validates the header (every value positive and consistent, head_dim even) and
// the file size, then reads the tensors. Throws InputError with the file name
// and what is wrong: "truncated: header implies N bytes, file has M".
ModelWeights load_checkpoint(const std::string& path);
// The same from a stream positioned at the header (a file, or bytes in memory:
// the fuzz targets). The stream must be seekable: its size, from the current
// position to the end, is checked against the header before anything is
// allocated. `name` stands for the file in the messages.
ModelWeights read_checkpoint(std::istream& in, const std::string& name);

// Writes `weights` in the same format (the RoPE tables are written as llama2.c's
// export does, so the file is loadable by run.c too).
void save_checkpoint(const ModelWeights& weights, const std::string& path);

}  // namespace llm
