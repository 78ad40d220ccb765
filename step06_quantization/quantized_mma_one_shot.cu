// The one-shot split-K W8A16 / W4A16 kernel: the first version, kept to
// time against the persistent kernel that replaced it
// (quantized_mma_persistent.cu). The pieces both share: quantized_mma.cuh.
//
// Grid (split, row block), gridDim.x = splits (slice-fastest). A block
// computes its 128 rows over one slice of the input columns (split-K, at
// most kMaxSteps steps of 64 bytes per row); the last block of each row
// block (a ticket counter) adds the slices' partial sums in a fixed order.
// One block: (1) each warp requests its first weights (128-bit loads), (2)
// all threads stage the slice of x as fp16 and the group scales in shared
// memory, one __syncthreads, (3) the rest of the weights are requested,
// dequantized in registers to exact fp16 integers and multiplied on the
// tensor cores; each 32-column partial is scaled in fp32.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "programmatic_launch.cuh"  // common/cuda
#include "step06_quantization/quantized_mma.cuh"

namespace step06::quantized_mma {
namespace {

using llm::cuda::wait_then_let_next_kernel_launch;  // programmatic_launch.cuh

constexpr int kEarlySteps = 4;  // of kMaxSteps, the steps requested before the staging (see phase 3)

// --- Shared memory and staging: x and the group parameters.

// Shared memory of one block (static: at most 46 KB, under the 48 KB every
// architecture grants without opting in). For the 4-bit schemes:
//   x           [16 tokens, 1024 + 16] fp16 as words    33,280 B
//   scales      [33 groups, 8 warps, 8] fp16 pairs        8,448 B
//   zeros       [33 groups, 8 warps, 8] uint8 pairs       4,224 B
template <QuantScheme kScheme>
struct SharedTiles {
  using Traits = SchemeTraits<kScheme>;
  // The slice of x: row n = token n (zeros past the launch's rows), word i =
  // columns 2i, 2i + 1 of the slice (low half = the even column).
  alignas(16) std::uint32_t x[kMaxBatchRows][Traits::kXStrideWords];
  // Group scales of the block's rows, fp16 (times the matrix's power-of-two
  // scale exponent): entry (local group, warp, g) holds rows g and g + 8 of
  // the warp's tile, the two rows a lane's fragments cover. [kMaxGroups * 64]
  alignas(16) __half2 scales[Traits::kMaxGroups * kBlockRows / 2];
  // Zero points (int4 asymmetric), same index: z(row g) | z(row g + 8) << 8.
  alignas(16) unsigned short zeros[Traits::kMaxGroups * kBlockRows / 2];
  unsigned short nf4_levels[16];  // NF4's levels as fp16 bits (16 halfwords in 8 banks: never a conflict)
};

// Rows 0 .. 8 kNTiles - 1 of x's slice [col0, col0 + slice_columns), each
// thread one unit of 4 columns (consecutive threads, consecutive words: no
// bank conflict).
template <QuantScheme kScheme, class Act, int kNTiles>
__device__ __forceinline__ void stage_x(SharedTiles<kScheme>& tiles, const DeviceMatrixView& m, const Act* x,
                                        int rows, int col0, int slice_columns, bool vector_x) {
  const int unit = static_cast<int>(threadIdx.x);
  if (unit >= slice_columns / 4) return;  // no barrier inside: returning early is safe
  stage_x_unit<Act, 8 * kNTiles>(&tiles.x[0][2 * unit], SchemeTraits<kScheme>::kXStrideWords, m, x, rows,
                                 col0 + 4 * unit, vector_x);
}

// One tile's 16 group scales (and zero points) of one group, as loaded:
// in the tables' pair order (paired_row_slot), entry g = rows g, g + 8.
struct TileGroupParams {
  uint4 scales[2];  // pairs 0-3 | pairs 4-7 of the tile, fp16 x 2 each
  uint4 zeros;      // pairs 0-7, a byte per row (int4 asymmetric)
};

// The tile starting at `row`, group `group`: 32 contiguous bytes of the
// [group, row] scale layout (two 128-bit loads) and 16 of zero points (one).
// A group past the row (the last step's columns beyond padded_in) or a tile
// past the matrix (`exists` false) gets scale 0 (and zero point 0): its codes
// add nothing.
template <bool kZeros>
__device__ __forceinline__ TileGroupParams load_tile_group_params(const DeviceMatrixView& m, int group, int row,
                                                                  bool exists) {
  // Element 0 of the arrays is a valid address to load from when nothing exists.
  const std::size_t at = exists ? static_cast<std::size_t>(group) * m.rows_padded + row : 0;
  const uint4 none = make_uint4(0, 0, 0, 0);
  const uint4 low = __ldg(reinterpret_cast<const uint4*>(m.scales + at));
  const uint4 high = __ldg(reinterpret_cast<const uint4*>(m.scales + at + 8));
  TileGroupParams params;
  params.scales[0] = exists ? low : none;
  params.scales[1] = exists ? high : none;
  params.zeros = none;
  if constexpr (kZeros) {
    const uint4 z = __ldg(reinterpret_cast<const uint4*>(m.zeros + at));
    params.zeros = exists ? z : none;
  }
  return params;
}

// Stores a tile's parameters as the lanes read them, which is as the
// device tables hold them: scale entry g (0..7) = fp16 pair (row g, row g +
// 8); zero entry g = z(row g) | z(row g + 8) << 8. Both tables are indexed
// (item, g), 8 entries per item.
template <bool kZeros>
__device__ __forceinline__ void store_tile_group_params(const TileGroupParams& params, __half2* scale_entries,
                                                        unsigned short* zero_entries) {
  uint4* scale_words = reinterpret_cast<uint4*>(scale_entries);
  scale_words[0] = params.scales[0];
  scale_words[1] = params.scales[1];
  if constexpr (kZeros) {
    *reinterpret_cast<uint4*>(zero_entries) = params.zeros;
  } else {
    static_cast<void>(zero_entries);
  }
}

// The scales (and zero points) of the block's 128 rows for the n_groups
// groups the slice touches. Thread item = (local group, tile c of the
// block). In two halves: load() first (these bytes come from DRAM,
// like the weights), the x staging in between, store() last, so the block
// waits for one DRAM round trip, not for one after the other.
template <QuantScheme kScheme>
struct GroupParamsInFlight {
  using Traits = SchemeTraits<kScheme>;
  static constexpr int kItems = Traits::kMaxGroups * kWarps;
  static constexpr int kPasses = (kItems + kThreads - 1) / kThreads;  // 2 for 4-bit (33 groups), 1 for int8
  TileGroupParams params[kPasses];
  bool wanted[kPasses];

  __device__ __forceinline__ void load(const DeviceMatrixView& m, int first_group, int n_groups) {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int item = static_cast<int>(threadIdx.x) + p * kThreads;
      const int local_group = item / kWarps, tile = item % kWarps;
      const int group = first_group + local_group;
      const int row = static_cast<int>(blockIdx.y) * kBlockRows + tile * kTileRows;
      wanted[p] = local_group < n_groups;
      const bool exists = wanted[p] && group < m.groups_per_row && row < m.rows_padded;
      params[p] = load_tile_group_params<Traits::kZeros>(m, group, row, exists);
    }
  }

  __device__ __forceinline__ void store(SharedTiles<kScheme>& tiles) const {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      if (!wanted[p]) continue;
      const int item = static_cast<int>(threadIdx.x) + p * kThreads;  // = local group * 8 + tile
      store_tile_group_params<Traits::kZeros>(params[p], &tiles.scales[item * 8], &tiles.zeros[item * 8]);
    }
    if constexpr (kScheme == QuantScheme::NF4) stage_nf4_levels(tiles.nf4_levels);
  }
};

// --- Weights: steps [kFirst, kLast) of a warp's slice into registers
// (steps >= `steps`, past the row's end, stay 0 and are never used).
template <int kFirst, int kLast>
__device__ __forceinline__ void load_steps(uint4 (&codes)[kMaxSteps][2], const uint4* tile_codes, int steps) {
#pragma unroll
  for (int s = kFirst; s < kLast; ++s) {
    if (s < steps) {
      load_step_codes(codes[s], tile_codes + 2 * s * kWarpSize);
    } else {
      codes[s][0] = codes[s][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

// --- The one-shot split-K kernel.
//
// Grid (k_splits, m_blocks), 256 threads. Warp w of block (split, m_block)
// computes output rows [16 (8 m_block + w), +16) over the columns of steps
// [split * steps_per_block, +steps_per_block) for `rows` <= 16 tokens (two
// n8 MMA tiles when rows > 8: kNTiles). x [rows, in] and y [rows, out] are
// row-major; partials and counters are used when k_splits > 1.
template <QuantScheme kScheme, class Act, int kNTiles>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    one_shot_matmul_kernel(DeviceMatrixView m, const Act* __restrict__ x, int rows, bool vector_x,
                           Act* __restrict__ y, SplitKView split_k) {
  using Traits = SchemeTraits<kScheme>;
  __shared__ SharedTiles<kScheme> tiles;
  __shared__ bool is_last_block;

  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int g = lane / 4;  // the fragments' "group": output rows g and g + 8, token g of an n-tile
  const int t = lane % 4;  // the fragments' "thread in group": columns 4t .. 4t + 3 of each 16
  const int split = static_cast<int>(blockIdx.x);
  const int m_block = static_cast<int>(blockIdx.y);
  const int m_tile = m_block * kWarps + warp;
  const bool warp_has_tile = m_tile < m.m_tiles;  // the last m_block may have fewer than 8 tiles
  const int first_step = split * m.steps_per_block;
  const int steps = min(m.steps_per_block, m.total_steps - first_step);  // >= 1: k_splits = ceil(total / per block)
  const int col0 = first_step * Traits::kColumnsPerStep;
  const int slice_columns = steps * Traits::kColumnsPerStep;

  // Phase 1: the weights of the slice's first kEarlySteps steps, requested
  // at once (the rest right after the barrier, see phase 3).
  uint4 codes[kMaxSteps][2];  // [step][rows 0-7 | rows 8-15 of the tile]
  const uint4* tile_codes =
      m.codes + (static_cast<std::size_t>(m_tile) * m.total_steps + first_step) * 2 * kWarpSize + lane;
  if (warp_has_tile) load_steps<0, kEarlySteps>(codes, tile_codes, steps);

  // Phase 2: the shared slice of x and the block's group parameters.
  int first_group = 0, n_groups = 1;
  if constexpr (!Traits::kInt8) {
    first_group = col0 / m.group_columns;
    n_groups = (col0 + slice_columns - 1) / m.group_columns - first_group + 1;  // <= kMaxGroups
  }
  GroupParamsInFlight<kScheme> group_params;
  group_params.load(m, first_group, n_groups);
  // So far only the matrix was read, which no kernel writes: with a
  // programmatic launch (common/cuda/programmatic_launch.cuh) that ran while
  // the kernel before was finishing. x, y and the split-K scratch come from
  // earlier kernels.
  wait_then_let_next_kernel_launch();
  stage_x<kScheme, Act, kNTiles>(tiles, m, x, rows, col0, slice_columns, vector_x);
  group_params.store(tiles);
  // Barrier 1: the staged x, scales and zeros are complete before any warp
  // reads them (every warp reads columns and rows another warp staged).
  __syncthreads();

  // Phase 3: the second half of the weights is requested before the first
  // half is multiplied (a register double buffer). Holding all 8 steps and
  // the staging loads at once would not fit in 128 registers, and need not:
  // ~32 KB in flight per SM keep HBM busy (Little's law with an H100's
  // datasheet figures: 3.35 TB/s over 132 SMs is ~25 GB/s per SM, times ~1 us
  // of latency), and 8 warps x 4 KB (x 2 blocks) already are 64 KB.
  if (warp_has_tile) load_steps<kEarlySteps, kMaxSteps>(codes, tile_codes, steps);

  // The math (multiply_step). acc[nt] is the warp's 16 x 8 output tile for
  // tokens [8 nt, 8 nt + 8) in the D-fragment layout.
  float acc[kNTiles][4];
  zero_tile(acc);

  if (warp_has_tile) {
    // This lane's B operands: token g (+ 8 nt), columns 4t.. of each 16.
    const std::uint32_t* x_lane = &tiles.x[0][0] + g * Traits::kXStrideWords + 2 * t;
    const int pair_index = warp * 8 + g;  // its entry in the scale and zero tables
    // 4-bit: the group of each word is tracked incrementally (no division
    // in the loop): local group (of the slice's groups) and column in it.
    int local_group = 0;
    int column_in_group = col0 % m.group_columns;
    const auto word_params = [&](int) {
      const int entry = local_group * (kBlockRows / 2) + pair_index;
      WordScale params{tiles.scales[entry], 0u};
      if constexpr (Traits::kZeros) params.zeros = tiles.zeros[entry];
      column_in_group += 32;
      if (column_in_group == m.group_columns) {  // the next word starts the next group
        column_in_group = 0;
        ++local_group;
      }
      return params;
    };
#pragma unroll
    for (int s = 0; s < kMaxSteps; ++s)
      if (s < steps)
        multiply_step<kScheme, kNTiles>(acc, codes[s], x_lane + s * Traits::kWordsPerStep, Traits::kXStrideWords,
                                        tiles.nf4_levels, s == 0, word_params);
    // int8: one group per row; all MMAs were accumulated unscaled.
    if constexpr (Traits::kInt8) scale_rows(acc, tiles.scales[pair_index]);
  }

  const int tile_row0 = m_tile * kTileRows;
  if (m.k_splits == 1) {
    if (warp_has_tile) write_output_tile<Act>(acc, m, tile_row0, g, t, rows, y);
    return;  // the whole block returns: no barrier follows
  }

  // Split-K: this slice's partial sums, then a ticket; the last block of the
  // m_block adds every slice's partials in slice order and writes y.
  if (warp_has_tile) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = tile_row0 + g + 8 * (i / 2), token = 8 * nt + 2 * t + i % 2;
        if (token < rows)
          __stcg(split_k.partials + (static_cast<std::size_t>(split) * kMaxBatchRows + token) * m.rows_padded + row,
                 acc[nt][i]);
      }
  }
  // Release: each thread's partials are visible device-wide before the
  // ticket is taken (the fence), and every thread has fenced before thread 0
  // takes it (barrier 2).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    // atomicInc wraps to 0 after k_splits - 1: the last block resets the
    // counter for the next launch.
    const unsigned ticket = atomicInc(split_k.counters + m_block, static_cast<unsigned>(m.k_splits - 1));
    __threadfence();  // acquire: the other blocks' partials are read after their tickets
    is_last_block = ticket == static_cast<unsigned>(m.k_splits - 1);
  }
  // Barrier 3: every thread sees is_last_block.
  __syncthreads();
  if (!is_last_block) return;

  const int row = m_block * kBlockRows + static_cast<int>(threadIdx.x) % kBlockRows;
  if (row >= m.out_features) return;
  for (int token = static_cast<int>(threadIdx.x) / kBlockRows; token < rows; token += kThreads / kBlockRows) {
    const float* partial = split_k.partials + static_cast<std::size_t>(token) * m.rows_padded + row;
    const std::size_t split_stride = static_cast<std::size_t>(kMaxBatchRows) * m.rows_padded;
    float sum = 0.0f;
    // __ldcg: from L2, where the other blocks' stores went (never a stale L1 line).
#pragma unroll 4
    for (int s = 0; s < m.k_splits; ++s) sum += __ldcg(partial + s * split_stride);
    y[static_cast<std::size_t>(token) * m.out_features + row] = from_float<Act>(sum * m.output_scale);
  }
}

}  // namespace

template <class Act>
void launch_one_shot(QuantScheme scheme, const DeviceMatrixView& v, const Act* x, int rows, bool vector_x, Act* y,
                     SplitKView split_k, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(v.k_splits), static_cast<unsigned>(v.m_blocks));
  with_scheme(scheme, [&](auto scheme_constant) {
    constexpr QuantScheme kScheme = decltype(scheme_constant)::value;
    if (rows <= 8)
      llm::cuda::launch_kernel(one_shot_matmul_kernel<kScheme, Act, 1>, grid, kThreads, 0, stream, v, x, rows,
                               vector_x, y, split_k);
    else
      llm::cuda::launch_kernel(one_shot_matmul_kernel<kScheme, Act, 2>, grid, kThreads, 0, stream, v, x, rows,
                               vector_x, y, split_k);
  });
}

// The two activation types the host side launches with.
template void launch_one_shot<float>(QuantScheme, const DeviceMatrixView&, const float*, int, bool, float*, SplitKView,
                                     cudaStream_t);
template void launch_one_shot<__half>(QuantScheme, const DeviceMatrixView&, const __half*, int, bool, __half*,
                                      SplitKView, cudaStream_t);

}  // namespace step06::quantized_mma
