#pragma once
// Whether cuBLAS's residual add gives the add kernel's bits, asked of cuBLAS.
//
// HalfCudaLinear folds the residual add after a product on cuBLAS's path
// into cublasGemmEx's epilogue (beta = 1: y = product + y, rounded once, as
// the add kernel rounds it). That gives the bits of the unfolded path (beta
// = 0, then the add kernel) exactly when cuBLAS computes the same product
// for both betas. cuBLAS chooses its kernel per call and does not promise
// that (a kernel that must read y may be another kernel, or split the sum
// otherwise). So the bit tests of the fold ask first, at the shape, row
// count and cuBLAS settings they run: the product added onto zeros (beta = 1)
// against the plain product (beta = 0), bit for bit. Where they differ, the
// fold cannot give the unfolded bits whatever it does, and the tests check it
// at the bound of two orders of summation instead, saying so.
// GPU tests only (a CUDA build).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "cuda_linear.hpp"
#include "cuda_stream.hpp"
#include "half_linear.hpp"
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "test_support.hpp"

namespace llm::testing {

// For a layer already built: its forward of `rows` rows of x_dev plain, then
// added onto zeros, on `stream` (the layer's cuBLAS handle as its caller set it
// up); true when the two are the same bits. Rows the GEMV takes give true:
// its add is its own, in the same sums.
inline bool cublas_adds_onto_its_plain_product(const cuda::HalfCudaLinear& layer, const float* x_dev, int rows,
                                               cudaStream_t stream) {
  const std::size_t count = static_cast<std::size_t>(rows) * static_cast<std::size_t>(layer.out_features());
  cuda::DeviceBuffer<float> plain(count), onto_zeros(count);
  layer.forward(x_dev, rows, plain.data(), stream);
  LLM_CUDA_CHECK(cudaMemsetAsync(onto_zeros.data(), 0, onto_zeros.bytes(), stream));
  layer.forward_fused(x_dev, rows, onto_zeros.data(), cuda::ProductFusion{.accumulate = true}, stream);
  LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> plain_host(count), onto_zeros_host(count);
  plain.download(plain_host);
  onto_zeros.download(onto_zeros_host);
  // A product of exactly -0 becomes +0 when added onto +0: the same value,
  // other bits, and no sign of another kernel.
  for (std::size_t i = 0; i < count; ++i)
    if (plain_host[i] == 0.0f && onto_zeros_host[i] == 0.0f) plain_host[i] = onto_zeros_host[i] = 0.0f;
  return std::memcmp(plain_host.data(), onto_zeros_host.data(), count * sizeof(float)) == 0;
}

// The same question for a model's products that add (wo and w2), asked with
// layers of the model's shapes and type, on a handle with the workspace the
// CUDA model binds to its stream (cuBLAS may choose by workspace size).
inline bool cublas_adds_onto_its_plain_products(cuda::HalfType type, int gemv_max_rows,
                                                std::span<const std::pair<int, int>> out_in_shapes, int rows) {
  if (rows <= gemv_max_rows) return true;
  cuda::CudaStream stream;
  cuda::CublasHandle cublas;
  cublas.bind_to_stream(stream.get());
  for (const auto& [out, in] : out_in_shapes) {
    const std::vector<float> weight = random_vector(static_cast<std::size_t>(out) * in, 4242u + out + in, 0.5f);
    const std::vector<float> x = random_vector(static_cast<std::size_t>(rows) * in, 4343u + rows, 1.0f);
    cuda::HalfCudaLinear layer(weight, out, in, type, std::make_shared<cuda::HalfActivationScratch>(), cublas.get(),
                               cuda::HalfGemvKernel::CudaCores, gemv_max_rows);
    layer.reserve_rows(rows);
    const cuda::DeviceBuffer<float> x_dev{std::span<const float>(x)};
    if (!cublas_adds_onto_its_plain_product(layer, x_dev.data(), rows, stream.get())) return false;
  }
  return true;
}

}  // namespace llm::testing
