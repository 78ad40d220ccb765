#pragma once
// splitmix64 (Steele, Lea and Flood, 2014; the constants of Vigna's
// public-domain reference code): the course's one source of seeded 64-bit
// mixing. Step 03 fills long caches with it (fill_uniform), step 05 chains it
// into the prefix cache's block keys and draws its request trace from it.
#include <cstdint>

namespace llm {

// The golden-ratio increment of splitmix64's state (2^64 / phi, odd).
inline constexpr std::uint64_t kSplitMix64Increment = 0x9e3779b97f4a7c15ull;

// splitmix64's finalizer: a bijection of the 64-bit words in which every
// input bit flips about half of the output bits, so inputs that differ in one
// low bit (token 5 vs token 4, seed 42 vs 43) come out unrelated.
constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The generator: state += increment, output = mix(state). Written out here
// instead of std::mt19937_64 + <random> distributions because the standard
// fixes no distribution's algorithm: libstdc++ and libc++ would draw different
// traces from one seed, and the course's tables must be reproducible.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return splitmix64_mix(state_ += kSplitMix64Increment); }
  // Uniform in [0, 1): the top 53 bits, exactly representable in a double.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

}  // namespace llm
