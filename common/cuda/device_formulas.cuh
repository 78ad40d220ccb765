#pragma once
// Device code that more than one .cu file needs, so that they compute the
// same thing the same way:
// - block-wide reductions (warp shuffles, then the warps' results);
// - RMSNorm's parts: the sum of squares of a row as a block sums it, the
//   inverse RMS and the normalized value, the expressions of cpu::rmsnorm;
// - SwiGLU's value, cpu::swiglu's expression;
// - RoPE's rotation of one pair of values;
// - the ticket that finds the last block of a group to finish.
//
// The RMSNorm and SwiGLU kernels (kernels.cu) and the half-precision GEMV
// that folds them into its own launch (half_linear.cu) both use these, the
// norms with blocks of the same size (kNormBlockThreads): the same partial
// sums reduced in the same order give the same bits, so folding a norm or
// SwiGLU into the product changes no result (a test checks it).
#include <cuda_runtime.h>

#include <cmath>

namespace llm::cuda::device {

inline constexpr int kWarpSize = 32;
// The block size of every block that sums a row's squares: 8 warps.
inline constexpr int kNormBlockThreads = 256;

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
  __device__ static float identity() { return 0.0f; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ static float identity() { return -INFINITY; }
};

template <class Op>
__device__ __forceinline__ float warp_reduce(float value, Op op) {
  // Butterfly: after the step with offset o every lane holds the reduction of
  // 2o lanes; after offset 1 every lane holds the whole warp's result.
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Each warp reduces its 32 values with shuffles (no shared memory, no
// __syncthreads), lane 0 of each warp parks the warp's result in `shared`
// [32], and warp 0 reduces those. Every thread of the block gets the result.
// All threads of the block must call it (it contains __syncthreads), and
// blockDim.x must be a multiple of 32.
template <class Op>
__device__ __forceinline__ float block_reduce(float value, Op op, float* shared /* [32] */) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
  value = warp_reduce(value, op);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < n_warps ? shared[lane] : Op::identity();
    value = warp_reduce(value, op);
    if (lane == 0) shared[0] = value;
  }
  __syncthreads();
  const float result = shared[0];
  __syncthreads();  // everyone has read shared[0] before a next call overwrites it
  return result;
}

// This thread's share of sum_i row[i]^2: elements threadIdx.x,
// threadIdx.x + blockDim.x, ... in increasing order. block_reduce of the
// shares is the row's sum of squares.
__device__ __forceinline__ float thread_sum_of_squares(const float* row, int dim) {
  float partial = 0.0f;
  for (int i = static_cast<int>(threadIdx.x); i < dim; i += static_cast<int>(blockDim.x)) partial += row[i] * row[i];
  return partial;
}

// 1 / sqrt(mean of squares + eps), cpu::rmsnorm's expression (IEEE division
// and sqrt: the build does not use --use_fast_math).
__device__ __forceinline__ float inverse_rms(float sum_of_squares, int dim, float eps) {
  return 1.0f / sqrtf(sum_of_squares / static_cast<float>(dim) + eps);
}

// One normalized element: weight * (inv_rms * x), in cpu::rmsnorm's order.
__device__ __forceinline__ float normalized(float weight, float inv_rms, float x) { return weight * (inv_rms * x); }

// silu(gate) * up, silu(g) = g / (1 + exp(-g)): cpu::swiglu's expression.
__device__ __forceinline__ float swiglu_value(float gate, float up) { return gate * (1.0f / (1.0f + expf(-gate))) * up; }

// (x0, x1) as a complex number times e^{i angle} (c = cos, s = sin of the
// angle), as cpu::rope rotates a pair: (x0 c - x1 s, x0 s + x1 c). Written
// with its roundings explicit (one product rounded, then one fmaf), so the
// RoPE kernels (kernels.cu) and the GEMV that folds RoPE into the QKV
// product (half_linear.cu) round alike whatever the compiler would contract.
__device__ __forceinline__ float2 rotated_pair(float x0, float x1, float c, float s) {
  return make_float2(fmaf(x0, c, -__fmul_rn(x1, s)), fmaf(x0, s, __fmul_rn(x1, c)));
}

// The last block of a group of `blocks` that each wrote partial results
// (the half GEMV's column slices, split-KV attention's splits): called after
// every thread of the block has written its partials, it takes one ticket
// from `counter` and is true, in every thread, in the block that took the
// last one; that block then adds the others' partials, reading them from L2
// (__ldcg, never a stale L1 line). No atomicAdd on values: the result is the
// same bits at every run. atomicInc wraps to 0 after the last ticket, so the
// counter is zero again for the next launch (or the next layer sharing it).
// Called by every thread of the block (it has barriers).
__device__ __forceinline__ bool takes_last_ticket(unsigned int* counter, unsigned int blocks) {
  __shared__ bool is_last_block;
  // Release: each thread's partials are visible device-wide before the
  // ticket is taken (the fence), and every thread has fenced before thread 0
  // takes it (the barrier).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int last_ticket = blocks - 1;
    const unsigned int ticket = atomicInc(counter, last_ticket);
    __threadfence();  // acquire: the other blocks' partials are read after their tickets
    is_last_block = ticket == last_ticket;
  }
  __syncthreads();
  return is_last_block;
}

}  // namespace llm::cuda::device
