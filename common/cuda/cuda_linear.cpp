#include "cuda_linear.hpp"

#include <fmt/format.h>

#include <stdexcept>

#include "llm/cuda/cuda_check.hpp"
#include "llm/errors.hpp"

namespace llm::cuda {

CublasHandle::CublasHandle() {
  LLM_CUBLAS_CHECK(cublasCreate(&handle_));
  // fp32 in, fp32 math, said out loud. CUBLAS_DEFAULT_MATH never rounds fp32
  // inputs to TF32 (10-bit mantissa: ~1e-3 relative error, far outside the fp32
  // tolerance against the CPU); only CUBLAS_TF32_TENSOR_OP_MATH (or the BF16x9
  // emulation mode) would. We do not pick CUBLAS_PEDANTIC_MATH: it is fp32 as
  // well but may run slower kernels, and this baseline should be as fast as
  // what a user gets from cuBLAS by default, so later steps beat a fair time.
  LLM_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
}

// cuBLAS's documentation asks for 32 MiB of workspace on Hopper (4 MiB
// before it) for its fastest kernels; 32 MiB suits every GPU.
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

void CublasHandle::bind_to_stream(cudaStream_t stream) {
  workspace_.ensure(kCublasWorkspaceBytes);
  LLM_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  LLM_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.data(), workspace_.bytes()));
}

void set_cublas_stream(cublasHandle_t cublas, cudaStream_t stream) {
  cudaStream_t current = nullptr;
  LLM_CUBLAS_CHECK(cublasGetStream(cublas, &current));
  if (current != stream) LLM_CUBLAS_CHECK(cublasSetStream(cublas, stream));
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) static_cast<void>(cublasDestroy(handle_));
}

void CudaLinear::forward_fused(const float*, int rows, float*, const ProductFusion&, cudaStream_t) const {
  throw std::logic_error(fmt::format("a [{}, {}] product of this kind folds nothing into its launch ({} rows): the "
                                     "model calls forward_fused only where fuses(rows)",
                                     out_features(), in_features(), rows));
}

void CudaLinear::check_fusion(int rows, const ProductFusion& fusion) const {
  const int out = out_features(), in = in_features();
  if (!fuses(rows))
    throw std::logic_error(fmt::format("a [{}, {}] product: a fused forward of {} rows, where it fuses {} at most", out,
                                       in, rows, max_fused_rows()));
  if (fusion.input_norm != nullptr && fusion.swiglu_of_gate_up)
    throw std::logic_error(fmt::format("a [{}, {}] product: x is either a norm's input or SwiGLU's, not both", out, in));
  const QkvRopeWrite& rope = fusion.rope;
  if (rope.q_out != nullptr &&
      (fusion.accumulate || rope.head_dim <= 0 || rope.head_dim % 2 != 0 ||
       out != (rope.n_heads + 2 * rope.n_kv_heads) * rope.head_dim))
    throw std::logic_error(fmt::format("a [{}, {}] product: RoPE folds into a QKV product of {} + 2 x {} heads of an "
                                       "even head_dim ({}), without an add",
                                       out, in, rope.n_heads, rope.n_kv_heads, rope.head_dim));
}

DenseCudaLinear::DenseCudaLinear(std::span<const float> weight, int out_features, int in_features,
                                 cublasHandle_t cublas)
    : out_(out_features), in_(in_features), cublas_(cublas) {
  if (out_features <= 0 || in_features <= 0 ||
      weight.size() != static_cast<std::size_t>(out_features) * static_cast<std::size_t>(in_features))
    throw InputError(fmt::format("linear layer: {} weights do not make a [{}, {}] matrix", weight.size(),
                                 out_features, in_features));
  weight_.ensure(weight.size());
  weight_.upload(weight);
}

void DenseCudaLinear::forward(const float* x_dev, int rows, float* y_dev, cudaStream_t stream) const {
  if (rows <= 0) return;
  // cuBLAS speaks column-major; our matrices are row-major. A row-major
  // matrix A [m, n] is, byte for byte, the column-major matrix A^T [n, m]
  // with leading dimension n. So cuBLAS sees
  //   W (row-major [out, in])  as  W^T  [in, out],   ld = in
  //   X (row-major [rows, in]) as  X^T  [in, rows],  ld = in
  //   Y (row-major [rows, out]) as Y^T  [out, rows], ld = out
  // and Y = X W^T is the same equation as Y^T = W X^T. In column-major terms
  // that is C [out, rows] = op(A) [out, in] . op(B) [in, rows] with
  //   A = W's memory with op T (turns W^T back into W), B = X's memory as is.
  // No data moves: the transposes are only in how cuBLAS reads the memory.
  const float alpha = 1.0f, beta = 0.0f;
  set_cublas_stream(cublas_, stream);
  LLM_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N,
                               /*m=*/out_, /*n=*/rows, /*k=*/in_, &alpha,
                               /*A=*/weight_.data(), /*lda=*/in_,
                               /*B=*/x_dev, /*ldb=*/in_, &beta,
                               /*C=*/y_dev, /*ldc=*/out_));
}

CudaLinearFactory dense_cuda_linear_factory() {
  return [](const std::vector<float>& weight, int out_features, int in_features, const LinearSite&,
            cublasHandle_t cublas) -> std::unique_ptr<CudaLinear> {
    return std::make_unique<DenseCudaLinear>(weight, out_features, in_features, cublas);
  };
}

}  // namespace llm::cuda
