// Half-precision weights (fp16, bf16) for the CUDA model: HalfCudaLinear
// (half_linear.hpp), its GEMV for 1..16 rows, in two kernels (multiply-adds
// on the CUDA cores, the default, or on the tensor cores: HalfGemvKernel),
// and its cuBLAS path for more.
//
// What is half and what is not. The weights are rounded once, at
// construction (round to nearest even), and stored half: at decode a token's
// activations are a few KB (x [rows, in] fp32) against MB of weights per
// product, so the weights are what a token's time is made of, and halving
// them is what pays. x, y, the residual stream and the norms stay fp32 in
// memory, and every sum is fp32. The products' inputs, though, are rounded
// to the weights' type on both paths: cuBLAS (prefill) multiplies half by
// half, so the GEMV rounds each x value as it stages it too (the same round
// to nearest even; it costs nothing, x is staged anyway). Why: a serving
// engine (step 07) puts a request's decode row into a forward with other
// requests' prefill rows, more than 16 in all, so the row goes through
// cuBLAS there and through the GEMV when it runs alone. With x rounded alike
// on both paths, one product's two results differ only by the order of fp32
// sums, as the fp32 model's cuBLAS kernels do between row counts, not by x's
// rounding. Through the model that order still matters: the next product
// rounds its input to half again, and a last-bit difference moves that
// rounding by one step now and then, so a row's logits alone and in a batch
// differ by far more than fp32 sums do (measured: docs/results/gpu_decode/
// README.md) and may pick another greedy token at a near-tie. Step 07's
// check_replay says when that is all that happened.
//
// The GEMV (rows <= kMaxGemvRows = 16). Why 16: speculative decoding verifies
// k + 1 <= 9 rows at once and step 07 batches a few sequences per step; a
// GEMV that reads every weight byte once whatever the row count was meant to
// make those rows nearly free at decode, where cublasSgemm's kernels for 9
// rows took 1.2-1.7x the time of one row. The row count is a template
// parameter, rounded up to a bucket (1, 2, 4, 8, 16; the extra rows are
// zeros that are never written), so the sums live in registers. Its
// multiply-adds grow with the rows, though, where cublasGemmEx's half
// kernels stay flat, so the model's layers are built with gemv_max_rows 1
// (kDefaultMaxGemvRows, CudaRunOptions::max_gemv_rows): only decode's
// single row runs here by default, and --max-gemv-rows 16 brings back the
// batch-invariant bits of 2-16 rows.
//
//   weights  [out, padded_in] half bit patterns, padded_in = in rounded up to
//            8 (16 bytes), columns [in, padded_in) zero: every row starts
//            16-byte aligned (cudaMalloc is 256-byte aligned), so any `in`
//            works with 16-byte loads and no scalar tail;
//   x        [rows, in] fp32, row-major;  y [rows, out] fp32, row-major;
//   partials [k_splits, rows, out] fp32 and counters [output blocks]
//            (HalfActivationScratch), only when the columns are split.
//
// Vector width: 16 bytes (8 halves) per load, the widest load a thread has;
// fewer, wider loads keep more bytes in flight per instruction, which is what
// a memory-bound kernel needs to reach HBM bandwidth.
//
// Block shape: 256 threads = 8 warps. Within a warp, 8 lanes share one weight
// row: they read 8 x 16 = 128 contiguous bytes of it (a whole cache line) per
// step of 64 columns, so a warp reads 4 rows per load instruction, and each
// lane does that for 2 output rows (kOutputsPerLane): a warp owns 8 output
// rows, a block 64. Why not 32 lanes on one row (512 bytes): x. A lane's x
// values for its 8 columns serve both its rows, and the 4 lane groups of a
// warp read the same x addresses from shared memory (a broadcast), so shared
// memory delivers 128 bytes of x per warp instruction instead of 512, and the
// 8-lane reduction at the end is 3 shuffles instead of 5. At 16 rows every
// weight is multiplied 16 times in fp32: at an H100's 3.35 TB/s that is
// about 27 TFMA/s, some 80% of its fp32 peak (33.5), so the instructions
// around the FMAs must stay few, and 16 rows may run somewhat slower than 1.
// (The tensor-core kernel, after this one, takes the multiply-adds off the
// CUDA cores.)
//
// x in shared memory. All 8 warps of a block multiply the same x, so the
// block stages a chunk of x's columns (16 KB: 4096 / kRows columns of every
// row) in shared memory once, and every warp reads it from there. A block's
// 64 outputs make the x traffic from L2 into the SM (4 * rows bytes per
// column) at most half its weight traffic (64 * 2 bytes per column) at 16
// rows. The chunk is stored swizzled so that the 8 lanes of a group read 128
// contiguous bytes (no bank conflicts).
//
// Filling the GPU: 64 outputs per block give out / 64 blocks, too few for
// out = 256 (TinyLlama's K/V projections: 4 blocks) and even out = 2048 (32)
// on 132 SMs. So the columns are split into k_splits slices (gridDim.y),
// chosen at construction from the shape and the SM count (about 2 blocks per
// SM, slices of whole 64-column steps). Each slice's block writes its partial
// sums; the last block of an output block to finish (a ticket counter) adds
// the slices' partials in slice order and writes y. No atomicAdd on y, so
// the result is bitwise reproducible, and the order of every output's sum
// depends only on the shape, never on the row count: a row gives the same
// bits alone or among 16 (the test checks it).
//
// Loads in flight: each lane requests kStepsPerBatch x kOutputsPerLane = 8
// vectors (128 bytes, a "batch") before it uses any, with 2 or more blocks
// per SM (the launch bounds cap registers at 128 for that): 64 KB per SM
// while a batch travels. Up to 4 rows the loads are also pipelined: a lane
// requests its next batch before it multiplies the current one, so its
// requests do not stop while it computes (up to 128 KB per SM), and it
// requests its first batch before it waits for the kernel before it. Little's
// law says why that matters: an SM's share of an H100's 3.35 TB/s is ~25
// GB/s, an H200's 4.8 TB/s ~36 GB/s, so at a loaded HBM latency of ~1.5 us
// it must keep ~40-55 KB in flight all the time, not only between its
// multiplies. A token's products are short (on 132 SMs a TinyLlama block
// streams 1-4 batches), so a batch that waits for the arithmetic before it
// is even requested costs a visible share of each product.
#include "half_linear.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "device_formulas.cuh"
#include "kernels.cuh"  // rope_and_write_kv: the RoPE fold's fallback past the GEMV's rows
#include "mma_fragments.cuh"
#include "programmatic_launch.cuh"
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/cuda/tensor_core_gemv_layout.hpp"
#include "llm/errors.hpp"
#include "llm/kv_cache.hpp"

namespace llm::cuda {
namespace {

using device::kWarpSize;
constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * kWarpSize;  // 256
// Blocks per SM the launch bounds ask for (registers <= 65536 / (2 * 256) =
// 128 per thread): two blocks let one stream weights while the other waits at
// a barrier for its next chunk of x.
constexpr int kGemvMinBlocksPerSm = 2;
constexpr int kHalvesPerVector = 8;                                   // one 16-byte load
constexpr int kLanesPerWeightRow = 8;                                 // 8 x 16 = 128 bytes of a row per step
constexpr int kLaneGroupsPerWarp = kWarpSize / kLanesPerWeightRow;    // 4
constexpr int kOutputsPerLane = 2;
constexpr int kOutputsPerBlock = kGemvWarps * kLaneGroupsPerWarp * kOutputsPerLane;  // 64
constexpr int kStepElements = kLanesPerWeightRow * kHalvesPerVector;  // 64 columns per step
constexpr int kStepsPerBatch = 4;                                     // steps whose loads are issued together
constexpr int kBatchElements = kStepsPerBatch * kStepElements;        // 256 columns
// Row buckets up to this one pipeline their weight loads (the next batch
// requested before the current one is multiplied: 64 registers of weights
// instead of 32). The 1-row kernel then takes 100-115 registers instead of ~70,
// the 2- and 4-row ones 118-128, under the launch bounds' 128 without a
// spill on sm_75 and sm_90; the 8- and 16-row kernels would spill (their
// sums take 16 and 32 registers more), and there the 8 or 16 fmaf per weight
// already keep a warp busy between its batches.
constexpr int kMaxPipelinedRows = 4;
constexpr int kStagedXFloats = 4096;                                  // 16 KB of x per chunk
// Wanted GEMV blocks per SM when choosing the column split.
constexpr int kWantedBlocksPerSm = 2;
// Element-wise kernels (conversions): 256 threads, a grid-stride loop over at
// most 65535 blocks (as kernels.cu does).
constexpr int kElementwiseThreads = 256;
constexpr std::size_t kMaxElementwiseBlocks = 65535;
static_assert(kGemvThreads % kWarpSize == 0 && kWarpSize % kLanesPerWeightRow == 0);
// A folded RMSNorm sums its squares as the RMSNorm kernel's blocks do, with
// blocks of the same size (device_formulas.cuh): the same bits.
static_assert(kGemvThreads == device::kNormBlockThreads);
static_assert(kStagedXFloats % (kMaxGemvRows * kBatchElements) == 0,
              "every row bucket's chunk must hold whole batches");

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
constexpr int round_up(int a, int b) { return ceil_div(a, b) * b; }

int elementwise_blocks(std::size_t count) {
  return static_cast<int>(
      std::clamp<std::size_t>((count + kElementwiseThreads - 1) / kElementwiseThreads, 1, kMaxElementwiseBlocks));
}

// The two half types, as bit patterns (std::uint16_t) outside the kernels.
struct Float16Traits {
  static constexpr cudaDataType_t kCublasType = CUDA_R_16F;
  static constexpr std::uint16_t kExponentMask = 0x7c00;  // all ones: inf or NaN
  __device__ static float to_float(std::uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
  // Round to nearest even; beyond 65504 (from 65520 on) the result is inf.
  __device__ static std::uint16_t from_float(float value) { return __half_as_ushort(__float2half_rn(value)); }
  // value rounded to fp16 and back: the value cuBLAS multiplies by.
  __device__ static float round_trip(float value) { return __half2float(__float2half_rn(value)); }
};
struct BFloat16Traits {
  static constexpr cudaDataType_t kCublasType = CUDA_R_16BF;
  static constexpr std::uint16_t kExponentMask = 0x7f80;
  __device__ static float to_float(std::uint16_t bits) { return __bfloat162float(__ushort_as_bfloat16(bits)); }
  __device__ static std::uint16_t from_float(float value) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(value));
  }
  __device__ static float round_trip(float value) { return __bfloat162float(__float2bfloat16_rn(value)); }
};

// The 16-bit element `index` (0..7) of a 16-byte vector: little-endian, so
// element 2i is the low half of 32-bit word i.
template <class Traits>
__device__ float vector_element(const uint4& vector, int index) {
  const unsigned int words[4] = {vector.x, vector.y, vector.z, vector.w};
  const unsigned int word = words[index / 2];
  return Traits::to_float(static_cast<std::uint16_t>(index % 2 == 0 ? word & 0xffffu : word >> 16));
}

// weight [out, in] fp32 -> bits [out, padded_in] of the half type, padding
// columns zero; counts the results that are not finite.
template <class Traits>
__global__ void round_weights_kernel(const float* __restrict__ weight, int out, int in, int padded_in,
                                     std::uint16_t* __restrict__ bits, unsigned long long* __restrict__ non_finite) {
  const std::size_t count = static_cast<std::size_t>(out) * static_cast<std::size_t>(padded_in);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const std::size_t row = i / static_cast<std::size_t>(padded_in);
    const int column = static_cast<int>(i % static_cast<std::size_t>(padded_in));
    std::uint16_t rounded = 0;
    if (column < in) {
      rounded = Traits::from_float(weight[row * static_cast<std::size_t>(in) + static_cast<std::size_t>(column)]);
      if ((rounded & Traits::kExponentMask) == Traits::kExponentMask) atomicAdd(non_finite, 1ull);
    }
    bits[i] = rounded;
  }
}

// The cuBLAS path's B operand, x_half [rows, in]: the product's input rounded
// to the half type, after what the fusion folds in (ProductFusion), computed
// as the model's own kernels compute it:
//   input_norm set:  rmsnorm(x) of x [rows, in], with the RMSNorm kernel's
//                    block size, formulas and order of additions
//                    (device_formulas.cuh), so the same fp32 values round;
//   swiglu_input:    silu(gate) * up of the gate/up rows x [rows, 2 * in];
//   neither:         x [rows, in] as it is.
// Block r writes row r. One launch is the norm's (or SwiGLU's) kernel and the
// rounding together: on this path, that and cuBLAS's beta (the residual add)
// are what folding saves.
template <class Traits>
__global__ void __launch_bounds__(device::kNormBlockThreads)
    round_product_input_kernel(const float* __restrict__ x, int in, const float* __restrict__ input_norm,
                               float norm_eps, bool swiglu_input, std::uint16_t* __restrict__ x_half) {
  wait_then_let_next_kernel_launch();  // x comes from the kernel before
  __shared__ float reduce_scratch[kWarpSize];
  const auto row = static_cast<std::size_t>(blockIdx.x);
  const auto columns = static_cast<std::size_t>(in);
  std::uint16_t* half_row = x_half + row * columns;
  const int first = static_cast<int>(threadIdx.x), stride = static_cast<int>(blockDim.x);
  if (swiglu_input) {
    const float* gate_up_row = x + row * 2 * columns;  // gate columns [0, in), up columns [in, 2 in)
    for (int i = first; i < in; i += stride)
      half_row[i] = Traits::from_float(device::swiglu_value(gate_up_row[i], gate_up_row[in + i]));
    return;
  }
  const float* x_row = x + row * columns;
  if (input_norm == nullptr) {
    for (int i = first; i < in; i += stride) half_row[i] = Traits::from_float(x_row[i]);
    return;
  }
  // Every thread of the block reaches the reduction: the branches above are
  // the same for the whole grid.
  const float sum_of_squares =
      device::block_reduce(device::thread_sum_of_squares(x_row, in), device::SumOp{}, reduce_scratch);
  const float inv_rms = device::inverse_rms(sum_of_squares, in, norm_eps);
  for (int i = first; i < in; i += stride)
    half_row[i] = Traits::from_float(device::normalized(input_norm[i], inv_rms, x_row[i]));
}

struct GemvArguments {
  const std::uint16_t* weight = nullptr;    // [out, padded_in] half bit patterns
  const float* x = nullptr;                 // [rows, in]
  float* y = nullptr;                       // [rows, out]
  float* partial_sums = nullptr;            // [k_splits, rows, out], when k_splits > 1
  unsigned int* split_counters = nullptr;   // [output blocks], when k_splits > 1
  int rows = 0;                             // 1..kRows of the bucket
  int out = 0;
  int in = 0;
  int padded_in = 0;
  int steps_per_split = 0;                  // 64-column steps per slice
  int k_splits = 1;                         // gridDim.y
  // ProductFusion: the RMSNorm folded in (input_norm [in], or null) and the
  // residual add (y += product).
  const float* input_norm = nullptr;
  float norm_eps = 0.0f;
  // x is [rows, 2 * in] gate/up rows: the staged value is silu(gate) * up.
  bool swiglu_input = false;
  bool accumulate = false;
  // Part 1's L2 prefetch of the block's first weights (on by default; off
  // only to measure what it buys, HalfCudaLinear::set_first_weights_prefetch).
  bool prefetch_first_weights = true;
  // The CUDA-core kernel's next batch of weights requested before the
  // arithmetic of the current one, in row buckets up to kMaxPipelinedRows
  // (on by default; off only to measure what it buys,
  // HalfCudaLinear::set_pipelined_weight_loads). The same bits either way.
  bool pipelined_weight_loads = true;
  // ProductFusion::rope (q_out non-null): the QKV product's outputs are
  // rotated and appended, not written to y (CUDA-core kernel only).
  QkvRopeWrite rope{};
};

// What a block keeps in shared memory for a folded RMSNorm.
template <int kRows>
struct FoldedNorm {  // in shared memory
  float inverse_rms[kRows];             // each x row's 1 / rms
  float warp_sums[kRows][kGemvWarps];   // stage 1's per-warp sums of squares
};

// The folded RMSNorm's first half: inverse_rms[r] for the block's x rows r <
// rows, each row's sum of squares taken exactly as the RMSNorm kernel takes it
// (device::thread_sum_of_squares, then device::block_reduce), but for all
// rows at once: the loads of every row are in flight together, and the rows
// share two barriers instead of three each. Stage 1 is the same per-warp
// butterfly; in stage 2 warp r % 8 reduces row r's 8 warp results padded
// with zeros to 32 lanes, as warp 0 does in block_reduce. Every block of the
// launch computes the same values (its x rows are a few KiB from L2).
// Ends with a barrier: inverse_rms is then visible to the whole block.
template <int kRows>
__device__ void rows_inverse_rms(const GemvArguments& args, FoldedNorm<kRows>& norm) {
  const float* __restrict__ x = args.x;
  const int rows = args.rows, in = args.in;
  const int thread = static_cast<int>(threadIdx.x);
  const int lane = thread % kWarpSize;
  const int warp = thread / kWarpSize;
  float partial[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) partial[r] = 0.0f;
  for (int i = thread; i < in; i += kGemvThreads)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r < rows) {
        const float value = x[static_cast<std::size_t>(r) * in + i];
        partial[r] += value * value;
      }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float warp_sum = device::warp_reduce(partial[r], device::SumOp{});
    if (lane == 0) norm.warp_sums[r][warp] = warp_sum;
  }
  __syncthreads();
  for (int r = warp; r < rows; r += kGemvWarps) {
    const float sum = device::warp_reduce(lane < kGemvWarps ? norm.warp_sums[r][lane] : 0.0f, device::SumOp{});
    if (lane == 0) norm.inverse_rms[r] = device::inverse_rms(sum, in, args.norm_eps);
  }
  __syncthreads();
}

// Part 1 of a GEMV block (programmatic_launch.cuh): asks L2 for the first
// weights the block will read, rows [first_output, first_output + outputs)
// (those below `out`) at columns [k_begin, k_begin + columns) (those below
// k_end), one 128-byte line per request, one request per thread for the two
// kernels' first batches (64 rows x 512 bytes, 128 rows x 256 bytes). The
// weights depend on no kernel, so with a programmatic launch these bytes
// travel from HBM while the kernel before is still finishing, and after
// the wait the block's first loads find them in L2 instead of waiting a
// whole HBM round trip behind the norm's sums and the staging of x. A
// prefetch, not a load into registers: the 16-row CUDA-core kernel has no
// registers to spare for a batch held across the staging. The CUDA-core
// kernel's pipelined buckets (1-4 rows) do have them, and also load their
// first batch into registers before the wait; there the prefetch asks for
// the same lines first, and L2 serves both requests with one read.
__device__ __forceinline__ void prefetch_first_weights_to_l2(const GemvArguments& args, int first_output,
                                                             int outputs, int k_begin, int k_end, int columns) {
  constexpr int kHalvesPerLine = 128 / 2;
  const int lines_per_row = columns / kHalvesPerLine;
  const int lines = outputs * lines_per_row;
  for (int line = static_cast<int>(threadIdx.x); line < lines; line += static_cast<int>(blockDim.x)) {
    const int output = first_output + line / lines_per_row;
    const int k = k_begin + (line % lines_per_row) * kHalvesPerLine;
    if (output < args.out && k < k_end) {
      const std::uint16_t* first_weight = args.weight + static_cast<std::size_t>(output) * args.padded_in + k;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(first_weight));
    }
  }
}

// The columns block (output block, split) multiplies: [k_begin, k_end) of
// the padded rows, whole 64-column steps of the slice (k_end a multiple of
// 8: every 16-byte vector is wholly inside or outside), x real below x_end.
struct SliceColumns {
  int k_begin = 0;
  int k_end = 0;
  int x_end = 0;
};
__device__ __forceinline__ SliceColumns slice_columns(const GemvArguments& args, int split) {
  const int first_step = split * args.steps_per_split;
  SliceColumns slice;
  slice.k_begin = first_step * kStepElements;
  slice.k_end = min((first_step + args.steps_per_split) * kStepElements, args.padded_in);
  slice.x_end = min(slice.k_end, args.in);
  return slice;
}

// Where column c (0 .. chunk length) of a staged x row lives in shared
// memory. Within each 64-column step, the 8 columns of lane group member
// `sublane` (c = 8 sublane + j) are stored as two float4: j = 0..3 at
// 4 sublane, j = 4..7 at 32 + 4 sublane. The 8 lanes of a group then read
// 2 x 128 contiguous bytes, and the 4 groups of a warp the same addresses.
__device__ int staged_column(int column) {
  const int step = column / kStepElements, within = column % kStepElements;
  const int sublane = within / kHalvesPerVector, j = within % kHalvesPerVector;
  return step * kStepElements + (j / 4) * (kStepElements / 2) + sublane * 4 + j % 4;
}

// The value the product multiplies x[r][k] by, before it is rounded to the
// weights' type: x itself, x normalized by the folded RMSNorm (the RMSNorm
// kernel's output element, bit for bit), or silu(gate) * up from a [2 * in]
// gate/up row (the SwiGLU kernel's output element, bit for bit). Zero for the
// bucket's rows past args.rows and for columns past `x_end`.
__device__ __forceinline__ float product_input(const GemvArguments& args, int r, int k, int x_end,
                                               const float* inverse_rms /* [rows] shared */) {
  if (r >= args.rows || k >= x_end) return 0.0f;
  if (args.swiglu_input) {
    const float* gate_up_row = args.x + static_cast<std::size_t>(r) * 2 * args.in;
    return device::swiglu_value(gate_up_row[k], gate_up_row[args.in + k]);
  }
  const float value = args.x[static_cast<std::size_t>(r) * args.in + k];
  return args.input_norm != nullptr ? device::normalized(args.input_norm[k], inverse_rms[r], value) : value;
}

// The folded RoPE and K/V append of one pair of outputs of row r of the
// fused QKV product, (o, o + 1) with o even: what rope_and_write_kv_kernel
// (kernels.cu) writes from y[r][o], y[r][o + 1], with the same table entries
// and the same rotation (device::rotated_pair), so the same bits. Q and K
// start at multiples of head_dim, so o and o + 1 are a RoPE pair.
__device__ __forceinline__ void rotate_and_append_pair(const QkvRopeWrite& rope, int r, int o, float y0, float y1) {
  const int q_width = rope.n_heads * rope.head_dim;
  const int kv_dim = rope.n_kv_heads * rope.head_dim;
  const int pos = rope.positions[r];
  float* to;
  float2 pair = make_float2(y0, y1);
  if (o < q_width + kv_dim) {  // a query or key pair: rotated
    const int half = rope.head_dim / 2;
    const std::size_t table_index = static_cast<std::size_t>(pos) * half + (o % rope.head_dim) / 2;
    pair = device::rotated_pair(y0, y1, rope.cos_table[table_index], rope.sin_table[table_index]);
    to = o < q_width ? rope.q_out + static_cast<std::size_t>(r) * q_width + o
                     : rope.views[r].key_row(pos) + (o - q_width);
  } else {  // a value pair: appended as it is
    to = rope.views[r].value_row(pos) + (o - q_width - kv_dim);
  }
  to[0] = pair.x;
  to[1] = pair.y;
}

// One output's sum over the block's slice of columns: y itself when the
// columns are not split (y = sum, or y += sum for the residual add, as
// add_inplace does), else the slice's partial sum (to L2).
__device__ __forceinline__ void store_slice_sum(const GemvArguments& args, int split, int r, int output, float sum) {
  if (args.k_splits == 1) {
    float& y = args.y[static_cast<std::size_t>(r) * args.out + output];
    y = args.accumulate ? y + sum : sum;
  } else {
    __stcg(args.partial_sums + (static_cast<std::size_t>(split) * args.rows + r) * args.out + output, sum);
  }
}

// Split columns (args.k_splits > 1), after every thread of the block stored
// its partial sums: a ticket per output block; the last of the k_splits
// blocks of outputs [first_output, first_output + outputs) to take one adds
// every slice's partials in slice order and writes y (or, with RoPE folded
// in, rotates and appends each pair of outputs). Called by every thread of
// the block (it has barriers).
__device__ void add_slices_if_last(const GemvArguments& args, int output_block, int first_output, int outputs) {
  const int thread = static_cast<int>(threadIdx.x);
  const auto k_splits = static_cast<unsigned int>(args.k_splits);
  if (!device::takes_last_ticket(args.split_counters + output_block, k_splits)) return;
  // Output `output` of row r: the slices' partial sums added in slice order.
  // __ldcg: from L2, where the other blocks' stores went (never a stale L1 line).
  const auto slices_sum = [&args](int r, int output) {
    float sum = 0.0f;
    for (int s = 0; s < args.k_splits; ++s)
      sum += __ldcg(args.partial_sums + (static_cast<std::size_t>(s) * args.rows + r) * args.out + output);
    return sum;
  };
  // A uniform branch. With RoPE folded in, each thread takes a pair of
  // outputs (outputs and first_output are even) and rotates and appends it.
  if (args.rope.q_out != nullptr) {
    const int pairs = outputs / 2;
    for (int index = thread; index < args.rows * pairs; index += static_cast<int>(blockDim.x)) {
      const int r = index / pairs;
      const int output = first_output + 2 * (index % pairs);
      if (output < args.out)
        rotate_and_append_pair(args.rope, r, output, slices_sum(r, output), slices_sum(r, output + 1));
    }
    return;
  }
  for (int index = thread; index < args.rows * outputs; index += static_cast<int>(blockDim.x)) {
    const int r = index / outputs;
    const int output = first_output + index % outputs;
    if (output >= args.out) continue;
    const float sum = slices_sum(r, output);
    float& y = args.y[static_cast<std::size_t>(r) * args.out + output];
    y = args.accumulate ? y + sum : sum;
  }
}

// One batch of a lane's weights: kStepsPerBatch steps of 64 columns for
// each of its kOutputsPerLane output rows, 16 bytes (8 halves) each:
//   vectors [kStepsPerBatch][kOutputsPerLane] uint4, 128 bytes, 32 registers.
struct WeightBatch {
  uint4 vectors[kStepsPerBatch][kOutputsPerLane];
};

// Requests the lane's batch at columns [batch_k, batch_k + kBatchElements):
// its 8 columns batch_k + 64 step + 8 sublane of each step, for each output
// row. A vector at or past k_bound, or of an output past `out`, is zero and
// is not loaded (x is zero there too: adding 0 * 0 changes no sum). The
// loads are only issued here; a register is waited for where it is used.
__device__ __forceinline__ WeightBatch load_weight_batch(const uint4* const (&weight_row)[kOutputsPerLane],
                                                         const bool (&output_valid)[kOutputsPerLane], int batch_k,
                                                         int k_bound, int sublane) {
  WeightBatch batch;
#pragma unroll
  for (int step = 0; step < kStepsPerBatch; ++step)
#pragma unroll
    for (int o = 0; o < kOutputsPerLane; ++o) {
      const int k = batch_k + step * kStepElements + sublane * kHalvesPerVector;
      batch.vectors[step][o] =
          output_valid[o] && k < k_bound ? __ldg(weight_row[o] + k / kHalvesPerVector) : make_uint4(0, 0, 0, 0);
    }
  return batch;
}

// sums[o][r] += the batch's weights of output o times x row r: per step,
// the lane's 8 columns in increasing order with fmaf. batch_x points at the
// batch's first column in the staged chunk (x row r at r * chunk_stride;
// columns swizzled by staged_column).
template <class Traits, int kRows>
__device__ __forceinline__ void multiply_weight_batch(const WeightBatch& batch, const float* batch_x, int chunk_stride,
                                                      int sublane, float (&sums)[kOutputsPerLane][kRows]) {
#pragma unroll
  for (int step = 0; step < kStepsPerBatch; ++step) {
    float weights[kOutputsPerLane][kHalvesPerVector];
#pragma unroll
    for (int o = 0; o < kOutputsPerLane; ++o)
#pragma unroll
      for (int j = 0; j < kHalvesPerVector; ++j) weights[o][j] = vector_element<Traits>(batch.vectors[step][o], j);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float* x_step = batch_x + r * chunk_stride + step * kStepElements + sublane * 4;
      const float4 low = *reinterpret_cast<const float4*>(x_step);
      const float4 high = *reinterpret_cast<const float4*>(x_step + kStepElements / 2);
      const float x_values[kHalvesPerVector] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
#pragma unroll
      for (int o = 0; o < kOutputsPerLane; ++o)
#pragma unroll
        for (int j = 0; j < kHalvesPerVector; ++j) sums[o][r] = fmaf(weights[o][j], x_values[j], sums[o][r]);
    }
  }
}

// Grid (output blocks, k_splits), kGemvThreads threads. Block (b, s)
// computes outputs [64 b, 64 b + 64) over columns [k_begin, k_end) of slice
// s for args.rows <= kRows rows. Lane `sublane` (0..7) of lane group
// `lane_group` (0..3) of warp w owns outputs first_output + 0, 1 and reads
// 16 bytes at column k = batch + 64 step + 8 sublane of each: per output and
// row, a lane sums its columns in increasing order with fmaf, then the group
// adds its 8 lanes (xor shuffles 4, 2, 1) and the slices are added in slice
// order: an order fixed by the shape alone.
template <class Traits, int kRows>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocksPerSm) half_gemv_kernel(const GemvArguments args) {
  constexpr int kChunkElements = kStagedXFloats / kRows;  // columns of x staged at a time
  static_assert(kChunkElements % kBatchElements == 0);
  // x [kRows, kChunkElements] of the current chunk, columns swizzled
  // (staged_column); rows >= args.rows and columns past the slice are zero.
  __shared__ __align__(16) float staged_x[kStagedXFloats];
  __shared__ FoldedNorm<kRows> folded_norm;  // args.input_norm's 1 / rms per row

  const int thread = static_cast<int>(threadIdx.x);
  const int lane = thread % kWarpSize;
  const int warp = thread / kWarpSize;
  const int sublane = lane % kLanesPerWeightRow;
  const int lane_group = lane / kLanesPerWeightRow;
  const int output_block = static_cast<int>(blockIdx.x);
  const int split = static_cast<int>(blockIdx.y);
  const int first_output =
      output_block * kOutputsPerBlock + (warp * kLaneGroupsPerWarp + lane_group) * kOutputsPerLane;

  const auto [k_begin, k_end, x_end] = slice_columns(args, split);

  bool output_valid[kOutputsPerLane];
  const uint4* weight_row[kOutputsPerLane];  // 16-byte vectors of this lane's output rows
#pragma unroll
  for (int o = 0; o < kOutputsPerLane; ++o) {
    const int output = first_output + o;
    output_valid[o] = output < args.out;
    const std::size_t row = output_valid[o] ? static_cast<std::size_t>(output) : 0;
    weight_row[o] = reinterpret_cast<const uint4*>(args.weight + row * static_cast<std::size_t>(args.padded_in));
  }

  // Pipelined loads (uniform, as every branch on args below): `batch` is
  // always the next batch to multiply, already requested. The first one is
  // requested here, before the wait: the weights depend on no kernel, so
  // with a programmatic launch they travel while the kernel before finishes,
  // and in any case during the norm's sums and the staging of x.
  const bool pipelined = kRows <= kMaxPipelinedRows && args.pipelined_weight_loads;
  WeightBatch batch;
  if (pipelined)
    batch = load_weight_batch(weight_row, output_valid, k_begin, min(k_begin + kChunkElements, k_end), sublane);

  // A uniform branch: every thread of every block takes it or none does.
  if (args.prefetch_first_weights)
    prefetch_first_weights_to_l2(args, output_block * kOutputsPerBlock, kOutputsPerBlock, k_begin, k_end,
                                 kBatchElements);
  wait_then_let_next_kernel_launch();  // x, y and the split scratch come from earlier kernels

  // A uniform branch: every thread of every block takes it or none does.
  if (args.input_norm != nullptr) rows_inverse_rms(args, folded_norm);

  float sums[kOutputsPerLane][kRows];
#pragma unroll
  for (int o = 0; o < kOutputsPerLane; ++o)
#pragma unroll
    for (int r = 0; r < kRows; ++r) sums[o][r] = 0.0f;

  for (int chunk_k = k_begin; chunk_k < k_end; chunk_k += kChunkElements) {
    const int chunk_length = min(kChunkElements, k_end - chunk_k);
    const int staged_length = round_up(chunk_length, kBatchElements);  // whole batches, zero past the slice
    __syncthreads();  // every warp is done with the previous chunk
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      for (int column = thread; column < staged_length; column += kGemvThreads) {
        // Rounded to the weights' type, as forward_gemm rounds x for cuBLAS
        // (the header says why).
        const float value = product_input(args, r, chunk_k + column, x_end, folded_norm.inverse_rms);
        staged_x[r * kChunkElements + staged_column(column)] = Traits::round_trip(value);
      }
    __syncthreads();

    // The weights of [chunk_k, chunk_end): every column of every batch in the
    // chunk is below chunk_end or past the slice's end (then 0, as x is).
    const int chunk_end = chunk_k + chunk_length;
    if (pipelined) {
      // Batch b + 1's loads go out before batch b's arithmetic: a lane keeps
      // a batch (128 bytes) in flight while it multiplies, where the serial
      // loop below has none. The same products in the same order, so the
      // same bits. The last iteration's next batch lies past chunk_end: all
      // zeros, and no load is issued for it; a later chunk requests its
      // first batch after its staging.
      if (chunk_k != k_begin) batch = load_weight_batch(weight_row, output_valid, chunk_k, chunk_end, sublane);
      for (int batch_offset = 0; batch_offset < chunk_length; batch_offset += kBatchElements) {
        const WeightBatch next_batch =
            load_weight_batch(weight_row, output_valid, chunk_k + batch_offset + kBatchElements, chunk_end, sublane);
        multiply_weight_batch<Traits, kRows>(batch, staged_x + batch_offset, kChunkElements, sublane, sums);
        batch = next_batch;
      }
    } else {
      // Every load of the batch first (8 x 16 bytes in flight per lane),
      // then the arithmetic; the next batch's loads only after it.
      for (int batch_offset = 0; batch_offset < chunk_length; batch_offset += kBatchElements)
        multiply_weight_batch<Traits, kRows>(
            load_weight_batch(weight_row, output_valid, chunk_k + batch_offset, chunk_end, sublane),
            staged_x + batch_offset, kChunkElements, sublane, sums);
    }
  }

  // The 8 lanes of a group hold partial sums of the same outputs: add them.
#pragma unroll
  for (int o = 0; o < kOutputsPerLane; ++o)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int offset = kLanesPerWeightRow / 2; offset > 0; offset /= 2)
        sums[o][r] += __shfl_xor_sync(0xffffffffu, sums[o][r], offset);

  static_assert(kOutputsPerLane == 2, "a lane's two outputs are one RoPE pair (first_output is even)");
  if (sublane == 0) {
    if (args.rope.q_out != nullptr && args.k_splits == 1) {  // uniform
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (output_valid[0] && r < args.rows)
          rotate_and_append_pair(args.rope, r, first_output, sums[0][r], sums[1][r]);
    } else {
#pragma unroll
      for (int o = 0; o < kOutputsPerLane; ++o)
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          if (output_valid[o] && r < args.rows) store_slice_sum(args, split, r, first_output + o, sums[o][r]);
    }
  }
  if (args.k_splits == 1) return;  // the whole block returns: no barrier follows
  add_slices_if_last(args, output_block, output_block * kOutputsPerBlock, kOutputsPerBlock);
}

// --- The tensor-core GEMV (HalfGemvKernel::TensorCores) -------------------
//
// The same product, with the multiply-adds on the tensor cores: one
// mma.sync (mma_fragments.cuh) multiplies a 16 x 16 tile of weights by 16
// columns of 8 rows of x. The weights are the mma's A (16 outputs by 16
// columns), x its B (16 columns by 8 rows: rows 1..8 are one n-tile, 9..16
// two), the fp32 accumulators D (16 outputs by 8 rows). A row bucket of 1 or
// 8 costs the same one mma: tensor cores have far more multiply-adds than
// HBM has bytes to feed them, so the count of rows no longer sets the
// instruction count, as it does for the CUDA-core kernel (16 fmaf per
// weight at 16 rows).
//
// Loads, with no change to the weights' row-major layout. A warp owns 16
// outputs; per step of 64 columns, lane (g, t) (lane = 4 g + t) loads 16
// bytes of weight rows g and g + 8 at columns 8t .. 8t + 7 and again at
// 32 + 8t .. 32 + 8t + 7: four 16-byte loads, each warp-wide load 8 rows x
// 64 contiguous bytes (whole 32-byte sectors). Those 16 halves of each row
// are not the columns the mma's A fragment names (2t, 2t+1, 2t+8, 2t+9 of
// 16), but a dot product does not care in which order its columns come, as
// long as A and B agree: mma j (0..3) of the step takes, for "its" columns
// 2t, 2t+1 the lane's halves at physical columns c_j + 8t + 0, 1 and for
// 2t+8, 2t+9 those at c_j + 8t + 2, 3, with c_j = 4 (j % 2) + 32 (j / 2).
// Over t that is 16 distinct columns per mma and the 64 of the step over
// the four mmas. B must hold x at the same physical columns, so lane (g, t)
// reads x row g (of the n-tile) at 8t .. 8t + 7 and 32 + 8t .. 32 + 8t + 7:
// two 16-byte loads from shared memory, the same words the A side used.
// The mapping is llm/cuda/tensor_core_gemv_layout.hpp's functions, which a
// CPU test runs through the PTX ISA's fragment definition.
//
//   weights  [out, padded_in] half, row-major, as the CUDA-core kernel
//            reads them;
//   staged_x [kRows, kChunkElements + kTensorCoreRowPad] half bit patterns
//            (x rounded as the CUDA-core kernel rounds it);
//   acc      [n-tiles][4] fp32, the mma's D: acc[nt][0, 1] = output g,
//            rows 8 nt + 2t, 2t + 1; acc[nt][2, 3] = output g + 8, the same
//            rows.
//
// A block is 8 warps, 128 outputs; the columns are split over blocks and
// the slices' sums added as in the CUDA-core kernel (the same ticket code),
// in an order fixed by the shape: a row gives the same bits alone or among
// 16. The two kernels' sums are added in different orders, so their results
// differ by fp32 rounding.
namespace layout = tensor_core_gemv;
static_assert(layout::kStepColumns == kStepElements && layout::kHalvesPerVector == kHalvesPerVector);
constexpr int kTensorCoreOutputsPerWarp = 16;  // the mma's M
constexpr int kTensorCoreOutputsPerBlock = kGemvWarps * kTensorCoreOutputsPerWarp;  // 128
constexpr int kRowsPerTile = 8;                // the mma's N
// Steps (64 columns) whose loads a lane issues together: 2 x 4 x 16 bytes =
// 128 bytes per lane, 32 KB per block, 64 KB per SM at 2 blocks: enough in
// flight to cover HBM latency, in 32 registers.
constexpr int kTensorCoreStepsPerBatch = 2;
constexpr int kTensorCoreBatchElements = kTensorCoreStepsPerBatch * kStepElements;  // 128 columns
constexpr int kTensorCoreStagedXHalves = 16384;  // 32 KB of x per chunk: 2048 columns of 8 rows, 1024 of 16
// x rows are padded by 32 halves (64 bytes), so consecutive rows start 64
// bytes apart modulo 128: a 16-byte shared load is served 8 lanes at a time
// (rows 2p and 2p + 1, 64 bytes each), and those two rows then fall in
// different banks.
constexpr int kTensorCoreRowPad = 32;
static_assert(kTensorCoreStagedXHalves % (2 * kRowsPerTile * kTensorCoreBatchElements) == 0,
              "every row bucket's chunk must hold whole batches");

template <class Traits, int kRowTiles>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocksPerSm)
    half_gemv_tensor_core_kernel(const GemvArguments args) {
  constexpr bool kBf16 = std::is_same_v<Traits, BFloat16Traits>;
  constexpr int kRows = kRowTiles * kRowsPerTile;  // 8 or 16
  constexpr int kChunkElements = kTensorCoreStagedXHalves / kRows;
  constexpr int kRowStride = kChunkElements + kTensorCoreRowPad;  // halves; 64 bytes past a multiple of 128
  static_assert(kChunkElements % kTensorCoreBatchElements == 0);
  static_assert((kRowStride * 2) % 128 == 64);
  __shared__ __align__(16) std::uint16_t staged_x[kRows * kRowStride];
  __shared__ FoldedNorm<kRows> folded_norm;  // args.input_norm's 1 / rms per row

  const int thread = static_cast<int>(threadIdx.x);
  const int lane = thread % kWarpSize;
  const int warp = thread / kWarpSize;
  const int g = lane / 4;  // the fragments' group: outputs g and g + 8, row g of an n-tile
  const int t = lane % 4;  // the fragments' thread in group
  const int output_block = static_cast<int>(blockIdx.x);
  const int split = static_cast<int>(blockIdx.y);
  const int first_output = output_block * kTensorCoreOutputsPerBlock + warp * kTensorCoreOutputsPerWarp;

  const auto [k_begin, k_end, x_end] = slice_columns(args, split);

  // The lane's two weight rows: outputs g and g + 8 of the warp's tile.
  bool output_valid[2];  // [row half]: row g (0) or g + 8 (1)
  const uint4* weight_row[2];
#pragma unroll
  for (int row_half = 0; row_half < 2; ++row_half) {
    const int output = first_output + g + 8 * row_half;
    output_valid[row_half] = output < args.out;
    const std::size_t row = output_valid[row_half] ? static_cast<std::size_t>(output) : 0;
    weight_row[row_half] = reinterpret_cast<const uint4*>(args.weight + row * static_cast<std::size_t>(args.padded_in));
  }

  if (args.prefetch_first_weights)  // uniform, as in half_gemv_kernel
    prefetch_first_weights_to_l2(args, output_block * kTensorCoreOutputsPerBlock, kTensorCoreOutputsPerBlock,
                                 k_begin, k_end, kTensorCoreBatchElements);
  wait_then_let_next_kernel_launch();  // x, y and the split scratch come from earlier kernels

  if (args.input_norm != nullptr) rows_inverse_rms(args, folded_norm);  // uniform, as in the CUDA-core kernel

  float acc[kRowTiles][4];
#pragma unroll
  for (int nt = 0; nt < kRowTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;

  for (int chunk_k = k_begin; chunk_k < k_end; chunk_k += kChunkElements) {
    const int chunk_length = min(kChunkElements, k_end - chunk_k);
    const int staged_length = round_up(chunk_length, kTensorCoreBatchElements);  // zero past the slice
    __syncthreads();  // every warp is done with the previous chunk
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      for (int column = thread; column < staged_length; column += kGemvThreads)
        staged_x[r * kRowStride + column] =
            Traits::from_float(product_input(args, r, chunk_k + column, x_end, folded_norm.inverse_rms));
    __syncthreads();

    for (int batch_offset = 0; batch_offset < chunk_length; batch_offset += kTensorCoreBatchElements) {
      // Every load of the batch first: raw[step][row half][vector] is weight
      // row g (+ 8 for row half 1) at columns vector_first_column(t, vector)
      // of the step. Past the slice or past `out` the vector is zero.
      uint4 raw[kTensorCoreStepsPerBatch][2][2];
#pragma unroll
      for (int step = 0; step < kTensorCoreStepsPerBatch; ++step)
#pragma unroll
        for (int row_half = 0; row_half < 2; ++row_half)
#pragma unroll
          for (int vector = 0; vector < 2; ++vector) {
            const int k = chunk_k + batch_offset + step * kStepElements + layout::vector_first_column(t, vector);
            raw[step][row_half][vector] = output_valid[row_half] && k < k_end
                                              ? __ldg(weight_row[row_half] + k / kHalvesPerVector)
                                              : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
      for (int step = 0; step < kTensorCoreStepsPerBatch; ++step)
#pragma unroll
        for (int nt = 0; nt < kRowTiles; ++nt) {
          // x row g of the n-tile at the same columns as the weights' vectors.
          const std::uint16_t* x_step = staged_x + (nt * kRowsPerTile + g) * kRowStride + batch_offset +
                                        step * kStepElements;
          const uint4 x_vectors[2] = {*reinterpret_cast<const uint4*>(x_step + layout::vector_first_column(t, 0)),
                                      *reinterpret_cast<const uint4*>(x_step + layout::vector_first_column(t, 1))};
#pragma unroll
          for (int j = 0; j < layout::kMmasPerStep; ++j) {
            const int vector = layout::mma_vector(j), low_word = layout::mma_low_word(j);
            const std::uint32_t a[4] = {device::word_of(raw[step][0][vector], low_word),       // row g
                                        device::word_of(raw[step][1][vector], low_word),       // row g + 8
                                        device::word_of(raw[step][0][vector], low_word + 1),   // row g
                                        device::word_of(raw[step][1][vector], low_word + 1)};  // row g + 8
            device::mma_16x8x16<kBf16>(acc[nt], a, device::word_of(x_vectors[vector], low_word),
                                       device::word_of(x_vectors[vector], low_word + 1));
          }
        }
    }
  }

  // D: acc[nt][i] is output g + 8 (i / 2) of the warp's, row 8 nt + 2t + i % 2.
#pragma unroll
  for (int nt = 0; nt < kRowTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = nt * kRowsPerTile + layout::accumulator_row(t, i);
      if (output_valid[i / 2] && r < args.rows)  // i / 2: the row half of accumulator_output
        store_slice_sum(args, split, r, first_output + layout::accumulator_output(g, i), acc[nt][i]);
    }
  if (args.k_splits == 1) return;  // the whole block returns: no barrier follows
  add_slices_if_last(args, output_block, output_block * kTensorCoreOutputsPerBlock, kTensorCoreOutputsPerBlock);
}

template <class Traits>
void launch_tensor_core_gemv(const GemvArguments& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(ceil_div(args.out, kTensorCoreOutputsPerBlock)),
                  static_cast<unsigned int>(args.k_splits));
  if (args.rows <= kRowsPerTile)
    launch_kernel(half_gemv_tensor_core_kernel<Traits, 1>, grid, kGemvThreads, 0, stream, args);
  else
    launch_kernel(half_gemv_tensor_core_kernel<Traits, 2>, grid, kGemvThreads, 0, stream, args);
}
static_assert(kMaxGemvRows == 2 * kRowsPerTile, "launch_tensor_core_gemv's largest bucket is 16 rows");

template <class Traits>
void launch_gemv(const GemvArguments& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(ceil_div(args.out, kOutputsPerBlock)),
                  static_cast<unsigned int>(args.k_splits));
  // The smallest bucket that holds the rows.
  if (args.rows <= 1)
    launch_kernel(half_gemv_kernel<Traits, 1>, grid, kGemvThreads, 0, stream, args);
  else if (args.rows <= 2)
    launch_kernel(half_gemv_kernel<Traits, 2>, grid, kGemvThreads, 0, stream, args);
  else if (args.rows <= 4)
    launch_kernel(half_gemv_kernel<Traits, 4>, grid, kGemvThreads, 0, stream, args);
  else if (args.rows <= 8)
    launch_kernel(half_gemv_kernel<Traits, 8>, grid, kGemvThreads, 0, stream, args);
  else
    launch_kernel(half_gemv_kernel<Traits, 16>, grid, kGemvThreads, 0, stream, args);
}
static_assert(kMaxGemvRows == 16, "launch_gemv's largest bucket is 16 rows");

// Throws InputError unless the tensor-core GEMV of `type` runs here: its
// code for this GPU must have been compiled for sm_75 or later (fp16: the
// mma as two k8 halves) or sm_80 (bf16). What decides is the architecture
// the kernel itself was compiled for (its ptxVersion: a compute_75-only
// build runs JIT-compiled on newer cards with the sm_75 code, whose bf16
// mma traps), not the card's compute capability.
void require_tensor_core_gemv(HalfType type) {
  cudaFuncAttributes attributes{};
  if (type == HalfType::Float16)
    LLM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, half_gemv_tensor_core_kernel<Float16Traits, 1>));
  else
    LLM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, half_gemv_tensor_core_kernel<BFloat16Traits, 1>));
  const int needed = type == HalfType::Float16 ? 75 : 80;
  if (attributes.ptxVersion < needed)
    throw InputError("the tensor-core GEMV (--gemv tensor-cores) needs " + to_string(type) +
                     " mma.sync, in code compiled for sm_" + std::to_string(needed) +
                     " or later; this build's code for this GPU is for sm_" + std::to_string(attributes.ptxVersion) +
                     " (build for this GPU's architecture, or use --gemv cuda-cores)");
}

// "[out, in]". (Appended piece by piece: GCC 12 at -O3 warns falsely
// (-Wrestrict) about "[" + std::to_string(...).)
std::string shape_text(int out, int in) {
  std::string text = "[";
  text += std::to_string(out);
  text += ", ";
  text += std::to_string(in);
  text += "]";
  return text;
}

}  // namespace

std::string to_string(HalfType type) { return type == HalfType::Float16 ? "fp16" : "bf16"; }

HalfCudaLinear::HalfCudaLinear(std::span<const float> weight, int out_features, int in_features, HalfType type,
                               std::shared_ptr<HalfActivationScratch> scratch, cublasHandle_t cublas,
                               HalfGemvKernel gemv_kernel, int gemv_max_rows)
    : out_(out_features),
      in_(in_features),
      padded_in_(0),
      type_(type),
      gemv_kernel_(gemv_kernel),
      gemv_max_rows_(gemv_max_rows),
      scratch_(std::move(scratch)),
      cublas_(cublas) {
  if (gemv_max_rows < 1 || gemv_max_rows > kMaxGemvRows)
    throw InputError("linear layer " + shape_text(out_features, in_features) + ": the GEMV takes products of 1.." +
                     std::to_string(kMaxGemvRows) + " rows, so its row limit must be in 1.." +
                     std::to_string(kMaxGemvRows) + " (got " + std::to_string(gemv_max_rows) + ")");
  if (out_features <= 0 || in_features <= 0 ||
      weight.size() != static_cast<std::size_t>(out_features) * static_cast<std::size_t>(in_features))
    throw InputError("linear layer: " + std::to_string(weight.size()) + " weights do not make a " +
                     shape_text(out_features, in_features) + " matrix");
  if (in_features > (1 << 24))
    throw InputError("linear layer " + shape_text(out_features, in_features) +
                     ": more than 2^24 input features (the GEMV's column indices are ints)");
  if (scratch_ == nullptr) throw std::logic_error("HalfCudaLinear: no scratch (pass a HalfActivationScratch)");
  if (gemv_kernel_ == HalfGemvKernel::TensorCores) require_tensor_core_gemv(type_);
  padded_in_ = round_up(in_, kHalvesPerVector);
  gemv_outputs_per_block_ =
      gemv_kernel_ == HalfGemvKernel::TensorCores ? kTensorCoreOutputsPerBlock : kOutputsPerBlock;

  // Round on the device: the fp32 matrix goes up once (a temporary), the
  // half one stays. The count of non-finite results comes back with a
  // synchronous copy, so the weights are ready when the constructor returns.
  const DeviceBuffer<float> weight_fp32(weight);
  weight_.ensure(static_cast<std::size_t>(out_) * static_cast<std::size_t>(padded_in_));
  DeviceBuffer<unsigned long long> non_finite(1);
  non_finite.zero();
  const int blocks = elementwise_blocks(weight_.size());
  if (type_ == HalfType::Float16)
    round_weights_kernel<Float16Traits><<<blocks, kElementwiseThreads>>>(weight_fp32.data(), out_, in_, padded_in_,
                                                                         weight_.data(), non_finite.data());
  else
    round_weights_kernel<BFloat16Traits><<<blocks, kElementwiseThreads>>>(weight_fp32.data(), out_, in_, padded_in_,
                                                                          weight_.data(), non_finite.data());
  LLM_CUDA_CHECK_LAUNCH();
  unsigned long long non_finite_count = 0;
  non_finite.download(std::span<unsigned long long>(&non_finite_count, 1));
  if (non_finite_count > 0) {
    const std::string why = type_ == HalfType::Float16
                                ? "fp16's largest finite value is 65504: keep this model in bf16 or fp32"
                                : "the fp32 weights were inf or NaN, or beyond bf16's largest value, about 3.39e38";
    throw InputError("linear layer " + shape_text(out_, in_) + ": " + std::to_string(non_finite_count) + " of " +
                     std::to_string(weight.size()) + " weights are not finite after rounding to " + to_string(type_) +
                     " (" + why + ")");
  }

  // The column split: about kWantedBlocksPerSm blocks per SM, slices of
  // whole steps, none empty. Depends on the shape, the kernel and the GPU
  // only, never on the row count.
  const int output_blocks = gemv_output_blocks();
  const int total_steps = ceil_div(padded_in_, kStepElements);
  const int wanted_splits = ceil_div(kWantedBlocksPerSm * sm_count(), output_blocks);
  const int splits = std::clamp(wanted_splits, 1, std::min(total_steps, 65535));  // gridDim.y <= 65535
  gemv_steps_per_split_ = ceil_div(total_steps, splits);
  gemv_k_splits_ = ceil_div(total_steps, gemv_steps_per_split_);
}

int HalfCudaLinear::gemv_output_blocks() const { return ceil_div(out_, gemv_outputs_per_block_); }

void HalfCudaLinear::reserve_rows(int rows) {
  if (rows <= 0) return;
  HalfActivationScratch& scratch = *scratch_;
  const auto gemv_rows = static_cast<std::size_t>(std::min(rows, gemv_max_rows_));
  const std::size_t partial_floats =
      gemv_k_splits_ > 1 ? static_cast<std::size_t>(gemv_k_splits_) * gemv_rows * static_cast<std::size_t>(out_) : 0;
  const std::size_t counters = gemv_k_splits_ > 1 ? static_cast<std::size_t>(gemv_output_blocks()) : 0;
  const std::size_t activation_halves =
      rows > gemv_max_rows_ ? static_cast<std::size_t>(rows) * static_cast<std::size_t>(in_) : 0;
  if (partial_floats <= scratch.partial_sums.size() && counters <= scratch.split_counters.size() &&
      activation_halves <= scratch.activations.size())
    return;
  // Growing frees the old buffers: nothing queued before may still use them.
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  scratch.partial_sums.ensure(partial_floats);
  scratch.activations.ensure(activation_halves);
  if (counters > scratch.split_counters.size()) {
    scratch.split_counters.ensure(counters);
    scratch.split_counters.zero();  // every ticket counter starts at zero
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void HalfCudaLinear::forward(const float* x_dev, int rows, float* y_dev, cudaStream_t stream) const {
  if (rows > 0) forward_on_path(x_dev, rows, y_dev, ProductFusion{}, stream);
}

void HalfCudaLinear::forward_fused(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                                   cudaStream_t stream) const {
  if (!fuses(rows))
    throw std::logic_error("HalfCudaLinear " + shape_text(out_, in_) + ": a fused forward needs 1 row or more, not " +
                           std::to_string(rows));
  if (fusion.input_norm != nullptr && fusion.swiglu_of_gate_up)
    throw std::logic_error("HalfCudaLinear " + shape_text(out_, in_) + ": x is either a norm's input or SwiGLU's, "
                           "not both");
  const QkvRopeWrite& rope = fusion.rope;
  if (rope.q_out != nullptr &&
      (fusion.accumulate || rope.head_dim <= 0 || rope.head_dim % 2 != 0 ||
       out_ != (rope.n_heads + 2 * rope.n_kv_heads) * rope.head_dim))
    throw std::logic_error("HalfCudaLinear " + shape_text(out_, in_) + ": RoPE folds into a QKV product of " +
                           std::to_string(rope.n_heads) + " + 2 x " + std::to_string(rope.n_kv_heads) +
                           " heads of an even head_dim (" + std::to_string(rope.head_dim) + "), without an add");
  forward_on_path(x_dev, rows, y_dev, fusion, stream);
}

// The GEMV folds RoPE and the K/V append into its last writes on CUDA cores.
// The tensor-core GEMV (whose lanes do not hold a pair of outputs) and
// cuBLAS's path write y and run rope_and_write_kv after it: the same bits,
// one launch more.
void HalfCudaLinear::forward_on_path(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                                     cudaStream_t stream) const {
  const bool gemv = rows <= gemv_max_rows_;
  const bool product_folds_rope = gemv && gemv_kernel_ == HalfGemvKernel::CudaCores;
  ProductFusion product = fusion;
  if (!product_folds_rope) product.rope = {};
  gemv ? forward_gemv(x_dev, rows, y_dev, product, stream) : forward_gemm(x_dev, rows, y_dev, product, stream);
  const QkvRopeWrite& rope = fusion.rope;
  if (rope.q_out == nullptr || product_folds_rope) return;
  const int q_width = rope.n_heads * rope.head_dim, kv_dim = rope.n_kv_heads * rope.head_dim;
  const kernels::QkvRows in{y_dev, y_dev + q_width, y_dev + q_width + kv_dim, out_, out_, out_};
  kernels::rope_and_write_kv(in, rope.q_out, nullptr, nullptr, rope.views, rope.positions, rows, rope.n_heads,
                             rope.n_kv_heads, rope.head_dim, rope.cos_table, rope.sin_table, KvElement::Float32,
                             stream);
}

void HalfCudaLinear::forward_gemv(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                                  cudaStream_t stream) const {
  GemvArguments args;
  args.input_norm = fusion.input_norm;
  args.norm_eps = fusion.norm_eps;
  args.swiglu_input = fusion.swiglu_of_gate_up;
  args.accumulate = fusion.accumulate;
  args.rope = fusion.rope;
  args.weight = weight_.data();
  args.x = x_dev;
  args.y = y_dev;
  args.rows = rows;
  args.out = out_;
  args.in = in_;
  args.padded_in = padded_in_;
  args.steps_per_split = gemv_steps_per_split_;
  args.k_splits = gemv_k_splits_;
  args.prefetch_first_weights = prefetch_first_weights_;
  args.pipelined_weight_loads = pipelined_weight_loads_;
  if (gemv_k_splits_ > 1) {
    const std::size_t partial_floats =
        static_cast<std::size_t>(gemv_k_splits_) * static_cast<std::size_t>(rows) * static_cast<std::size_t>(out_);
    const auto counters = static_cast<std::size_t>(gemv_output_blocks());
    if (scratch_->partial_sums.size() < partial_floats || scratch_->split_counters.size() < counters)
      throw std::logic_error("HalfCudaLinear " + shape_text(out_, in_) + ": a forward of " + std::to_string(rows) +
                             " rows needs scratch that reserve_rows(" + std::to_string(rows) +
                             ") grows; call it first, outside any stream capture");
    args.partial_sums = scratch_->partial_sums.data();
    args.split_counters = scratch_->split_counters.data();
  }
  const bool tensor_cores = gemv_kernel_ == HalfGemvKernel::TensorCores;
  if (type_ == HalfType::Float16)
    tensor_cores ? launch_tensor_core_gemv<Float16Traits>(args, stream) : launch_gemv<Float16Traits>(args, stream);
  else
    tensor_cores ? launch_tensor_core_gemv<BFloat16Traits>(args, stream) : launch_gemv<BFloat16Traits>(args, stream);
}

// More rows than the GEMV takes (prefill, batches, verify passes): x is
// rounded to the half type into the shared scratch and cuBLAS multiplies half
// by half with fp32 sums (tensor cores). Both paths round x alike (the GEMV
// as it stages it): each x value gains a relative error of at most 2^-11
// (fp16) or 2^-8 (bf16), so an output can move by up to that fraction of
// sum_i |w_i| |x_i| (in practice about sqrt(in) times less: the errors have
// random signs). fp16 also turns |x| > 65504 into inf and flushes
// |x| < 2^-24 to zero; bf16 keeps fp32's range.
//
// The fusion folds in here too, in two places that cost no launch of their
// own: the RMSNorm or SwiGLU before the product goes into the kernel that
// rounds x (round_product_input_kernel), and the residual add after it into
// cuBLAS's epilogue, y = 1 * (x . W^T) + beta * y with beta = 1. The
// epilogue rounds that sum once, as the add kernel rounds y + product, so
// where cuBLAS runs the same kernel for both betas the bits are those of the
// plain product and the add kernel (a test checks them: cuBLAS chooses its
// kernel, we do not).
void HalfCudaLinear::forward_gemm(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                                  cudaStream_t stream) const {
  const std::size_t count = static_cast<std::size_t>(rows) * static_cast<std::size_t>(in_);
  if (scratch_->activations.size() < count)
    throw std::logic_error("HalfCudaLinear " + shape_text(out_, in_) + ": a forward of " + std::to_string(rows) +
                           " rows needs scratch that reserve_rows(" + std::to_string(rows) +
                           ") grows; call it first, outside any stream capture");
  std::uint16_t* x_half = scratch_->activations.data();  // [rows, in]
  const dim3 one_block_per_row(static_cast<unsigned int>(rows));
  if (type_ == HalfType::Float16)
    launch_kernel(round_product_input_kernel<Float16Traits>, one_block_per_row, device::kNormBlockThreads, 0, stream,
                  x_dev, in_, fusion.input_norm, fusion.norm_eps, fusion.swiglu_of_gate_up, x_half);
  else
    launch_kernel(round_product_input_kernel<BFloat16Traits>, one_block_per_row, device::kNormBlockThreads, 0,
                  stream, x_dev, in_, fusion.input_norm, fusion.norm_eps, fusion.swiglu_of_gate_up, x_half);
  const cudaDataType_t half_type =
      type_ == HalfType::Float16 ? Float16Traits::kCublasType : BFloat16Traits::kCublasType;
  // The row-major / column-major reading of DenseCudaLinear::forward
  // (cuda_linear.cpp): C [out, rows] = op(A) [out, in] . B [in, rows] with A
  // the weights' memory under op T and B = x's memory as is. The weights'
  // rows are padded_in_ apart (lda), x's are in_ apart.
  const float alpha = 1.0f;
  const float beta = fusion.accumulate ? 1.0f : 0.0f;  // 1: y += product (the residual add)
  set_cublas_stream(cublas_, stream);  // cuda_linear.hpp: keeps the model's workspace
  LLM_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N,
                                /*m=*/out_, /*n=*/rows, /*k=*/in_, &alpha,
                                /*A=*/weight_.data(), half_type, /*lda=*/padded_in_,
                                /*B=*/x_half, half_type, /*ldb=*/in_, &beta,
                                /*C=*/y_dev, CUDA_R_32F, /*ldc=*/out_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

CudaLinearFactory half_cuda_linear_factory(HalfType type, HalfGemvKernel gemv_kernel, int gemv_max_rows,
                                           HalfGemvLoads loads) {
  auto scratch = std::make_shared<HalfActivationScratch>();
  return [type, gemv_kernel, gemv_max_rows, loads, scratch](
             const std::vector<float>& weight, int out_features, int in_features, const LinearSite&,
             cublasHandle_t cublas) -> std::unique_ptr<CudaLinear> {
    auto layer = std::make_unique<HalfCudaLinear>(weight, out_features, in_features, type, scratch, cublas,
                                                  gemv_kernel, gemv_max_rows);
    layer->set_first_weights_prefetch(loads.prefetch_first_weights);
    layer->set_pipelined_weight_loads(loads.pipelined);
    return layer;
  };
}

}  // namespace llm::cuda
