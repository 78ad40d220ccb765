#pragma once
// The quantized products on the GPU: W8A16 / W4A16 GEMV and small-batch GEMM
// (fp16 activations, fp32 accumulation), and the same kernels with fp32
// activations behind the CUDA model's Linear hook (CudaLinear). This header
// has no CUDA types, so the step's host code compiles without nvcc; in a build
// without CUDA every function throws llm::DeviceError saying so.
//
// GPU layout (uploaded once from a QuantizedMatrix): each row's codes padded
// to a multiple of 16 bytes (64: whole warp steps), so a thread reads its
// weights with 128-bit loads (32 int4 codes or 16 int8 codes per load),
// stored in the order the tensor-core fragments want them; scales as fp16
// (with one power-of-two exponent per matrix) and int4 zero points as bytes
// beside them, [groups_per_row, out_features] (the 16 rows of each MMA tile
// in the order its lanes read them). Details in the .cu file.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "llm/cuda/cuda_runtime_api.hpp"  // CudaRunOptions (no CUDA types)
#include "llm/harness/compare.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"
#include "step06_quantization/quant_format.hpp"

namespace step06 {

struct QuantizedLayers;

// The kernels (the .cu files' top comments have them):
//   OneShotSplitK        the first version: one-shot blocks of 128 rows x one
//                        slice of the columns, the slices' partial sums added
//                        by the last block after a ticket counter
//   PersistentPipelined  blocks that stay resident, each streaming one
//                        contiguous range of (128 rows, step) units through a
//                        ring of register loads; what the model runs past
//                        4 rows, and at every row count for int8 and NF4
//   Int4DecodeGemv       the fp16 model's CUDA-core GEMV reading int4 codes
//                        (int4_decode_gemv.cuh): int4 schemes only, 1..4
//                        rows a launch (cuda_quantized_matmul runs more 4 at
//                        a time), fp32 activations only; what the model runs
//                        at decode
// All give y within the fp16 tolerance of the reference; they add in
// different orders, so not bitwise the same as each other (each is bitwise
// reproducible from call to call).
enum class CudaQuantizedKernel { OneShotSplitK, PersistentPipelined, Int4DecodeGemv };

// y [rows, out] = x [rows, in] . dequantize(matrix)^T on the GPU with fp32
// activations in and out (the model's path). For checks. whole_wave_split:
// the int4 decode GEMV's column split (Int4DecodeGemv::set_whole_wave_split;
// false: the split of before, --no-gemv-wave-fit); the other kernels ignore it.
std::vector<float> cuda_quantized_matmul(const QuantizedMatrix& matrix, std::span<const float> x, int rows,
                                         CudaQuantizedKernel kernel = CudaQuantizedKernel::PersistentPipelined,
                                         bool whole_wave_split = true);
// The same with fp16 activations: x is rounded to fp16 on upload, y comes back
// from fp16. For checks of the A16 path (not Int4DecodeGemv: InputError).
std::vector<float> cuda_quantized_matmul_fp16(const QuantizedMatrix& matrix, std::span<const float> x, int rows,
                                              CudaQuantizedKernel kernel = CudaQuantizedKernel::PersistentPipelined);

struct CudaMatmulTiming {
  double quantized_ms = 0.0;     // median: the persistent kernel (the default), fp16 x and y
  double one_shot_ms = 0.0;      // median: the one-shot split-K kernel, the same x
  double cublas_fp16_ms = 0.0;   // median: cublasGemmEx, fp16 W [out, in], fp16 x, fp32 accumulate
  // median: the int4 decode GEMV, the same x values in fp32 (its input) and
  // y in fp32; 0 where it does not run (not int4, or more than 4 rows).
  double int4_gemv_ms = 0.0;
  // Each kernel's y vs the fp32 product of dequantize(matrix) with the same fp16 x.
  llm::CompareResult check;            // the persistent kernel's
  llm::CompareResult one_shot_check;   // the one-shot kernel's
  llm::CompareResult int4_gemv_check;  // the int4 decode GEMV's (where it runs)
};
// Times the kernels (fp16 activations; the int4 decode GEMV's fp32) and
// cuBLAS fp16 on the same fresh random x [rows, in] (seeded), each warm-up
// then median of `repeats`, with L2 flushed before each run (the weights of
// one layer fit in an H100's 50 MB L2 otherwise), and checks each kernel once.
CudaMatmulTiming time_cuda_quantized_matmul(const QuantizedMatrix& matrix, int rows, int repeats,
                                            std::uint64_t seed);

// How the quantized CUDA model runs.
struct CudaQuantizedModelOptions {
  // The CUDA model's own switches, as steps 01 and 04 take them: graphs,
  // the fusions and their folds, programmatic launches, the GEMV's two load
  // switches. With the fusions on, the Q/K/V and the gate/up products are
  // one quantized matrix each (the sites' matrices stacked by rows: the same
  // codes), and where every product of a forward fuses its rows (the int4
  // decode GEMV's 1..4) the norms, SwiGLU, residual adds and RoPE fold into
  // the products. dtype, gemv and max_gemv_rows are not read: the sites
  // this step leaves unquantized stay fp32.
  llm::cuda::CudaRunOptions run;
  // Int4 layers run products of 1..4 rows on the int4 decode GEMV
  // (CudaQuantizedKernel::Int4DecodeGemv), which folds the fusions above;
  // false: the persistent kernel at every row count, which folds nothing
  // (the before row).
  bool int4_decode_gemv = true;
};

// CudaModel with the quantized layers behind its Linear hook (fp32
// activations in memory, rounded to fp16 by the products).
std::unique_ptr<llm::Model> make_cuda_quantized_model(const llm::ModelWeights& weights, const QuantizedLayers& layers,
                                                      const CudaQuantizedModelOptions& options = {});

}  // namespace step06
