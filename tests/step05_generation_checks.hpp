#pragma once
// Step 05's model part as a test, on either device: every variant, block
// size (1, 7, 16, 64) and scenario (plain, shared prefix, fork) generates
// step 01's contiguous greedy tokens, and the run really took a prefix from
// the cache and really copied a block on write (so neither path goes untested).
#include <gtest/gtest.h>

#include <span>
#include <string>

#include "llm/harness/model_on_device.hpp"
#include "llm/weights.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"

namespace step05::testing {

inline void expect_paged_generation_identical(const std::string& device, const llm::ModelWeights& weights,
                                              std::span<const int> prompt, int positions) {
  auto baseline = llm::make_model_on(device, weights);
  auto paged = make_paged_model_on(device, weights);
  const auto checks = check_paged_generation(device, *baseline, *paged, prompt, positions, {});
  ASSERT_EQ(checks.size(), 1u + 2u * 4u * 3u);  // contiguous, then 2 paged variants x 4 block sizes x 3 scenarios
  long long copies = 0;
  int hits = 0;
  for (const auto& c : checks) {
    EXPECT_TRUE(c.identical) << device << " " << c.variant_name << " block " << c.block_size << " " << c.scenario;
    EXPECT_FALSE(c.tokens.empty());
    copies += c.copy_on_write;
    hits += c.cached_positions > 0;
  }
  EXPECT_GT(copies, 0) << "no fork ever copied a block: the copy-on-write path went untested";
  EXPECT_GT(hits, 0) << "no shared prefix was ever found in the cache";
}

}  // namespace step05::testing
