#pragma once
// What step 06's CUDA kernels read, built on the host in plain C++: no CUDA
// types, so every build compiles it and the CPU tests check it
// (tests/step06_formats_test.cpp); cuda_quantized_kernels.cu uploads it.
//
//   codes   [m_tiles, total_steps, 2, 32, 16] bytes: per 16-row tile and
//           64-byte step of a row, rows 0-7 then rows 8-15 of the tile, each
//           lane's 16 bytes in the order the lanes load them (lane 4g + t
//           holds row g (+ 8), one 128-bit load), its codes where its MMA
//           fragments want them (cuda_int4_column, cuda_int8_column)
//   scales  [groups_per_row, rows_padded] floats times 2^exponent (rounded
//           to fp16 on upload), each tile's rows in the lanes' pair order
//           (paired_row_slot); 0 for the rows that pad the last tile
//   zeros   the same layout, one byte per row (int4 asymmetric only)
#include <cstdint>
#include <vector>

#include "step06_quantization/quant_format.hpp"

namespace step06 {

// a / b rounded up (a >= 0, b > 0): whole tiles, steps, groups. The layout
// and the kernels (cuda_quantized_kernels.cu) count them alike.
constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

inline constexpr int kCudaTileRows = 16;   // output rows of one MMA tile (the M of m16n8k16): a warp's
inline constexpr int kCudaStepBytes = 64;  // bytes of one row a warp reads per step: 4 lanes x 16 bytes

// Column (of the matrix) of code i (0..31) of the 16 bytes lane (g, t)
// loads at `step` (4-bit). Code i sits in 32-bit word w = i / 8, nibble
// i % 8; the dequantization pairs nibbles k and k + 4 of a word into one
// fp16x2 fragment register, k = 0, 1 for MMA 2w (a0 and a2: the lane's
// columns 4t, 4t + 1 and 4t + 2, 4t + 3 of those 16) and k = 2, 3 for MMA
// 2w + 1.
int cuda_int4_column(int step, int t, int i);
// int8: byte i (0..15) of the lane's 16 is in word w = i / 4 = MMA w, its
// element i % 4 (the kernel takes bytes 0, 1 for a0 and 2, 3 for a2 in place).
int cuda_int8_column(int step, int t, int i);

// Where row `row` of the matrix sits in a group's row of the scale and
// zero-point tables: each 16-row tile stays together, and inside it the two
// rows one lane's fragments cover, g and g + 8 (g = lane / 4), sit side by
// side: row g in slot 2g, row g + 8 in slot 2g + 1. A lane then reads its
// pair of scales as one __half2 (row g in .x) and its pair of zero points as
// one 16-bit word (row g in the low byte), with no instruction to pair them;
// a tile's 16 entries stay 32 (or 16) contiguous bytes, copied whole.
constexpr int paired_row_slot(int row) {
  const int tile_start = row - row % kCudaTileRows, r = row % kCudaTileRows;
  return tile_start + 2 * (r % 8) + r / 8;
}
static_assert(paired_row_slot(0) == 0 && paired_row_slot(8) == 1 && paired_row_slot(7) == 14 &&
                  paired_row_slot(15) == 15 && paired_row_slot(16 + 9) == 16 + 3,
              "rows g and g + 8 of a tile sit side by side");

// The codes in the tile-major layout above (int8 codes stored as q + 128).
// Rows past out_features and columns past padded_in hold code 0.
std::vector<std::uint8_t> cuda_tile_major_codes(const QuantizedMatrix& q);

// The group scales and zero points in the layout above. fp16's normal range
// is only 2^-14 .. 2^16, so every scale is multiplied by one power of two
// that puts the largest at 2^14 .. 2^15 (output_scale, its inverse, is
// exact). Scales 2^28 times smaller than the largest lose precision as fp16
// subnormals, but their groups' contributions are that much smaller too.
struct CudaGroupTables {
  int rows_padded = 0;              // out_features rounded up to whole tiles
  float output_scale = 1.0f;        // 2^-exponent: what y is multiplied by
  std::vector<float> scales;        // [groups_per_row, rows_padded], times 2^exponent
  std::vector<std::uint8_t> zeros;  // [groups_per_row, rows_padded] (int4 asymmetric), else empty
};
CudaGroupTables cuda_group_tables(const QuantizedMatrix& q);

}  // namespace step06
