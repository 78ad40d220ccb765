#pragma once
// fp16 and bf16 on the host, without CUDA headers: the bits the 16-bit
// kernels read, and the rounded floats the checks compare them against.
//
// Why round on the host: a 16-bit variant sees Q, K and V already rounded to
// 16 bits (fp16: 10-bit mantissa, relative step ~1e-3; bf16: 7 bits, ~8e-3).
// With large logits a 1e-3 change of q or k moves a logit by a lot, so the
// float64 reference for a 16-bit variant is computed from the ROUNDED inputs;
// what remains is the kernel's own error (P rounded to 16 bits before P V).
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "llm/harness/compare.hpp"

namespace step02 {

// IEEE binary16, round to nearest even; overflow goes to +-inf, tiny values
// to subnormals or zero (what __float2half_rn does on the GPU).
inline std::uint16_t float_to_half_bits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // value = abs_float * 2^24 in units of the smallest subnormal (2^-24).
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 -> 15), keep 10 mantissa bits, round to
  // nearest even on the 13 dropped bits.
  const std::uint32_t mantissa_rounding = 0xfffu + ((abs >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((abs - 0x38000000u + mantissa_rounding) >> 13));
}

inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// bfloat16: the top 16 bits of a float, round to nearest even.
inline std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // NaN stays NaN
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// Bits of every value in the given 16-bit type (fp16 or bf16).
inline std::vector<std::uint16_t> to_16bit(const std::vector<float>& values, llm::DType dtype) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    bits[i] = dtype == llm::DType::BF16 ? float_to_bf16_bits(values[i]) : float_to_half_bits(values[i]);
  return bits;
}

// The values a variant of `dtype` actually sees (fp32: unchanged).
inline std::vector<float> rounded_to(const std::vector<float>& values, llm::DType dtype) {
  if (dtype == llm::DType::F32) return values;
  std::vector<float> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    out[i] = dtype == llm::DType::BF16 ? bf16_bits_to_float(float_to_bf16_bits(values[i]))
                                       : half_bits_to_float(float_to_half_bits(values[i]));
  return out;
}

}  // namespace step02
