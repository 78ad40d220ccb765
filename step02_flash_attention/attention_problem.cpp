#include "step02_flash_attention/attention_problem.hpp"

#include <fmt/format.h>

#include <cmath>

#include "llm/errors.hpp"

namespace step02 {

std::int64_t AttentionProblem::visible_pairs() const {
  if (!causal) return static_cast<std::int64_t>(seqlen_q) * seqlen_k;
  std::int64_t pairs = 0;
  for (int i = 0; i < seqlen_q; ++i) pairs += std::max(0, last_visible_key(i) + 1);  // keys 0..last (none when last < 0)
  return pairs;
}

std::string AttentionProblem::describe() const {
  return fmt::format("Sq {}, Sk {}, {} heads ({} KV), d {}, {}", seqlen_q, seqlen_k, n_heads, n_kv_heads, head_dim,
                     causal ? "causal" : "not causal");
}

void AttentionProblem::validate() const {
  if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    throw llm::InputError(fmt::format("heads {} / KV heads {}: both must be positive and heads a multiple of KV heads",
                                      n_heads, n_kv_heads));
  if (head_dim <= 0) throw llm::InputError(fmt::format("head_dim {} must be positive", head_dim));
  if (seqlen_q <= 0 || seqlen_k <= 0)
    throw llm::InputError(fmt::format("sequence lengths must be positive (Sq {}, Sk {})", seqlen_q, seqlen_k));
}

PrefillCall prefill_call(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past,
                         int n_new, float* out) {
  PrefillCall call{{shape.n_heads, shape.n_kv_heads, shape.head_dim, n_new, n_past + n_new, true}, {}};
  call.args.q = q;
  call.args.kv = kv;  // positions 0..n_past+n_new-1 written (the model appends K/V before attending)
  call.args.out = out;
  return call;
}

llm::KvView contiguous_kv_view(float* keys, float* values, int seqlen, int kv_row, const std::int32_t* block_table) {
  llm::KvView view;
  view.keys = keys;
  view.values = values;
  view.block_table = block_table;
  view.block_size = std::max(seqlen, 1);
  view.kv_dim = kv_row;
  return view;
}

float softmax_scale(int head_dim) { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

}  // namespace step02
