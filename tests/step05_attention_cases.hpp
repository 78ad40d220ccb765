#pragma once
// The cases step 05's attention tests run on the CPU and on the GPU, with
// short, stable names ("q32_kv8_hd128_bs16_len_5000_1_17_300").
#include <ostream>
#include <string>
#include <vector>

namespace step05 {

struct DecodeCase {
  int n_heads, n_kv_heads, head_dim, block_size;
  std::vector<int> lengths;  // one sequence each, all in one call (one launch on the GPU)
  float key_scale;           // > 1: large scores, a peaky softmax (the online max moves a lot)
};

inline std::string decode_case_name(const DecodeCase& c) {
  std::string name = "q" + std::to_string(c.n_heads) + "_kv" + std::to_string(c.n_kv_heads) + "_hd" +
                     std::to_string(c.head_dim) + "_bs" + std::to_string(c.block_size) + "_len";
  for (const int l : c.lengths) name += "_" + std::to_string(l);
  return name + (c.key_scale > 1.0f ? "_peaky" : "");
}
inline void PrintTo(const DecodeCase& c, std::ostream* os) { *os << decode_case_name(c); }

struct PrefillCase {
  int n_heads, n_kv_heads, head_dim, block_size, n_past, n_new;
};
inline std::string prefill_case_name(const PrefillCase& c) {
  return "q" + std::to_string(c.n_heads) + "_kv" + std::to_string(c.n_kv_heads) + "_hd" + std::to_string(c.head_dim) +
         "_bs" + std::to_string(c.block_size) + "_past" + std::to_string(c.n_past) + "_new" + std::to_string(c.n_new);
}
inline void PrintTo(const PrefillCase& c, std::ostream* os) { *os << prefill_case_name(c); }

}  // namespace step05
