// The int4 weight format of the CUDA-core GEMV (Int4GroupWeights) and the
// decode product that launches it (Int4DecodeGemv); the header says why.
//
// What a lane does per 16-byte vector (32 codes of one group, 8 per 32-bit
// word): for each word, 8 codes to fp32 and 8 fmaf per x row, then one fmaf
// by the group's scale. Decoding is two integer instructions and one add per
// code: a code q (0..15) OR-ed into the mantissa of 2^23 is the float
// 2^23 + q, exactly, and subtracting 2^23 + zero leaves q - zero, exactly
// (both are integers below 2^24). No int-to-float conversion, whose
// throughput is a quarter of the fp32 adds' or less.
//
// At one row that is about four instructions per weight. An H100's 3.35
// TB/s of int4 codes is 6.7e12 weights a second, about 25 per SM and cycle
// (132 SMs at 1.98 GHz): some 100 of the 128 instructions an SM issues per
// cycle, half of them on its 64 integer lanes a cycle. The arithmetic then
// takes most of the issue slots, which the fp16 kernel (4 times the bytes
// per weight) never comes near. Tensor cores (the persistent kernel) or
// fp16x2 arithmetic would take much of it off; a profile on a GPU decides
// whether it is what limits this kernel.
//
// The scale multiplies each vector's sums once: sums += scale * sum(q - zero)
// x, where dequantize() multiplies every weight by it. Both are exact up to
// the order of fp32 roundings, so the product stays within the fp16
// tolerance of dequantize(matrix) . x (x rounded to fp16, as for cuBLAS).
#include "step06_quantization/int4_decode_gemv.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_core_gemv.cuh"
#include "mma_fragments.cuh"  // device::word_of
#include "llm/cuda/cuda_check.hpp"
#include "llm/errors.hpp"

namespace step06 {
namespace {

using namespace llm::cuda::gemv;  // the kernel, its arguments and launch
using llm::cuda::ColumnSplit;
using llm::cuda::ProductFusion;

constexpr int kCodesPerVector = 32;  // 16 bytes of 4-bit codes
constexpr int kCodesPerWord = 8;
// 2^23 as a float's bits: OR a code below 2^23 into its mantissa and the
// float is 2^23 + code.
constexpr unsigned int kTwoTo23Bits = 0x4B000000u;

// x as the product sees it: rounded to fp16 (the "A16"), as the fp16
// model's products and the persistent kernel round it.
struct RoundToFp16 {
  __device__ static float round_trip(float value) { return __half2float(__float2half_rn(value)); }
};

// Int4 weights in groups, as cuda_core_gemv.cuh's WeightFormat: a vector is
// 32 codes of one group of one row; kZeroPoints: asymmetric (a zero point
// per group), else symmetric (zero 8).
template <bool kZeroPoints>
struct Int4GroupWeights {
  struct Matrix {
    const std::uint8_t* codes = nullptr;   // [out, padded_in / 2]
    const float* scales = nullptr;         // [out, groups_per_row]
    const std::uint8_t* zeros = nullptr;   // [out, groups_per_row] (kZeroPoints)
    int groups_per_row = 0;
    int group_columns = 0;                 // a multiple of 32: a vector is inside one group
  };
  struct Row {
    const uint4* codes;          // the row's 16-byte vectors
    const float* scales;         // the row's group scales
    const std::uint8_t* zeros;   // the row's zero points (kZeroPoints)
    int group_columns;
  };
  // What one load brings, as loaded: the 16 bytes, the group's scale and
  // zero point. Nothing is computed from them here: a value used at load
  // time would make the lane wait for the load there, before the arithmetic
  // of the batch before it.
  struct Vector {
    uint4 codes;
    float scale;
    unsigned int zero;  // 0..15 (8 when symmetric)
  };
  static constexpr int kColumnsPerVector = kCodesPerVector;
  static constexpr int kBitsPerWeight = 4;
  // 2 steps x 2 outputs x 16 bytes: 64 bytes per lane per batch, 128 with
  // the next batch in flight. Each vector also holds its scale and zero
  // point (6 registers a vector, not 4): with 4 steps the 2- and 4-row
  // kernels spill (the 1-row one fits in 127 registers).
  static constexpr int kStepsPerBatch = 2;
  static constexpr int kMaxRows = Int4DecodeGemv::kMaxRows;
  static constexpr bool kScalePerVector = true;

  __device__ static Row row(const Matrix& matrix, int output, int padded_in) {
    const auto row_index = static_cast<std::size_t>(output);
    const std::size_t groups = row_index * matrix.groups_per_row;
    return {reinterpret_cast<const uint4*>(matrix.codes + row_index * (static_cast<std::size_t>(padded_in) / 2)),
            matrix.scales + groups, kZeroPoints ? matrix.zeros + groups : nullptr, matrix.group_columns};
  }
  __device__ static Vector load(const Row& row, int k) {
    const int group = k / row.group_columns;
    Vector vector;
    vector.codes = __ldg(row.codes + k / kCodesPerVector);
    vector.scale = __ldg(row.scales + group);
    vector.zero = kZeroPoints ? __ldg(row.zeros + group) : 8u;
    return vector;
  }
  // Codes 0 with zero point 0 and scale 0: every weight reads as 0.
  __device__ static Vector zero() { return {make_uint4(0, 0, 0, 0), 0.0f, 0u}; }
  // weights[n] = q - zero for the code of column 8 word + n (nibble n of the
  // vector's word `word`: little-endian bytes, low nibble first).
  __device__ static void decode_word(const Vector& vector, int word, float (&weights)[8]) {
    const std::uint32_t codes = llm::cuda::device::word_of(vector.codes, word);
    const float two_to_23_plus_zero = __uint_as_float(kTwoTo23Bits | vector.zero);
#pragma unroll
    for (int n = 0; n < kCodesPerWord; ++n)
      weights[n] = __uint_as_float(kTwoTo23Bits | ((codes >> (4 * n)) & 0xFu)) - two_to_23_plus_zero;
  }
  __device__ static float scale(const Vector& vector) { return vector.scale; }
  __device__ static const std::uint8_t* address(const Matrix& matrix, int output, int k, int padded_in) {
    return matrix.codes + static_cast<std::size_t>(output) * (static_cast<std::size_t>(padded_in) / 2) + k / 2;
  }
};
static_assert(WeightFormat<Int4GroupWeights<true>> && WeightFormat<Int4GroupWeights<false>>);
static_assert(kStepColumns<Int4GroupWeights<true>> == 256 && kBatchColumns<Int4GroupWeights<true>> == 512);

template <class T>
std::span<const T> bytes_of(const llm::HugePageVector<T>& values) {
  return {values.data(), values.size()};
}

}  // namespace

bool Int4DecodeGemv::supports(const QuantFormat& format) {
  return !format.int8_activations() &&
         (format.scheme == QuantScheme::Int4Asymmetric || format.scheme == QuantScheme::Int4Symmetric);
}

Int4DecodeGemv::Int4DecodeGemv(const QuantizedMatrix& matrix)
    : out_(matrix.out_features),
      in_(matrix.in_features),
      padded_in_(matrix.padded_in),
      group_columns_(matrix.group_columns),
      groups_per_row_(matrix.groups_per_row),
      zero_points_(matrix.format.has_zero_points()) {
  if (!supports(matrix.format))
    throw llm::InputError("the int4 decode GEMV reads int4 groups with fp16 activations, not " +
                          matrix.format.name());
  // Its callers in this step check first (cuda_quantized_kernels.cu:
  // check_matrix); a matrix built by hand may come straight here.
  check_gpu_quantized_matrix(matrix, "the int4 decode GEMV");
  codes_ = llm::cuda::DeviceBuffer<std::uint8_t>(bytes_of(matrix.packed));
  scales_ = llm::cuda::DeviceBuffer<float>(bytes_of(matrix.scales));
  if (zero_points_) zeros_ = llm::cuda::DeviceBuffer<std::uint8_t>(bytes_of(matrix.zeros));
  if (!matrix.input_scales.empty()) {
    std::vector<float> inverse(matrix.input_scales.size());
    for (std::size_t i = 0; i < inverse.size(); ++i) inverse[i] = 1.0f / matrix.input_scales[i];
    inverse_input_scales_ = llm::cuda::DeviceBuffer<float>(std::span<const float>(inverse.data(), inverse.size()));
  }
  set_whole_wave_split(true);
}

void Int4DecodeGemv::set_whole_wave_split(bool on) {
  const ColumnSplit split = choose_column_split(ceil_div(out_, kOutputsPerBlock),
                                                ceil_div(padded_in_, kStepColumns<Int4GroupWeights<true>>), on);
  steps_per_split_ = split.steps_per_split;
  k_splits_ = split.k_splits;
}

llm::cuda::FirstWeightLines Int4DecodeGemv::first_weight_lines() const {
  // The codes only: a block's first batch of a row is 2 steps of 256 codes
  // (256 bytes); its group scales and zero points (a line or two of a row's
  // parameters) are left to the block's own loads.
  return first_batch_lines<Int4GroupWeights<true>>(codes_.data(), out_, padded_in_, k_splits_, steps_per_split_);
}

std::size_t Int4DecodeGemv::weight_bytes() const {
  return codes_.bytes() + scales_.bytes() + zeros_.bytes() + inverse_input_scales_.bytes();
}

void Int4DecodeGemv::reserve(llm::cuda::HalfActivationScratch& scratch, int rows) const {
  if (rows <= 0) return;
  const SplitScratchSize split =
      split_scratch_size(k_splits_, std::min(rows, kMaxRows), out_, ceil_div(out_, kOutputsPerBlock));
  scratch.grow(split.partial_floats, split.counters, 0);
}

void Int4DecodeGemv::forward(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                             llm::cuda::HalfActivationScratch& scratch, cudaStream_t stream) const {
  if (rows < 1 || rows > kMaxRows)
    throw std::logic_error("the int4 decode GEMV takes 1.." + std::to_string(kMaxRows) + " rows, not " +
                           std::to_string(rows));
  GemvArguments args = layer_gemv_arguments(
      x_dev, rows, y_dev, out_, in_, padded_in_, steps_per_split_, k_splits_, ceil_div(out_, kOutputsPerBlock), fusion,
      scratch, "the int4 decode GEMV", "reserve");
  args.inverse_input_scales = inverse_input_scales_.empty() ? nullptr : inverse_input_scales_.data();
  args.prefetch_first_weights = prefetch_first_weights_;
  args.pipelined_weight_loads = pipelined_weight_loads_;
  args.next_product_lines = next_product_lines_;
  if (zero_points_)
    launch_cuda_core_gemv<Int4GroupWeights<true>, RoundToFp16>(
        args, {codes_.data(), scales_.data(), zeros_.data(), groups_per_row_, group_columns_}, stream);
  else
    launch_cuda_core_gemv<Int4GroupWeights<false>, RoundToFp16>(
        args, {codes_.data(), scales_.data(), nullptr, groups_per_row_, group_columns_}, stream);
}

}  // namespace step06
