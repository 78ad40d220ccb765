#pragma once
// The KV-cache formula applied to well-known models:
//   bytes = 2 (K and V) x layers x kv_heads x head_dim x positions x bytes/value
// (llm::ModelConfig::kv_bytes_per_token() x positions), and how many
// sequences of a given context fit in a memory budget.
#include <cstddef>
#include <string>
#include <vector>

#include "llm/config.hpp"
#include "llm/harness/well_known_models.hpp"  // the models it is applied to

namespace step03 {

// Sequences of `bytes_per_sequence` that fit in `budget_bytes` (0 if none).
long long sequences_that_fit(double budget_bytes, double bytes_per_sequence);

}  // namespace step03
