#pragma once
// Step 06's int8 KV elements (docs/06_quantization.md, section 7): each KV
// head of a cached row is stored as int8 values and one fp32 scale,
// value = q * scale. The arithmetic shared by the host (store_kv_row,
// load_kv_row, the reference attention) and the CUDA kernels, so both
// devices store and read the same bytes. The view's int8 fields and row
// accessors are in llm/kv_cache.hpp (KvView is one struct for every cache).
#include <cmath>
#include <cstdint>

#include "llm/kv_cache.hpp"

namespace llm {

// Symmetric absmax quantization of one head's values: scale = max|x| / 127,
// q = round(x / scale), so the largest value is exact and every value is
// within scale / 2. An all-zero head gets scale 0 (and reads back as zeros).
LLM_HOST_DEVICE inline float int8_scale_of(const float* x, int n) {
  float absmax = 0.0f;
  for (int i = 0; i < n; ++i) absmax = fmaxf(absmax, fabsf(x[i]));
  return absmax / 127.0f;
}
LLM_HOST_DEVICE inline std::int8_t int8_quantize(float x, float scale) {
  if (scale == 0.0f) return 0;
  // |x / scale| <= 127 by the choice of scale; the clamp guards rounding.
  return static_cast<std::int8_t>(fminf(127.0f, fmaxf(-127.0f, roundf(x / scale))));
}

// An int8 row back to floats: out[i] = row[i] * scales[i / head_dim].
// row, out [kv_dim]; scales [kv_dim / head_dim].
LLM_HOST_DEVICE inline void dequantize_int8_row(const std::int8_t* row, const float* scales, int kv_dim,
                                                int head_dim, float* out) {
  for (int i = 0; i < kv_dim; ++i) out[i] = static_cast<float>(row[i]) * scales[i / head_dim];
}

// Quantizes KV head `head` of one position's K and V rows ([kv_dim] floats
// each) into an Int8 view: one scale per head and pool. Shared by the host
// (store_kv_row) and the CUDA write kernel, so both devices store the same bytes.
LLM_HOST_DEVICE inline void store_int8_head(const KvView& view, int pos, int head, const float* key,
                                            const float* value) {
  const int first = head * view.head_dim;
  const float key_scale = int8_scale_of(key + first, view.head_dim);
  const float value_scale = int8_scale_of(value + first, view.head_dim);
  view.key_row_scales(pos)[head] = key_scale;
  view.value_row_scales(pos)[head] = value_scale;
  std::int8_t* key_out = view.key_row_int8(pos);
  std::int8_t* value_out = view.value_row_int8(pos);
  for (int i = first; i < first + view.head_dim; ++i) {
    key_out[i] = int8_quantize(key[i], key_scale);
    value_out[i] = int8_quantize(value[i], value_scale);
  }
}

}  // namespace llm
