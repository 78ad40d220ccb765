#pragma once
// Half-precision weights for the CUDA model: a CudaLinear whose weights are
// rounded once to fp16 or bf16 and kept that way on the device, so a decode
// token reads half the bytes of the fp32 baseline. Activations stay fp32 in
// memory (x in, y out) and every sum is accumulated in fp32; each product
// multiplies the half weights by x rounded to the same half type. Up to
// gemv_max_rows rows (kMaxGemvRows unless the layer is built with fewer; the
// model builds its layers with 1, kDefaultMaxGemvRows) go through a GEMV
// written for this (one pass over the weights whatever the row count; its
// multiply-adds on the CUDA cores or on the tensor cores, HalfGemvKernel);
// more rows (batches, verify passes, prefill) go through cuBLAS. Both paths
// fold the model's RMSNorm or SwiGLU before a product, the residual add
// after it, and the QKV product's RoPE and K/V append (forward_fused), at
// every row count.
// Both paths round x alike, so a row's output does not depend (beyond the
// order of fp32 sums) on which path its forward took. Why these choices, and
// the kernel's shape: half_linear.cu.
//
// Host-only: includable from .cpp files of a CUDA build (the half types
// themselves, cuda_fp16.h and cuda_bf16.h, appear only in half_linear.cu).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "cuda_linear.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"  // HalfGemvKernel, kMaxGemvRows
#include "llm/cuda/device_buffer.hpp"

namespace llm::cuda {

enum class HalfType { Float16, BFloat16 };
std::string to_string(HalfType type);  // "fp16", "bf16"

// Device scratch that every layer of one factory shares: the layers run one
// after another on one stream, so one buffer of each kind serves them all.
// Grown (never shrunk) by HalfCudaLinear::reserve_rows, outside any forward;
// forward only checks that it is big enough.
struct HalfActivationScratch {
  // Prefill path: x [rows, in_features] rounded to the half type (bit
  // patterns), the B operand of cublasGemmEx.
  DeviceBuffer<std::uint16_t> activations;
  // GEMV path, layers that split the input columns over several blocks:
  // each slice's partial sums [k_splits, rows, out_features] fp32 ...
  DeviceBuffer<float> partial_sums;
  // ... and one ticket counter per block of outputs [output_blocks], zero
  // between launches (the last block of each output block wraps it to 0).
  DeviceBuffer<unsigned int> split_counters;

  // Grows each buffer to hold at least the given count (never shrinks).
  // Outside any forward and any stream capture: before it frees a buffer it
  // waits for the device (work queued before may still use it), and it
  // zeroes new counters synchronously.
  void grow(std::size_t partial_floats, std::size_t counters, std::size_t activation_halves);
};

// y [rows, out] = x [rows, in] . W^T with W [out, in] rounded once to `type`
// (round to nearest, ties to even) and kept on the device; x and y are fp32,
// the sums fp32.
class HalfCudaLinear final : public CudaLinear {
 public:
  // Rounds `weight` [out_features, in_features] to `type` (on the device) and
  // keeps it. Throws InputError when the sizes do not match or a weight is not
  // finite after rounding (fp16 ends at 65504: larger weights become inf; bf16
  // has fp32's exponent range). `scratch` is shared with the factory's other
  // layers; `cublas` is borrowed (the model outlives its layers' calls).
  // `gemv_kernel` runs the products of 1..gemv_max_rows rows; TensorCores
  // throws InputError where the build's code for this GPU has no mma.sync of
  // the type (fp16 needs code for sm_75 or later, bf16 sm_80). More rows than
  // `gemv_max_rows` go through cuBLAS (CudaRunOptions::max_gemv_rows);
  // outside 1..kMaxGemvRows it throws InputError.
  HalfCudaLinear(std::span<const float> weight, int out_features, int in_features, HalfType type,
                 std::shared_ptr<HalfActivationScratch> scratch, cublasHandle_t cublas,
                 HalfGemvKernel gemv_kernel = HalfGemvKernel::CudaCores, int gemv_max_rows = kMaxGemvRows);

  // rows <= 0: nothing. rows <= gemv_max_rows(): the GEMV. More: x rounded
  // to the half type into the scratch (one kernel), then cublasGemmEx. Never
  // allocates (it may be captured into a CUDA graph): throws
  // std::logic_error when the scratch it needs was not grown by
  // reserve_rows(rows) (of this layer or another layer sharing the scratch).
  void forward(const float* x_dev, int rows, float* y_dev, cudaStream_t stream) const override;
  // The prefill path (x rounded into the scratch, then cublasGemmEx) at any
  // row count: what forward runs past gemv_max_rows(). For measuring where
  // cuBLAS overtakes the GEMV (step 01's benchmark); the scratch must hold
  // rows x in_features halves (reserve_rows of more than gemv_max_rows()
  // rows grows it), else it throws std::logic_error.
  void forward_with_cublas(const float* x_dev, int rows, float* y_dev, cudaStream_t stream) const {
    if (rows > 0) forward_gemm(x_dev, rows, y_dev, ProductFusion{}, stream);
  }
  // Grows the shared scratch for forwards of up to `rows` rows. Outside any
  // forward and any stream capture (it allocates, and zeroes the split
  // counters synchronously).
  void reserve_rows(int rows) override;
  // The RMSNorm or SwiGLU before the product and the residual add after it,
  // folded in at every row count, so the model runs no kernel of its own
  // for them. The GEMV (1..gemv_max_rows() rows) folds them into its own
  // launch: the bits of the norm or SwiGLU kernel, then forward, then the
  // add kernel. Past gemv_max_rows(), the norm or SwiGLU goes into the
  // kernel that rounds x for cuBLAS (the same bits again) and the add into
  // cuBLAS's epilogue (beta = 1: the same bits where cuBLAS runs the same
  // kernel for both betas; half_linear.cu). The QKV product's RoPE and K/V
  // append (fusion.rope): the CUDA-core GEMV does them in its last writes;
  // the tensor-core GEMV and cuBLAS's path run rope_and_write_kv after the
  // product. The same bits either way.
  int max_fused_rows() const override { return kFusesAnyRowCount; }
  void forward_fused(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                     cudaStream_t stream) const override;

  int in_features() const override { return in_; }
  int out_features() const override { return out_; }
  // Bytes of weights one product reads: out * padded_in * 2, where padded_in
  // is in_features rounded up to a multiple of 8 (see padded_in_features);
  // out * in * 2 for every real model (their widths are multiples of 8).
  std::size_t weight_bytes() const override { return weight_.bytes(); }

  HalfType type() const { return type_; }
  HalfGemvKernel gemv_kernel() const { return gemv_kernel_; }
  // The most rows forward sends to the GEMV; more go through cuBLAS.
  int gemv_max_rows() const { return gemv_max_rows_; }
  // Row stride of the device weights: in_features rounded up to 8 halves (16
  // bytes), the padding columns zero, so every 16-byte load is aligned.
  int padded_in_features() const { return padded_in_; }
  // How many slices of the input columns the GEMV splits each output over
  // (1: none); fixed at construction from the shape and the GPU's SM count.
  int gemv_k_splits() const { return gemv_k_splits_; }
  // The weights as stored: [out_features, padded_in_features] bit patterns of
  // `type` values.
  const std::uint16_t* weight_bits() const { return weight_.data(); }
  // Whether each GEMV block asks L2 for its first weights before it waits
  // for the kernel before it (on, the default; programmatic_launch.cuh). Off
  // only to measure what the prefetch buys (step 01's benchmark of a token's
  // products back to back, --no-gemv-prefetch); the same bits either way.
  void set_first_weights_prefetch(bool on) { prefetch_first_weights_ = on; }
  bool first_weights_prefetch() const { return prefetch_first_weights_; }
  // Whether the CUDA-core GEMV requests its next batch of weights before it
  // multiplies the current one, for products of 1..4 rows (on, the default;
  // half_linear.cu says why). Off only to measure what that buys (step 01's
  // benchmarks, --no-gemv-pipelining); the same bits either way. The
  // tensor-core kernel ignores it.
  void set_pipelined_weight_loads(bool on) { pipelined_weight_loads_ = on; }
  bool pipelined_weight_loads() const { return pipelined_weight_loads_; }
  // Whether the GEMV's column split fits its blocks into whole waves of the
  // GPU (on, the default; gemv_column_split.hpp says why) or aims at about a
  // wave's worth of blocks rounded up, as before (off: the before row,
  // --no-gemv-wave-fit). Changes the order of the slices' sums, so the bits
  // may differ in the last place. Before reserve_rows: the split sizes the
  // scratch (a forward whose scratch was reserved for another split throws
  // std::logic_error, as any forward without its scratch does).
  void set_whole_wave_split(bool on);
  bool whole_wave_split() const { return whole_wave_split_; }
  // The first batch of every slice of every row, as the CUDA-core GEMV's
  // blocks read them at one row (weight_prefetch.hpp); empty on the
  // tensor-core GEMV. Computed from the current column split: a layer given
  // them before its split changed (set_whole_wave_split) should be given
  // them again (the old lines are still inside the weights, but not the
  // first ones).
  FirstWeightLines first_weight_lines() const override;
  // The next product's first weight lines, asked of L2 by the CUDA-core
  // GEMV's threads once their own weights are read (off by default; on in
  // the model with CudaModelOptions::prefetch_next_product; step 01's
  // chain benchmark measures both). The tensor-core GEMV and cuBLAS's path
  // ignore them. The same bits either way.
  void set_next_product_lines(const FirstWeightLines& lines) override { next_product_lines_ = lines; }
  const FirstWeightLines& next_product_lines() const { return next_product_lines_; }

 private:
  // 1..gemv_max_rows_ rows: the GEMV; more: cuBLAS's path. Both fold `fusion`
  // (fusion.rope: the CUDA-core GEMV in its writes, else the RoPE kernel after).
  void forward_on_path(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                       cudaStream_t stream) const;
  void forward_gemv(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                    cudaStream_t stream) const;
  void forward_gemm(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                    cudaStream_t stream) const;
  // gridDim.x of the GEMV: blocks of gemv_outputs_per_block_ outputs (one
  // split counter each).
  int gemv_output_blocks() const;

  DeviceBuffer<std::uint16_t> weight_;  // [out_, padded_in_] half bit patterns, columns >= in_ zero
  int out_;
  int in_;
  int padded_in_;
  HalfType type_;
  HalfGemvKernel gemv_kernel_;
  int gemv_max_rows_;               // forwards of 1..gemv_max_rows_ rows run the GEMV, more cuBLAS
  int gemv_outputs_per_block_ = 0;  // outputs of one GEMV block (64 on CUDA cores, 128 on tensor cores)
  int gemv_k_splits_ = 1;           // blockIdx.y of the GEMV: slices of the input columns
  int gemv_steps_per_split_ = 1;    // 64-column steps in each slice (the last may have fewer)
  bool prefetch_first_weights_ = true;  // the GEMV's L2 prefetch before its wait
  bool pipelined_weight_loads_ = true;  // the CUDA-core GEMV's next batch requested before this one's multiplies
  bool whole_wave_split_ = true;        // gemv_k_splits_ fitted to whole waves (set_whole_wave_split)
  FirstWeightLines next_product_lines_{};  // the next product's first weights (none: no prefetch)
  std::shared_ptr<HalfActivationScratch> scratch_;
  cublasHandle_t cublas_;
};

// Layers with weights rounded to `type`, whose products of 1..gemv_max_rows
// rows run `gemv_kernel` (more rows: cuBLAS), whose weight loads and column
// split are set by `loads` (set_first_weights_prefetch,
// set_pipelined_weight_loads, set_whole_wave_split); all the layers one
// factory makes share one HalfActivationScratch.
CudaLinearFactory half_cuda_linear_factory(HalfType type, HalfGemvKernel gemv_kernel = HalfGemvKernel::CudaCores,
                                           int gemv_max_rows = kMaxGemvRows, HalfGemvLoads loads = {});

}  // namespace llm::cuda
