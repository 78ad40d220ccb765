#pragma once
// The CUDA-core GEMV: y [rows, out] = x [rows, in] . W^T for 1..16 rows, x
// and y fp32, every sum fp32, W in a weight format of its own. One kernel
// for two formats: HalfCudaLinear's fp16 / bf16 weights (HalfWeights,
// half_linear.cu) and step 06's int4 weights with a scale (and zero point)
// per group of columns (Int4GroupWeights, step06_quantization/
// int4_decode_gemv.cu). What a format gives the kernel (the WeightFormat concept
// below): how one 16-byte load of a row is addressed and what weights it
// holds. Everything else is shared: the block shape, x staged in shared
// memory (rounded to a half type: the "A16"), the column split and the
// ticket that adds the slices, the folded RMSNorm or SwiGLU before the
// product, the residual add and the QKV product's RoPE and K/V append after
// it, the pipelined loads, and the next product's first weights asked of
// L2 once a thread's own are read (weight_prefetch.hpp). Folding and its
// bits: half_linear.cu.
//
//   weights  [out, padded_in] columns in the format's storage, every row
//            padded to whole 16-byte vectors (the padding multiplies zeros);
//   x        [rows, in] fp32, row-major;  y [rows, out] fp32, row-major;
//   partials [k_splits, rows, out] fp32 and counters [output blocks] (ticket
//            counters, zero between launches), only when the columns are split.
//
// Columns per 16-byte vector: 8 halves, or 32 four-bit codes. A "step" is
// what the 8 lanes sharing a row read side by side (8 vectors: 64 half
// columns, 256 int4 columns), a "batch" the steps whose loads a lane issues
// together. In what follows, numbers are for half weights; int4 reads the
// same 128 bytes per step and lane group, four times the columns.
//
// Vector width: 16 bytes per load, the widest load a thread has;
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
// chosen at construction from the shape and the SM count so that the blocks
// fill whole waves of 2 per SM (slices of whole 64-column steps;
// gemv_column_split.hpp). Each slice's block writes its partial
// sums; the last block of an output block to finish (a ticket counter) adds
// the slices' partials in slice order and writes y. No atomicAdd on y, so
// the result is bitwise reproducible, and the order of every output's sum
// depends only on the shape, never on the row count: a row gives the same
// bits alone or among 16 (the test checks it).
//
// Loads in flight: each lane requests kStepsPerBatch x kOutputsPerLane = 8
// vectors (128 bytes, a "batch"; int4: 2 steps, 64 bytes, as each vector
// also brings its group's scale and zero point) before it uses any, with 2 or more blocks
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
//
// Included by the .cu files that instantiate it (CUDA code only).
#include <cuda_runtime.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_linear.hpp"  // ProductFusion, QkvRopeWrite
#include "device_formulas.cuh"
#include "half_linear.hpp"  // HalfActivationScratch: the split scratch every layer shares
#include "programmatic_launch.cuh"
#include "llm/cuda/cuda_runtime_api.hpp"  // kMaxGemvRows, sm_count
#include "llm/cuda/gemv_column_split.hpp"
#include "llm/cuda/weight_prefetch.hpp"
#include "llm/kv_cache.hpp"

namespace llm::cuda::gemv {

using device::kWarpSize;
constexpr int kGemvWarps = 8;
constexpr int kGemvThreads = kGemvWarps * kWarpSize;  // 256
// Blocks per SM the launch bounds ask for (registers <= 65536 / (2 * 256) =
// 128 per thread): two blocks let one stream weights while the other waits at
// a barrier for its next chunk of x.
constexpr int kGemvMinBlocksPerSm = 2;
constexpr int kLanesPerWeightRow = 8;                               // 8 x 16 = 128 bytes of a row per step
constexpr int kLaneGroupsPerWarp = kWarpSize / kLanesPerWeightRow;  // 4
constexpr int kOutputsPerLane = 2;
constexpr int kOutputsPerBlock = kGemvWarps * kLaneGroupsPerWarp * kOutputsPerLane;  // 64
// Row buckets up to this one pipeline their weight loads (the next batch
// requested before the current one is multiplied: 64 registers of half
// weights instead of 32). With half weights the 1-row kernel then takes
// 100-115 registers instead of ~70, the 2- and 4-row ones 118-128, under the
// launch bounds' 128 without a spill on sm_75 and sm_90; the 8- and 16-row
// kernels would spill (their sums take 16 and 32 registers more), and there
// the 8 or 16 fmaf per weight already keep a warp busy between its batches.
constexpr int kMaxPipelinedRows = 4;
constexpr int kStagedXFloats = 4096;                                  // 16 KB of x per chunk
// x is staged in float4 runs of kLanesPerWeightRow * 4 floats: each lane's 4
// columns side by side (staged_column).
constexpr int kStagedRun = kLanesPerWeightRow * 4;  // 32 floats, 128 bytes
static_assert(kGemvThreads % kWarpSize == 0 && kWarpSize % kLanesPerWeightRow == 0);
// A folded RMSNorm sums its squares as the RMSNorm kernel's blocks do, with
// blocks of the same size (device_formulas.cuh): the same bits.
static_assert(kGemvThreads == device::kNormBlockThreads);

using llm::cuda::ceil_div;  // gemv_column_split.hpp
constexpr int round_up(int a, int b) { return ceil_div(a, b) * b; }

// A weight format the kernel reads, one 16-byte vector of a row at a time:
//   Matrix                  the kernel's argument: the format's device
//                           pointers (and any sizes beyond GemvArguments')
//   Row                     a lane's handle on one weight row
//   Vector                  what one load brings: 16 bytes of the row and
//                           any parameters that go with them
//   kColumnsPerVector       8 halves or 32 int4 codes
//   kBitsPerWeight          16 or 4 (the L2 prefetch's line count)
//   kStepsPerBatch          steps whose loads a lane issues together
//   kMaxRows                the largest row bucket the format is built for
//   kScalePerVector         true: decode_word gives weights before a scale
//                           common to the vector, and the kernel multiplies
//                           each vector's sums by scale(vector) once
//   row(matrix, output, padded_in)   the Row of output `output`
//   load(row, k)            the vector at column k (a multiple of
//                           kColumnsPerVector), requested, not waited for
//   zero()                  a vector that adds nothing
//   decode_word(vector, word, w)  w[0..7]: the weights of columns
//                           8 word .. 8 word + 7 of the vector
//   scale(vector)           with kScalePerVector: what the vector's sums
//                           are multiplied by
//   address(matrix, output, k, padded_in)  where column k of a row is
//                           stored (for the L2 prefetch)
template <class Format>
concept WeightFormat = requires {
  typename Format::Matrix;
  typename Format::Row;
  typename Format::Vector;
  requires Format::kColumnsPerVector % 8 == 0;
  requires Format::kBitsPerWeight * Format::kColumnsPerVector == 128;
  requires Format::kStepsPerBatch >= 1;
  requires Format::kMaxRows >= 1 && Format::kMaxRows <= kMaxGemvRows;
  { Format::kScalePerVector } -> std::convertible_to<bool>;
};

// Columns per step and per batch of a format.
template <class Format>
constexpr int kStepColumns = kLanesPerWeightRow * Format::kColumnsPerVector;
template <class Format>
constexpr int kBatchColumns = Format::kStepsPerBatch * kStepColumns<Format>;

// The kernels' arguments besides the weights (GEMV kernels of both kinds:
// the tensor-core one in half_linear.cu takes them too).
struct GemvArguments {
  const float* x = nullptr;                 // [rows, in]
  float* y = nullptr;                       // [rows, out]
  float* partial_sums = nullptr;            // [k_splits, rows, out], when k_splits > 1
  unsigned int* split_counters = nullptr;   // [output blocks], when k_splits > 1
  int rows = 0;                             // 1..kRows of the bucket
  int out = 0;
  int in = 0;
  int padded_in = 0;                        // stored columns of a row: whole vectors
  int steps_per_split = 0;                  // steps per slice (kStepColumns of the format)
  int k_splits = 1;                         // gridDim.y
  // ProductFusion: the RMSNorm folded in (input_norm [in], or null) and the
  // residual add (y += product).
  const float* input_norm = nullptr;
  float norm_eps = 0.0f;
  // x is [rows, 2 * in] gate/up rows: the staged value is silu(gate) * up.
  bool swiglu_input = false;
  // [in] 1 / s, or null: the product reads x / s (AWQ's input scaling, step
  // 06), each staged value multiplied by its column's factor before it is
  // rounded.
  const float* inverse_input_scales = nullptr;
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
  // The first weight lines of the product the model runs next
  // (weight_prefetch.hpp), which the CUDA-core kernel's threads ask L2 for
  // once their own loads are done; none (the default) unless the model
  // wires its products together (CudaModelOptions::prefetch_next_product).
  // The same bits either way.
  FirstWeightLines next_product_lines{};
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

// Asks L2 for the 128-byte line holding `address`; nothing waits for it.
__device__ __forceinline__ void prefetch_line_to_l2(const void* address) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(address));
}

// Part 1 of a GEMV block (programmatic_launch.cuh): asks L2 for the first
// weights the block will read, rows [first_output, first_output + outputs)
// (those below `out`) at columns [k_begin, k_begin + columns) (those below
// k_end), one 128-byte line per request, one request per thread for the
// kernels' first batches (64 rows x 512 bytes of half weights, 128 rows x
// 256 bytes for the tensor-core kernel). The weights depend on no kernel,
// so with a programmatic launch these bytes travel from HBM while the
// kernel before is still finishing, and after the wait the block's first
// loads find them in L2 instead of waiting a whole HBM round trip behind
// the norm's sums and the staging of x. A prefetch, not a load into
// registers: the 16-row CUDA-core kernel has no registers to spare for a
// batch held across the staging. The CUDA-core kernel's pipelined buckets
// (1-4 rows) do have them, and also load their first batch into registers
// before the wait; there the prefetch asks for the same lines first, and L2
// serves both requests with one read. `address(output, k)` is where column k
// of row `output` is stored; `columns_per_line` columns fill 128 bytes.
template <class Address>
__device__ __forceinline__ void prefetch_first_weights_to_l2(const GemvArguments& args, const Address& address,
                                                             int columns_per_line, int first_output, int outputs,
                                                             int k_begin, int k_end, int columns) {
  const int lines_per_row = columns / columns_per_line;
  const int lines = outputs * lines_per_row;
  for (int line = static_cast<int>(threadIdx.x); line < lines; line += static_cast<int>(blockDim.x)) {
    const int output = first_output + line / lines_per_row;
    const int k = k_begin + (line % lines_per_row) * columns_per_line;
    if (output < args.out && k < k_end) prefetch_line_to_l2(address(output, k));
  }
}

// This launch's share of the next product's first weight lines
// (weight_prefetch.hpp says why). Threads are numbered from the grid's end:
// the last thread of the last block takes lines 0, T, 2T, ... of the grid's
// T threads, the one before it lines 1, T + 1, ..., so where a grid runs in
// two waves its last blocks ask, which start last (blocks start roughly in
// index order): the second wave's (up to three lines a thread on
// TinyLlama's products). Each thread calls it once its own loads are done,
// after its last batch is multiplied, so that the lines travel while the
// slower blocks finish, the slices are added and the next kernel launches:
// the time HBM was expected to be idle. Measured, it is slower (chapter 01,
// section 5.14), hence an opt-in. 64-bit counters: line + T never overflows.
__device__ __forceinline__ void prefetch_next_product_lines(const FirstWeightLines& next) {
  const long long lines = next.lines();
  const long long threads = static_cast<long long>(gridDim.x) * gridDim.y * blockDim.x;
  const long long thread = (static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  for (long long line = threads - 1 - thread; line < lines; line += threads)
    if (const unsigned char* address = next.line_address(static_cast<int>(line)); address != nullptr)
      prefetch_line_to_l2(address);
}

// The columns block (output block, split) multiplies: [k_begin, k_end) of
// the padded rows, whole steps of kStepColumns columns (k_end a multiple of
// the vector: every 16-byte vector is wholly inside or outside), x real
// below x_end.
struct SliceColumns {
  int k_begin = 0;
  int k_end = 0;
  int x_end = 0;
};
template <int kStepColumns>
__device__ __forceinline__ SliceColumns slice_columns(const GemvArguments& args, int split) {
  const int first_step = split * args.steps_per_split;
  SliceColumns slice;
  slice.k_begin = first_step * kStepColumns;
  slice.k_end = min((first_step + args.steps_per_split) * kStepColumns, args.padded_in);
  slice.x_end = min(slice.k_end, args.in);
  return slice;
}

// Where column c (0 .. chunk length) of a staged x row lives in shared
// memory. Within each step, the kColumnsPerVector columns of lane group
// member `sublane` (c = kColumnsPerVector sublane + j) are stored as float4
// runs: j = 4i..4i + 3 at kStagedRun i + 4 sublane (half weights: j = 0..3
// at 4 sublane, j = 4..7 at 32 + 4 sublane). The 8 lanes of a group then
// read 128 contiguous bytes per float4, and the 4 groups of a warp the same
// addresses (a broadcast).
template <int kColumnsPerVector>
__device__ __forceinline__ int staged_column(int column) {
  constexpr int kStep = kLanesPerWeightRow * kColumnsPerVector;
  const int step = column / kStep, within = column % kStep;
  const int sublane = within / kColumnsPerVector, j = within % kColumnsPerVector;
  return step * kStep + (j / 4) * kStagedRun + sublane * 4 + j % 4;
}

// The value the product multiplies x[r][k] by, before it is rounded: x
// itself, x normalized by the folded RMSNorm (the RMSNorm kernel's output
// element, bit for bit), or silu(gate) * up from a [2 * in] gate/up row (the
// SwiGLU kernel's output element, bit for bit); then, with AWQ's input
// scales, times 1 / s[k]. Zero for the bucket's rows past args.rows and for
// columns past `x_end`.
__device__ __forceinline__ float product_input(const GemvArguments& args, int r, int k, int x_end,
                                               const float* inverse_rms /* [rows] shared */) {
  if (r >= args.rows || k >= x_end) return 0.0f;
  float input;
  if (args.swiglu_input) {
    const float* gate_up_row = args.x + static_cast<std::size_t>(r) * 2 * args.in;
    input = device::swiglu_value(gate_up_row[k], gate_up_row[args.in + k]);
  } else {
    const float value = args.x[static_cast<std::size_t>(r) * args.in + k];
    input = args.input_norm != nullptr ? device::normalized(args.input_norm[k], inverse_rms[r], value) : value;
  }
  return args.inverse_input_scales != nullptr ? input * args.inverse_input_scales[k] : input;
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
inline __device__ void add_slices_if_last(const GemvArguments& args, int output_block, int first_output, int outputs) {
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

// One batch of a lane's weights: Format::kStepsPerBatch steps, for each of
// its kOutputsPerLane output rows one vector (16 bytes and its parameters):
//   vectors [kStepsPerBatch][kOutputsPerLane]; half weights: 4 x 2 uint4,
//   128 bytes, 32 registers.
template <WeightFormat Format>
struct WeightBatch {
  typename Format::Vector vectors[Format::kStepsPerBatch][kOutputsPerLane];
};

// Requests the lane's batch at columns [batch_k, batch_k + kBatchColumns):
// its vector at batch_k + kStepColumns step + kColumnsPerVector sublane of
// each step, for each output row. A vector at or past k_bound, or of an
// output past `out`, is zero and is not loaded (x is zero there too: adding
// 0 * 0 changes no sum). The loads are only issued here; a register is
// waited for where it is used.
template <WeightFormat Format>
__device__ __forceinline__ WeightBatch<Format> load_weight_batch(
    const typename Format::Row (&weight_row)[kOutputsPerLane], const bool (&output_valid)[kOutputsPerLane],
    int batch_k, int k_bound, int sublane) {
  WeightBatch<Format> batch;
#pragma unroll
  for (int step = 0; step < Format::kStepsPerBatch; ++step)
#pragma unroll
    for (int o = 0; o < kOutputsPerLane; ++o) {
      const int k = batch_k + step * kStepColumns<Format> + sublane * Format::kColumnsPerVector;
      batch.vectors[step][o] = output_valid[o] && k < k_bound ? Format::load(weight_row[o], k) : Format::zero();
    }
  return batch;
}

// sums[o][r] += the 8 weights of `word` of each output's vector times x row
// r, in increasing column order with fmaf. x_word points at the word's
// first staged float of x row 0 (row r at r * chunk_stride; the word's 8
// columns are two float4, kStagedRun apart).
template <WeightFormat Format, int kRows>
__device__ __forceinline__ void multiply_word(const typename Format::Vector (&vectors)[kOutputsPerLane], int word,
                                              const float* x_word, int chunk_stride,
                                              float (&sums)[kOutputsPerLane][kRows]) {
  float weights[kOutputsPerLane][8];
#pragma unroll
  for (int o = 0; o < kOutputsPerLane; ++o) Format::decode_word(vectors[o], word, weights[o]);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float4 low = *reinterpret_cast<const float4*>(x_word + r * chunk_stride);
    const float4 high = *reinterpret_cast<const float4*>(x_word + r * chunk_stride + kStagedRun);
    const float x_values[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
#pragma unroll
    for (int o = 0; o < kOutputsPerLane; ++o)
#pragma unroll
      for (int j = 0; j < 8; ++j) sums[o][r] = fmaf(weights[o][j], x_values[j], sums[o][r]);
  }
}

// sums[o][r] += the batch's weights of output o times x row r. Per step and
// vector, the lane's columns in increasing order with fmaf, 8 (one 32-bit
// word of the vector's storage) at a time. With a scale per vector
// (int4's group scale), each vector's sums start at zero and are added
// scaled: sums += scale * (sum of code values times x), one multiply per
// vector instead of one per weight. batch_x points at the batch's first
// column in the staged chunk (columns swizzled by staged_column).
template <WeightFormat Format, int kRows>
__device__ __forceinline__ void multiply_weight_batch(const WeightBatch<Format>& batch, const float* batch_x,
                                                      int chunk_stride, int sublane,
                                                      float (&sums)[kOutputsPerLane][kRows]) {
  constexpr int kWords = Format::kColumnsPerVector / 8;
#pragma unroll
  for (int step = 0; step < Format::kStepsPerBatch; ++step) {
    const float* x_step = batch_x + step * kStepColumns<Format> + sublane * 4;
    if constexpr (Format::kScalePerVector) {
      float vector_sums[kOutputsPerLane][kRows];
#pragma unroll
      for (int o = 0; o < kOutputsPerLane; ++o)
#pragma unroll
        for (int r = 0; r < kRows; ++r) vector_sums[o][r] = 0.0f;
#pragma unroll
      for (int word = 0; word < kWords; ++word)
        multiply_word<Format, kRows>(batch.vectors[step], word, x_step + word * 2 * kStagedRun, chunk_stride,
                                     vector_sums);
#pragma unroll
      for (int o = 0; o < kOutputsPerLane; ++o)
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          sums[o][r] = fmaf(Format::scale(batch.vectors[step][o]), vector_sums[o][r], sums[o][r]);
    } else {
#pragma unroll
      for (int word = 0; word < kWords; ++word)
        multiply_word<Format, kRows>(batch.vectors[step], word, x_step + word * 2 * kStagedRun, chunk_stride, sums);
    }
  }
}

// Grid (output blocks, k_splits), kGemvThreads threads. Block (b, s)
// computes outputs [64 b, 64 b + 64) over columns [k_begin, k_end) of slice
// s for args.rows <= kRows rows. Lane `sublane` (0..7) of lane group
// `lane_group` (0..3) of warp w owns outputs first_output + 0, 1 and reads
// one vector at column k = batch + kStepColumns step + kColumnsPerVector
// sublane of each: per output and row, a lane sums its columns in
// increasing order with fmaf, then the group adds its 8 lanes (xor shuffles
// 4, 2, 1) and the slices are added in slice order: an order fixed by the
// shape alone. x is staged rounded by `RoundX` (its round_trip: the value
// the weights are multiplied by, as cuBLAS's half inputs would hold it).
template <WeightFormat Format, class RoundX, int kRows>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocksPerSm)
    cuda_core_gemv_kernel(const GemvArguments args, const typename Format::Matrix weights) {
  constexpr int kStep = kStepColumns<Format>;
  constexpr int kBatch = kBatchColumns<Format>;
  constexpr int kChunkElements = kStagedXFloats / kRows;  // columns of x staged at a time
  static_assert(kRows <= Format::kMaxRows && kChunkElements % kBatch == 0,
                "a row bucket's chunk of x must hold whole batches");
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

  const auto [k_begin, k_end, x_end] = slice_columns<kStep>(args, split);

  bool output_valid[kOutputsPerLane];
  typename Format::Row weight_row[kOutputsPerLane];  // this lane's output rows
#pragma unroll
  for (int o = 0; o < kOutputsPerLane; ++o) {
    const int output = first_output + o;
    output_valid[o] = output < args.out;
    weight_row[o] = Format::row(weights, output_valid[o] ? output : 0, args.padded_in);
  }

  // Pipelined loads (uniform, as every branch on args below): `batch` is
  // always the next batch to multiply, already requested. The first one is
  // requested here, before the wait: the weights depend on no kernel, so
  // with a programmatic launch they travel while the kernel before finishes,
  // and in any case during the norm's sums and the staging of x.
  const bool pipelined = kRows <= kMaxPipelinedRows && args.pipelined_weight_loads;
  WeightBatch<Format> batch;
  if (pipelined)
    batch = load_weight_batch<Format>(weight_row, output_valid, k_begin, min(k_begin + kChunkElements, k_end),
                                      sublane);

  // A uniform branch: every thread of every block takes it or none does.
  if (args.prefetch_first_weights) {
    const auto address = [&weights, &args](int output, int k) {
      return Format::address(weights, output, k, args.padded_in);
    };
    prefetch_first_weights_to_l2(args, address, 1024 / Format::kBitsPerWeight, output_block * kOutputsPerBlock,
                                 kOutputsPerBlock, k_begin, k_end, kBatch);
  }
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
    const int staged_length = round_up(chunk_length, kBatch);  // whole batches, zero past the slice
    __syncthreads();  // every warp is done with the previous chunk
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      for (int column = thread; column < staged_length; column += kGemvThreads) {
        // Rounded to a half type, as forward_gemm rounds x for cuBLAS
        // (half_linear.cu says why).
        const float value = product_input(args, r, chunk_k + column, x_end, folded_norm.inverse_rms);
        staged_x[r * kChunkElements + staged_column<Format::kColumnsPerVector>(column)] = RoundX::round_trip(value);
      }
    __syncthreads();

    // The weights of [chunk_k, chunk_end): every column of every batch in the
    // chunk is below chunk_end or past the slice's end (then 0, as x is).
    const int chunk_end = chunk_k + chunk_length;
    if (pipelined) {
      // Batch b + 1's loads go out before batch b's arithmetic: a lane keeps
      // a batch in flight while it multiplies, where the serial loop below
      // has none. The same products in the same order, so the same bits.
      // The last iteration's next batch lies past chunk_end: all zeros, and
      // no load is issued for it; a later chunk requests its first batch
      // after its staging.
      if (chunk_k != k_begin) batch = load_weight_batch<Format>(weight_row, output_valid, chunk_k, chunk_end, sublane);
      for (int batch_offset = 0; batch_offset < chunk_length; batch_offset += kBatch) {
        const WeightBatch<Format> next_batch =
            load_weight_batch<Format>(weight_row, output_valid, chunk_k + batch_offset + kBatch, chunk_end, sublane);
        multiply_weight_batch<Format, kRows>(batch, staged_x + batch_offset, kChunkElements, sublane, sums);
        batch = next_batch;
      }
    } else {
      // Every load of the batch first (8 vectors in flight per lane), then
      // the arithmetic; the next batch's loads only after it.
      for (int batch_offset = 0; batch_offset < chunk_length; batch_offset += kBatch)
        multiply_weight_batch<Format, kRows>(
            load_weight_batch<Format>(weight_row, output_valid, chunk_k + batch_offset, chunk_end, sublane),
            staged_x + batch_offset, kChunkElements, sublane, sums);
    }
  }

  // Its own weights all read, the thread asks L2 for its share of the next
  // product's first weights (none unless the model wires it; uniform).
  if (args.next_product_lines.base != nullptr) prefetch_next_product_lines(args.next_product_lines);

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

// Launches the kernel on the smallest row bucket (1, 2, 4, 8, 16, up to
// Format::kMaxRows) that holds args.rows, grid (output blocks, k_splits).
template <WeightFormat Format, class RoundX>
void launch_cuda_core_gemv(const GemvArguments& args, const typename Format::Matrix& weights, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>(ceil_div(args.out, kOutputsPerBlock)),
                  static_cast<unsigned int>(args.k_splits));
  const auto launch = [&](auto kernel) { launch_kernel(kernel, grid, kGemvThreads, 0, stream, args, weights); };
  if (args.rows <= 1)
    launch(cuda_core_gemv_kernel<Format, RoundX, 1>);
  else if (args.rows <= 2 || Format::kMaxRows < 4)
    launch(cuda_core_gemv_kernel<Format, RoundX, std::min(2, Format::kMaxRows)>);
  else if (args.rows <= 4 || Format::kMaxRows < 8)
    launch(cuda_core_gemv_kernel<Format, RoundX, std::min(4, Format::kMaxRows)>);
  else if (args.rows <= 8 || Format::kMaxRows < 16)
    launch(cuda_core_gemv_kernel<Format, RoundX, std::min(8, Format::kMaxRows)>);
  else
    launch(cuda_core_gemv_kernel<Format, RoundX, std::min(16, Format::kMaxRows)>);
}

// The column split of a layer (gemv_column_split.hpp): its blocks fitted to
// whole waves of kGemvMinBlocksPerSm blocks per SM, or (whole_waves false:
// the before row, --no-gemv-wave-fit) about that many blocks rounded up.
// Depends on the shape, the kernel and the GPU only, never on the row count
// (so a row's sums are added in the same order alone or among others).
inline ColumnSplit choose_column_split(int output_blocks, int total_steps, bool whole_waves) {
  const int wave_blocks = kGemvMinBlocksPerSm * sm_count();
  return whole_waves ? column_split_for_whole_waves(output_blocks, total_steps, wave_blocks)
                     : column_split_filling_a_wave(output_blocks, total_steps, wave_blocks);
}

// The lines a launch of this kernel reads first (weight_prefetch.hpp), what
// the product before it may ask L2 for: of each of the `out` weight rows
// (padded_in columns of the format's storage, rows back to back), the first
// batch of each of the k_splits slices of steps_per_split steps. A step is
// 128 bytes of a row in every format (8 lanes x 16 bytes).
template <WeightFormat Format>
FirstWeightLines first_batch_lines(const void* weights, int out, int padded_in, int k_splits, int steps_per_split) {
  constexpr std::size_t kStepBytes = static_cast<std::size_t>(kStepColumns<Format>) * Format::kBitsPerWeight / 8;
  constexpr std::size_t kBatchBytes = static_cast<std::size_t>(kBatchColumns<Format>) * Format::kBitsPerWeight / 8;
  const std::size_t row_bytes = static_cast<std::size_t>(padded_in) * Format::kBitsPerWeight / 8;
  return first_weight_lines(weights, out, row_bytes, row_bytes, k_splits,
                            static_cast<std::size_t>(steps_per_split) * kStepBytes, kBatchBytes);
}

// The split scratch (HalfActivationScratch) a launch of `rows` rows needs:
// the slices' partial sums [k_splits, rows, out] and one ticket counter per
// output block; nothing when the columns are not split.
struct SplitScratchSize {
  std::size_t partial_floats = 0;
  std::size_t counters = 0;
};
inline SplitScratchSize split_scratch_size(int k_splits, int rows, int out, int output_blocks) {
  if (k_splits <= 1) return {};
  return {static_cast<std::size_t>(k_splits) * static_cast<std::size_t>(rows) * static_cast<std::size_t>(out),
          static_cast<std::size_t>(output_blocks)};
}

// The arguments of one launch of a layer, the ones every layer sets alike:
// x, y and the rows; the shape and the column split; what `fusion` folds in;
// the shared split scratch, which must hold the launch (std::logic_error
// naming the layer, "`layer` [out, in]", and the call that grows it,
// `grow_call`, otherwise: a forward never allocates, it may be captured into
// a CUDA graph). The caller adds its load switches (and input scales).
inline GemvArguments layer_gemv_arguments(const float* x, int rows, float* y, int out, int in, int padded_in,
                                          int steps_per_split, int k_splits, int output_blocks,
                                          const ProductFusion& fusion, HalfActivationScratch& scratch,
                                          const char* layer, const char* grow_call) {
  GemvArguments args;
  args.x = x;
  args.y = y;
  args.rows = rows;
  args.out = out;
  args.in = in;
  args.padded_in = padded_in;
  args.steps_per_split = steps_per_split;
  args.k_splits = k_splits;
  args.input_norm = fusion.input_norm;
  args.norm_eps = fusion.norm_eps;
  args.swiglu_input = fusion.swiglu_of_gate_up;
  args.accumulate = fusion.accumulate;
  args.rope = fusion.rope;
  if (k_splits > 1) {
    const SplitScratchSize needed = split_scratch_size(k_splits, rows, out, output_blocks);
    if (scratch.partial_sums.size() < needed.partial_floats || scratch.split_counters.size() < needed.counters)
      throw std::logic_error(std::string(layer) + " [" + std::to_string(out) + ", " + std::to_string(in) +
                             "]: a forward of " + std::to_string(rows) + " rows needs scratch that " + grow_call +
                             "(" + std::to_string(rows) + ") grows; call it first, outside any stream capture");
    args.partial_sums = scratch.partial_sums.data();
    args.split_counters = scratch.split_counters.data();
  }
  return args;
}

}  // namespace llm::cuda::gemv
