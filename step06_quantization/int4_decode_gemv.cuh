#pragma once
// W4A16 for decode: the CUDA-core GEMV of common/cuda/cuda_core_gemv.cuh
// reading int4 weights, for products of 1..4 rows. Why a second kernel
// beside the persistent tensor-core one (cuda_quantized_kernels.cu): at one
// row a product is a few microseconds of bytes, and the persistent kernel's
// fixed costs (its ring to fill, x and the group scales staged per segment,
// the flags between blocks that share a row block) were of that size too
// (docs/06_quantization.md, sections 6.5 and 9.4). This one is the fp16
// model's decode kernel with another weight format, so it also folds what
// that one folds (the RMSNorm or SwiGLU before the product, the residual
// add, the QKV product's RoPE and K/V append) and starts its weight loads
// before the kernel before it ends: the W4A16 model's decode then runs the
// same launches as the fp16 model's, and their difference is the weights'
// bytes.
//
// The weights as QuantizedMatrix stores them, uploaded unchanged:
//   codes   [out, padded_in / 2] bytes, row-major; byte j of a row holds
//           column 2j in its low nibble, 2j + 1 in its high one; padded_in
//           is whole groups (multiples of 32 columns), so every row is whole
//           16-byte vectors of 32 codes, each inside one group;
//   scales  [out, groups_per_row] fp32;
//   zeros   [out, groups_per_row] bytes (int4 asymmetric; symmetric: 8);
//   inverse_input_scales [in] fp32 1 / s (AWQ), or none.
// A weight is (code - zero) * scale, exactly dequantize()'s value. Device
// code only in the .cu file; this header is for CUDA translation units.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda_linear.hpp"  // ProductFusion
#include "half_linear.hpp"  // HalfActivationScratch: the column split's partial sums and tickets
#include "llm/cuda/device_buffer.hpp"
#include "step06_quantization/quant_format.hpp"

namespace step06 {

class Int4DecodeGemv {
 public:
  // Row buckets 1, 2 and 4: what decode needs (1 row; a few for a verify
  // pass of speculative decoding or a batch of a few sequences), all of them
  // pipelined (cuda_core_gemv.cuh: kMaxPipelinedRows is 4). The chunk of x is
  // not the limit: its 16 KB (kStagedXFloats) hold 4096 / rows columns, two
  // 512-column batches at 4 rows, one at 8; only 16 rows (half a batch)
  // would fail the kernel's static_assert on whole batches. An 8-row bucket
  // would run unpipelined, its 16 registers of sums beside vectors of 6
  // registers each (Int4GroupWeights, int4_decode_gemv.cu, where 4 steps a
  // batch already make the 2- and 4-row kernels spill); it is not built:
  // products of more rows go to the tensor-core kernels.
  static constexpr int kMaxRows = 4;
  // Int4 asymmetric or symmetric groups (not int8, not NF4).
  static bool supports(const QuantFormat& format);

  // Uploads `matrix`. Throws llm::InputError for a format supports()
  // refuses, or a matrix check_gpu_quantized_matrix refuses (its loads
  // would leave the buffers).
  explicit Int4DecodeGemv(const QuantizedMatrix& matrix);

  // Grows `scratch` for products of up to `rows` rows (capped at kMaxRows):
  // the column split's partial sums and ticket counters. Outside any forward
  // and stream capture (it may allocate and synchronize).
  void reserve(llm::cuda::HalfActivationScratch& scratch, int rows) const;
  // y [rows, out] = x [rows, in] . W^T, 1..kMaxRows rows, with `fusion`
  // folded in (cuda_linear.hpp: ProductFusion). Never allocates (it may be
  // captured into a CUDA graph): throws std::logic_error when `scratch` was
  // not grown by reserve() for `rows`.
  void forward(const float* x_dev, int rows, float* y_dev, const llm::cuda::ProductFusion& fusion,
               llm::cuda::HalfActivationScratch& scratch, cudaStream_t stream) const;

  int out_features() const { return out_; }
  int in_features() const { return in_; }
  // Codes, scales, zero points and input scales: what one product reads,
  // QuantizedMatrix::bytes().
  std::size_t weight_bytes() const;
  int k_splits() const { return k_splits_; }

  // The before rows of the kernel's two load choices (HalfCudaLinear has
  // the same switches, half_linear.hpp): the L2 prefetch of the first
  // weights before the wait, and the next batch requested before the
  // current one is multiplied. The same bits either way.
  void set_first_weights_prefetch(bool on) { prefetch_first_weights_ = on; }
  void set_pipelined_weight_loads(bool on) { pipelined_weight_loads_ = on; }
  // The column split fitted to whole waves (the default) or about a wave's
  // worth of blocks rounded up (the before row): HalfCudaLinear's switch of
  // the same name. Before reserve(): the split sizes the scratch.
  void set_whole_wave_split(bool on);
  // The first batch of every slice of every row's codes, as the blocks read
  // them (llm/cuda/weight_prefetch.hpp), and the next product's, which this
  // kernel's threads ask L2 for once their own weights are read:
  // HalfCudaLinear's pair of the same names (the lines follow the current
  // split, as there). The same bits either way.
  llm::cuda::FirstWeightLines first_weight_lines() const;
  void set_next_product_lines(const llm::cuda::FirstWeightLines& lines) { next_product_lines_ = lines; }

 private:
  llm::cuda::DeviceBuffer<std::uint8_t> codes_;  // [out, padded_in / 2]
  llm::cuda::DeviceBuffer<float> scales_;        // [out, groups_per_row]
  llm::cuda::DeviceBuffer<std::uint8_t> zeros_;  // [out, groups_per_row], empty when symmetric
  llm::cuda::DeviceBuffer<float> inverse_input_scales_;  // [in] 1 / s, empty without AWQ
  int out_ = 0;
  int in_ = 0;
  int padded_in_ = 0;
  int group_columns_ = 0;
  int groups_per_row_ = 0;
  bool zero_points_ = false;
  int steps_per_split_ = 1;  // 256-column steps per slice of the columns
  int k_splits_ = 1;         // slices (gridDim.y)
  bool prefetch_first_weights_ = true;
  bool pipelined_weight_loads_ = true;
  llm::cuda::FirstWeightLines next_product_lines_{};  // none: no prefetch
};

}  // namespace step06
