#include "step03_gqa/kv_heads_conversion.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "llm/errors.hpp"
#include "llm/exercise.hpp"

namespace step03 {
namespace {

// Rebuilds one projection, wk or wv: [old_kv_heads * head_dim, dim] ->
// [new_kv_heads * head_dim, dim]. Head g owns rows g*head_dim .. g*head_dim +
// head_dim - 1 (row-major, one output feature per row).
std::vector<float> convert_projection(const std::vector<float>& old_rows, int old_kv_heads, int new_kv_heads,
                                      int head_dim, int dim) {
  // BEGIN EXERCISE ex03.2
  const std::size_t head_floats = static_cast<std::size_t>(head_dim) * dim;  // one head's [head_dim, dim] block
  std::vector<float> new_rows(static_cast<std::size_t>(new_kv_heads) * head_floats);  // [new_kv_heads*head_dim, dim]
  if (new_kv_heads >= old_kv_heads) {
    // Duplicate: consecutive new heads j = r*i .. r*i+r-1 are copies of old
    // head i (repeat-interleave, not tile: query head h must still meet the
    // K/V it was trained with).
    const int copies = new_kv_heads / old_kv_heads;
    for (int j = 0; j < new_kv_heads; ++j) {
      const auto from = old_rows.begin() + static_cast<std::ptrdiff_t>((j / copies) * head_floats);
      std::copy(from, from + static_cast<std::ptrdiff_t>(head_floats),
                new_rows.begin() + static_cast<std::ptrdiff_t>(j * head_floats));
    }
  } else {
    // Mean-pool: new head j = average of the `pooled` old heads j*pooled ..
    // (the query heads of all of them now share the average).
    const int pooled = old_kv_heads / new_kv_heads;
    for (int j = 0; j < new_kv_heads; ++j) {
      float* out = new_rows.data() + j * head_floats;
      for (int i = j * pooled; i < (j + 1) * pooled; ++i) {
        const float* in = old_rows.data() + i * head_floats;
        for (std::size_t e = 0; e < head_floats; ++e) out[e] += in[e];
      }
      for (std::size_t e = 0; e < head_floats; ++e) out[e] /= static_cast<float>(pooled);
    }
  }
  return new_rows;
  // END EXERCISE ex03.2
}

}  // namespace

llm::ModelWeights convert_kv_heads(const llm::ModelWeights& original, int new_kv_heads) {
  const llm::ModelConfig& c = original.config;
  const int old_kv_heads = c.n_kv_heads;
  if (new_kv_heads <= 0 || c.n_heads % new_kv_heads != 0)
    throw llm::InputError(fmt::format("cannot give a model with {} query heads {} KV heads: the KV heads must divide "
                                      "the query heads",
                                      c.n_heads, new_kv_heads));
  if (new_kv_heads % old_kv_heads != 0 && old_kv_heads % new_kv_heads != 0)
    throw llm::InputError(fmt::format("cannot convert {} KV heads to {}: one count must divide the other (duplicate "
                                      "heads, or mean-pool whole groups)",
                                      old_kv_heads, new_kv_heads));
  llm::ModelWeights converted = original;  // every other tensor as trained
  converted.config.n_kv_heads = new_kv_heads;
  for (llm::LayerWeights& layer : converted.layers) {
    layer.wk = convert_projection(layer.wk, old_kv_heads, new_kv_heads, c.head_dim(), c.dim);
    layer.wv = convert_projection(layer.wv, old_kv_heads, new_kv_heads, c.head_dim(), c.dim);
  }
  converted.config.validate();
  return converted;
}

}  // namespace step03
