// W8A16 / W4A16 on the GPU: y [rows, out] = x [rows, in] . dequantize(W)^T for
// 1..16 rows (more rows: 16 at a time), int8 per channel, int4 asymmetric and
// symmetric groups and NF4, fp16 or fp32 activations, fp32 accumulation.
//
// Two tensor-core kernels, CudaQuantizedKernel picks one (the persistent
// one by default: the model's path, except for int4 products of 1..4 rows,
// which run the CUDA-core decode GEMV of int4_decode_gemv.cu); they share
// every device piece below (x staging, group parameters, dequantization,
// MMAs, output). In both a block is 256 threads = 8 warps, each warp one
// 16-row m16n8k16 MMA tile, so a block covers 128 output rows (a "row
// block") and its 8 warps share one staged copy of x.
//
// One-shot split-K (the first version, kept to time against): grid (split,
// row block), gridDim.x = splits (slice-fastest). A block computes its 128
// rows over one slice of the input columns (split-K, at most kMaxSteps steps
// of 64 bytes per row); the last block of each row block (a ticket counter)
// adds the slices' partial sums in a fixed order. One block: (1) each warp
// requests its first weights (128-bit loads), (2) all threads stage the slice
// of x as fp16 and the group scales in shared memory, one __syncthreads, (3)
// the rest of the weights are requested, dequantized in registers to exact
// fp16 integers and multiplied on the tensor cores; each 32-column partial is
// scaled in fp32.
//
// Persistent pipelined: grid = the blocks that stay resident at once (SMs x
// blocks per SM). The work is cut into units (row block, step), numbered
// row-block-major, and each block owns one contiguous range of them, so its
// consecutive units continue along K of the same 128 rows and the partial
// sums stay in registers; it walks its range downwards (see the kernel). Each
// warp streams its tile's weights through a ring of kRingUnits units held in
// registers: a unit's loads are requested kRingUnits units before its math,
// so kRingUnits - 1 units are always in flight. x and the group scales of a
// segment of units are staged into shared memory once (for the shapes of
// section 9, one segment per block) while the ring's first loads travel. A
// row block whose K range two or more blocks share (only at the two ends of
// a block's range) is added up by the block that owns its last step, from
// the others' partial sums, after a per-warp flag: one release and one
// acquire, no ticket round trip, and always the same order.
//
// Invariants: every weight byte is read once per call, in the tile-major
// layout of DeviceQuantizedMatrix (a warp load = 512 contiguous bytes);
// results are bitwise reproducible (no atomicAdd on values). Why this design
// (the flop and activation budgets, the layout, fp16 ranges, the persistent
// schedule): docs/06_quantization.md, section 6.3.
#include "step06_quantization/cuda_quantized_kernels.hpp"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

// common/cuda (a public include directory of llm_common in CUDA builds).
// Inside namespace step06 the model's types are spelled llm::cuda::...
#include "cuda_linear.hpp"
#include "cuda_model.hpp"
#include "exercise.cuh"
#include "mma_fragments.cuh"
#include "programmatic_launch.cuh"
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/cuda/cuda_timer.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/errors.hpp"
#include "llm/splitmix64.hpp"
#include "half_linear.hpp"  // HalfActivationScratch: the int4 decode GEMV's split scratch
#include "step06_quantization/cuda_weight_layout.hpp"
#include "step06_quantization/int4_decode_gemv.cuh"
#include "step06_quantization/quantized_layers.hpp"

namespace step06 {
namespace {

using llm::cuda::DeviceBuffer;
using llm::cuda::launch_kernel;  // programmatic_launch.cuh
using llm::cuda::wait_then_let_next_kernel_launch;

constexpr int kWarpSize = 32;
// 8 warps = 8 MMA tiles of 16 output rows: the rows that share one staged
// copy of x (see the top of the file). 8, not more: a block of 256 threads
// at <= 128 registers still fits twice per SM, and the one-shot kernel's last
// block has 128 rows x 16 tokens to add, 8 per thread.
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
constexpr int kEarlySteps = 4;  // of which requested before the staging (see phase 3)
constexpr int kWantedBlocksPerSm = 2;  // what the grid aims for (kMinBlocksPerSm stay resident)
constexpr int kMaxGridY = 65535;
// Persistent kernel: units (one step of one 16-row tile, 1 KB) in a warp's
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
// Persistent kernel: the partial sums a warp hands to another block, per
// lane: 4 per n8 tile of tokens, at most two tiles.
constexpr int kPartialValues = kMaxBatchRows / 8 * 4;

// Per-scheme constants of the kernels.
template <QuantScheme kScheme>
struct SchemeTraits {
  static constexpr bool kInt8 = kScheme == QuantScheme::Int8PerChannel;
  static constexpr bool kZeros = kScheme == QuantScheme::Int4Asymmetric;  // zero points stored per group
  static constexpr int kBits = kInt8 ? 8 : 4;
  static constexpr int kColumnsPerStep = kStepBytes * 8 / kBits;  // 64 (int8) or 128 (4-bit)
  static constexpr int kWordsPerStep = kColumnsPerStep / 2;       // staged x words (fp16 pairs) per step
  static constexpr int kSliceColumns = kColumnsPerStep * kMaxSteps;  // 512 or 1024
  // Groups a slice can touch: one per 32 columns (the smallest group) plus
  // one a group straddling the slice's start adds. int8: one group per row.
  static constexpr int kMaxGroups = kInt8 ? 1 : kSliceColumns / 32 + 1;
  // Persistent kernel: group scales staged per unit. 4-bit: one per 32-column
  // word of the step (a word lies in one group: groups are whole multiples
  // of 32 columns), so the loop looks its scale up without tracking groups;
  // int8: the row's one scale.
  static constexpr int kScaleEntriesPerStep = kInt8 ? 1 : 4;
  // A staged x row in 32-bit words (2 fp16 each): the slice plus 8 words of
  // padding, so rows start 8 banks apart (stride = 8 mod 32 words). The B
  // fragment loads are 64-bit (4 fp16 per lane, see multiply_int4_word): a
  // half-warp (lanes 4g + t, g in 0..3) reads words 8g + 2t (+ same offset)
  // mod 32, 16 distinct even banks, each access taking 2 banks: all 32 banks
  // once, no conflict. The persistent kernel's rows (a whole number of
  // steps plus 8 words) keep the same residue.
  static constexpr int kXStrideWords = kSliceColumns / 2 + 8;
  static_assert(kSliceColumns % 64 == 0, "the bank argument needs a slice of whole 32-word rows");
  static_assert(kWordsPerStep % 32 == 0, "the bank argument needs steps of whole 32-word rows");
  static_assert(kSliceColumns / 4 <= kThreads, "staging: one 4-column unit of a row per thread");
};

// One-shot kernel: shared memory of one block (static: at most 46 KB, under
// the 48 KB every architecture grants without opting in). For the 4-bit
// schemes:
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
  int x_stride_words = 0;  // words of one staged x row: x_window_steps * words per step + 8 (see SchemeTraits)
  std::size_t shared_bytes[2] = {0, 0};  // dynamic shared memory at up to 8 and up to 16 tokens
};

// Split-K scratch of a launch: the partial sums and the flags.
//   one-shot:   partials [k_splits, 16, rows_padded] fp32;
//               counters [m_blocks]: blocks of each row block done so far.
//   persistent: partials [grid, 8 warps, kPartialValues, 32 lanes] fp32: the
//               one piece each block may hand over (see the kernel);
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
  // bytes: the persistent kernel copies it with cp.async (see stage_segment_x).
  bool async_x = false;
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

// (a & kMask) | kBits as one instruction (LOP3, lookup table 0xEA = (a & b) |
// c). Written in C++, with both operands constants, the compiler emits an
// AND and then an OR (a LOP3 holds one immediate, and it does not keep the
// other in a register): two instructions per fp16x2 register of weights,
// where this takes one (ptxas keeps kBits in a register for the whole loop).
// Compiled for sm_75 it stays the C++ expression: there the one register
// more makes the persistent kernel spill under its 128-register cap (int4
// symmetric, fp32 activations, 9-16 rows), and the T4 path is the fallback.
template <std::uint32_t kMask, std::uint32_t kBits>
__device__ __forceinline__ std::uint32_t and_or(std::uint32_t a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return (a & kMask) | kBits;
#else
  std::uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(a), "n"(kMask), "n"(kBits));
  return d;
#endif
}

// The tensor-core product (d += A . B on a 16 x 8 x 16 tile, fp16 inputs,
// fp32 accumulation; the fragment layouts, lane = 4 g + t, are written out
// in common/cuda/mma_fragments.cuh) and a 16-byte vector's 32-bit words.
using llm::cuda::device::mma_16x8x16;
using llm::cuda::device::word_of;

// --- Dequantization in registers: one fp16x2 register of an A fragment.
//
// A 32-bit word of codes holds 8 nibbles; register k (0..3) of a fragment
// is the pair of columns in nibbles k (low half) and k + 4 (high half): the
// upload puts each pair there. The int4 schemes become the exact fp16
// integers code - zero (int4_fragments); NF4 looks the same two nibbles up
// in the 16-entry table of fp16 levels.
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

// --- Staging x.
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

// One unit of 4 columns of x, [column, column + 4), rows 0 .. kRows - 1,
// into shared memory as fp16: row r's two words at dst + r * stride_words
// (one 64-bit store per row). Columns >= in_features and rows >= `rows` are
// 0, so padded weights (and the MMA tile's tokens past the batch) multiply
// zeros. With AWQ input scales, x / s is what is staged (y = Q(W diag(s))
// (x / s)). Rows are loaded in batches of 16 registers (4 rows of fp32, 8
// of fp16): what fits beside the weights and group parameters already in
// flight.
template <class Act, int kRows>
__device__ __forceinline__ void stage_x_unit(std::uint32_t* dst, int stride_words, const DeviceMatrixView& m,
                                             const Act* x, int rows, int column, bool vector_x) {
  constexpr int kBatchRows = std::is_same_v<Act, float> ? 4 : 8;
  const int in = m.in_features;
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
      *reinterpret_cast<uint2*>(dst + (batch + r) * stride_words) =
          make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
    }
  }
}

// One-shot kernel: rows 0 .. 8 kNTiles - 1 of x's slice [col0, col0 +
// slice_columns), each thread one unit of 4 columns (consecutive threads,
// consecutive words: no bank conflict).
template <QuantScheme kScheme, class Act, int kNTiles>
__device__ __forceinline__ void stage_x(SharedTiles<kScheme>& tiles, const DeviceMatrixView& m, const Act* x,
                                        int rows, int col0, int slice_columns, bool vector_x) {
  const int unit = static_cast<int>(threadIdx.x);
  if (unit >= slice_columns / 4) return;  // no barrier inside: returning early is safe
  stage_x_unit<Act, 8 * kNTiles>(&tiles.x[0][2 * unit], SchemeTraits<kScheme>::kXStrideWords, m, x, rows,
                                 col0 + 4 * unit, vector_x);
}

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

// --- Group parameters.

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

// NF4's 16 levels as fp16 bits into shared memory (threads 0..15; visible
// after the next barrier).
__device__ __forceinline__ void stage_nf4_levels(unsigned short* levels) {
  if (threadIdx.x < 16) levels[threadIdx.x] = static_cast<unsigned short>(half_bits(kNf4LevelsDevice[threadIdx.x]));
}

// One-shot kernel: the scales (and zero points) of the block's 128 rows for
// the n_groups groups the slice touches. Thread item = (local group, tile c
// of the block). In two halves: load() first (these bytes come from DRAM,
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

// --- Weights.

// One step of a warp's tile: its lane's 16 bytes of rows 0-7 and of rows
// 8-15. __ldcs (ld.global.cs, "cache streaming"): lines are allocated
// evict-first in L1 and L2. The weights are read exactly once per launch,
// so they should not push x, the scales or the partial sums (read again)
// out of L2. It exists on every architecture and needs no cache-policy
// register (sm_80's L2::evict_first cache hints would be the finer tool).
__device__ __forceinline__ void load_step_codes(uint4 (&codes)[2], const uint4* step_codes) {
  codes[0] = __ldcs(step_codes);
  codes[1] = __ldcs(step_codes + kWarpSize);
}

// One-shot kernel: weights of steps [kFirst, kLast) of a warp's slice into
// registers (steps >= `steps`, past the row's end, stay 0 and are never used).
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

// --- The math of one step.
//
// acc[nt] is a warp's 16 x 8 output tile for tokens [8 nt, 8 nt + 8) in the
// D-fragment layout (mma_16x8x16). x_* point at the lane's B operands in a
// staged x: token g (+ 8 nt rows of x_stride_words), columns 4t.. of each 16.

// The A fragment of MMA 2w + h of a 4-bit word: a0 and a2 are row g's nibble
// pairs (2h, 2h + 4) and (2h + 1, 2h + 5) of `low`, a1 and a3 the same pairs
// of row g + 8 (`high`), fp16x2 each (mma_16x8x16). `zeros` = z(row g) |
// z(row g + 8) << 8 (int4 asymmetric's zero table entry). `report_exercise`:
// the thread's first word of the launch.
template <QuantScheme kScheme>
__device__ __forceinline__ void int4_fragments(std::uint32_t low, std::uint32_t high, int h, unsigned zeros,
                                               const unsigned short* nf4_levels,
                                               [[maybe_unused]] bool report_exercise, std::uint32_t& a0,
                                               std::uint32_t& a1, std::uint32_t& a2, std::uint32_t& a3) {
  if constexpr (kScheme == QuantScheme::NF4) {
    static_cast<void>(zeros);
    a0 = nf4_pair(low, 2 * h, nf4_levels), a2 = nf4_pair(low, 2 * h + 1, nf4_levels);
    a1 = nf4_pair(high, 2 * h, nf4_levels), a3 = nf4_pair(high, 2 * h + 1, nf4_levels);
  } else {
    static_cast<void>(nf4_levels);
    // BEGIN EXERCISE ex06.3
    // STUB: if (report_exercise && h == 0) LLM_CUDA_EXERCISE_TODO("ex06.3");  // one line per launch
    // STUB: a0 = a1 = a2 = a3 = half_bits(llm::cuda::device::exercise_nan()) * 0x00010001u;  // NaN pairs
    // The classic trick (there is no int -> fp16 conversion
    // instruction): (word >> 4k) & 0x000F000F keeps nibble k in
    // the low half and nibble k + 4 in the high half; OR-ing
    // 0x6400 (fp16 1024, whose mantissa step is exactly 1) makes
    // each half the fp16 number 1024 + code. Subtracting 1024 +
    // zero (also exact) leaves code - zero: the integer the
    // group's scale multiplies after the MMA. The mask and the OR
    // are one instruction (and_or).
    // fp16x2 (1024 + zero) of rows g (zero_low) and g + 8 (zero_high);
    // int4 symmetric's zero is 8 for every row (codes 1..15 stand for -7..7).
    std::uint32_t zero_low = 0x64086408u, zero_high = 0x64086408u;
    if constexpr (kScheme == QuantScheme::Int4Asymmetric) {
      // The group's zero points, z(row g) | z(row g + 8) << 8, each
      // byte placed under an 0x64 high byte in both halves.
      zero_low = __byte_perm(zeros, 0x64646464u, 0x4040);
      zero_high = __byte_perm(zeros, 0x64646464u, 0x4141);
    }
    constexpr std::uint32_t kHalf2Of1024 = 0x64006400u;  // fp16 bits of (1024, 1024)
    const auto code_minus_zero = [](std::uint32_t word, int k, std::uint32_t zero_pair) {
      return sub_f16x2(and_or<0x000F000Fu, kHalf2Of1024>(word >> (4 * k)), zero_pair);
    };
    a0 = code_minus_zero(low, 2 * h, zero_low), a2 = code_minus_zero(low, 2 * h + 1, zero_low);
    a1 = code_minus_zero(high, 2 * h, zero_high), a3 = code_minus_zero(high, 2 * h + 1, zero_high);
    // END EXERCISE ex06.3
  }
}

// 4-bit: word w of a lane's 16 bytes covers 32 columns (2 MMAs), which lie in
// one group (groups are whole multiples of 32 columns). Its product is formed
// from exact integers, then scaled by the group's scale pair (rows g, g + 8)
// in fp32. x_word: the lane's B operand of the word's first MMA.
template <QuantScheme kScheme, int kNTiles>
__device__ __forceinline__ void multiply_int4_word(float (&acc)[kNTiles][4], std::uint32_t low, std::uint32_t high,
                                                   const std::uint32_t* x_word, int x_stride_words, __half2 scale,
                                                   unsigned zeros, const unsigned short* nf4_levels,
                                                   bool report_exercise) {
  float part[kNTiles][4];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) part[nt][0] = part[nt][1] = part[nt][2] = part[nt][3] = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // MMA 2w + h: nibble pairs 2h (a0, a1) and 2h + 1 (a2, a3)
    std::uint32_t a0, a1, a2, a3;
    int4_fragments<kScheme>(low, high, h, zeros, nf4_levels, report_exercise, a0, a1, a2, a3);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const uint2 b = *reinterpret_cast<const uint2*>(x_word + 8 * h + 8 * nt * x_stride_words);
      mma_16x8x16<false>(part[nt], {a0, a1, a2, a3}, b.x, b.y);
    }
  }
  const float2 s = __half22float2(scale);
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    acc[nt][0] = fmaf(s.x, part[nt][0], acc[nt][0]);
    acc[nt][1] = fmaf(s.x, part[nt][1], acc[nt][1]);
    acc[nt][2] = fmaf(s.y, part[nt][2], acc[nt][2]);
    acc[nt][3] = fmaf(s.y, part[nt][3], acc[nt][3]);
  }
}

// int8: word w of a lane's 16 bytes is MMA w (16 columns); int8_pair takes
// bytes 0, 1 for a0 and 2, 3 for a2 in place. One group per row: the sums
// stay unscaled until the end (scale_rows).
template <int kNTiles>
__device__ __forceinline__ void multiply_int8_word(float (&acc)[kNTiles][4], std::uint32_t low, std::uint32_t high,
                                                   const std::uint32_t* x_word, int x_stride_words) {
  const std::uint32_t a0 = int8_pair(low, 0x4140), a2 = int8_pair(low, 0x4342);
  const std::uint32_t a1 = int8_pair(high, 0x4140), a3 = int8_pair(high, 0x4342);
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    const uint2 b = *reinterpret_cast<const uint2*>(x_word + 8 * nt * x_stride_words);
    mma_16x8x16<false>(acc[nt], {a0, a1, a2, a3}, b.x, b.y);
  }
}

// A 4-bit word's group parameters as the lane reads them.
struct WordScale {
  __half2 scale;   // rows g, g + 8
  unsigned zeros;  // z(row g) | z(row g + 8) << 8 (int4 asymmetric), else unused
};

// One step of a warp's tile: codes[0] (rows 0-7) and codes[1] (rows 8-15),
// 4 words each, against the staged x at x_step (the step's first column).
// word_params(w) gives word w's group parameters (4-bit only; called once
// per word, in order).
template <QuantScheme kScheme, int kNTiles, class WordParams>
__device__ __forceinline__ void multiply_step(float (&acc)[kNTiles][4], const uint4 (&codes)[2],
                                              const std::uint32_t* x_step, int x_stride_words,
                                              const unsigned short* nf4_levels, bool first_step,
                                              WordParams&& word_params) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    // The lane's codes of this word: rows g (low) and g + 8 (high).
    const std::uint32_t low = word_of(codes[0], w), high = word_of(codes[1], w);
    if constexpr (kScheme == QuantScheme::Int8PerChannel) {
      multiply_int8_word<kNTiles>(acc, low, high, x_step + 8 * w, x_stride_words);
    } else {
      const WordScale params = word_params(w);
      multiply_int4_word<kScheme, kNTiles>(acc, low, high, x_step + 16 * w, x_stride_words, params.scale,
                                           params.zeros, nf4_levels, first_step && w == 0);
    }
  }
}

// int8: the unscaled sums times the rows' scale pair (rows g, g + 8).
template <int kNTiles>
__device__ __forceinline__ void scale_rows(float (&acc)[kNTiles][4], __half2 scale_pair) {
  const float2 scale = __half22float2(scale_pair);
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    acc[nt][0] *= scale.x, acc[nt][1] *= scale.x;
    acc[nt][2] *= scale.y, acc[nt][3] *= scale.y;
  }
}

// y for a warp's tile: D fragment element i of tile nt is (row g + 8 (i /
// 2), token 8 nt + 2t + i % 2); rows past the matrix and tokens past the
// batch are not written.
template <class Act, int kNTiles>
__device__ __forceinline__ void write_output_tile(const float (&acc)[kNTiles][4], const DeviceMatrixView& m,
                                                  int tile_row0, int g, int t, int rows, Act* y) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = tile_row0 + g + 8 * (i / 2), token = 8 * nt + 2 * t + i % 2;
      if (row < m.out_features && token < rows)
        y[static_cast<std::size_t>(token) * m.out_features + row] = from_float<Act>(acc[nt][i] * m.output_scale);
    }
}

template <int kNTiles>
__device__ __forceinline__ void zero_tile(float (&acc)[kNTiles][4]) {
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
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

// --- The persistent pipelined kernel's pieces.

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
  // The persistent kernel's RequestCursor offsets, up to the last row
  // block's 8 tiles, are ints.
  const long long steps = ceil_div(q.padded_in, kStepBytes * 8 / f.bits());
  const long long tiles = static_cast<long long>(ceil_div(ceil_div(q.out_features, kTileRows), kWarps)) * kWarps;
  if (tiles * steps * 2 * kWarpSize > std::numeric_limits<int>::max())
    input_error(text(f.name(), " [", q.out_features, ", ", q.in_features,
                     "]: more than 2^31 16-byte words of codes (32 GiB), which the kernels index with ints"));
}

// Calls f with the scheme as a compile-time constant (std::integral_constant):
// the one switch from a matrix's run-time scheme to the kernels' template.
template <class F>
decltype(auto) with_scheme(QuantScheme scheme, F&& f) {
  switch (scheme) {
    case QuantScheme::Int8PerChannel:
      return f(std::integral_constant<QuantScheme, QuantScheme::Int8PerChannel>{});
    case QuantScheme::Int4Asymmetric:
      return f(std::integral_constant<QuantScheme, QuantScheme::Int4Asymmetric>{});
    case QuantScheme::Int4Symmetric:
      return f(std::integral_constant<QuantScheme, QuantScheme::Int4Symmetric>{});
    case QuantScheme::NF4:
      break;
  }
  return f(std::integral_constant<QuantScheme, QuantScheme::NF4>{});
}

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
PersistentPlan plan_persistent(const DeviceMatrixView& v) {
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
    throw llm::DeviceError(text("step06: the persistent quantized kernel needs ", plan.shared_bytes[1],
                                " bytes of shared memory per block; this GPU grants ", limits.per_block_opt_in));
  plan.grid = static_cast<int>(std::min(plan.units, static_cast<long long>(sms) * blocks_per_sm));
  return plan;
}

// The device copy of a QuantizedMatrix in the kernels' layout (see the top of
// the file), uploaded once, and the launch plans that go with it.
class DeviceQuantizedMatrix {
 public:
  explicit DeviceQuantizedMatrix(const QuantizedMatrix& q) : scheme_(q.format.scheme) {
    check_matrix(q);
    require_device();
    plan_launch(q);
    persistent_ = with_scheme(scheme_, [this](auto scheme) { return plan_persistent<decltype(scheme)::value>(view_); });
    upload_codes(q);
    upload_scales(q);
    view_.codes = codes_.data();
    view_.scales = as_half(scales_.data());
    view_.zeros = zeros_.empty() ? nullptr : zeros_.data();
    view_.inverse_input_scales = inverse_input_scales_.empty() ? nullptr : inverse_input_scales_.data();
  }

 private:
  // The view's dims and the one-shot kernel's split-K plan (no device memory yet).
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
    v.code_words = v.m_tiles * v.total_steps * 2 * kWarpSize;
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

  // The codes in the kernels' tile-major layout (cuda_weight_layout.hpp), uploaded.
  void upload_codes(const QuantizedMatrix& q) {
    const std::vector<std::uint8_t> bytes = cuda_tile_major_codes(q);
    std::vector<uint4> codes(bytes.size() / sizeof(uint4));  // [m_tiles, total_steps, 2, 32] uint4
    if (codes.size() != static_cast<std::size_t>(view_.code_words))
      throw llm::DeviceError(text("step06: the tile-major codes hold ", codes.size(), " 16-byte words, the plan ",
                                  view_.code_words));
    std::memcpy(codes.data(), bytes.data(), bytes.size());
    codes_ = DeviceBuffer<uint4>(span_of(codes));
  }

  // The group scales (fp16, one power-of-two exponent for the matrix) and
  // zero points in the kernels' layout (cuda_weight_layout.hpp: [group, row],
  // so the 128 rows of a block's group are 256 contiguous bytes, each tile's
  // rows in pair order), and AWQ's inverse input scales, uploaded. fp16
  // halves the scales' bytes (int4-g64: 2 instead of 4 bytes per 32 bytes of
  // codes, what keeps W4A16 near 4x fewer bytes than fp16).
  void upload_scales(const QuantizedMatrix& q) {
    const CudaGroupTables tables = cuda_group_tables(q);
    view_.output_scale = tables.output_scale;
    std::vector<Fp16Bits> scales(tables.scales.size());
    for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = fp16_bits(tables.scales[i]);
    scales_ = DeviceBuffer<Fp16Bits>(span_of(scales));
    if (!tables.zeros.empty()) zeros_ = DeviceBuffer<unsigned char>(span_of(tables.zeros));
    if (!q.input_scales.empty()) {
      // 1 / s once here, a multiply per activation in the kernel.
      std::vector<float> inverse(q.input_scales.size());
      for (std::size_t i = 0; i < inverse.size(); ++i) inverse[i] = 1.0f / q.input_scales[i];
      inverse_input_scales_ = DeviceBuffer<float>(span_of(inverse));
    }
  }

 public:
  QuantScheme scheme() const { return scheme_; }
  const DeviceMatrixView& view() const { return view_; }
  const PersistentPlan& persistent_plan() const { return persistent_; }
  int out_features() const { return view_.out_features; }
  int in_features() const { return view_.in_features; }
  std::size_t bytes() const {
    return codes_.bytes() + scales_.bytes() + zeros_.bytes() + inverse_input_scales_.bytes();
  }
  // Split-K scratch a launch of either kernel needs (see SplitKView): the
  // one-shot kernel's only with more than one slice.
  std::size_t partial_floats() const {
    const std::size_t one_shot =
        view_.k_splits > 1 ? static_cast<std::size_t>(view_.k_splits) * kMaxBatchRows * view_.rows_padded : 0;
    const std::size_t persistent = static_cast<std::size_t>(persistent_.grid) * kWarps * kPartialValues * kWarpSize;
    return std::max(one_shot, persistent);
  }
  std::size_t counters() const { return static_cast<std::size_t>(view_.m_tiles); }  // >= m_blocks

 private:
  QuantScheme scheme_;
  DeviceMatrixView view_;
  PersistentPlan persistent_;
  DeviceBuffer<uint4> codes_;                  // [m_tiles, total_steps, 2, 32] uint4
  DeviceBuffer<Fp16Bits> scales_;              // [groups_per_row, rows_padded] fp16 (paired_row_slot)
  DeviceBuffer<unsigned char> zeros_;          // [groups_per_row, rows_padded] (paired_row_slot) or empty
  DeviceBuffer<float> inverse_input_scales_;   // [in_features] or empty
};

// Split-K scratch, shared by every quantized layer of a model: the layers run
// one after another on the model's stream, and each launch of either kernel
// leaves the counters at 0 (the one-shot kernel's atomicInc wraps, the
// persistent kernel's owners reset their flags), so one buffer serves them
// all. Not for two launches in flight at once on different streams.
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
  DeviceBuffer<float> partials_;     // SplitKView's partials, of the largest user
  DeviceBuffer<unsigned> counters_;  // SplitKView's counters, of the largest user
};

template <QuantScheme kScheme, class Act>
void launch_one_shot(const DeviceMatrixView& v, const Act* x, int rows, bool vector_x, Act* y, SplitKView split_k,
                     cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(v.k_splits), static_cast<unsigned>(v.m_blocks));
  if (rows <= 8)
    launch_kernel(one_shot_matmul_kernel<kScheme, Act, 1>, grid, kThreads, 0, stream, v, x, rows, vector_x, y, split_k);
  else
    launch_kernel(one_shot_matmul_kernel<kScheme, Act, 2>, grid, kThreads, 0, stream, v, x, rows, vector_x, y, split_k);
}

template <QuantScheme kScheme, class Act>
void launch_persistent(const DeviceMatrixView& v, const PersistentPlan& plan, const Act* x, int rows,
                       XStaging staging, Act* y, SplitKView reduction, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>(plan.grid);
  if (rows <= 8)
    launch_kernel(persistent_matmul_kernel<kScheme, Act, 1>, grid, kThreads, plan.shared_bytes[0], stream, v, plan, x,
                  rows, staging, y, reduction);
  else
    launch_kernel(persistent_matmul_kernel<kScheme, Act, 2>, grid, kThreads, plan.shared_bytes[1], stream, v, plan, x,
                  rows, staging, y, reduction);
}

// y [rows, out] = x [rows, in] . W~^T, both device memory, queued on
// `stream`: one launch per 16 rows (each re-reads W: prefill is not what
// these kernels are for).
template <class Act>
void quantized_matmul(const DeviceQuantizedMatrix& w, const Act* x, int rows, Act* y, SplitKWorkspace& workspace,
                      CudaQuantizedKernel kernel, cudaStream_t stream) {
  const DeviceMatrixView& v = w.view();
  const SplitKView split_k = workspace.view();
  constexpr std::size_t kVectorBytes = 4 * sizeof(Act);  // one 4-activation load
  for (int row0 = 0; row0 < rows; row0 += kMaxBatchRows) {
    const int tile_rows = std::min(kMaxBatchRows, rows - row0);
    const Act* x_tile = x + static_cast<std::size_t>(row0) * v.in_features;
    Act* y_tile = y + static_cast<std::size_t>(row0) * v.out_features;
    const auto x_address = reinterpret_cast<std::uintptr_t>(x_tile);
    XStaging staging;
    staging.vector_x = v.in_features % 4 == 0 && x_address % kVectorBytes == 0;
    staging.async_x = std::is_same_v<Act, __half> && v.inverse_input_scales == nullptr && v.in_features % 8 == 0 &&
                      x_address % 16 == 0;
    with_scheme(w.scheme(), [&](auto scheme) {
      constexpr QuantScheme kScheme = decltype(scheme)::value;
      if (kernel == CudaQuantizedKernel::OneShotSplitK) {
        launch_one_shot<kScheme>(v, x_tile, tile_rows, staging.vector_x, y_tile, split_k, stream);
      } else {
        launch_persistent<kScheme>(v, w.persistent_plan(), x_tile, tile_rows, staging, y_tile, split_k, stream);
      }
    });
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

// y [rows, out] = x [rows, in] . W~^T on the int4 decode GEMV, both device
// memory, queued on `stream`: Int4DecodeGemv::kMaxRows rows per launch.
void int4_gemv_matmul(const Int4DecodeGemv& gemv, const float* x, int rows, float* y,
                      llm::cuda::HalfActivationScratch& scratch, cudaStream_t stream) {
  for (int row0 = 0; row0 < rows; row0 += Int4DecodeGemv::kMaxRows) {
    const int launch_rows = std::min(Int4DecodeGemv::kMaxRows, rows - row0);
    gemv.forward(x + static_cast<std::size_t>(row0) * gemv.in_features(), launch_rows,
                 y + static_cast<std::size_t>(row0) * gemv.out_features(), {}, scratch, stream);
  }
}

// The int4 decode GEMV's refusals: not an int4 scheme, or fp16 activations.
void check_int4_gemv_request(const QuantizedMatrix& matrix, bool fp16_activations) {
  if (!Int4DecodeGemv::supports(matrix.format))
    input_error(text("the int4 decode GEMV reads int4 groups, not ", matrix.format.name()));
  if (fp16_activations)
    input_error("the int4 decode GEMV takes fp32 activations (it rounds them to fp16 as it stages them)");
}

// Runs a kernel once on host data; y is poisoned with NaN first (0xFF
// bytes are a NaN in fp16 and fp32) so an output the kernel skips fails
// every check.
template <class Host>
std::vector<Host> run_once(const QuantizedMatrix& matrix, std::span<const Host> x_host, int rows,
                           CudaQuantizedKernel kernel) {
  using Act = typename KernelActivation<Host>::type;
  check_matrix(matrix);  // InputErrors before any device work
  const bool int4_gemv = kernel == CudaQuantizedKernel::Int4DecodeGemv;
  if (int4_gemv) check_int4_gemv_request(matrix, std::is_same_v<Host, Fp16Bits>);
  require_device();
  const DeviceBuffer<Host> x{x_host};
  DeviceBuffer<Host> y{static_cast<std::size_t>(rows) * matrix.out_features};
  LLM_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.bytes()));
  if (int4_gemv) {
    if constexpr (std::is_same_v<Host, float>) {  // fp16 activations were refused above
      const Int4DecodeGemv gemv(matrix);
      llm::cuda::HalfActivationScratch scratch;
      gemv.reserve(scratch, rows);
      int4_gemv_matmul(gemv, x.data(), rows, y.data(), scratch, nullptr);
      LLM_CUDA_CHECK(cudaDeviceSynchronize());  // faults inside the kernel surface here (before the scratch goes)
    }
  } else {
    const DeviceQuantizedMatrix w(matrix);
    SplitKWorkspace workspace;
    workspace.ensure(w.partial_floats(), w.counters());
    quantized_matmul(w, reinterpret_cast<const Act*>(x.data()), rows, reinterpret_cast<Act*>(y.data()), workspace,
                     kernel, nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());  // faults inside the kernel surface here
  }
  std::vector<Host> y_host(y.size());
  y.download(span_of(y_host));
  return y_host;
}

// The model's Linear hook with quantized weights (fp32 activations in and
// out, rounded to fp16 by the kernels). Int4 layers with the decode GEMV
// run products of 1..4 rows on it, folding what the model gives them
// (ProductFusion); every other product runs the persistent kernel, which
// folds nothing.
class CudaQuantizedLinear final : public llm::cuda::CudaLinear {
 public:
  CudaQuantizedLinear(const QuantizedMatrix& matrix, std::shared_ptr<SplitKWorkspace> workspace,
                      std::shared_ptr<llm::cuda::HalfActivationScratch> gemv_scratch,
                      const CudaQuantizedModelOptions& options)
      : weights_(matrix), workspace_(std::move(workspace)), gemv_scratch_(std::move(gemv_scratch)) {
    workspace_->ensure(weights_.partial_floats(), weights_.counters());
    if (options.int4_decode_gemv && Int4DecodeGemv::supports(matrix.format)) {
      gemv_ = std::make_unique<Int4DecodeGemv>(matrix);
      gemv_->set_first_weights_prefetch(options.run.gemv_prefetch);
      gemv_->set_pipelined_weight_loads(options.run.gemv_pipelining);
    }
  }
  void forward(const float* x_dev, int rows, float* y_dev, cudaStream_t stream) const override {
    if (rows <= 0) return;
    if (fuses(rows))
      gemv_->forward(x_dev, rows, y_dev, {}, *gemv_scratch_, stream);
    else
      quantized_matmul(weights_, x_dev, rows, y_dev, *workspace_, CudaQuantizedKernel::PersistentPipelined, stream);
  }
  void reserve_rows(int rows) override {
    if (gemv_ != nullptr) gemv_->reserve(*gemv_scratch_, rows);
  }
  int max_fused_rows() const override { return gemv_ != nullptr ? Int4DecodeGemv::kMaxRows : 0; }
  void forward_fused(const float* x_dev, int rows, float* y_dev, const llm::cuda::ProductFusion& fusion,
                     cudaStream_t stream) const override {
    check_fusion(rows, fusion);
    gemv_->forward(x_dev, rows, y_dev, fusion, *gemv_scratch_, stream);
  }
  int in_features() const override { return weights_.in_features(); }
  int out_features() const override { return weights_.out_features(); }
  // What a decode token's product reads: the GEMV's copy (QuantizedMatrix's
  // bytes: fp32 group scales) where it runs, else the persistent kernel's
  // (fp16 scales, padded tiles); never both.
  std::size_t weight_bytes() const override { return gemv_ != nullptr ? gemv_->weight_bytes() : weights_.bytes(); }
  // dense_weight(): nullptr (the default). A quantized tied classifier has no
  // fp32 rows to lend, so the model keeps its own copy of the embedding.

 private:
  // The persistent kernel's tile-major copy (prefill, batches, and every
  // product of int8 and NF4) and, for int4 with the GEMV, a row-major copy
  // as QuantizedMatrix stores it: twice the device memory of an int4 layer.
  // One layout for both kernels is what a production kernel (Marlin's) has;
  // here each kernel keeps the layout that makes it short to read.
  DeviceQuantizedMatrix weights_;
  std::unique_ptr<Int4DecodeGemv> gemv_;  // null: no GEMV (not int4, or switched off)
  std::shared_ptr<SplitKWorkspace> workspace_;
  std::shared_ptr<llm::cuda::HalfActivationScratch> gemv_scratch_;
};

// The quantized matrix of the model's product at `site` of [out_features,
// in_features]: the site's own, or for a fused product (CudaFusions'
// qkv_product and gate_up_product: the model asks for the Query site with
// the Q, K and V rows stacked, the Gate site with gate and up) the sites'
// matrices stacked by rows. Null: the site is not quantized (fp32).
std::optional<QuantizedMatrix> quantized_matrix_for(const QuantizedLayers& layers, const llm::LinearSite& site,
                                                    int out_features, int in_features) {
  const auto find = [&layers](int layer, llm::LinearRole role) -> const QuantizedMatrix* {
    const auto found = layers.matrices.find(llm::LinearSite{layer, role});
    return found == layers.matrices.end() ? nullptr : &found->second;
  };
  const QuantizedMatrix* own = find(site.layer, site.role);
  if (own == nullptr) return std::nullopt;
  std::vector<const QuantizedMatrix*> parts = {own};
  if (own->out_features != out_features) {
    using llm::LinearRole;
    if (site.role == LinearRole::Query)
      parts = {own, find(site.layer, LinearRole::Key), find(site.layer, LinearRole::Value)};
    if (site.role == LinearRole::Gate) parts = {own, find(site.layer, LinearRole::Up)};
  }
  int stacked_rows = 0;
  for (const QuantizedMatrix* part : parts) {
    if (part == nullptr)
      input_error(text(site.name(), ": a fused product of quantized and fp32 matrices (quantize every site it stacks)"));
    stacked_rows += part->out_features;
  }
  if (stacked_rows != out_features || own->in_features != in_features)
    input_error(text(site.name(), ": the quantized matrix is [", stacked_rows, ", ", own->in_features,
                     "], the model's is [", out_features, ", ", in_features, "]"));
  return parts.size() == 1 ? *own : stack_rows(std::span<const QuantizedMatrix* const>(parts.data(), parts.size()));
}

}  // namespace

std::vector<float> cuda_quantized_matmul(const QuantizedMatrix& matrix, std::span<const float> x, int rows,
                                         CudaQuantizedKernel kernel) {
  check_rows(matrix, x.size(), rows);
  return run_once<float>(matrix, x, rows, kernel);
}

std::vector<float> cuda_quantized_matmul_fp16(const QuantizedMatrix& matrix, std::span<const float> x, int rows,
                                              CudaQuantizedKernel kernel) {
  check_rows(matrix, x.size(), rows);
  const std::vector<Fp16Bits> x_half = floats_to_halves(x);
  return halves_to_floats(span_of(run_once<Fp16Bits>(matrix, span_of(x_half), rows, kernel)));
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

  // The checks: one run of each kernel into a NaN-poisoned y against the
  // fp32 product of dequantize(matrix) with the same fp16 x, accumulated in
  // double on the host. fp16 tolerance (1e-3 absolute + 1e-2 relative): y is
  // rounded to fp16 (relative 2^-11) and each group's scale was stored as
  // fp16 (relative 2^-12 per group, so |error| <= 2^-12 sum over groups
  // |partial|, about 1e-4 of |y| for 4096 columns of random data);
  // accumulation is fp32.
  const std::vector<float> weight = dequantize(matrix);  // [out, in]
  const std::vector<float> reference = host_reference_product(weight, halves_to_floats(span_of(x_host)), rows, in, out);
  const auto check = [&](CudaQuantizedKernel kernel) {
    LLM_CUDA_CHECK(cudaMemset(y.data(), 0xFF, y.bytes()));
    quantized_matmul(w, as_half(x.data()), rows, as_half(y.data()), workspace, kernel, nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<Fp16Bits> y_host(y.size());
    y.download(span_of(y_host));
    return llm::compare(span_of(halves_to_floats(span_of(y_host))), span_of(reference),
                        llm::tolerance_for(llm::DType::F16));
  };
  const auto median_ms = [&](CudaQuantizedKernel kernel) {
    const auto run = [&] {
      quantized_matmul(w, as_half(x.data()), rows, as_half(y.data()), workspace, kernel, nullptr);
    };
    return llm::cuda::time_cuda(run, kWarmupRuns, repeats, /*flush_l2=*/true).median_ms;
  };
  CudaMatmulTiming timing;
  timing.check = check(CudaQuantizedKernel::PersistentPipelined);
  timing.one_shot_check = check(CudaQuantizedKernel::OneShotSplitK);
  timing.quantized_ms = median_ms(CudaQuantizedKernel::PersistentPipelined);
  timing.one_shot_ms = median_ms(CudaQuantizedKernel::OneShotSplitK);
  timing.cublas_fp16_ms = time_cublas_fp16(weight, x, rows, in, out, kWarmupRuns, repeats);
  if (Int4DecodeGemv::supports(matrix.format) && rows <= Int4DecodeGemv::kMaxRows) {
    // The decode GEMV reads x as the model hands it over, fp32 (the same
    // fp16 values), and writes y in fp32.
    const std::vector<float> x_float = halves_to_floats(span_of(x_host));
    timing.int4_gemv_check =
        llm::compare(span_of(run_once<float>(matrix, span_of(x_float), rows, CudaQuantizedKernel::Int4DecodeGemv)),
                     span_of(reference), llm::tolerance_for(llm::DType::F16));
    const Int4DecodeGemv gemv(matrix);
    llm::cuda::HalfActivationScratch scratch;
    gemv.reserve(scratch, rows);
    const DeviceBuffer<float> x_dev{span_of(x_float)};
    DeviceBuffer<float> y_dev{static_cast<std::size_t>(rows) * out};
    const auto run = [&] { gemv.forward(x_dev.data(), rows, y_dev.data(), {}, scratch, nullptr); };
    timing.int4_gemv_ms = llm::cuda::time_cuda(run, kWarmupRuns, repeats, /*flush_l2=*/true).median_ms;
  }
  return timing;
}

std::unique_ptr<llm::Model> make_cuda_quantized_model(const llm::ModelWeights& weights, const QuantizedLayers& layers,
                                                      const CudaQuantizedModelOptions& options) {
  require_device();
  auto workspace = std::make_shared<SplitKWorkspace>();
  auto gemv_scratch = std::make_shared<llm::cuda::HalfActivationScratch>();
  llm::cuda::CudaModelOptions model_options = llm::cuda::cuda_model_options(options.run);
  // Called only while the model is built: `layers` need not outlive it (every
  // quantized layer uploads its own device copy).
  model_options.linear_factory = [&layers, &options, workspace, gemv_scratch](
                                     const std::vector<float>& weight, int out_features, int in_features,
                                     const llm::LinearSite& site,
                                     cublasHandle_t cublas) -> std::unique_ptr<llm::cuda::CudaLinear> {
    const std::optional<QuantizedMatrix> matrix = quantized_matrix_for(layers, site, out_features, in_features);
    if (!matrix) return std::make_unique<llm::cuda::DenseCudaLinear>(weight, out_features, in_features, cublas);
    return std::make_unique<CudaQuantizedLinear>(*matrix, workspace, gemv_scratch, options);
  };
  return std::make_unique<llm::cuda::CudaModel>(weights, std::move(model_options));
}

}  // namespace step06
