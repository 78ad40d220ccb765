// W8A16 / W4A16 on the GPU: y [rows, out] = x [rows, in] . dequantize(W)^T for
// 1..16 rows (more rows: 16 at a time), int8 per channel, int4 asymmetric and
// symmetric groups and NF4, fp16 or fp32 activations, fp32 accumulation.
//
// The grid: block (split, m_block), gridDim.x = splits (slice-fastest), 256
// threads = 8 warps. A block computes 128 output rows (one 16-row m16n8k16
// MMA tile per warp) over one slice of the input columns (split-K, at most
// kMaxSteps steps of 64 bytes per row); the last block of each m_block (a
// ticket counter) adds the slices' partial sums in a fixed order.
// One block: (1) each warp requests its first weights (128-bit loads),
// (2) all threads stage the slice of x as fp16 and the group scales in
// shared memory, one __syncthreads, (3) the rest of the weights are
// requested, dequantized in registers to exact fp16 integers and multiplied
// on the tensor cores; each 32-column partial is scaled in fp32.
// Invariants: every weight byte is read once per call, in the tile-major
// layout of DeviceQuantizedMatrix (a warp load = 512 contiguous bytes);
// results are bitwise reproducible (no atomicAdd). Why this design (the flop
// and activation budgets, the layout, fp16 ranges): docs/06_quantization.md,
// section 6.3.
#include "step06_quantization/cuda_quantized_kernels.hpp"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

// common/cuda (a public include directory of llm_common in CUDA builds).
// Inside namespace step06 the model's types are spelled llm::cuda::...
#include "cuda_linear.hpp"
#include "cuda_model.hpp"
#include "exercise.cuh"
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/cuda/cuda_timer.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/errors.hpp"
#include "llm/splitmix64.hpp"
#include "step06_quantization/quantized_layers.hpp"

namespace step06 {
namespace {

using llm::cuda::DeviceBuffer;

constexpr int kWarpSize = 32;
// 8 warps = 8 MMA tiles of 16 output rows: the rows that share one staged
// copy of x (see the top of the file). 8, not more: a block of 256 threads
// at <= 128 registers still fits twice per SM, and the last block's
// reduction has 128 rows x 16 tokens to add, 8 per thread.
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMinBlocksPerSm = 2;  // __launch_bounds__: caps the registers at 65536 / (2 * 256) = 128
constexpr int kTileRows = 16;       // output rows of one MMA tile (the M of m16n8k16)
constexpr int kBlockRows = kWarps * kTileRows;  // 128 output rows per block
constexpr int kMaxBatchRows = 16;   // tokens per launch: two n8 MMA tiles
constexpr int kStepBytes = 64;      // bytes of one row a warp reads per step: 4 lanes x 16 bytes
// Steps per block, all held in registers (2 uint4 = 8 registers each, 64 in
// all). 8 steps = 1024 4-bit columns: a 4096-column row in 4 slices; fewer
// steps per block would mean more slices and more partial sums to add at
// the end (at 16 tokens, 8 KB per slice per m_block).
constexpr int kMaxSteps = 8;
constexpr int kEarlySteps = 4;  // of which requested before the staging (see phase 3)
constexpr int kWantedBlocksPerSm = 2;  // what the grid aims for (kMinBlocksPerSm stay resident)
constexpr int kMaxGridY = 65535;

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Per-scheme constants of the kernel.
template <QuantScheme kScheme>
struct SchemeTraits {
  static constexpr bool kInt8 = kScheme == QuantScheme::Int8PerChannel;
  static constexpr int kBits = kInt8 ? 8 : 4;
  static constexpr int kColumnsPerStep = kStepBytes * 8 / kBits;  // 64 (int8) or 128 (4-bit)
  static constexpr int kSliceColumns = kColumnsPerStep * kMaxSteps;  // 512 or 1024
  // Groups a slice can touch: one per 32 columns (the smallest group) plus
  // one a group straddling the slice's start adds. int8: one group per row.
  static constexpr int kMaxGroups = kInt8 ? 1 : kSliceColumns / 32 + 1;
  // A staged x row in 32-bit words (2 fp16 each): the slice plus 8 words of
  // padding, so rows start 8 banks apart (stride = 8 mod 32 words). The B
  // fragment loads are 64-bit (4 fp16 per lane, see compute): a half-warp
  // (lanes 4g + t, g in 0..3) reads words 8g + 2t (+ same offset) mod 32,
  // 16 distinct even banks, each access taking 2 banks: all 32 banks once,
  // no conflict.
  static constexpr int kXStrideWords = kSliceColumns / 2 + 8;
  static_assert(kSliceColumns % 64 == 0, "the bank argument needs a slice of whole 32-word rows");
  static_assert(kSliceColumns / 4 <= kThreads, "staging: one 4-column unit of a row per thread");
};

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

// What a launch needs of the device matrix (pointers into its buffers).
struct DeviceMatrixView {
  const uint4* codes = nullptr;             // [m_tiles, total_steps, 2, 32] uint4 (the tile-major layout)
  const __half* scales = nullptr;           // [groups_per_row, rows_padded] fp16, times 2^scale_exponent
  const unsigned char* zeros = nullptr;     // [groups_per_row, rows_padded] (int4 asymmetric), else null
  const float* inverse_input_scales = nullptr;  // [in_features] 1 / s (AWQ), else null
  int out_features = 0;
  int in_features = 0;
  int m_tiles = 0;          // ceil(out / 16)
  int rows_padded = 0;      // m_tiles * 16
  int group_columns = 0;    // columns per group (in_features for int8)
  int groups_per_row = 0;
  int total_steps = 0;      // steps per row: ceil(padded_in / columns per step)
  int steps_per_block = 0;  // <= kMaxSteps
  int k_splits = 0;         // ceil(total_steps / steps_per_block): gridDim.x
  int m_blocks = 0;         // ceil(m_tiles / 8): gridDim.y
  float output_scale = 1.0f;  // 2^-scale_exponent: undoes the scales' exponent
};

// Split-K scratch of a launch: the slices' partial sums and the tickets.
struct SplitKView {
  float* partials = nullptr;     // [k_splits, 16, rows_padded] fp32
  unsigned* counters = nullptr;  // [m_blocks] blocks of each m_block done so far; 0 between launches
};

__constant__ float kNf4LevelsDevice[16] = {
    kNf4Levels[0],  kNf4Levels[1],  kNf4Levels[2],  kNf4Levels[3],  kNf4Levels[4],  kNf4Levels[5],
    kNf4Levels[6],  kNf4Levels[7],  kNf4Levels[8],  kNf4Levels[9],  kNf4Levels[10], kNf4Levels[11],
    kNf4Levels[12], kNf4Levels[13], kNf4Levels[14], kNf4Levels[15]};

// --- Small device helpers.

template <class Act>
__device__ __forceinline__ Act from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ std::uint32_t half_bits(float v) { return __half_as_ushort(__float2half_rn(v)); }

// fp16x2 a - b on the bits (both lanes).
__device__ __forceinline__ std::uint32_t sub_f16x2(std::uint32_t a, std::uint32_t b) {
  std::uint32_t d;
  asm("sub.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ std::uint32_t word_of(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;  // w is a compile-time constant after unrolling
}

// d += A (16 x 16, fp16, row-major fragment) . B (16 x 8, fp16, column
// fragment), fp32 accumulation. Fragments (PTX ISA, mma.m16n8k16; lane = 4 g + t):
//   a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]   a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
//   b0 = B[2t, 2t+1][g]   b1 = B[2t+8, 2t+9][g]
//   d0, d1 = D[g][2t, 2t+1]   d2, d3 = D[g+8][2t, 2t+1]
// (low half of each register = the first of the pair). sm_75 has only the
// k8 shape: the same product is two m16n8k8, one per half of k.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                            std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(b0));
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a2), "r"(a3), "r"(b1));
#else
  // No fp16 tensor cores before sm_75; the host refuses to launch there
  // (check_compute_capability), so this is never reached.
  static_cast<void>(d), static_cast<void>(a0), static_cast<void>(a1), static_cast<void>(a2),
      static_cast<void>(a3), static_cast<void>(b0), static_cast<void>(b1);
  __trap();
#endif
}

// --- Dequantization in registers: one fp16x2 register of an A fragment.
//
// A 32-bit word of codes holds 8 nibbles; register k (0..3) of a fragment
// is the pair of columns in nibbles k (low half) and k + 4 (high half): the
// upload puts each pair there. The int4 schemes dequantize in the kernel's
// loop (the exact fp16 integers code - zero, see there); NF4 looks the same
// two nibbles up in the 16-entry table of fp16 levels.
__device__ __forceinline__ std::uint32_t nf4_pair(std::uint32_t word, int k, const unsigned short* levels) {
  const std::uint32_t low = levels[(word >> (4 * k)) & 0xF];
  const std::uint32_t high = levels[(word >> (4 * k + 16)) & 0xF];
  return low | (high << 16);
}
// int8: the word's bytes were stored as q + 128 (the upload flips the sign
// bit) so byte_perm can place byte i under an 0x64 high byte: fp16 1024 + q
// + 128; subtracting 1152 leaves q exactly. `selector` picks bytes (0, 1) or (2, 3).
__device__ __forceinline__ std::uint32_t int8_pair(std::uint32_t biased_word, unsigned selector) {
  constexpr std::uint32_t kHalf2Of1152 = 0x64806480u;
  return sub_f16x2(__byte_perm(biased_word, 0x64646464u, selector), kHalf2Of1152);
}

// --- Phase 2: staging.
//
// Staging runs while the weight loads are in flight; what it must not do is
// wait for its own loads one at a time. So every load below is
// unconditional, in straight-line unrolled code: an address that would be
// out of range is clamped to a valid one and the value is replaced by 0
// afterwards. The compiler can then issue all of a batch's loads before the
// first one returns (one round trip per batch, not one per row).

// 4 activations as loaded: 16 bytes of fp32 or 8 bytes of fp16 (4 halves).
template <class Act>
using RawUnit = std::conditional_t<std::is_same_v<Act, float>, float4, uint2>;

// Loads 4 activations of one row at `column` as one vector, or (at the end
// of a row, or when the host found x unaligned) one at a time with each
// column clamped into the row; either way always from a valid address.
template <class Act>
__device__ __forceinline__ RawUnit<Act> load_unit(const Act* row, int column, int in, bool vector_unit) {
  if constexpr (std::is_same_v<Act, float>) {
    if (vector_unit) return __ldg(reinterpret_cast<const float4*>(row + column));
    return make_float4(__ldg(row + min(column, in - 1)), __ldg(row + min(column + 1, in - 1)),
                       __ldg(row + min(column + 2, in - 1)), __ldg(row + min(column + 3, in - 1)));
  } else {
    if (vector_unit) return __ldg(reinterpret_cast<const uint2*>(row + column));
    const auto bits = [&](int i) -> std::uint32_t { return __half_as_ushort(__ldg(row + min(column + i, in - 1))); };
    return make_uint2(bits(0) | (bits(1) << 16), bits(2) | (bits(3) << 16));
  }
}

template <class Act>
__device__ __forceinline__ float unit_value(const RawUnit<Act>& raw, int i) {
  if constexpr (std::is_same_v<Act, float>) {
    return i == 0 ? raw.x : i == 1 ? raw.y : i == 2 ? raw.z : raw.w;
  } else {
    const std::uint32_t word = i < 2 ? raw.x : raw.y;
    return __half2float(__ushort_as_half(static_cast<unsigned short>(i % 2 == 0 ? word & 0xFFFF : word >> 16)));
  }
}

// Rows 0 .. 8 kNTiles - 1 of x's slice [col0, col0 + slice_columns) into
// shared memory as fp16, each thread one unit of 4 columns per row (one
// 64-bit store: consecutive threads, consecutive words, no bank conflict).
// Columns >= in_features and rows >= `rows` are 0, so padded weights (and
// the MMA tile's tokens past the batch) multiply zeros. With AWQ input
// scales, x / s is what is staged (y = Q(W diag(s)) (x / s)). Rows are
// loaded in batches of 16 registers (4 rows of fp32, 8 of fp16): what fits
// beside the weights and group parameters already in flight.
template <QuantScheme kScheme, class Act, int kNTiles>
__device__ __forceinline__ void stage_x(SharedTiles<kScheme>& tiles, const DeviceMatrixView& m, const Act* x,
                                        int rows, int col0, int slice_columns, bool vector_x) {
  constexpr int kBatchRows = std::is_same_v<Act, float> ? 4 : 8;
  constexpr int kRows = 8 * kNTiles;
  const int unit = static_cast<int>(threadIdx.x);
  if (unit >= slice_columns / 4) return;  // no barrier inside: returning early is safe
  const int in = m.in_features;
  const int column = col0 + 4 * unit;
  float inverse_scale[4] = {1.0f, 1.0f, 1.0f, 1.0f};  // and 0 past in_features
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (m.inverse_input_scales != nullptr) inverse_scale[i] = __ldg(m.inverse_input_scales + min(column + i, in - 1));
    if (column + i >= in) inverse_scale[i] = 0.0f;
  }
  // The 4-wide load needs the whole unit inside the row and the host's
  // alignment check (in_features % 4 == 0, x aligned to 4 activations).
  const bool vector_unit = vector_x && column + 3 < in;
  // Not unrolled: the compiler would hoist every batch's loads to the top
  // and need registers for all of them at once.
#pragma unroll 1
  for (int batch = 0; batch < kRows; batch += kBatchRows) {
    RawUnit<Act> raw[kBatchRows];
#pragma unroll
    for (int r = 0; r < kBatchRows; ++r)  // rows past the batch re-read the last row (discarded below)
      raw[r] = load_unit(x + static_cast<std::size_t>(min(batch + r, rows - 1)) * in, column, in, vector_unit);
#pragma unroll
    for (int r = 0; r < kBatchRows; ++r) {
      const bool token_exists = batch + r < rows;
      std::uint32_t h[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)  // x * 0 would keep a NaN or inf of a discarded row: select instead
        h[i] = half_bits(token_exists && column + i < in ? unit_value<Act>(raw[r], i) * inverse_scale[i] : 0.0f);
      // fp16 -> fp32 -> fp16 is exact: the A16 path stages x unchanged.
      *reinterpret_cast<uint2*>(&tiles.x[batch + r][2 * unit]) = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
    }
  }
}

// The scales (and zero points) of the block's 128 rows for the n_groups
// groups the slice touches, paired as the lanes read them (see SharedTiles).
// Thread item = (local group, tile c of the block): the tile's 16 scales are
// 32 contiguous bytes of the [group, row] layout (two 128-bit loads), its 16
// zero points 16 bytes (one). Groups past the row (the last step's columns
// beyond padded_in) and tiles past the matrix get scale 0 (and zero point 0):
// their codes add nothing. In two halves: load() first (these bytes come
// from DRAM, like the weights), the x staging in between, store() last, so
// the block waits for one DRAM round trip, not for one after the other.
template <QuantScheme kScheme>
struct GroupParamsInFlight {
  using Traits = SchemeTraits<kScheme>;
  static constexpr bool kZeros = kScheme == QuantScheme::Int4Asymmetric;
  static constexpr int kItems = Traits::kMaxGroups * kWarps;
  static constexpr int kPasses = (kItems + kThreads - 1) / kThreads;  // 2 for 4-bit (33 groups), 1 for int8
  uint4 scales[kPasses][2];  // [pass][rows 0-7 | rows 8-15 of the tile] fp16
  uint4 zeros[kPasses];      // [pass] rows 0-15, a byte each
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
      // Element 0 of the arrays is a valid address to load from when nothing exists.
      const std::size_t at = exists ? static_cast<std::size_t>(group) * m.rows_padded + row : 0;
      const uint4 none = make_uint4(0, 0, 0, 0);
      const uint4 low = __ldg(reinterpret_cast<const uint4*>(m.scales + at));
      const uint4 high = __ldg(reinterpret_cast<const uint4*>(m.scales + at + 8));
      scales[p][0] = exists ? low : none;
      scales[p][1] = exists ? high : none;
      if constexpr (kZeros) {
        const uint4 z = __ldg(reinterpret_cast<const uint4*>(m.zeros + at));
        zeros[p] = exists ? z : none;
      }
    }
  }

  __device__ __forceinline__ void store(SharedTiles<kScheme>& tiles) const {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      if (!wanted[p]) continue;
      const int item = static_cast<int>(threadIdx.x) + p * kThreads;  // = local group * 8 + tile
      // Entry (local group, tile, g) = item * 8 + g: fp16 pairs (row g, row g + 8).
      const uint4 low = scales[p][0], high = scales[p][1];
      uint4* scale_entries = reinterpret_cast<uint4*>(&tiles.scales[item * 8]);
      scale_entries[0] = make_uint4(__byte_perm(low.x, high.x, 0x5410), __byte_perm(low.x, high.x, 0x7632),
                                    __byte_perm(low.y, high.y, 0x5410), __byte_perm(low.y, high.y, 0x7632));
      scale_entries[1] = make_uint4(__byte_perm(low.z, high.z, 0x5410), __byte_perm(low.z, high.z, 0x7632),
                                    __byte_perm(low.w, high.w, 0x5410), __byte_perm(low.w, high.w, 0x7632));
      if constexpr (kZeros) {
        // Pair g = byte g | byte g + 8 << 8, two pairs per word.
        const uint4 z = zeros[p];
        *reinterpret_cast<uint4*>(&tiles.zeros[item * 8]) =
            make_uint4(__byte_perm(z.x, z.z, 0x5140), __byte_perm(z.x, z.z, 0x7362), __byte_perm(z.y, z.w, 0x5140),
                       __byte_perm(z.y, z.w, 0x7362));
      }
    }
    if constexpr (kScheme == QuantScheme::NF4) {
      if (threadIdx.x < 16)
        tiles.nf4_levels[threadIdx.x] = static_cast<unsigned short>(half_bits(kNf4LevelsDevice[threadIdx.x]));
    }
  }
};

// Weights of steps [kFirst, kLast) of a warp's slice into registers (steps
// >= `steps`, past the row's end, stay 0 and are never used). __ldcs ("cache
// streaming", evict first): the weights are read exactly once per launch,
// so they should not push x or the partials out of L2.
template <int kFirst, int kLast>
__device__ __forceinline__ void load_steps(uint4 (&codes)[kMaxSteps][2], const uint4* tile_codes, int steps) {
#pragma unroll
  for (int s = kFirst; s < kLast; ++s) {
    if (s < steps) {
      codes[s][0] = __ldcs(tile_codes + (2 * s) * kWarpSize);
      codes[s][1] = __ldcs(tile_codes + (2 * s + 1) * kWarpSize);
    } else {
      codes[s][0] = codes[s][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

// --- The kernel.
//
// Grid (k_splits, m_blocks), 256 threads. Warp w of block (split, m_block)
// computes output rows [16 (8 m_block + w), +16) over the columns of steps
// [split * steps_per_block, +steps_per_block) for `rows` <= 16 tokens (two
// n8 MMA tiles when rows > 8: kNTiles). x [rows, in] and y [rows, out] are
// row-major; partials and counters are used when k_splits > 1.
template <QuantScheme kScheme, class Act, int kNTiles>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    quantized_matmul_kernel(DeviceMatrixView m, const Act* __restrict__ x, int rows, bool vector_x,
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

  // The math. acc[nt] is the warp's 16 x 8 output tile for tokens
  // [8 nt, 8 nt + 8) in the D-fragment layout.
  float acc[kNTiles][4];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

  if (warp_has_tile) {
    // This lane's B operands: token g (+ 8 nt), columns 4t.. of each 16.
    const std::uint32_t* x_lane = &tiles.x[0][0] + g * Traits::kXStrideWords + 2 * t;
    const int pair_index = warp * 8 + g;  // its entry in the scale and zero tables
    if constexpr (Traits::kInt8) {
      // One group per row: accumulate all MMAs, scale once at the end.
#pragma unroll
      for (int s = 0; s < kMaxSteps; ++s) {
        if (s < steps) {
#pragma unroll
          for (int w = 0; w < 4; ++w) {  // word w = MMA w: columns [64 s + 16 w, +16)
            const std::uint32_t low = word_of(codes[s][0], w), high = word_of(codes[s][1], w);
            const std::uint32_t a0 = int8_pair(low, 0x4140), a2 = int8_pair(low, 0x4342);
            const std::uint32_t a1 = int8_pair(high, 0x4140), a3 = int8_pair(high, 0x4342);
            const int word_offset = (s * Traits::kColumnsPerStep + 16 * w) / 2;
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
              const uint2 b = *reinterpret_cast<const uint2*>(x_lane + 8 * nt * Traits::kXStrideWords + word_offset);
              mma_16x8x16(acc[nt], a0, a1, a2, a3, b.x, b.y);
            }
          }
        }
      }
      const float2 scale = __half22float2(tiles.scales[pair_index]);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        acc[nt][0] *= scale.x, acc[nt][1] *= scale.x;
        acc[nt][2] *= scale.y, acc[nt][3] *= scale.y;
      }
    } else {
      // 4-bit: word w of a lane's 16 bytes covers columns [128 s + 32 w, +32)
      // (2 MMAs), which lie in one group (groups are whole multiples of 32
      // columns). Its product is formed from exact integers, then scaled.
      // The group is tracked incrementally: no division in the loop.
      int local_group = 0;
      int column_in_group = col0 % m.group_columns;
#pragma unroll
      for (int s = 0; s < kMaxSteps; ++s) {
        if (s < steps) {
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            // The lane's codes of this word: rows g (low) and g + 8 (high), 8 columns each.
            const std::uint32_t low = word_of(codes[s][0], w), high = word_of(codes[s][1], w);
            float part[kNTiles][4];
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) part[nt][0] = part[nt][1] = part[nt][2] = part[nt][3] = 0.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // MMA 2w + h: nibble pairs 2h (a0, a1) and 2h + 1 (a2, a3)
              // The A fragment of this MMA, fp16x2 each (mma_16x8x16): a0 and a2 are
              // row g's nibble pairs (2h, 2h + 4) and (2h + 1, 2h + 5) of `low`, a1
              // and a3 the same pairs of row g + 8 (`high`).
              std::uint32_t a0, a1, a2, a3;
              if constexpr (kScheme == QuantScheme::NF4) {
                a0 = nf4_pair(low, 2 * h, tiles.nf4_levels), a2 = nf4_pair(low, 2 * h + 1, tiles.nf4_levels);
                a1 = nf4_pair(high, 2 * h, tiles.nf4_levels), a3 = nf4_pair(high, 2 * h + 1, tiles.nf4_levels);
              } else {
                // BEGIN EXERCISE ex06.3
                // STUB: if (s == 0 && w == 0 && h == 0) LLM_CUDA_EXERCISE_TODO("ex06.3");  // one line per launch
                // STUB: a0 = a1 = a2 = a3 = half_bits(llm::cuda::device::exercise_nan()) * 0x00010001u;  // NaN pairs
                // The classic trick (there is no int -> fp16 conversion
                // instruction): (word >> 4k) & 0x000F000F keeps nibble k in
                // the low half and nibble k + 4 in the high half; OR-ing
                // 0x6400 (fp16 1024, whose mantissa step is exactly 1) makes
                // each half the fp16 number 1024 + code. Subtracting 1024 +
                // zero (also exact) leaves code - zero: the integer the
                // group's scale multiplies after the MMA.
                // fp16x2 (1024 + zero) of rows g (zero_low) and g + 8 (zero_high);
                // int4 symmetric's zero is 8 for every row (codes 1..15 stand for -7..7).
                std::uint32_t zero_low = 0x64086408u, zero_high = 0x64086408u;
                if constexpr (kScheme == QuantScheme::Int4Asymmetric) {
                  // The group's zero points, z(row g) | z(row g + 8) << 8, each
                  // byte placed under an 0x64 high byte in both halves.
                  const std::uint32_t zeros = tiles.zeros[local_group * (kBlockRows / 2) + pair_index];
                  zero_low = __byte_perm(zeros, 0x64646464u, 0x4040);
                  zero_high = __byte_perm(zeros, 0x64646464u, 0x4141);
                }
                constexpr std::uint32_t kHalf2Of1024 = 0x64006400u;  // fp16 bits of (1024, 1024)
                const auto code_minus_zero = [](std::uint32_t word, int k, std::uint32_t zero_pair) {
                  return sub_f16x2(((word >> (4 * k)) & 0x000F000Fu) | kHalf2Of1024, zero_pair);
                };
                a0 = code_minus_zero(low, 2 * h, zero_low), a2 = code_minus_zero(low, 2 * h + 1, zero_low);
                a1 = code_minus_zero(high, 2 * h, zero_high), a3 = code_minus_zero(high, 2 * h + 1, zero_high);
                // END EXERCISE ex06.3
              }
              const int word_offset = (s * Traits::kColumnsPerStep + 16 * (2 * w + h)) / 2;
#pragma unroll
              for (int nt = 0; nt < kNTiles; ++nt) {
                const uint2 b =
                    *reinterpret_cast<const uint2*>(x_lane + 8 * nt * Traits::kXStrideWords + word_offset);
                mma_16x8x16(part[nt], a0, a1, a2, a3, b.x, b.y);
              }
            }
            const float2 scale = __half22float2(tiles.scales[local_group * (kBlockRows / 2) + pair_index]);
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt) {
              acc[nt][0] = fmaf(scale.x, part[nt][0], acc[nt][0]);
              acc[nt][1] = fmaf(scale.x, part[nt][1], acc[nt][1]);
              acc[nt][2] = fmaf(scale.y, part[nt][2], acc[nt][2]);
              acc[nt][3] = fmaf(scale.y, part[nt][3], acc[nt][3]);
            }
            column_in_group += 32;
            if (column_in_group == m.group_columns) {  // the next word starts the next group
              column_in_group = 0;
              ++local_group;
            }
          }
        }
      }
    }
  }

  // Output: D fragment element i of tile nt is (row g + 8 (i / 2), token 8 nt + 2t + i % 2).
  const int tile_row0 = m_tile * kTileRows;
  if (m.k_splits == 1) {
    if (warp_has_tile) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int row = tile_row0 + g + 8 * (i / 2), token = 8 * nt + 2 * t + i % 2;
          if (row < m.out_features && token < rows)
            y[static_cast<std::size_t>(token) * m.out_features + row] = from_float<Act>(acc[nt][i] * m.output_scale);
        }
    }
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

// --- Host side.

// A message from its pieces. (Not fmt: its headers do not compile in nvcc's
// host pass, which is why step 05's .cu files build strings too.)
template <class... Pieces>
std::string text(const Pieces&... pieces) {
  std::ostringstream out;
  (out << ... << pieces);
  return out.str();
}

[[noreturn]] void input_error(const std::string& what) {
  throw llm::InputError("step06 CUDA quantized matmul: " + what);
}

// fp16 values on the host are their bits: std::vector<__half> does not
// compile under nvcc's C++20 front end (__half is not default-constructible
// there), and the bits are all a copy needs. Device pointers are cast back.
using Fp16Bits = std::uint16_t;
Fp16Bits fp16_bits(float v) { return __half_as_ushort(__float2half_rn(v)); }
float fp16_value(Fp16Bits bits) { return __half2float(__ushort_as_half(bits)); }
const __half* as_half(const Fp16Bits* p) { return reinterpret_cast<const __half*>(p); }
__half* as_half(Fp16Bits* p) { return reinterpret_cast<__half*>(p); }

// Spans spelled out: nvcc's front end does not take std::span's range
// constructor from a std::vector.
template <class T>
std::span<const T> span_of(const std::vector<T>& v) {
  return {v.data(), v.size()};
}
template <class T>
std::span<T> span_of(std::vector<T>& v) {
  return {v.data(), v.size()};
}

// fp16 tensor-core MMAs need sm_75 (Turing) or later.
void check_compute_capability() {
  if (const int capability = llm::cuda::compute_capability(); capability < 75)
    throw llm::DeviceError(text("step06: the quantized kernels use fp16 tensor-core MMAs, which need compute "
                                "capability 7.5+ (this GPU: ", capability / 10, ".", capability % 10, ")"));
}

void require_device() {
  const llm::cuda::DeviceStatus status = llm::cuda::device_status();
  if (!status.usable) throw llm::DeviceError("step06: " + llm::cuda::unusable_message(status));
  check_compute_capability();
}

// Checks that a QuantizedMatrix is internally consistent (it comes from the
// user's side of the API, possibly built by hand): a wrong size here would be
// an out-of-bounds read on the GPU, where nothing checks.
void check_matrix(const QuantizedMatrix& q) {
  const QuantFormat& f = q.format;
  if (q.out_features <= 0 || q.in_features <= 0) input_error("the matrix has no weights");
  if (q.format.int8_activations())
    input_error(text(q.format.name(), ": int8 activations are CPU kernels only (the GPU kernels are W8A16 / W4A16)"));
  if (q.group_columns != f.group_columns(q.in_features) ||
      q.groups_per_row != ceil_div(q.in_features, q.group_columns) ||
      q.padded_in != q.groups_per_row * q.group_columns)
    input_error(text(f.name(), ": group layout (", q.group_columns, " columns per group, ", q.groups_per_row,
                     " groups, ", q.padded_in, " padded columns) does not fit ", q.in_features, " input columns"));
  if (f.bits() == 4 && q.group_columns % 32 != 0)
    input_error(text(f.name(), ": 4-bit groups must be whole multiples of 32 columns"));
  const auto out = static_cast<std::size_t>(q.out_features);
  const std::size_t n_groups = out * q.groups_per_row;
  if (q.packed.size() != out * q.bytes_per_row() || q.scales.size() != n_groups ||
      q.zeros.size() != (f.has_zero_points() ? n_groups : 0) ||
      (!q.input_scales.empty() && q.input_scales.size() != static_cast<std::size_t>(q.in_features)))
    input_error(text(f.name(), " [", q.out_features, ", ", q.in_features, "]: ", q.packed.size(), " code bytes, ",
                     q.scales.size(), " scales, ", q.zeros.size(), " zero points, ", q.input_scales.size(),
                     " input scales do not fit"));
  for (float s : q.scales)
    if (!std::isfinite(s) || s < 0.0f) input_error(text(f.name(), ": a group scale is ", s));
  for (float s : q.input_scales)
    if (!std::isfinite(s) || s == 0.0f) input_error(text(f.name(), ": an input scale is ", s));
  if (ceil_div(ceil_div(q.out_features, kTileRows), kWarps) > kMaxGridY)
    input_error(text(q.out_features, " output rows: more than the grid holds (",
                     static_cast<long long>(kMaxGridY) * kBlockRows, ")"));
}

// The device copy of a QuantizedMatrix in the kernel's layout (see the top of
// the file), uploaded once, and the launch configuration that goes with it.
class DeviceQuantizedMatrix {
 public:
  explicit DeviceQuantizedMatrix(const QuantizedMatrix& q) : scheme_(q.format.scheme) {
    check_matrix(q);
    require_device();
    plan_launch(q);
    upload_codes(q);
    upload_scales(q);
    view_.codes = codes_.data();
    view_.scales = as_half(scales_.data());
    view_.zeros = zeros_.empty() ? nullptr : zeros_.data();
    view_.inverse_input_scales = inverse_input_scales_.empty() ? nullptr : inverse_input_scales_.data();
  }

 private:
  // The view's dims and the split-K plan (no device memory yet).
  void plan_launch(const QuantizedMatrix& q) {
    DeviceMatrixView& v = view_;
    const int columns_per_step = kStepBytes * 8 / q.format.bits();
    v.out_features = q.out_features;
    v.in_features = q.in_features;
    v.m_tiles = ceil_div(q.out_features, kTileRows);
    v.rows_padded = v.m_tiles * kTileRows;
    v.group_columns = q.group_columns;
    v.groups_per_row = q.groups_per_row;
    v.total_steps = ceil_div(q.padded_in, columns_per_step);
    v.m_blocks = ceil_div(v.m_tiles, kWarps);
    // Slices: at least enough that a block's steps fit in its registers, and
    // as many more as bring the grid to ~kWantedBlocksPerSm blocks per SM
    // (fewer blocks leave SMs, and their share of the memory bandwidth,
    // idle); then the steps spread evenly over that many slices.
    const int min_splits = ceil_div(v.total_steps, kMaxSteps);
    const int wanted_splits = ceil_div(kWantedBlocksPerSm * llm::cuda::sm_count(), v.m_blocks);
    const int splits = std::clamp(std::max(min_splits, wanted_splits), 1, v.total_steps);
    v.steps_per_block = ceil_div(v.total_steps, splits);
    v.k_splits = ceil_div(v.total_steps, v.steps_per_block);

  }

  // The codes in the kernel's tile-major layout, uploaded.
  void upload_codes(const QuantizedMatrix& q) {
    const DeviceMatrixView& v = view_;
    const bool int8 = q.format.bits() == 8;
    // Codes, tile-major: [m_tiles, total_steps, 2 (rows 0-7 | 8-15), 32 lanes, 16 bytes].
    std::vector<uint4> codes(static_cast<std::size_t>(v.m_tiles) * v.total_steps * 2 * kWarpSize);
    auto* bytes = reinterpret_cast<unsigned char*>(codes.data());
    std::size_t at = 0;
    for (int tile = 0; tile < v.m_tiles; ++tile)
      for (int step = 0; step < v.total_steps; ++step)
        for (int half = 0; half < 2; ++half)
          for (int lane = 0; lane < kWarpSize; ++lane, at += 16) {
            const int row = tile * kTileRows + lane / 4 + 8 * half;
            const int t = lane % 4;
            for (int i = 0; i < 32; ++i) {  // the lane's 32 (4-bit) or 16 (int8) codes
              if (int8 && i >= 16) break;
              const int column = int8 ? int8_column(step, t, i) : int4_column(step, t, i);
              const bool stored = row < q.out_features && column < q.padded_in;
              const int code = stored ? q.code(row, column) : 0;  // padding: scale 0 (or x = 0) makes it vanish
              if (int8) {
                bytes[at + i] = static_cast<unsigned char>((code + 128) & 0xFF);  // q + 128: see int8_pair
              } else {
                bytes[at + i / 2] |= static_cast<unsigned char>(code << (4 * (i % 2)));
              }
            }
          }
    codes_ = DeviceBuffer<uint4>(span_of(codes));
  }

  // The group scales (fp16, one power-of-two exponent for the matrix), the
  // zero points and AWQ's inverse input scales, uploaded.
  void upload_scales(const QuantizedMatrix& q) {
    DeviceMatrixView& v = view_;
    // Scales: fp16, transposed to [group, row] so the 128 rows of a block's
    // group are 256 contiguous bytes. fp16 halves their bytes (int4-g64:
    // 2 instead of 4 bytes per 32 bytes of codes, what keeps W4A16 near 4x
    // fewer bytes than fp16). fp16's normal range is only 2^-14 .. 2^16, so
    // every scale is first multiplied by one power of two that puts the
    // largest at 2^14 .. 2^15; y is multiplied back by its inverse (exact).
    // Scales 2^28 times smaller than the largest lose precision as fp16
    // subnormals, but their groups' contributions are that much smaller too.
    float max_scale = 0.0f;
    for (float s : q.scales) max_scale = std::max(max_scale, s);
    int exponent = 0;
    if (max_scale > 0.0f) {
      static_cast<void>(std::frexp(max_scale, &exponent));  // max_scale = m 2^exponent, m in [0.5, 1)
      exponent = std::clamp(15 - exponent, -100, 100);       // max_scale 2^exponent in [2^14, 2^15)
    }
    const float pow2 = std::ldexp(1.0f, exponent);
    v.output_scale = std::ldexp(1.0f, -exponent);
    const std::size_t scale_count = static_cast<std::size_t>(v.groups_per_row) * v.rows_padded;
    std::vector<Fp16Bits> scales(scale_count, fp16_bits(0.0f));
    std::vector<unsigned char> zeros(q.format.has_zero_points() ? scale_count : 0, 0);
    for (int row = 0; row < q.out_features; ++row)
      for (int group = 0; group < v.groups_per_row; ++group) {
        const std::size_t host = static_cast<std::size_t>(row) * v.groups_per_row + group;
        const std::size_t device = static_cast<std::size_t>(group) * v.rows_padded + row;
        scales[device] = fp16_bits(q.scales[host] * pow2);
        if (!zeros.empty()) zeros[device] = q.zeros[host];
      }
    scales_ = DeviceBuffer<Fp16Bits>(span_of(scales));
    if (!zeros.empty()) zeros_ = DeviceBuffer<unsigned char>(span_of(zeros));
    if (!q.input_scales.empty()) {
      // 1 / s once here, a multiply per activation in the kernel.
      std::vector<float> inverse(q.input_scales.size());
      for (std::size_t i = 0; i < inverse.size(); ++i) inverse[i] = 1.0f / q.input_scales[i];
      inverse_input_scales_ = DeviceBuffer<float>(span_of(inverse));
    }
  }

 public:

  // Column of the i-th code (0..31) of lane (., t)'s 16 bytes at `step`
  // (4-bit). Code i sits in word w = i / 8, nibble k' = i % 8; the
  // dequantization pairs nibbles (k, k + 4) of a word into one fp16x2
  // fragment register (the kernel's loop, nf4_pair), k = 0, 1 for MMA 2w (a0 and a2: the lane's
  // columns 4t, 4t+1 and 4t+2, 4t+3 of those 16) and k = 2, 3 for MMA 2w + 1.
  static int int4_column(int step, int t, int i) {
    const int w = i / 8, nibble = i % 8;
    const int k = nibble % 4, high_half = nibble / 4;
    const int mma = 2 * w + k / 2;                  // 16-column block of the step
    const int element = 2 * (k % 2) + high_half;  // 0..3: the lane's 4 columns of that block
    return step * 128 + 16 * mma + 4 * t + element;
  }
  // int8: byte i of the lane's 16 is word w = i / 4 = MMA w, element i % 4
  // (int8_pair takes bytes 0, 1 for a0 and 2, 3 for a2 in place).
  static int int8_column(int step, int t, int i) { return step * 64 + 16 * (i / 4) + 4 * t + i % 4; }

  QuantScheme scheme() const { return scheme_; }
  const DeviceMatrixView& view() const { return view_; }
  int out_features() const { return view_.out_features; }
  int in_features() const { return view_.in_features; }
  std::size_t bytes() const {
    return codes_.bytes() + scales_.bytes() + zeros_.bytes() + inverse_input_scales_.bytes();
  }
  // Split-K scratch one launch needs (none with a single slice).
  std::size_t partial_floats() const {
    return view_.k_splits > 1 ? static_cast<std::size_t>(view_.k_splits) * kMaxBatchRows * view_.rows_padded : 0;
  }
  std::size_t counters() const { return view_.k_splits > 1 ? static_cast<std::size_t>(view_.m_blocks) : 0; }

 private:
  QuantScheme scheme_;
  DeviceMatrixView view_;
  DeviceBuffer<uint4> codes_;                  // [m_tiles, total_steps, 2, 32] uint4
  DeviceBuffer<Fp16Bits> scales_;              // [groups_per_row, rows_padded] fp16
  DeviceBuffer<unsigned char> zeros_;          // [groups_per_row, rows_padded] or empty
  DeviceBuffer<float> inverse_input_scales_;   // [in_features] or empty
};

// Split-K scratch, shared by every quantized layer of a model: the layers run
// one after another on the model's stream, and each launch leaves the
// counters at 0 (atomicInc wraps), so one buffer serves them all. Not for
// two launches in flight at once on different streams.
class SplitKWorkspace {
 public:
  void ensure(std::size_t partial_floats, std::size_t counters) {
    partials_.ensure(partial_floats);
    if (counters > counters_.size()) {
      counters_.ensure(counters);
      counters_.zero();  // a fresh allocation holds garbage; the kernel needs 0 (legacy stream: ordered before any use)
    }
  }
  SplitKView view() { return {partials_.data(), counters_.data()}; }

 private:
  DeviceBuffer<float> partials_;     // [k_splits, 16, rows_padded] of the largest user
  DeviceBuffer<unsigned> counters_;  // [m_blocks] of the largest user
};

template <QuantScheme kScheme, class Act>
void launch_scheme(const DeviceMatrixView& v, const Act* x, int rows, bool vector_x, Act* y, SplitKView split_k,
                   cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(v.k_splits), static_cast<unsigned>(v.m_blocks));
  if (rows <= 8) {
    quantized_matmul_kernel<kScheme, Act, 1><<<grid, kThreads, 0, stream>>>(v, x, rows, vector_x, y, split_k);
  } else {
    quantized_matmul_kernel<kScheme, Act, 2><<<grid, kThreads, 0, stream>>>(v, x, rows, vector_x, y, split_k);
  }
  LLM_CUDA_CHECK_LAUNCH();
}

// y [rows, out] = x [rows, in] . W~^T, both device memory, queued on
// `stream`: one launch per 16 rows (each re-reads W: prefill is not what
// these kernels are for).
template <class Act>
void quantized_matmul(const DeviceQuantizedMatrix& w, const Act* x, int rows, Act* y, SplitKWorkspace& workspace,
                      cudaStream_t stream) {
  const DeviceMatrixView& v = w.view();
  const SplitKView split_k = workspace.view();
  constexpr std::size_t kVectorBytes = 4 * sizeof(Act);  // one 4-activation load
  for (int row0 = 0; row0 < rows; row0 += kMaxBatchRows) {
    const int tile_rows = std::min(kMaxBatchRows, rows - row0);
    const Act* x_tile = x + static_cast<std::size_t>(row0) * v.in_features;
    Act* y_tile = y + static_cast<std::size_t>(row0) * v.out_features;
    const bool vector_x = v.in_features % 4 == 0 && reinterpret_cast<std::uintptr_t>(x_tile) % kVectorBytes == 0;
    switch (w.scheme()) {
      case QuantScheme::Int8PerChannel:
        launch_scheme<QuantScheme::Int8PerChannel>(v, x_tile, tile_rows, vector_x, y_tile, split_k, stream);
        break;
      case QuantScheme::Int4Asymmetric:
        launch_scheme<QuantScheme::Int4Asymmetric>(v, x_tile, tile_rows, vector_x, y_tile, split_k, stream);
        break;
      case QuantScheme::Int4Symmetric:
        launch_scheme<QuantScheme::Int4Symmetric>(v, x_tile, tile_rows, vector_x, y_tile, split_k, stream);
        break;
      case QuantScheme::NF4:
        launch_scheme<QuantScheme::NF4>(v, x_tile, tile_rows, vector_x, y_tile, split_k, stream);
        break;
    }
  }
}

void check_rows(const QuantizedMatrix& matrix, std::size_t x_size, int rows) {
  if (rows <= 0) input_error(text(rows, " rows: need at least one"));
  if (x_size != static_cast<std::size_t>(rows) * static_cast<std::size_t>(matrix.in_features))
    input_error(text("x has ", x_size, " values, not ", rows, " rows x ", matrix.in_features, " input columns"));
}

std::vector<Fp16Bits> floats_to_halves(std::span<const float> values) {
  std::vector<Fp16Bits> halves(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) halves[i] = fp16_bits(values[i]);
  return halves;
}

std::vector<float> halves_to_floats(std::span<const Fp16Bits> halves) {
  std::vector<float> values(halves.size());
  for (std::size_t i = 0; i < halves.size(); ++i) values[i] = fp16_value(halves[i]);
  return values;
}

// The kernel's activation type for a host element type: fp32 as is, fp16
// bits as __half.
template <class Host>
struct KernelActivation {
  using type = float;
};
template <>
struct KernelActivation<Fp16Bits> {
  using type = __half;
};

// Runs the kernel once on host data; y is poisoned with NaN first (0xFF
// bytes are a NaN in fp16 and fp32) so an output the kernel skips fails
// every check.
template <class Host>
std::vector<Host> run_once(const QuantizedMatrix& matrix, std::span<const Host> x_host, int rows) {
  using Act = typename KernelActivation<Host>::type;
  const DeviceQuantizedMatrix w(matrix);
  SplitKWorkspace workspace;
  workspace.ensure(w.partial_floats(), w.counters());
  const DeviceBuffer<Host> x{x_host};
  DeviceBuffer<Host> y{static_cast<std::size_t>(rows) * matrix.out_features};
  LLM_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.bytes()));
  quantized_matmul(w, reinterpret_cast<const Act*>(x.data()), rows, reinterpret_cast<Act*>(y.data()), workspace,
                   nullptr);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());  // faults inside the kernel surface here
  std::vector<Host> y_host(y.size());
  y.download(span_of(y_host));
  return y_host;
}

// The model's Linear hook with quantized weights (fp32 activations in and out).
class CudaQuantizedLinear final : public llm::cuda::CudaLinear {
 public:
  CudaQuantizedLinear(const QuantizedMatrix& matrix, std::shared_ptr<SplitKWorkspace> workspace)
      : weights_(matrix), workspace_(std::move(workspace)) {
    workspace_->ensure(weights_.partial_floats(), weights_.counters());
  }
  void forward(const float* x_dev, int rows, float* y_dev, cudaStream_t stream) const override {
    if (rows <= 0) return;
    quantized_matmul(weights_, x_dev, rows, y_dev, *workspace_, stream);
  }
  int in_features() const override { return weights_.in_features(); }
  int out_features() const override { return weights_.out_features(); }
  std::size_t weight_bytes() const override { return weights_.bytes(); }
  // dense_weight(): nullptr (the default). A quantized tied classifier has no
  // fp32 rows to lend, so the model keeps its own copy of the embedding.

 private:
  DeviceQuantizedMatrix weights_;
  std::shared_ptr<SplitKWorkspace> workspace_;
};

}  // namespace

std::vector<float> cuda_quantized_matmul(const QuantizedMatrix& matrix, std::span<const float> x, int rows) {
  check_rows(matrix, x.size(), rows);
  return run_once<float>(matrix, x, rows);
}

std::vector<float> cuda_quantized_matmul_fp16(const QuantizedMatrix& matrix, std::span<const float> x, int rows) {
  check_rows(matrix, x.size(), rows);
  const std::vector<Fp16Bits> x_half = floats_to_halves(x);
  return halves_to_floats(span_of(run_once<Fp16Bits>(matrix, span_of(x_half), rows)));
}

namespace {

// y [rows, out] = x [rows, in] . weight [out, in]^T on the host, each sum in
// double (4 chains: the adds overlap): the reference the kernel is checked on.
std::vector<float> host_reference_product(const std::vector<float>& weight, const std::vector<float>& x_float,
                                          int rows, int in, int out) {
  std::vector<float> reference(static_cast<std::size_t>(rows) * out);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x_float.data() + static_cast<std::size_t>(r) * in;
    for (int o = 0; o < out; ++o) {
      const float* wo = weight.data() + static_cast<std::size_t>(o) * in;
      double sum[4] = {0.0, 0.0, 0.0, 0.0};  // 4 chains: the adds overlap
      int i = 0;
      for (; i + 4 <= in; i += 4)
        for (int j = 0; j < 4; ++j) sum[j] += static_cast<double>(xr[i + j]) * wo[i + j];
      for (; i < in; ++i) sum[0] += static_cast<double>(xr[i]) * wo[i];
      reference[static_cast<std::size_t>(r) * out + o] = static_cast<float>((sum[0] + sum[1]) + (sum[2] + sum[3]));
    }
  }
  return reference;
}

// The baseline: cuBLAS on the same matrix dequantized to fp16, weight [out,
// in] (fp32 on the host), x [rows, in] fp16 on the device; the median time.
double time_cublas_fp16(const std::vector<float>& weight, const DeviceBuffer<Fp16Bits>& x, int rows, int in, int out,
                        int warmup_runs, int repeats) {
  const DeviceBuffer<Fp16Bits> weight_dev{span_of(floats_to_halves(span_of(weight)))};
  DeviceBuffer<Fp16Bits> y_cublas{static_cast<std::size_t>(rows) * out};
  const llm::cuda::CublasHandle cublas;
  LLM_CUBLAS_CHECK(cublasSetStream(cublas.get(), nullptr));  // the legacy stream time_cuda's events are on
  const float alpha = 1.0f, beta = 0.0f;
  const auto run_cublas = [&] {
    // Y [rows, out] = X W^T, row-major, as DenseCudaLinear::forward explains:
    // in column-major terms C [out, rows] = op(A) [out, in] . B [in, rows],
    // with A = W's memory read transposed (lda = in), B = X's memory (ldb =
    // in), C = Y's memory (ldc = out). CUBLAS_COMPUTE_32F: fp16 inputs on the
    // tensor cores with fp32 accumulation, the same arithmetic as the
    // quantized kernel, so the comparison is of bytes moved, not of
    // precision (CUBLAS_COMPUTE_16F would accumulate in fp16).
    LLM_CUBLAS_CHECK(cublasGemmEx(cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, /*m=*/out, /*n=*/rows, /*k=*/in, &alpha,
                                  weight_dev.data(), CUDA_R_16F, /*lda=*/in, x.data(), CUDA_R_16F, /*ldb=*/in, &beta,
                                  y_cublas.data(), CUDA_R_16F, /*ldc=*/out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  return llm::cuda::time_cuda(run_cublas, warmup_runs, repeats, /*flush_l2=*/true).median_ms;
}

}  // namespace

CudaMatmulTiming time_cuda_quantized_matmul(const QuantizedMatrix& matrix, int rows, int repeats, std::uint64_t seed) {
  if (rows <= 0) input_error(text(rows, " rows: need at least one"));
  if (repeats < 1) input_error(text(repeats, " timed runs: need at least one"));
  constexpr int kWarmupRuns = 3;
  const int in = matrix.in_features, out = matrix.out_features;
  const DeviceQuantizedMatrix w(matrix);
  SplitKWorkspace workspace;
  workspace.ensure(w.partial_floats(), w.counters());

  // x: uniform in [-1, 1), rounded to fp16 here, so the kernel, cuBLAS and
  // the reference all see the same numbers.
  llm::SplitMix64 rng(seed);
  std::vector<Fp16Bits> x_host(static_cast<std::size_t>(rows) * in);
  for (Fp16Bits& v : x_host) v = fp16_bits(static_cast<float>(2.0 * rng.uniform() - 1.0));
  const DeviceBuffer<Fp16Bits> x{span_of(x_host)};
  DeviceBuffer<Fp16Bits> y{static_cast<std::size_t>(rows) * out};

  // The check: one run into a NaN-poisoned y against the fp32 product of
  // dequantize(matrix) with the same fp16 x, accumulated in double on the host.
  LLM_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.bytes()));
  quantized_matmul(w, as_half(x.data()), rows, as_half(y.data()), workspace, nullptr);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<Fp16Bits> y_host(y.size());
  y.download(span_of(y_host));
  const std::vector<float> weight = dequantize(matrix);  // [out, in]
  const std::vector<float> x_float = halves_to_floats(span_of(x_host));
  const std::vector<float> reference = host_reference_product(weight, x_float, rows, in, out);
  CudaMatmulTiming timing;
  // fp16 tolerance (1e-3 absolute + 1e-2 relative): y is rounded to fp16
  // (relative 2^-11) and each group's scale was stored as fp16 (relative
  // 2^-12 per group, so |error| <= 2^-12 sum over groups |partial|, about
  // 1e-4 of |y| for 4096 columns of random data); accumulation is fp32.
  timing.check = llm::compare(span_of(halves_to_floats(span_of(y_host))), span_of(reference),
                              llm::tolerance_for(llm::DType::F16));

  const auto run_quantized = [&] {
    quantized_matmul(w, as_half(x.data()), rows, as_half(y.data()), workspace, nullptr);
  };
  timing.quantized_ms = llm::cuda::time_cuda(run_quantized, kWarmupRuns, repeats, /*flush_l2=*/true).median_ms;
  timing.cublas_fp16_ms = time_cublas_fp16(weight, x, rows, in, out, kWarmupRuns, repeats);
  return timing;
}

std::unique_ptr<llm::Model> make_cuda_quantized_model(const llm::ModelWeights& weights,
                                                      const QuantizedLayers& layers) {
  require_device();
  auto workspace = std::make_shared<SplitKWorkspace>();
  llm::cuda::CudaModelOptions options;
  // Called only while the model is built: `layers` need not outlive it (every
  // quantized layer uploads its own device copy).
  options.linear_factory = [&layers, workspace](const std::vector<float>& weight, int out_features, int in_features,
                                                const llm::LinearSite& site,
                                                cublasHandle_t cublas) -> std::unique_ptr<llm::cuda::CudaLinear> {
    const auto found = layers.matrices.find(site);
    if (found == layers.matrices.end())
      return std::make_unique<llm::cuda::DenseCudaLinear>(weight, out_features, in_features, cublas);
    const QuantizedMatrix& matrix = found->second;
    if (matrix.out_features != out_features || matrix.in_features != in_features)
      input_error(text(site.name(), ": the quantized matrix is [", matrix.out_features, ", ", matrix.in_features,
                       "], the model's is [", out_features, ", ", in_features, "]"));
    return std::make_unique<CudaQuantizedLinear>(matrix, workspace);
  };
  return std::make_unique<llm::cuda::CudaModel>(weights, std::move(options));
}

}  // namespace step06
