#pragma once
// Part 3 of step 02's executable: the model's prefill of a long random prompt
// with its default attention ("model_prefill_before", id 0) and with step
// 02's flash kernel in its attention hook ("model_prefill_flash", id 1), per
// device; every row's last-row logits are checked against its device's
// "before" row and against the CPU's.
#include <cstdint>

#include "llm/harness/cli.hpp"
#include "llm/harness/results.hpp"

namespace step02 {

struct ModelPrefillSettings {
  bool cpu = true;           // the devices that run
  bool cuda = false;
  int repeats = 3;           // timed runs (at least 2 on the CPU, 5 on CUDA)
  bool quick = false;        // one timed run per row
  int prefill_tokens = 1024; // the random prompt's length; may exceed the model's context
  std::uint64_t seed = 42;   // of the random prompt
};

// Prints the rows and adds them to `results`, with the model's config keys.
// Returns false when a check failed.
bool run_model_prefill(llm::Results& results, const ModelPrefillSettings& settings, llm::LoadedModel loaded);

}  // namespace step02
