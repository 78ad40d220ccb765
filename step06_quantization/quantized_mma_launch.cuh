// What the host side (cuda_quantized_kernels.cu) sees of step 06's two
// tensor-core kernels: their sizes, what a launch takes (the device matrix's
// view, the split-K scratch, how x is staged), the persistent kernel's plan,
// and the launches. The kernels and the device pieces they share:
// quantized_mma.cuh, which includes this file. Kept apart from it so the
// host side compiles none of the device code (nor, in a workshop copy, its
// exercise).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "step06_quantization/cuda_weight_layout.hpp"  // kCudaTileRows, kCudaStepBytes
#include "step06_quantization/quant_format.hpp"        // QuantScheme

namespace step06::quantized_mma {

constexpr int kWarpSize = 32;
// 8 warps = 8 MMA tiles of 16 output rows: the rows that share one staged
// copy of x (the top of quantized_mma.cuh). 8, not more: a block of 256
// threads at <= 128 registers still fits twice per SM, and the one-shot
// kernel's last block has 128 rows x 16 tokens to add, 8 per thread.
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMinBlocksPerSm = 2;  // __launch_bounds__: caps the registers at 65536 / (2 * 256) = 128
constexpr int kTileRows = kCudaTileRows;  // 16 output rows of one MMA tile (the M of m16n8k16)
constexpr int kBlockRows = kWarps * kTileRows;  // 128 output rows per block
constexpr int kMaxBatchRows = 16;   // tokens per launch: two n8 MMA tiles
constexpr int kStepBytes = kCudaStepBytes;  // 64 bytes of one row a warp reads per step: 4 lanes x 16 bytes
// One-shot kernel: steps per block, all held in registers (2 uint4 = 8
// registers each, 64 in all). 8 steps = 1024 4-bit columns: a 4096-column
// row in 4 slices; fewer steps per block would mean more slices and more
// partial sums to add at the end (at 16 tokens, 8 KB per slice per row block).
constexpr int kMaxSteps = 8;
constexpr int kWantedBlocksPerSm = 2;  // what the grid aims for (kMinBlocksPerSm stay resident)
constexpr int kMaxGridY = 65535;
// Persistent kernel: the partial sums a warp hands to another block, per
// lane: 4 per n8 tile of tokens, at most two tiles.
constexpr int kPartialValues = kMaxBatchRows / 8 * 4;

// What a launch needs of the device matrix (pointers into its buffers).
struct DeviceMatrixView {
  const uint4* codes = nullptr;             // [m_tiles, total_steps, 2, 32] uint4 (the tile-major layout)
  // [groups_per_row, rows_padded] fp16, times 2^scale_exponent; a row's
  // entry at paired_row_slot(row) (cuda_weight_layout.hpp)
  const __half* scales = nullptr;
  const unsigned char* zeros = nullptr;     // the same layout, bytes (int4 asymmetric), else null
  const float* inverse_input_scales = nullptr;  // [in_features] 1 / s (AWQ), else null
  int out_features = 0;
  int in_features = 0;
  int m_tiles = 0;          // ceil(out / 16)
  int code_words = 0;       // m_tiles * total_steps * 2 * 32: the codes' uint4 (an int: check_matrix)
  int rows_padded = 0;      // m_tiles * 16
  int group_columns = 0;    // columns per group (in_features for int8)
  int groups_per_row = 0;
  int total_steps = 0;      // steps per row: ceil(padded_in / columns per step)
  int steps_per_block = 0;  // one-shot: <= kMaxSteps
  int k_splits = 0;         // one-shot: ceil(total_steps / steps_per_block): gridDim.x
  int m_blocks = 0;         // row blocks: ceil(m_tiles / 8) (one-shot: gridDim.y)
  float output_scale = 1.0f;  // 2^-scale_exponent: undoes the scales' exponent
};

// The persistent kernel's schedule for one matrix (DeviceQuantizedMatrix
// plans it once; the same for every launch on it).
struct PersistentPlan {
  long long units = 0;     // m_blocks * total_steps: (row block, step) pairs, row-block-major
  int grid = 0;            // blocks: min(units, SMs x the blocks that stay resident per SM)
  // Units whose x and group scales one staging covers (a multiple of the
  // ring's units, as large as shared memory allows for two blocks per SM):
  // a block's range is walked in segments of this many units.
  int segment_units = 0;
  int x_window_steps = 0;  // steps of x one segment stages: min(segment_units, total_steps)
  int x_stride_words = 0;  // words of one staged x row: x_window_steps * words per step + 8 (SchemeTraits)
  std::size_t shared_bytes[2] = {0, 0};  // dynamic shared memory at up to 8 and up to 16 tokens
};

// Split-K scratch of a launch: the partial sums and the flags.
//   one-shot:   partials [k_splits, 16, rows_padded] fp32;
//               counters [m_blocks]: blocks of each row block done so far.
//   persistent: partials [grid, 8 warps, kPartialValues, 32 lanes] fp32: the
//               one piece each block may hand over (persistent_matmul_kernel);
//               counters [m_tiles]: warps that handed over a piece of the tile.
// Both kernels leave every counter at 0 at the end of a launch.
struct SplitKView {
  float* partials = nullptr;
  unsigned* counters = nullptr;
};

// How a launch stages x (both checked by the host on the launch's x).
struct XStaging {
  bool vector_x = false;  // in_features % 4 == 0 and x aligned to 4 activations: 4-wide loads
  // fp16 x as is (no input scales), in_features % 8 == 0 and x aligned to 16
  // bytes: the persistent kernel copies it with cp.async (stage_segment_x).
  bool async_x = false;
};

// The launches (each kernel's file defines its own):
// y [rows, out] = x [rows, in] . W~^T for rows <= kMaxBatchRows, x and y
// device memory of activation type Act (float or __half), queued on
// `stream`. `v` points into a DeviceQuantizedMatrix of `scheme`; the
// split-K scratch holds what DeviceQuantizedMatrix::partial_floats() and
// counters() ask for, every counter 0.

// The one-shot kernel: grid (v.k_splits, v.m_blocks). vector_x: XStaging::vector_x.
template <class Act>
void launch_one_shot(QuantScheme scheme, const DeviceMatrixView& v, const Act* x, int rows, bool vector_x, Act* y,
                     SplitKView split_k, cudaStream_t stream);

// The persistent kernel's schedule for a matrix with view `v` (dims filled
// in), planned once per matrix for this GPU.
PersistentPlan plan_persistent(QuantScheme scheme, const DeviceMatrixView& v);

// The persistent kernel: grid plan.grid, on the plan of this matrix.
template <class Act>
void launch_persistent(QuantScheme scheme, const DeviceMatrixView& v, const PersistentPlan& plan, const Act* x,
                       int rows, XStaging staging, Act* y, SplitKView reduction, cudaStream_t stream);

}  // namespace step06::quantized_mma
