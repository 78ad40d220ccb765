#pragma once
// Step 04's variant table: the drafters. Id 0 is the baseline, plain decoding
// (step 01's generate_cached: one target pass per token), which has no
// drafter; every other row builds one. The executable, tests and benchmark
// all read this table.
#include <memory>
#include <string>
#include <vector>

#include "llm/harness/variant.hpp"
#include "llm/weights.hpp"
#include "step04_speculative/drafter.hpp"
#include "step04_speculative/model_drafter.hpp"

namespace step04 {

// What a drafter factory may need.
struct DrafterSetup {
  const llm::ModelWeights* target = nullptr;  // the target's weights (early exit slices them)
  const llm::ModelWeights* draft = nullptr;   // --draft-model's weights (for the draft_model row)
  std::string draft_name;                     // shown in the row's name
  int draft_layers = 1;                       // early exit: layers kept
  int ngram = 3;                              // n-gram: longest suffix matched
  ModelFactory make_model;                    // builds a Model on the device being measured
};

// Returns nullptr for the baseline (no drafter). Throws InputError for bad
// settings (vocabulary mismatch, layers out of range, n < 1).
using MakeDrafterFn = std::unique_ptr<Drafter> (*)(const DrafterSetup& setup);

namespace variant_id {
inline constexpr int kPlain = 0;
inline constexpr int kDraftModel = 1;
inline constexpr int kEarlyExit = 2;
inline constexpr int kNgram = 3;
}  // namespace variant_id

const std::vector<llm::Variant<MakeDrafterFn>>& variants();

}  // namespace step04
