#pragma once
// Self-drafting by early exit: the target's first L layers, then its own final
// RMSNorm and classifier, predict the next token. No second checkpoint, the
// same vocabulary by construction, and a cost of about L / n_layers of the
// target's (plus the classifier, which both pay in full).
#include <memory>

#include "step04_speculative/model_drafter.hpp"

namespace step04 {

// The weights of the early-exit model: the target's embedding, layers
// 0..layers-1, final norm and classifier, copied into a config with
// n_layers = layers. Throws InputError unless 1 <= layers < target n_layers
// (layers = n_layers would be the target itself).
llm::ModelWeights early_exit_weights(const llm::ModelWeights& target, int layers);

// A ModelDrafter over early_exit_weights(target, layers), named "early_exit(L=..)".
//
// The simplest honest implementation: the truncated model is its own Model
// with its own KV cache, so layers 0..L-1 compute K/V for a token twice (once
// drafting, once verifying). A production system shares them: the first L
// layers' K/V written while drafting are exactly the target's, so verification
// could start at layer L for the drafted rows (LayerSkip, Elhoushi et al. 2024).
std::unique_ptr<ModelDrafter> make_early_exit_drafter(const llm::ModelWeights& target, int layers,
                                                      const ModelFactory& make_model);

}  // namespace step04
