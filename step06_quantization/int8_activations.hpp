#pragma once
// Int8 activations: the input x of a product rounded to int8 once per call,
// in blocks of 32 columns with one fp32 scale each (the layout llama.cpp's
// Q8_0 gives its activations), so that the product can multiply integers.
//
// Why: a product with fp32 x must turn every weight into an fp32 value before
// its multiply (a table lookup or a convert, then a scale); at one row that
// is several instructions per weight, and the kernel is bound by them, not by
// the bytes it reads. With int8 x, a block of 32 weights meets its 32 codes of
// x in one or two integer dot-product instructions (AVX-512 VNNI vpdpbusd:
// 64 byte products summed into 16 int32 lanes; AVX2 vpmaddubsw + vpmaddwd),
// and the scales are applied once per block instead of once per weight:
//   y[r, o] = sum over blocks b of  scale_x[r, b] * sum_{j in b} w[o, j] * code_x[r, j]
// with w[o, j] the integer weight (q - zero for int4, the code for int8) and
// its group's scale applied per block as well.
//
// The cost is a second rounding: x~ = code * scale differs from x by up to
// half a step (absmax / 254) per element. Section 6.2 of the chapter measures
// what that does to the model (KL, top-1, perplexity against the fp32-x rows).
#include <cstdint>
#include <span>
#include <vector>

namespace step06 {

// Columns per activation block: one scale per 32 values of x.
inline constexpr int kActivationBlockColumns = 32;

struct Int8Activations {
  int rows = 0;
  int in_features = 0;
  int blocks_per_row = 0;  // ceil(in_features / 32)
  int codes_per_row = 0;   // blocks_per_row * 32

  // [rows, codes_per_row]: round(x / scale) in [-127, 127], columns in their
  // natural order, 0 past in_features.
  std::vector<std::int8_t> codes;
  // [rows, blocks_per_row]: absmax of the block / 127 (0 for an all-zero
  // block; NaN for a block holding a NaN or an infinity, so the product is
  // NaN rather than silently finite).
  std::vector<float> scales;
  // [rows, blocks_per_row]: the sum of the block's codes. A weight with a
  // zero point adds -zero * sum(codes) to its block's dot product; the
  // kernels add that term once per group from these sums.
  std::vector<std::int32_t> code_sums;

  // The value the code of (row, column) stands for: code * scale.
  float value(int row, int column) const;
};

// Rounds x [rows, in_features] to int8 block by block into `activations`
// (its buffers reused across calls). With `input_scales` ([in_features], AWQ's
// scales) x is divided by them column by column first, as the fp32 product
// does. Throws llm::InputError for negative sizes or input scales of the
// wrong length.
void quantize_activations(const float* x, int rows, int in_features, std::span<const float> input_scales,
                          Int8Activations& activations);

}  // namespace step06
