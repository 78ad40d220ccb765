#pragma once
// The linear-layer hook on the GPU, the twin of llm/linear.hpp: every matrix
// product of CudaModel goes through CudaLinear::forward, so step 06 can swap
// in int8/int4 weights by handing CudaModel another CudaLinearFactory, without
// touching the layer code. The baseline is DenseCudaLinear: fp32 weights and
// cuBLAS's SGEMM.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llm/cuda/device_buffer.hpp"
#include "llm/cuda/weight_prefetch.hpp"
#include "llm/linear.hpp"

namespace llm {
struct KvView;  // llm/kv_cache.hpp
}

namespace llm::cuda {

// A cuBLAS handle that destroys itself. Created in fp32 math mode (see the
// constructor for why that is set explicitly).
class CublasHandle {
 public:
  CublasHandle();
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }
  // Binds the handle to `stream` with a workspace this object owns, so no
  // cuBLAS call on that stream allocates memory: a call captured into a CUDA
  // graph must not (cudaMalloc is not a stream operation). The layers' own
  // set_cublas_stream calls then find the stream already bound and leave the
  // workspace in place.
  void bind_to_stream(cudaStream_t stream);

 private:
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer<unsigned char> workspace_;  // [kCublasWorkspaceBytes]
};

// cublasSetStream, unless `stream` is already the handle's: cublasSetStream
// resets the workspace to cuBLAS's own pool, which would undo bind_to_stream.
void set_cublas_stream(cublasHandle_t cublas, cudaStream_t stream);

// The fused QKV product's RoPE and K/V append (kernels::rope_and_write_kv,
// fp32 caches), for the product to do them on its outputs instead of
// writing them (CudaFusions::rope_in_qkv_product). Device pointers:
//   q_out [rows, n_heads * head_dim]      the rotated queries
//   views [rows]                          each row's cache view (fp32 rows)
//   positions [rows]                      each row's position
//   cos_table, sin_table [positions, head_dim / 2]
// Row r's product [n_heads * head_dim + 2 * kv_dim] is Q, then K, then V.
struct QkvRopeWrite {
  float* q_out = nullptr;  // null: no RoPE folded in
  const KvView* views = nullptr;
  const int* positions = nullptr;
  const float* cos_table = nullptr;
  const float* sin_table = nullptr;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
};

// What a product can take into launches it has anyway, where the kernels
// around it move a few KiB each and cost a launch apiece (see
// CudaFusions::norm_in_product): the RMSNorm or the SwiGLU before it, the
// residual add after it, and the QKV product's RoPE and K/V append. A layer
// that fuses (max_fused_rows() > 0) does every one it is given.
struct ProductFusion {
  // Non-null: the product multiplies rmsnorm(x) = input_norm * (x / rms(x))
  // (input_norm [in_features] in device memory, eps its epsilon), row by
  // row, instead of x.
  const float* input_norm = nullptr;
  float norm_eps = 0.0f;
  // x is the fused gate/up product's output [rows, 2 * in_features] (gate
  // columns, then up columns): the product multiplies silu(gate) * up.
  // Not together with input_norm.
  bool swiglu_of_gate_up = false;
  // y += x . W^T (the residual add) instead of y = x . W^T.
  bool accumulate = false;
  // rope.q_out non-null: the product's rows go through RoPE and the K/V
  // append as rope_and_write_kv would take them from y, and y itself may be
  // left unwritten. Not together with `accumulate`.
  QkvRopeWrite rope{};
};

// max_fused_rows() of a layer that folds a ProductFusion into a product of
// any number of rows.
inline constexpr int kFusesAnyRowCount = std::numeric_limits<int>::max();

class CudaLinear {
 public:
  virtual ~CudaLinear() = default;
  // y[rows, out_features] = x[rows, in_features] . W^T, both row-major in
  // device memory, queued on `stream` (nothing waits for it to finish).
  virtual void forward(const float* x_dev, int rows, float* y_dev, cudaStream_t stream) const = 0;
  virtual int in_features() const = 0;
  virtual int out_features() const = 0;
  virtual std::size_t weight_bytes() const = 0;  // bytes read per full product
  // Called by the model, outside any forward, with the most rows a coming
  // forward may pass: a layer that needs scratch for that many rows allocates
  // it here, so forward never allocates (it may be captured into a CUDA
  // graph, where cudaMalloc is not allowed).
  virtual void reserve_rows(int /*rows*/) {}
  // The most rows forward_fused takes (0: it folds nothing, and the model
  // runs the norm and the add as kernels of their own around forward;
  // kFusesAnyRowCount: every count).
  virtual int max_fused_rows() const { return 0; }
  bool fuses(int rows) const { return rows >= 1 && rows <= max_fused_rows(); }
  // forward with `fusion` folded in; only where fuses(rows).
  virtual void forward_fused(const float* x_dev, int rows, float* y_dev, const ProductFusion& fusion,
                             cudaStream_t stream) const;
  // Throws std::logic_error (a bug in the caller, not bad input) unless
  // fuses(rows) and `fusion` is one a product can fold: a norm or SwiGLU,
  // not both; RoPE only into a QKV product of an even head_dim, without an
  // add. What every forward_fused checks first.
  void check_fusion(int rows, const ProductFusion& fusion) const;
  // The fp32 weights [out_features, in_features] in device memory when the
  // layer keeps them that way (DenseCudaLinear), else nullptr: a tied
  // classifier's weights are the embedding table (see Linear::dense_weight).
  virtual const float* dense_weight() const { return nullptr; }
  // The weights this layer's one-row product reads first, as 128-byte lines
  // (weight_prefetch.hpp): what the product run before it may ask L2 for.
  // Empty where the layer has no kernel of that kind (fp32 on cuBLAS, the
  // tensor-core GEMV; step 06's int8 and NF4).
  virtual FirstWeightLines first_weight_lines() const { return {}; }
  // The first weight lines of the product the model runs after this one
  // (CudaModelOptions::prefetch_next_product): this layer's CUDA-core GEMV
  // asks L2 for them once its own weights are read. Empty: none. Layers
  // without that GEMV ignore it. The same bits either way.
  virtual void set_next_product_lines(const FirstWeightLines& /*lines*/) {}
};

// fp32 weights [out_features, in_features] row-major in device memory,
// multiplied with cublasSgemm.
class DenseCudaLinear final : public CudaLinear {
 public:
  // Uploads `weight` [out_features, in_features]. `cublas` is borrowed: the
  // owner (the model) keeps it alive longer than this layer.
  DenseCudaLinear(std::span<const float> weight, int out_features, int in_features, cublasHandle_t cublas);
  void forward(const float* x_dev, int rows, float* y_dev, cudaStream_t stream) const override;
  int in_features() const override { return in_; }
  int out_features() const override { return out_; }
  std::size_t weight_bytes() const override { return weight_.bytes(); }
  const float* dense_weight() const override { return weight_.data(); }

 private:
  DeviceBuffer<float> weight_;  // [out_features, in_features]
  int out_;
  int in_;
  cublasHandle_t cublas_;
};

// Builds a CudaLinear from an fp32 host matrix [out, in]; `site` says which
// layer and role it is (llm/linear.hpp), so a factory may treat some
// differently; `cublas` is the model's handle, for layers that use cuBLAS.
using CudaLinearFactory = std::function<std::unique_ptr<CudaLinear>(
    const std::vector<float>& weight, int out_features, int in_features, const LinearSite& site,
    cublasHandle_t cublas)>;

CudaLinearFactory dense_cuda_linear_factory();

}  // namespace llm::cuda
