#pragma once
// Seeded uniform test data in [-1, 1): what the kernel sweeps of steps 03, 05
// and 07 fill their K/V, queries and weights with (never zeros).
#include <cstddef>
#include <cstdint>

#include "llm/splitmix64.hpp"

namespace llm {

inline void fill_uniform(float* data, std::size_t n, std::uint64_t seed) {
  SplitMix64 generator(seed);  // one multiply-xorshift step per value
  for (std::size_t i = 0; i < n; ++i) {
    // Top 24 bits -> [0, 1) exactly representable in float, then [-1, 1).
    data[i] = static_cast<float>(generator.next() >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
}

}  // namespace llm
