#pragma once
// The prefix cache's key of a full block: the hash of its parent block's key
// and its block_size token ids, so equal keys stand for equal prefixes (up to
// a 64-bit collision, which the block manager detects: block_manager.cpp).
// Its own header so that a test can build real collisions against it.
#include <cstdint>
#include <span>

#include "llm/splitmix64.hpp"

namespace step05 {

// The parent hash of block 0 (the first 64 bits of pi's fraction: any fixed
// non-zero value works; splitmix64_mix(0) is 0, so 0 would let an all-zero
// block hash to 0).
inline constexpr std::uint64_t kPrefixHashRoot = 0x243f6a8885a308d3ull;

// The parent's hash, then each token folded in by one splitmix64 step.
// std::hash<int> is the identity in libstdc++, and a plain multiply-add chain
// (FNV, boost::hash_combine) spreads small sequential ids poorly; the
// finalizer mixes every bit into all 64. For a fixed h, distinct tokens give
// distinct h + increment + token and the finalizer is a bijection, so two
// blocks with the same parent that differ only in their last token never
// collide. Not a cryptographic hash: collisions can be built on purpose
// (tests/step05_block_manager_test.cpp does), which is why hits are verified.
constexpr std::uint64_t hash_block(std::uint64_t parent_hash, std::span<const int> tokens) {
  std::uint64_t hash = parent_hash;
  for (const int token : tokens)
    hash = llm::splitmix64_mix(hash + llm::kSplitMix64Increment + static_cast<std::uint32_t>(token));
  return hash;
}

}  // namespace step05
