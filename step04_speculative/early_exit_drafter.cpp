#include "step04_speculative/early_exit_drafter.hpp"

#include <fmt/format.h>

#include "llm/errors.hpp"

namespace step04 {

llm::ModelWeights early_exit_weights(const llm::ModelWeights& target, int layers) {
  const int n_layers = target.config.n_layers;
  if (layers < 1 || layers >= n_layers)
    throw llm::InputError(fmt::format(
        "--draft-layers {} is out of range: the early-exit draft uses the target's first L layers, "
        "1 <= L <= {} for this {}-layer target",
        layers, n_layers - 1, n_layers));
  llm::ModelWeights draft;
  draft.config = target.config;
  draft.config.n_layers = layers;
  draft.token_embedding = target.token_embedding;
  draft.layers.assign(target.layers.begin(), target.layers.begin() + layers);
  draft.final_norm = target.final_norm;
  draft.classifier = target.classifier;  // empty when shared with the embedding
  return draft;
}

std::unique_ptr<ModelDrafter> make_early_exit_drafter(const llm::ModelWeights& target, int layers,
                                                      const ModelFactory& make_model) {
  // The weights are copied into the model (CpuModel keeps its own copy, the
  // CUDA model uploads them), so the temporary can go.
  return std::make_unique<ModelDrafter>(fmt::format("early_exit(L={})", layers),
                                        make_model(early_exit_weights(target, layers)), target.config);
}

}  // namespace step04
