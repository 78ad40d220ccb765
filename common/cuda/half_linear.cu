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
// The CUDA-core kernel itself (block shape, x in shared memory, the column
// split, loads in flight) is cuda_core_gemv.cuh: the same kernel reads step
// 06's int4 weights. This file gives it the half weights (HalfWeights).
//
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

#include "cuda_core_gemv.cuh"
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

using namespace gemv;  // cuda_core_gemv.cuh: the CUDA-core kernel and the parts both kernels share
constexpr int kHalvesPerVector = 8;                                   // one 16-byte load
constexpr int kStepElements = kLanesPerWeightRow * kHalvesPerVector;  // 64 columns per step
// Element-wise kernels (conversions): 256 threads, a grid-stride loop over at
// most 65535 blocks (as kernels.cu does).
constexpr int kElementwiseThreads = 256;
constexpr std::size_t kMaxElementwiseBlocks = 65535;

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

// Half weights as the CUDA-core GEMV reads them (cuda_core_gemv.cuh's
// WeightFormat): [out, padded_in] bit patterns of `Traits`' type, rows
// padded_in halves apart; a vector is 8 halves, decoded to fp32 exactly.
template <class Traits>
struct HalfWeights {
  struct Matrix {
    const std::uint16_t* bits = nullptr;  // [out, padded_in]
  };
  using Row = const uint4*;  // the row's 16-byte vectors
  using Vector = uint4;
  static constexpr int kColumnsPerVector = kHalvesPerVector;
  static constexpr int kBitsPerWeight = 16;
  // 4 steps x 2 outputs x 16 bytes: 128 bytes per lane in flight (the
  // kernel's comment says why that much).
  static constexpr int kStepsPerBatch = 4;
  static constexpr int kMaxRows = kMaxGemvRows;
  static constexpr bool kScalePerVector = false;
  __device__ static Row row(const Matrix& matrix, int output, int padded_in) {
    return reinterpret_cast<const uint4*>(matrix.bits + static_cast<std::size_t>(output) * padded_in);
  }
  __device__ static Vector load(const Row& row, int k) { return __ldg(row + k / kHalvesPerVector); }
  __device__ static Vector zero() { return make_uint4(0, 0, 0, 0); }
  __device__ static void decode_word(const Vector& vector, int /*word: a vector is one*/, float (&weights)[8]) {
#pragma unroll
    for (int j = 0; j < kHalvesPerVector; ++j) weights[j] = vector_element<Traits>(vector, j);
  }
  __device__ static const std::uint16_t* address(const Matrix& matrix, int output, int k, int padded_in) {
    return matrix.bits + static_cast<std::size_t>(output) * padded_in + k;
  }
};
static_assert(WeightFormat<HalfWeights<Float16Traits>> && WeightFormat<HalfWeights<BFloat16Traits>>);
static_assert(kStagedXFloats % (kMaxGemvRows * kBatchColumns<HalfWeights<Float16Traits>>) == 0,
              "every row bucket's chunk must hold whole batches");

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
    half_gemv_tensor_core_kernel(const GemvArguments args, const std::uint16_t* weight /* [out, padded_in] */) {
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

  const auto [k_begin, k_end, x_end] = slice_columns<kStepElements>(args, split);

  // The lane's two weight rows: outputs g and g + 8 of the warp's tile.
  bool output_valid[2];  // [row half]: row g (0) or g + 8 (1)
  const uint4* weight_row[2];
#pragma unroll
  for (int row_half = 0; row_half < 2; ++row_half) {
    const int output = first_output + g + 8 * row_half;
    output_valid[row_half] = output < args.out;
    const std::size_t row = output_valid[row_half] ? static_cast<std::size_t>(output) : 0;
    weight_row[row_half] = reinterpret_cast<const uint4*>(weight + row * static_cast<std::size_t>(args.padded_in));
  }

  if (args.prefetch_first_weights) {  // uniform, as in cuda_core_gemv_kernel
    const auto address = [weight, &args](int output, int k) {
      return weight + static_cast<std::size_t>(output) * args.padded_in + k;
    };
    prefetch_first_weights_to_l2(args, address, /*columns_per_line=*/128 / 2, output_block * kTensorCoreOutputsPerBlock,
                                 kTensorCoreOutputsPerBlock, k_begin, k_end, kTensorCoreBatchElements);
  }
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
void launch_tensor_core_gemv(const GemvArguments& args, const std::uint16_t* weight, cudaStream_t stream) {
  // The kernel has no RoPE fold (it would write y, and never q or the cache):
  // forward_on_path clears the request and runs rope_and_write_kv after it.
  if (args.rope.q_out != nullptr)
    throw std::logic_error("the tensor-core GEMV does not fold RoPE and the K/V append: clear GemvArguments::rope "
                           "and run kernels::rope_and_write_kv after it (HalfCudaLinear::forward_on_path)");
  const dim3 grid(static_cast<unsigned int>(ceil_div(args.out, kTensorCoreOutputsPerBlock)),
                  static_cast<unsigned int>(args.k_splits));
  if (args.rows <= kRowsPerTile)
    launch_kernel(half_gemv_tensor_core_kernel<Traits, 1>, grid, kGemvThreads, 0, stream, args, weight);
  else
    launch_kernel(half_gemv_tensor_core_kernel<Traits, 2>, grid, kGemvThreads, 0, stream, args, weight);
}
static_assert(kMaxGemvRows == 2 * kRowsPerTile, "launch_tensor_core_gemv's largest bucket is 16 rows");


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

  set_whole_wave_split(true);
}

void HalfCudaLinear::set_whole_wave_split(bool on) {
  // The column split (cuda_core_gemv.cuh): the same for both kernels' steps
  // of 64 columns.
  whole_wave_split_ = on;
  const ColumnSplit split = choose_column_split(gemv_output_blocks(), ceil_div(padded_in_, kStepElements), on);
  gemv_steps_per_split_ = split.steps_per_split;
  gemv_k_splits_ = split.k_splits;
}

int HalfCudaLinear::gemv_output_blocks() const { return ceil_div(out_, gemv_outputs_per_block_); }

FirstWeightLines HalfCudaLinear::first_weight_lines() const {
  if (gemv_kernel_ != HalfGemvKernel::CudaCores) return {};
  return first_batch_lines<HalfWeights<Float16Traits>>(weight_.data(), out_, padded_in_, gemv_k_splits_,
                                                       gemv_steps_per_split_);
}

void HalfCudaLinear::reserve_rows(int rows) {
  if (rows <= 0) return;
  HalfActivationScratch& scratch = *scratch_;
  const SplitScratchSize split =
      split_scratch_size(gemv_k_splits_, std::min(rows, gemv_max_rows_), out_, gemv_output_blocks());
  const std::size_t activation_halves =
      rows > gemv_max_rows_ ? static_cast<std::size_t>(rows) * static_cast<std::size_t>(in_) : 0;
  scratch.grow(split.partial_floats, split.counters, activation_halves);
}

void HalfActivationScratch::grow(std::size_t partial_floats, std::size_t counters, std::size_t activation_halves) {
  if (partial_floats <= partial_sums.size() && counters <= split_counters.size() &&
      activation_halves <= activations.size())
    return;
  // Growing frees the old buffers: nothing queued before may still use them.
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  partial_sums.ensure(partial_floats);
  activations.ensure(activation_halves);
  if (counters > split_counters.size()) {
    split_counters.ensure(counters);
    split_counters.zero();  // every ticket counter starts at zero
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void HalfCudaLinear::forward(const float* x_dev, int rows, float* y_dev, cudaStream_t stream) const {
  if (rows > 0) forward_on_path(x_dev, rows, y_dev, ProductFusion{}, stream);
}

void HalfCudaLinear::forward_fused(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                                   cudaStream_t stream) const {
  check_fusion(rows, fusion);
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
  GemvArguments args = layer_gemv_arguments(x_dev, rows, y_dev, out_, in_, padded_in_, gemv_steps_per_split_,
                                            gemv_k_splits_, gemv_output_blocks(), fusion, *scratch_,
                                            "HalfCudaLinear", "reserve_rows");
  args.prefetch_first_weights = prefetch_first_weights_;
  args.pipelined_weight_loads = pipelined_weight_loads_;
  const bool tensor_cores = gemv_kernel_ == HalfGemvKernel::TensorCores;
  if (!tensor_cores) args.next_product_lines = next_product_lines_;
  const std::uint16_t* weight = weight_.data();
  if (tensor_cores)
    type_ == HalfType::Float16 ? launch_tensor_core_gemv<Float16Traits>(args, weight, stream)
                               : launch_tensor_core_gemv<BFloat16Traits>(args, weight, stream);
  else if (type_ == HalfType::Float16)
    launch_cuda_core_gemv<HalfWeights<Float16Traits>, Float16Traits>(args, {weight}, stream);
  else
    launch_cuda_core_gemv<HalfWeights<BFloat16Traits>, BFloat16Traits>(args, {weight}, stream);
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
// where cuBLAS computes the same product for both betas the bits are those
// of the plain product and the add kernel (cuBLAS chooses its kernel, we do
// not: the tests ask it first, tests/cublas_beta_probe.hpp).
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
    layer->set_whole_wave_split(loads.whole_wave_split);
    return layer;
  };
}

}  // namespace llm::cuda
