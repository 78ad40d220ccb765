// What the CUDA kernels read, built on the host (cuda_weight_layout.hpp).
#include "step06_quantization/cuda_weight_layout.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "llm/parallel_for.hpp"

namespace step06 {

int cuda_int4_column(int step, int t, int i) {
  const int w = i / 8, nibble = i % 8;
  const int k = nibble % 4, high_half = nibble / 4;
  const int mma = 2 * w + k / 2;                // 16-column block of the step
  const int element = 2 * (k % 2) + high_half;  // 0..3: the lane's 4 columns of that block
  return step * 128 + 16 * mma + 4 * t + element;
}

int cuda_int8_column(int step, int t, int i) { return step * 64 + 16 * (i / 4) + 4 * t + i % 4; }

std::vector<std::uint8_t> cuda_tile_major_codes(const QuantizedMatrix& q) {
  constexpr int kLanes = 32, kLaneBytes = 16;
  const bool int8 = q.format.bits() == 8;
  const int m_tiles = ceil_div(q.out_features, kCudaTileRows);
  const int columns_per_step = kCudaStepBytes * 8 / q.format.bits();
  const int total_steps = ceil_div(q.padded_in, columns_per_step);
  const std::size_t tile_bytes = static_cast<std::size_t>(total_steps) * 2 * kLanes * kLaneBytes;
  std::vector<std::uint8_t> bytes(m_tiles * tile_bytes, 0);  // [m_tiles][total_steps][2 halves][32 lanes][16 bytes]
  // Every tile is its own run of bytes, so the tiles are laid out on every
  // core (a large model's matrices are long work for one thread); a matrix of
  // a few tiles stays on this thread, where starting threads would cost more
  // than its layout.
  constexpr int kTilesWorthThreads = 64;
  const unsigned threads = m_tiles >= kTilesWorthThreads ? 0 : 1;  // 0: every core
  llm::parallel_for(static_cast<std::size_t>(m_tiles), [&](std::size_t tile_index) {
    const int tile = static_cast<int>(tile_index);
    std::size_t at = tile_index * tile_bytes;
    for (int step = 0; step < total_steps; ++step)
      for (int half = 0; half < 2; ++half)
        for (int lane = 0; lane < kLanes; ++lane, at += kLaneBytes) {
          const int row = tile * kCudaTileRows + lane / 4 + 8 * half;
          const int t = lane % 4;
          for (int i = 0; i < (int8 ? 16 : 32); ++i) {  // the lane's 16 int8 or 32 4-bit codes
            const int column = int8 ? cuda_int8_column(step, t, i) : cuda_int4_column(step, t, i);
            const bool stored = row < q.out_features && column < q.padded_in;
            const int code = stored ? q.code(row, column) : 0;  // padding: scale 0 (or x = 0) makes it vanish
            if (int8) {
              bytes[at + i] = static_cast<std::uint8_t>((code + 128) & 0xFF);  // q + 128: the kernel's int8_pair
            } else {
              bytes[at + i / 2] |= static_cast<std::uint8_t>(code << (4 * (i % 2)));
            }
          }
        }
  }, threads);
  return bytes;
}

CudaGroupTables cuda_group_tables(const QuantizedMatrix& q) {
  CudaGroupTables tables;
  tables.rows_padded = ceil_div(q.out_features, kCudaTileRows) * kCudaTileRows;
  float max_scale = 0.0f;
  for (float s : q.scales) max_scale = std::max(max_scale, s);
  int exponent = 0;
  if (max_scale > 0.0f) {
    static_cast<void>(std::frexp(max_scale, &exponent));  // max_scale = m 2^exponent, m in [0.5, 1)
    exponent = std::clamp(15 - exponent, -100, 100);       // max_scale 2^exponent in [2^14, 2^15)
  }
  const float pow2 = std::ldexp(1.0f, exponent);
  tables.output_scale = std::ldexp(1.0f, -exponent);
  const std::size_t count = static_cast<std::size_t>(q.groups_per_row) * tables.rows_padded;
  tables.scales.assign(count, 0.0f);
  tables.zeros.assign(q.format.has_zero_points() ? count : 0, 0);
  for (int row = 0; row < q.out_features; ++row)
    for (int group = 0; group < q.groups_per_row; ++group) {
      const std::size_t host = static_cast<std::size_t>(row) * q.groups_per_row + group;
      const std::size_t device = static_cast<std::size_t>(group) * tables.rows_padded + paired_row_slot(row);
      tables.scales[device] = q.scales[host] * pow2;
      if (!tables.zeros.empty()) tables.zeros[device] = q.zeros[host];
    }
  return tables;
}

}  // namespace step06
