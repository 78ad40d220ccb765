#pragma once
// ModelDrafter: a smaller transformer proposes tokens autoregressively, one
// forward per drafted token, keeping its own KV cache. Any llm::Model works:
// a second llama2.c checkpoint sharing the target's vocabulary (--draft-model),
// or the target's own first L layers (early_exit_drafter.hpp).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llm/model.hpp"
#include "llm/weights.hpp"
#include "step04_speculative/drafter.hpp"

namespace step04 {

// Builds a Model from weights on the device being measured (CpuModel, or
// llm::cuda::make_cuda_model), so drafters run wherever the target runs.
using ModelFactory = std::function<std::unique_ptr<llm::Model>(const llm::ModelWeights&)>;

// A draft must speak the target's vocabulary: token id t has to mean the same
// piece to both, or "the target agrees with the draft" is meaningless. Throws
// InputError naming both sizes when they differ.
void check_same_vocabulary(const llm::ModelConfig& draft, const llm::ModelConfig& target,
                           const std::string& draft_name);

class ModelDrafter final : public Drafter {
 public:
  // Throws InputError when the vocabularies differ.
  ModelDrafter(std::string name, std::unique_ptr<llm::Model> model, const llm::ModelConfig& target_config);

  std::string name() const override { return name_; }
  bool one_step_per_token() const override { return true; }
  void reset(int capacity) override;
  void propose(std::span<const int> context, int k, const SamplingSettings& sampling, llm::Sampler& rng,
               Draft& out) override;
  void commit(std::span<const int> context) override;

  const llm::KvCache& cache() const { return *cache_; }  // for the rollback tests
  const llm::Model& model() const { return *model_; }

 private:
  // Truncates the cache to the longest prefix of `context` it already holds,
  // but at most `limit` positions.
  void rollback_to(std::span<const int> context, std::size_t limit);

  std::string name_;
  std::unique_ptr<llm::Model> model_;
  std::unique_ptr<llm::KvCache> cache_;
  int cache_capacity_ = 0;        // positions per sequence cache_ was made with
  int capacity_ = 0;              // positions this generation may use in the draft's cache
  std::vector<int> fed_;          // [cache length] the tokens whose K/V the cache holds, in order
  std::vector<float> q_row_;      // [vocab] scratch: the distribution of one drafted token
};

}  // namespace step04
