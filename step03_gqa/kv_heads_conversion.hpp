#pragma once
// Changing a trained model's number of KV heads without retraining, as the
// GQA paper (Ainslie et al. 2023, section 2.1) converts multi-head
// checkpoints before "uptraining" them:
//   fewer KV heads  mean-pool the K and V projection heads of each group
//                   (wk and wv rows; the paper found mean-pooling better than
//                   keeping one head or random init);
//   more KV heads   duplicate each KV head for the query heads that read it,
//                   which changes nothing: MHA by duplication computes the
//                   original model's function exactly, with a bigger cache.
// Only wk and wv change: queries, wo and everything else stay as trained.
#include "llm/weights.hpp"

namespace step03 {

// A copy of `original` with `new_kv_heads` KV heads. Query head h reads KV
// head h / (n_heads / n_kv_heads) both before and after, so
//   duplicating (new = r x old): new head j = old head j / r
//   pooling (old = m x new):     new head j = mean of old heads j*m .. j*m+m-1
// Throws InputError unless new_kv_heads divides n_heads and one of old and
// new divides the other.
llm::ModelWeights convert_kv_heads(const llm::ModelWeights& original, int new_kv_heads);

}  // namespace step03
