// The persistent pipelined W8A16 / W4A16 kernel: the model's (every
// product but the int4 decode GEMV's 1..4 rows), its schedule and its
// launch. The pieces it shares with the one-shot kernel it replaced
// (quantized_mma_one_shot.cu): quantized_mma.cuh.
//
// Grid = the blocks that stay resident at once (SMs x blocks per SM). The
// work is cut into units (row block, step), numbered row-block-major, and
// each block owns one contiguous range of them, so its consecutive units
// continue along K of the same 128 rows and the partial sums stay in
// registers; it walks its range downwards (see the kernel). Each warp
// streams its tile's weights through a ring of kRingUnits units held in
// registers: a unit's loads are requested kRingUnits units before its math,
// so kRingUnits - 1 units are always in flight. x and the group scales of a
// segment of units are staged into shared memory once (for the shapes of
// chapter 06's section 9, one segment per block) while the ring's first
// loads travel. A row block whose K range two or more blocks share (only at
// the two ends of a block's range) is added up by the block that owns its
// last step, from the others' partial sums, after a per-warp flag: one
// release and one acquire, no ticket round trip, and always the same order.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

// common/cuda (a public include directory of llm_common in CUDA builds).
#include "programmatic_launch.cuh"
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "step06_quantization/quantized_mma.cuh"

namespace step06::quantized_mma {
namespace {

using llm::cuda::wait_then_let_next_kernel_launch;  // programmatic_launch.cuh

// The ring: units (one step of one 16-row tile, 1 KB) in a warp's
// ring of registers, 8 registers each: 6 units, 48 registers. With 5 units
// always in flight a warp keeps 5 KB requested, an SM with two blocks 80 KB:
// Little's law with an H100's datasheet figures (3.35 TB/s over 132 SMs is
// ~25 GB/s per SM) asks for ~25 KB per microsecond of latency, so the ring
// covers a loaded DRAM latency of ~3 us. The one-shot kernel had at most 64
// KB per SM in flight, and none between its blocks. A deeper ring does not
// fit in 128 registers beside the staging's (7 units already spill), and on
// sm_75 int4 asymmetric (its zero points) and NF4 (9-16 rows, fp16 x)
// spill with 6: 5 there, more than a T4's 320 GB/s over 40 SMs need. The device
// side takes the architecture it is compiled for (__CUDA_ARCH__), the host
// the same number of the code that runs (the kernel's ptxVersion, also when
// the driver compiles PTX for a newer GPU), so the two always agree.
constexpr int ring_units(QuantScheme scheme, int architecture) {
  const bool tight = scheme == QuantScheme::Int4Asymmetric || scheme == QuantScheme::NF4;
  return tight && architecture < 80 ? 5 : 6;
}
#if defined(__CUDA_ARCH__)
constexpr int kCompiledArchitecture = __CUDA_ARCH__ / 10;  // 75, 80, 90
#else
constexpr int kCompiledArchitecture = 0;  // the host pass compiles no kernel body
#endif

// --- The persistent pipelined kernel's pieces.

// 16 bytes from global to shared memory, the bytes past src_bytes (0 or 16)
// zero-filled. From sm_80 on: cp.async.cg, asynchronous (no register holds
// the data, so a thread can have all of its copies in flight at once, and
// they land while the weights stream) and cached in L2 only (x is re-read
// from L2 by every block; L1 would not keep it for the next segment). Before
// sm_80 (Turing has no cp.async): a plain load and store, correct and
// synchronous. src must be a valid address even when src_bytes is 0.
__device__ __forceinline__ void copy_16_async(void* dst_shared, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(dst_shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
#else
  *static_cast<uint4*>(dst_shared) = src_bytes > 0 ? __ldg(static_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
#endif
}

// Waits until this thread's copy_16_async copies have landed (a barrier then
// makes them visible to the block).
__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// The staged tables of a segment, in the block's dynamic shared memory (the
// sizes come from the plan; every table starts 16-byte aligned):
//   x       [8 kNTiles tokens][x_stride_words] words: x slot s = step
//           (top_step - s) mod total_steps of x, as fp16 pairs (as SharedTiles::x)
//   scales  [segment_units][entries per step][128 rows] fp16: unit slot j's
//           group scales of the row block's rows (word w's group, or the
//           row's one group for int8), as the device matrix stores them
//   zeros   [segment_units][entries per step][128 rows] bytes (int4 asymmetric only)
// Copied as they are (16-byte cp.async copies: no registers, all in flight
// at once); the device tables' pair order (paired_row_slot) gives a lane its
// two rows' entries side by side (group_params_of_word).
// Llama-2-7B's FFN matrices on an H100 give a block 10 or 11 units; int4
// asymmetric at 16 tokens stages them in one 15-unit segment, 61,952 +
// 15,360 + 7,680 bytes, and two such blocks fit in an SM's 228 KB.
struct SegmentTables {
  std::uint32_t* x;
  __half* scales;
  unsigned char* zeros;
};

template <QuantScheme kScheme, int kNTiles>
__device__ __forceinline__ SegmentTables segment_tables(uint4* shared, const PersistentPlan& plan) {
  SegmentTables tables;
  tables.x = reinterpret_cast<std::uint32_t*>(shared);
  tables.scales = reinterpret_cast<__half*>(tables.x + 8 * kNTiles * plan.x_stride_words);
  tables.zeros = reinterpret_cast<unsigned char*>(
      tables.scales + plan.segment_units * SchemeTraits<kScheme>::kScaleEntriesPerStep * kBlockRows);
  return tables;
}

// The group parameters of rows g and g + 8 of a warp's tile as a lane reads
// them (WordScale), from a segment table entry (at the tile's first slot):
// pair g of the tile's entries (paired_row_slot), one 32-bit and one 16-bit
// shared load. (The entry is 32-byte aligned: slots of whole tiles.)
template <bool kZeros>
__device__ __forceinline__ WordScale group_params_of_word(const __half* scales, const unsigned char* zeros, int g) {
  WordScale params{reinterpret_cast<const __half2*>(scales)[g], 0u};
  if constexpr (kZeros) params.zeros = reinterpret_cast<const unsigned short*>(zeros)[g];
  return params;
}

// Units are walked downwards: from (row_block, step) to the unit below it.
__device__ __forceinline__ void step_down(int& row_block, int& step, int total_steps) {
  if (--step < 0) {
    step = total_steps - 1;
    --row_block;
  }
}

// Unit j (0, 1, ...) below (top_block, top_step), counting downwards.
__device__ __forceinline__ void unit_below(int top_block, int top_step, int j, int total_steps, int& row_block,
                                           int& step) {
  const int wraps = j <= top_step ? 0 : (j - top_step - 1) / total_steps + 1;  // row blocks crossed
  step = top_step - j + wraps * total_steps;
  row_block = top_block - wraps;
}

// The next unit whose weights a warp requests, walked downwards like the
// units, with the lane's offset into the codes: a step down subtracts one
// step's 64 uint4 (and, into the row block below, its other 7 tiles' steps
// too), where computing (tile x total_steps + step) x 64 + lane anew, in 64
// bits, was a chain of multiplies and shifts per unit (chapter 06, section
// 9.4, counts it). An int holds every offset (check_matrix).
struct RequestCursor {
  int offset;  // of the lane's first uint4 of the warp's tile in unit (row block, step)
  int step;

  __device__ __forceinline__ RequestCursor(const DeviceMatrixView& m, int row_block, int step_, int warp, int lane)
      : offset(((row_block * kWarps + warp) * m.total_steps + step_) * 2 * kWarpSize + lane), step(step_) {}

  // Requests the unit's weights; nothing when the warp's tile lies past the
  // matrix (the last row block's), which is when its offset lies past the
  // codes: one compare, and no third register for the tile.
  __device__ __forceinline__ void request(uint4 (&codes)[2], const DeviceMatrixView& m) const {
    if (offset < m.code_words) load_step_codes(codes, m.codes + offset);
  }
  __device__ __forceinline__ void step_down(int total_steps) {
    offset -= 2 * kWarpSize;
    if (--step < 0) {
      step = total_steps - 1;
      offset -= (kWarps - 1) * total_steps * 2 * kWarpSize;
    }
  }
};

// The group parameters of a segment's `units` units below (top_block,
// top_step) into its tables: per (unit slot, entry), the row block's 128
// scales (256 contiguous bytes of the [group, row] layout, 16 copies) and
// zero points (128 bytes, 8 copies). A group past the row (the last step's
// columns beyond padded_in) or rows past the matrix are zero-filled: scale 0,
// their codes add nothing.
template <QuantScheme kScheme>
__device__ __forceinline__ void stage_segment_params(const SegmentTables& tables, const DeviceMatrixView& m,
                                                     int top_block, int top_step, int units) {
  using Traits = SchemeTraits<kScheme>;
  constexpr int kEntries = Traits::kScaleEntriesPerStep;
  constexpr int kScaleCopies = kBlockRows * sizeof(__half) / 16;  // 16 per (slot, entry)
  constexpr int kZeroCopies = kBlockRows / 16;                     // 8
  constexpr int kCopies = kScaleCopies + (Traits::kZeros ? kZeroCopies : 0);
  const int n_copies = units * kEntries * kCopies;
#pragma unroll 1
  for (int item = static_cast<int>(threadIdx.x); item < n_copies; item += kThreads) {
    const int entry_index = item / kCopies, copy = item % kCopies;  // entry_index = slot * kEntries + entry
    const int slot = entry_index / kEntries, entry = entry_index % kEntries;
    int row_block = 0, step = 0;
    unit_below(top_block, top_step, slot, m.total_steps, row_block, step);
    const int group = Traits::kInt8 ? 0 : (step * Traits::kColumnsPerStep + 32 * entry) / m.group_columns;
    if (copy < kScaleCopies) {
      const int row = row_block * kBlockRows + 8 * copy;  // 8 fp16 per copy
      const bool exists = group < m.groups_per_row && row < m.rows_padded;
      const __half* src = exists ? m.scales + static_cast<std::size_t>(group) * m.rows_padded + row : m.scales;
      copy_16_async(tables.scales + entry_index * kBlockRows + 8 * copy, src, exists ? 16 : 0);
    } else {
      const int zero_copy = copy - kScaleCopies;
      const int row = row_block * kBlockRows + 16 * zero_copy;  // 16 bytes per copy
      const bool exists = group < m.groups_per_row && row < m.rows_padded;
      const unsigned char* src = exists ? m.zeros + static_cast<std::size_t>(group) * m.rows_padded + row : m.zeros;
      copy_16_async(tables.zeros + entry_index * kBlockRows + 16 * zero_copy, src, exists ? 16 : 0);
    }
  }
}

// x of a segment: x_steps steps (slot s = step (top_step - s) mod
// total_steps), tokens 0 .. 8 kNTiles - 1. fp16 x that needs no change
// (XStaging::async_x): 16-byte cp.async copies, all of a thread's in flight
// at once, zero-filled past the batch and past in_features (in_features %
// 8 == 0: a copy is all inside or all outside). Otherwise (fp32 x, AWQ's
// input scales, odd sizes) through registers, rounded and divided as
// stage_x_unit does, one 4-column unit at a time.
template <QuantScheme kScheme, class Act, int kNTiles>
__device__ __forceinline__ void stage_segment_x(std::uint32_t* x_table, int x_stride_words, const DeviceMatrixView& m,
                                                const Act* x, int rows, XStaging staging, int top_step, int x_steps) {
  using Traits = SchemeTraits<kScheme>;
  constexpr int kRows = 8 * kNTiles;
  const int total_steps = m.total_steps;
  if constexpr (std::is_same_v<Act, __half>) {
    if (staging.async_x) {
      constexpr int kCopiesPerStep = Traits::kColumnsPerStep / 8;  // 8 fp16 columns per 16 bytes
      const int n_copies = kRows * x_steps * kCopiesPerStep;
#pragma unroll 1
      for (int item = static_cast<int>(threadIdx.x); item < n_copies; item += kThreads) {
        // Consecutive threads, consecutive 16 bytes of one row of one step.
        const int copy = item % kCopiesPerStep, slot = item / kCopiesPerStep % x_steps;
        const int token = item / (kCopiesPerStep * x_steps);
        const int step = top_step - slot + (slot > top_step ? total_steps : 0);
        const int column = step * Traits::kColumnsPerStep + 8 * copy;
        const bool inside = token < rows && column < m.in_features;
        const __half* src = inside ? x + static_cast<std::size_t>(token) * m.in_features + column : x;
        copy_16_async(x_table + token * x_stride_words + slot * Traits::kWordsPerStep + 4 * copy, src,
                      inside ? 16 : 0);
      }
      return;
    }
  }
  constexpr int kUnitsPerStep = Traits::kColumnsPerStep / 4;
  const int n_units = x_steps * kUnitsPerStep;
#pragma unroll 1
  for (int item = static_cast<int>(threadIdx.x); item < n_units; item += kThreads) {
    const int slot = item / kUnitsPerStep, unit = item % kUnitsPerStep;
    const int step = top_step - slot + (slot > top_step ? total_steps : 0);
    stage_x_unit<Act, kRows>(x_table + slot * Traits::kWordsPerStep + 2 * unit, x_stride_words, m, x, rows,
                             step * Traits::kColumnsPerStep + 4 * unit, staging.vector_x);
  }
}

// Stages the segment whose first (highest) unit is (top_block, top_step) and
// which holds `units` units: their group parameters (DRAM, like the weights:
// requested first) and their steps of x (L2), then waits for its copies. The
// caller's barrier makes it all visible.
template <QuantScheme kScheme, class Act, int kNTiles>
__device__ __forceinline__ void stage_segment(const SegmentTables& tables, const DeviceMatrixView& m,
                                              const PersistentPlan& plan, const Act* x, int rows, XStaging staging,
                                              int top_block, int top_step, int units) {
  stage_segment_params<kScheme>(tables, m, top_block, top_step, units);
  stage_segment_x<kScheme, Act, kNTiles>(tables.x, plan.x_stride_words, m, x, rows, staging, top_step,
                                         min(units, m.total_steps));
  wait_async_copies();
}

// ld.acquire.gpu: the loads after it see what the writers released before
// the value read.
__device__ __forceinline__ unsigned load_acquire(const unsigned* address) {
  unsigned value;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];\n" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// A warp hands its tile's partial sums (a piece of the tile's K range that
// does not end the range) to the block that owns the range's end: its
// slot of the scratch (one per block and warp: a block hands over at most one
// piece), then the tile's flag. Release: every lane's stores are visible
// device-wide (its fence) before the warp's barrier, and lane 0 raises the
// flag after it.
template <int kNTiles>
__device__ __forceinline__ void hand_over_partials(const float (&acc)[kNTiles][4], SplitKView reduction, int block,
                                                   int warp, int lane, int m_tile) {
  float* slot = reduction.partials + (static_cast<std::size_t>(block) * kWarps + warp) * kPartialValues * kWarpSize;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) __stcg(slot + (nt * 4 + i) * kWarpSize + lane, acc[nt][i]);  // coalesced: lane-fastest
  __threadfence();
  __syncwarp();
  if (lane == 0) atomicAdd(reduction.counters + m_tile, 1u);
}

// The warp owns the end of its tile's K range, and blocks first_block ..
// block - 1 each handed over a piece of the rest: it waits for their flags
// (acquire; each lane reads the flag itself), resets the flag for the next
// launch, adds their partial sums in block order and then its own, and
// writes y. The grid is what the GPU holds at once (plan_persistent), so
// the blocks waited for are running; and only lower-numbered blocks are
// waited for, which never wait for higher ones: no wait closes a cycle.
template <class Act, int kNTiles>
__device__ __forceinline__ void finish_owned_tile(const float (&acc)[kNTiles][4], SplitKView reduction,
                                                  const DeviceMatrixView& m, int first_block, int block, int warp,
                                                  int lane, int m_tile, int rows, Act* y) {
  unsigned* flag = reduction.counters + m_tile;
  const auto contributors = static_cast<unsigned>(block - first_block);
  while (load_acquire(flag) < contributors) __nanosleep(64);
  __syncwarp();
  if (lane == 0) *flag = 0;  // every lane has read it; nothing else touches it before the next launch
  float sum[kNTiles][4];
  zero_tile(sum);
  for (int contributor = first_block; contributor < block; ++contributor) {
    const float* slot =
        reduction.partials + (static_cast<std::size_t>(contributor) * kWarps + warp) * kPartialValues * kWarpSize;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) sum[nt][i] += __ldcg(slot + (nt * 4 + i) * kWarpSize + lane);  // L2: never stale
  }
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) sum[nt][i] += acc[nt][i];
  write_output_tile<Act>(sum, m, m_tile * kTileRows, lane / 4, lane % 4, rows, y);
}

// --- The persistent pipelined kernel.
//
// Grid plan.grid (<= units), 256 threads, plan.shared_bytes[kNTiles - 1] of
// dynamic shared memory. Block b owns units [b units / grid, (b + 1) units /
// grid) (unit u = row block u / total_steps, step u % total_steps) and
// walks them downwards, so of the pieces its range cuts from row blocks
// (one per row block it touches) it meets
//   first, the piece of its highest row block, which may stop short of that
//     row block's last step: then it hands the piece's partial sums over;
//   then whole row blocks, written straight to y;
//   last, the piece of its lowest row block, which may start after that row
//     block's step 0: then it owns the row block's end and adds up the
//     pieces that lower blocks handed over at their start, long done.
// A warp computes its tile (row block * 8 + warp) of every unit. x [rows,
// in] and y [rows, out] are row-major.
template <QuantScheme kScheme, class Act, int kNTiles>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    persistent_matmul_kernel(DeviceMatrixView m, PersistentPlan plan, const Act* __restrict__ x, int rows,
                             XStaging staging, Act* __restrict__ y, SplitKView reduction) {
  using Traits = SchemeTraits<kScheme>;
  constexpr int kEntries = Traits::kScaleEntriesPerStep;
  constexpr int kRingUnits = ring_units(kScheme, kCompiledArchitecture);
  extern __shared__ uint4 segment_shared[];  // SegmentTables; uint4: 16-byte aligned for cp.async
  __shared__ unsigned short nf4_levels[16];
  const SegmentTables tables = segment_tables<kScheme, kNTiles>(segment_shared, plan);

  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int g = lane / 4;  // the fragments' "group": output rows g and g + 8, token g of an n-tile
  const int t = lane % 4;  // the fragments' "thread in group": columns 4t .. 4t + 3 of each 16
  const int block = static_cast<int>(blockIdx.x);
  const int total_steps = m.total_steps;
  const long long unit_begin = block * plan.units / gridDim.x;
  const long long unit_end = (block + 1) * plan.units / gridDim.x;
  const int count = static_cast<int>(unit_end - unit_begin);  // >= 1: grid <= units
  if (count <= 0) {  // never (grid <= units); the whole block, no barrier follows
    wait_then_let_next_kernel_launch();  // every block waits before it exits (programmatic_launch.cuh)
    return;
  }
  const int top_block = static_cast<int>((unit_end - 1) / total_steps);
  const int top_step = static_cast<int>((unit_end - 1) % total_steps);
  const int bottom_block = static_cast<int>(unit_begin / total_steps);
  const int bottom_step = static_cast<int>(unit_begin % total_steps);

  if constexpr (kScheme == QuantScheme::NF4) stage_nf4_levels(nf4_levels);  // visible after the first barrier

  // The ring: unit p of the walk (p = 0 .. count - 1, from the top down)
  // sits in ring[p % kRingUnits] from kRingUnits units before its math until
  // its math; the first kRingUnits are requested before anything else.
  uint4 ring[kRingUnits][2];
  RequestCursor next_request(m, top_block, top_step, warp, lane);  // the next unit to request
#pragma unroll
  for (int i = 0; i < kRingUnits; ++i) {
    if (i < count) {
      next_request.request(ring[i], m);
      next_request.step_down(total_steps);
    }
  }
  // So far only the matrix was read (and NF4's levels staged), which no
  // kernel writes: with a programmatic launch (common/cuda/
  // programmatic_launch.cuh) that ran while the kernel before was
  // finishing. x, y and the split-K scratch come from earlier kernels.
  wait_then_let_next_kernel_launch();

  // The math's cursor: the unit, its slot in the staged segment (scales)
  // and its slot of x (the same until a segment holds more than a row's
  // steps).
  int unit_block = top_block, unit_step = top_step;
  int slot = 0, x_slot = 0;
  // Whether the piece being summed reaches its row block's last step (only
  // the first piece can fail to).
  bool piece_reaches_end = top_step == total_steps - 1;
  float acc[kNTiles][4];
  zero_tile(acc);
  const std::uint32_t* x_lane = tables.x + g * plan.x_stride_words + 2 * t;  // this lane's B operands
  // int8: the scale pair of the tile's rows g, g + 8 (the row's one group), from a unit slot's entry.
  const auto int8_row_scales = [&](int unit_slot) {
    return group_params_of_word<false>(tables.scales + unit_slot * kBlockRows + warp * kTileRows, nullptr, g).scale;
  };

  for (int p0 = 0; p0 < count; p0 += kRingUnits) {
    if (p0 % plan.segment_units == 0) {
      // A new segment (segment_units is a multiple of kRingUnits): its x
      // and group parameters. The ring's units are already requested, so
      // the weights keep streaming while the block stages.
      if (p0 > 0) __syncthreads();  // every warp is done with the previous segment's tables
      stage_segment<kScheme, Act, kNTiles>(tables, m, plan, x, rows, staging, unit_block, unit_step,
                                           min(plan.segment_units, count - p0));
      __syncthreads();  // the tables are complete before any warp reads them
      slot = 0;
      x_slot = 0;
    }
#pragma unroll
    for (int i = 0; i < kRingUnits; ++i) {
      const int p = p0 + i;
      if (p < count) {  // the same for the whole block
        const int m_tile = unit_block * kWarps + warp;
        const bool warp_has_tile = m_tile < m.m_tiles;  // the last row block may have fewer than 8 tiles
        const int entry0 = slot * kEntries * kBlockRows + warp * kTileRows;  // the tile's rows in the tables
        if (warp_has_tile) {
          const auto word_params = [&](int w) {
            const int entry = entry0 + w * kBlockRows;
            return group_params_of_word<Traits::kZeros>(tables.scales + entry, tables.zeros + entry, g);
          };
          multiply_step<kScheme, kNTiles>(acc, ring[i], x_lane + x_slot * Traits::kWordsPerStep, plan.x_stride_words,
                                          nf4_levels, p == 0, word_params);
        }
        // The ring slot is free again: the unit kRingUnits further down.
        if (p + kRingUnits < count) {
          next_request.request(ring[i], m);
          next_request.step_down(total_steps);
        }
        // Step 0 ends the piece: it covers its row block's K range from the
        // start, so no lower block holds any of it.
        if (unit_step == 0) {
          if (warp_has_tile) {
            if constexpr (Traits::kInt8) scale_rows(acc, int8_row_scales(slot));
            if (piece_reaches_end) {
              write_output_tile<Act>(acc, m, m_tile * kTileRows, g, t, rows, y);
            } else {
              hand_over_partials(acc, reduction, block, warp, lane, m_tile);
            }
          }
          zero_tile(acc);
          piece_reaches_end = true;  // the next unit is the previous row block's last step
        }
        step_down(unit_block, unit_step, total_steps);
        ++slot;
        if (++x_slot == total_steps) x_slot = 0;
      }
    }
  }

  // The last piece, when it starts after step 0 of its row block: lower
  // blocks hold the rest of the row block's K range.
  if (bottom_step != 0) {
    const int m_tile = bottom_block * kWarps + warp;
    if (m_tile < m.m_tiles) {
      // int8: the last unit's slot is still staged (no segment follows it).
      if constexpr (Traits::kInt8) scale_rows(acc, int8_row_scales(slot - 1));
      if (piece_reaches_end) {
        // The lowest block holding part of the row block: the block of its step 0.
        const long long first_unit = static_cast<long long>(bottom_block) * total_steps;
        const auto first_block = static_cast<int>(((first_unit + 1) * gridDim.x - 1) / plan.units);
        finish_owned_tile<Act>(acc, reduction, m, first_block, block, warp, lane, m_tile, rows, y);
      } else {
        hand_over_partials(acc, reduction, block, warp, lane, m_tile);  // a piece inside one row block
      }
    }
  }
}

// --- Host side: the plan and the launch.

// The GPU's shared memory as the persistent plan needs it (read once).
struct SharedMemoryLimits {
  int per_sm = 0;              // what the resident blocks of one SM share
  int per_block_opt_in = 0;    // the most one block may have, static and dynamic, once it opts in
  int reserved_per_block = 0;  // what the system keeps of per_sm for each resident block
};

const SharedMemoryLimits& shared_memory_limits() {
  static const SharedMemoryLimits limits = [] {
    int device = 0;
    LLM_CUDA_CHECK(cudaGetDevice(&device));
    SharedMemoryLimits read;
    LLM_CUDA_CHECK(cudaDeviceGetAttribute(&read.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    LLM_CUDA_CHECK(cudaDeviceGetAttribute(&read.per_block_opt_in, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    LLM_CUDA_CHECK(cudaDeviceGetAttribute(&read.reserved_per_block, cudaDevAttrReservedSharedMemoryPerBlock, device));
    return read;
  }();
  return limits;
}

// How many blocks of one persistent kernel with `shared_bytes` of dynamic
// shared memory an SM holds at once (0: not even one). First, once per
// kernel: the kernel may use all the dynamic shared memory a block can opt
// into (over 48 KB needs the opt-in), and prefers the SM's largest shared
// memory carveout (its tables are its cache; the weights stream past L1).
template <QuantScheme kScheme, class Act, int kNTiles>
int persistent_blocks_per_sm(std::size_t shared_bytes) {
  static const std::size_t dynamic_limit = [] {
    const auto kernel = persistent_matmul_kernel<kScheme, Act, kNTiles>;
    cudaFuncAttributes attributes{};
    LLM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    const int limit = shared_memory_limits().per_block_opt_in - static_cast<int>(attributes.sharedSizeBytes);
    LLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit));
    LLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    return static_cast<std::size_t>(limit);
  }();
  if (shared_bytes > dynamic_limit) return 0;
  int blocks = 0;
  LLM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, persistent_matmul_kernel<kScheme, Act, kNTiles>,
                                                               kThreads, shared_bytes));
  return blocks;
}

// The persistent kernel's plan for a matrix with view `v` (dims filled in).
// Segment: all of a block's units when their tables fit in half an SM's
// shared memory (two blocks per SM, as the registers allow), else the most
// whole rings that do (a block then stages more than once). Grid: as many
// blocks as stay resident at once, whichever instantiation runs (the
// launch's activation type and token count pick one), so no block waits for
// a block that has not started, and every launch on the matrix cuts the
// units the same way (the partial-sum slots depend on it).
template <QuantScheme kScheme>
PersistentPlan plan_persistent_for(const DeviceMatrixView& v) {
  using Traits = SchemeTraits<kScheme>;
  PersistentPlan plan;
  plan.units = static_cast<long long>(v.m_blocks) * v.total_steps;
  const auto shared_bytes_for = [&](int segment_units, int n_tiles) {
    const int x_steps = std::min(segment_units, v.total_steps);
    const std::size_t x_words = static_cast<std::size_t>(8 * n_tiles) * (x_steps * Traits::kWordsPerStep + 8);
    const std::size_t table_rows = static_cast<std::size_t>(segment_units) * Traits::kScaleEntriesPerStep * kBlockRows;
    return x_words * sizeof(std::uint32_t) + table_rows * (sizeof(__half) + (Traits::kZeros ? 1 : 0));
  };
  const int sms = llm::cuda::sm_count();
  const SharedMemoryLimits& limits = shared_memory_limits();
  const long long wanted_grid = std::min(plan.units, static_cast<long long>(sms) * kMinBlocksPerSm);
  const long long units_per_block = (plan.units + wanted_grid - 1) / wanted_grid;
  constexpr int kStaticShared = 64;  // the NF4 table, rounded up
  const long long budget = limits.per_sm / kMinBlocksPerSm - limits.reserved_per_block - kStaticShared;
  // The ring of the code that runs on this GPU (see ring_units).
  cudaFuncAttributes attributes{};
  LLM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, persistent_matmul_kernel<kScheme, __half, 2>));
  const int ring = ring_units(kScheme, attributes.ptxVersion);
  int segment_units = ring;
  while (segment_units < units_per_block &&
         static_cast<long long>(shared_bytes_for(segment_units + ring, 2)) <= budget)
    segment_units += ring;
  plan.segment_units = segment_units;
  plan.x_window_steps = std::min(segment_units, v.total_steps);
  plan.x_stride_words = plan.x_window_steps * Traits::kWordsPerStep + 8;
  plan.shared_bytes[0] = shared_bytes_for(segment_units, 1);
  plan.shared_bytes[1] = shared_bytes_for(segment_units, 2);
  const int blocks_per_sm = std::min({persistent_blocks_per_sm<kScheme, float, 1>(plan.shared_bytes[0]),
                                      persistent_blocks_per_sm<kScheme, float, 2>(plan.shared_bytes[1]),
                                      persistent_blocks_per_sm<kScheme, __half, 1>(plan.shared_bytes[0]),
                                      persistent_blocks_per_sm<kScheme, __half, 2>(plan.shared_bytes[1])});
  if (blocks_per_sm < 1)
    throw llm::DeviceError("step06: the persistent quantized kernel needs " + std::to_string(plan.shared_bytes[1]) +
                           " bytes of shared memory per block; this GPU grants " +
                           std::to_string(limits.per_block_opt_in));
  plan.grid = static_cast<int>(std::min(plan.units, static_cast<long long>(sms) * blocks_per_sm));
  return plan;
}

}  // namespace

PersistentPlan plan_persistent(QuantScheme scheme, const DeviceMatrixView& v) {
  return with_scheme(scheme,
                     [&](auto scheme_constant) { return plan_persistent_for<decltype(scheme_constant)::value>(v); });
}

template <class Act>
void launch_persistent(QuantScheme scheme, const DeviceMatrixView& v, const PersistentPlan& plan, const Act* x,
                       int rows, XStaging staging, Act* y, SplitKView reduction, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>(plan.grid);
  with_scheme(scheme, [&](auto scheme_constant) {
    constexpr QuantScheme kScheme = decltype(scheme_constant)::value;
    if (rows <= 8)
      llm::cuda::launch_kernel(persistent_matmul_kernel<kScheme, Act, 1>, grid, kThreads, plan.shared_bytes[0], stream,
                               v, plan, x, rows, staging, y, reduction);
    else
      llm::cuda::launch_kernel(persistent_matmul_kernel<kScheme, Act, 2>, grid, kThreads, plan.shared_bytes[1], stream,
                               v, plan, x, rows, staging, y, reduction);
  });
}

// The two activation types the host side launches with.
template void launch_persistent<float>(QuantScheme, const DeviceMatrixView&, const PersistentPlan&, const float*, int,
                                       XStaging, float*, SplitKView, cudaStream_t);
template void launch_persistent<__half>(QuantScheme, const DeviceMatrixView&, const PersistentPlan&, const __half*,
                                        int, XStaging, __half*, SplitKView, cudaStream_t);

}  // namespace step06::quantized_mma
