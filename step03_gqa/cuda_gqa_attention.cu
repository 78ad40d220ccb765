// Decode attention on the GPU, repeat-K/V and group-aware (see
// cuda_gqa_attention.hpp). fp32, written to be obviously right: three small
// kernels instead of one fused one, so each phase can be read on its own.
//
//   1. group_scores_kernel   scores[h, t] = q_h . k_t / sqrt(head_dim)
//      grid (n_kv_heads, key chunks): block (j, c) reads the K rows of KV head
//      j in key chunk c ONCE and scores all `group` query heads of j on them.
//   2. softmax_kernel        one block per query head: probabilities in place.
//   3. group_values_kernel   out[h, :] = sum_t p[h, t] v_t
//      grid (n_kv_heads, key chunks): block (j, c) reads the V rows of KV head
//      j in chunk c ONCE and accumulates all `group` heads' outputs; the
//      chunks' partial sums meet in `out` with atomicAdd.
//
// Key chunks matter as much as the grouping: one block per KV head would run
// MQA as a single block on a GPU of 100+ SMs, slower than MHA on 32x fewer
// bytes; with chunks every configuration fills the GPU (docs/03_gqa.md).
//
// repeat_kv = expand_kv_kernel (copy KV head h / group into a private K/V for
// every query head h) followed by the same three kernels with group 1: MHA
// over the copy, which reads n_heads copies of K and V.
#include <algorithm>
#include <cmath>
#include <string>

#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_timer.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/errors.hpp"
#include "step03_gqa/cuda_gqa_attention.hpp"

namespace step03 {
namespace {

constexpr int kWarpSize = 32;
// Scores: 128 threads = 4 warps per block; each warp takes one key at a time
// (its 32 lanes split the head_dim floats of the row, so the load of a K row
// is one coalesced 128..1024-byte read).
constexpr int kScoreThreads = 128;
// Keys per block in the score and value kernels. 64 keys x 128 head_dim x 4 B
// = 32 KiB of K per block: enough work to hide the launch, and 32k keys give
// 512 chunks, so even MQA (one KV head) puts hundreds of blocks on the GPU.
constexpr int kKeysPerChunk = 64;
// Softmax: one block of 256 threads per query head; each thread handles
// length/256 scores, then the block reduces 256 partial results.
constexpr int kSoftmaxThreads = 256;
// Values: one thread per output column d of the head (head_dim <= 256), so a
// V row is read by consecutive threads: coalesced.
constexpr int kValueThreads = 128;
// The element-wise expansion (repeat_kv): grid-stride loop.
constexpr int kExpandThreads = 256;
constexpr int kMaxExpandBlocks = 65535;
constexpr int kKeyFloatsPerLane = kCudaMaxHeadDim / kWarpSize;  // 8: one K row in a warp's registers

static_assert(kScoreThreads % kWarpSize == 0 && kSoftmaxThreads % kWarpSize == 0);
static_assert(kSoftmaxThreads / kWarpSize <= kWarpSize);  // the second reduction stage is one warp

__device__ float warp_sum(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
__device__ float warp_max(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Block-wide sum or max over kSoftmaxThreads threads. Every thread of the
// block must call it (it contains __syncthreads); every thread gets the result.
// scratch: [32] shared floats.
template <bool kMax>
__device__ float block_reduce(float value, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  value = kMax ? warp_max(value) : warp_sum(value);
  __syncthreads();  // scratch may still be read by a previous call's last step
  if (lane == 0) scratch[warp] = value;
  __syncthreads();  // every warp's partial result is in scratch
  const int n_warps = blockDim.x / kWarpSize;
  value = lane < n_warps ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(value) : warp_sum(value);  // every warp reduces the same values: all get the result
}

// Grid (n_kv_heads, ceil(length / kKeysPerChunk)), kScoreThreads threads,
// dynamic shared memory group * head_dim floats.
// q [n_heads, head_dim], scores [n_heads, score_stride]
__global__ void group_scores_kernel(llm::AttentionShape shape, const float* __restrict__ q, llm::KvView kv,
                                    int length, int score_stride, float* __restrict__ scores) {
  extern __shared__ float group_queries[];  // [group, head_dim]
  const int group = shape.n_heads / shape.n_kv_heads;
  const int hd = shape.head_dim;
  const int kv_head = static_cast<int>(blockIdx.x);
  const int first_query_head = kv_head * group;  // this KV head's query heads are adjacent
  for (int i = static_cast<int>(threadIdx.x); i < group * hd; i += blockDim.x)
    group_queries[i] = q[static_cast<std::size_t>(first_query_head) * hd + i];
  __syncthreads();  // every warp reads every query of the group

  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  const int chunk_begin = static_cast<int>(blockIdx.y) * kKeysPerChunk;
  const int chunk_end = min(length, chunk_begin + kKeysPerChunk);
  const float scale = sqrtf(static_cast<float>(hd));
  for (int t = chunk_begin + warp; t < chunk_end; t += n_warps) {
    // The K row of (t, kv_head) goes into registers once: lane holds floats
    // lane, lane+32, ... (zeros past head_dim).
    const float* key = kv.key_row(t) + static_cast<std::size_t>(kv_head) * hd;
    float key_part[kKeyFloatsPerLane];
#pragma unroll
    for (int i = 0; i < kKeyFloatsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      key_part[i] = d < hd ? key[d] : 0.0f;
    }
    // ... and is used by every query head of the group.
    for (int g = 0; g < group; ++g) {
      float partial = 0.0f;
#pragma unroll
      for (int i = 0; i < kKeyFloatsPerLane; ++i) {
        const int d = lane + i * kWarpSize;
        if (d < hd) partial += group_queries[g * hd + d] * key_part[i];
      }
      const float dot = warp_sum(partial);  // every lane holds the full dot product
      if (lane == 0) scores[static_cast<std::size_t>(first_query_head + g) * score_stride + t] = dot / scale;
    }
  }
}

// Grid (n_heads), kSoftmaxThreads threads. scores [n_heads, score_stride]:
// the first `length` entries of each row become probabilities.
__global__ void softmax_kernel(int length, int score_stride, float* __restrict__ scores) {
  __shared__ float scratch[kWarpSize];
  float* row = scores + static_cast<std::size_t>(blockIdx.x) * score_stride;
  float local_max = -INFINITY;
  for (int t = static_cast<int>(threadIdx.x); t < length; t += blockDim.x) local_max = fmaxf(local_max, row[t]);
  const float row_max = block_reduce<true>(local_max, scratch);
  float local_sum = 0.0f;
  for (int t = static_cast<int>(threadIdx.x); t < length; t += blockDim.x) {
    const float e = expf(row[t] - row_max);  // max subtracted: exp never overflows
    row[t] = e;
    local_sum += e;
  }
  const float row_sum = block_reduce<false>(local_sum, scratch);
  // Each thread rescales only the entries it wrote itself: no barrier needed.
  for (int t = static_cast<int>(threadIdx.x); t < length; t += blockDim.x) row[t] /= row_sum;
}

// Grid (n_kv_heads, ceil(length / kKeysPerChunk)), kValueThreads threads.
// probabilities [n_heads, score_stride], out [n_heads, head_dim] (zeroed
// before the launch: every chunk adds its partial sum).
//
// The chunk's probabilities of the group are staged in shared memory first
// (at most kCudaMaxGroup x kKeysPerChunk floats = 8 KiB). Reading them from
// global memory inside the key loop, as the kernel first did, kept 32 row
// addresses (64-bit each) live beside the 32 accumulators: 255 registers and
// spills on sm_75 and sm_80. From shared memory every head's probability is
// one base register plus a constant offset (g * kKeysPerChunk floats), so
// the accumulators are all that stays live and nothing spills; each
// probability is also read from global memory once per block instead of
// once per thread.
__global__ void group_values_kernel(llm::AttentionShape shape, llm::KvView kv, int length, int score_stride,
                                    const float* __restrict__ probabilities, float* __restrict__ out) {
  __shared__ float chunk_probabilities[kCudaMaxGroup * kKeysPerChunk];  // [group, key in the chunk]
  const int group = shape.n_heads / shape.n_kv_heads;
  const int hd = shape.head_dim;
  const int kv_head = static_cast<int>(blockIdx.x);
  const int first_query_head = kv_head * group;
  const int chunk_begin = static_cast<int>(blockIdx.y) * kKeysPerChunk;
  const int chunk_keys = min(length, chunk_begin + kKeysPerChunk) - chunk_begin;
  // Consecutive threads read consecutive keys of one head's row: coalesced.
  for (int i = static_cast<int>(threadIdx.x); i < group * kKeysPerChunk; i += blockDim.x) {
    const int g = i / kKeysPerChunk, k = i % kKeysPerChunk;
    chunk_probabilities[i] =
        k < chunk_keys ? probabilities[static_cast<std::size_t>(first_query_head + g) * score_stride + chunk_begin + k]
                       : 0.0f;
  }
  __syncthreads();  // every thread reads every head's probabilities
  for (int d = static_cast<int>(threadIdx.x); d < hd; d += blockDim.x) {
    // One accumulator per query head of the group, in registers: the loops
    // over kCudaMaxGroup are unrolled and masked with g < group.
    float acc[kCudaMaxGroup];
#pragma unroll
    for (int g = 0; g < kCudaMaxGroup; ++g) acc[g] = 0.0f;
    for (int k = 0; k < chunk_keys; ++k) {
      const float v = kv.value_row(chunk_begin + k)[static_cast<std::size_t>(kv_head) * hd + d];  // read once per group
#pragma unroll
      for (int g = 0; g < kCudaMaxGroup; ++g)
        if (g < group) acc[g] += chunk_probabilities[g * kKeysPerChunk + k] * v;  // a broadcast: one address per warp
    }
#pragma unroll
    for (int g = 0; g < kCudaMaxGroup; ++g)
      if (g < group) atomicAdd(&out[static_cast<std::size_t>(first_query_head + g) * hd + d], acc[g]);
  }
}

// expanded[t, h, d] = kv row t, KV head h / group, column d; for K and V.
// Grid-stride over length * n_heads * head_dim elements.
__global__ void expand_kv_kernel(llm::AttentionShape shape, llm::KvView kv, int length,
                                 float* __restrict__ expanded_keys, float* __restrict__ expanded_values) {
  const int group = shape.n_heads / shape.n_kv_heads;
  const std::size_t hd = static_cast<std::size_t>(shape.head_dim);
  const std::size_t row_floats = static_cast<std::size_t>(shape.n_heads) * hd;
  const std::size_t n = static_cast<std::size_t>(length) * row_floats;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(i / row_floats);
    const std::size_t h = (i % row_floats) / hd;
    const std::size_t d = i % hd;
    const std::size_t from = (h / group) * hd + d;
    expanded_keys[i] = kv.key_row(t)[from];
    expanded_values[i] = kv.value_row(t)[from];
  }
}

void check_cuda_shape(const llm::AttentionShape& s, int length, const CudaDecodeWorkspace& workspace) {
  if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0)
    throw llm::InputError("bad attention heads: " + std::to_string(s.n_heads) + " query heads, " +
                          std::to_string(s.n_kv_heads) + " KV heads");
  if (s.head_dim <= 0 || s.head_dim > kCudaMaxHeadDim)
    throw llm::InputError("the step 03 CUDA kernels support head_dim 1.." + std::to_string(kCudaMaxHeadDim));
  if (s.n_heads / s.n_kv_heads > kCudaMaxGroup)
    throw llm::InputError("the step 03 CUDA kernels support up to " + std::to_string(kCudaMaxGroup) +
                          " query heads per KV head");
  if (length <= 0 || length > workspace.capacity)
    throw llm::InputError("decode length " + std::to_string(length) + " outside 1.." +
                          std::to_string(workspace.capacity));
}

// Scores, softmax, weighted sum of V, for any group size (1 = MHA).
void grouped_attention(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int length,
                       float* out, const CudaDecodeWorkspace& workspace) {
  const int group = shape.n_heads / shape.n_kv_heads;
  const dim3 chunk_grid(static_cast<unsigned>(shape.n_kv_heads),
                        static_cast<unsigned>((length + kKeysPerChunk - 1) / kKeysPerChunk));
  const std::size_t query_bytes = static_cast<std::size_t>(group) * shape.head_dim * sizeof(float);  // <= 32 KiB
  const int stride = workspace.capacity;
  group_scores_kernel<<<chunk_grid, kScoreThreads, query_bytes>>>(shape, q, kv, length, stride, workspace.scores);
  LLM_CUDA_CHECK_LAUNCH();
  softmax_kernel<<<shape.n_heads, kSoftmaxThreads>>>(length, stride, workspace.scores);
  LLM_CUDA_CHECK_LAUNCH();
  // The chunks add into out: start from zero (same stream, so it runs first).
  LLM_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<std::size_t>(shape.n_heads) * shape.head_dim * sizeof(float)));
  group_values_kernel<<<chunk_grid, kValueThreads>>>(shape, kv, length, stride, workspace.scores, out);
  LLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void group_aware_decode_attention_cuda(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv,
                                       int length, float* out, const CudaDecodeWorkspace& workspace) {
  check_cuda_shape(shape, length, workspace);
  grouped_attention(shape, q, kv, length, out, workspace);
}

void repeat_kv_decode_attention_cuda(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv,
                                     int length, float* out, const CudaDecodeWorkspace& workspace) {
  check_cuda_shape(shape, length, workspace);
  const std::size_t n = static_cast<std::size_t>(length) * shape.n_heads * shape.head_dim;
  const int blocks = static_cast<int>(std::min<std::size_t>((n + kExpandThreads - 1) / kExpandThreads, kMaxExpandBlocks));
  expand_kv_kernel<<<blocks, kExpandThreads>>>(shape, kv, length, workspace.expanded_keys, workspace.expanded_values);
  LLM_CUDA_CHECK_LAUNCH();
  // The copy as a cache of its own: one block of `capacity` rows, n_heads*head_dim wide.
  llm::KvView expanded;
  expanded.keys = workspace.expanded_keys;
  expanded.values = workspace.expanded_values;
  expanded.block_table = workspace.single_block_table;
  expanded.block_size = workspace.capacity;
  expanded.kv_dim = shape.n_heads * shape.head_dim;
  grouped_attention({shape.n_heads, shape.n_heads, shape.head_dim}, q, expanded, length, out, workspace);
}

// ---------------------------------------------------------------------------
// CudaDecodeProblem: the device copies of one problem.

struct CudaDecodeProblem::DeviceState {
  llm::AttentionShape shape;
  llm::cuda::DeviceBuffer<float> keys;             // [capacity, kv_dim]
  llm::cuda::DeviceBuffer<float> values;           // [capacity, kv_dim]
  llm::cuda::DeviceBuffer<int> block_table;        // [1] = {0}
  llm::cuda::DeviceBuffer<float> query;            // [n_heads, head_dim]
  llm::cuda::DeviceBuffer<float> out;              // [n_heads, head_dim]
  llm::cuda::DeviceBuffer<float> scores;           // [n_heads, capacity]
  llm::cuda::DeviceBuffer<float> expanded_keys;    // [capacity, n_heads, head_dim]
  llm::cuda::DeviceBuffer<float> expanded_values;  // [capacity, n_heads, head_dim]
  CudaDecodeWorkspace workspace;
  llm::KvView device_kv;
};

CudaDecodeProblem::CudaDecodeProblem(const llm::AttentionShape& shape, const llm::KvView& host_kv, int capacity,
                                     std::span<const float> q)
    : state_(std::make_unique<DeviceState>()) {
  DeviceState& s = *state_;
  s.shape = shape;
  const std::size_t kv_dim = static_cast<std::size_t>(shape.n_kv_heads) * shape.head_dim;
  const std::size_t q_floats = static_cast<std::size_t>(shape.n_heads) * shape.head_dim;
  if (q.size() != q_floats) throw llm::InputError("CudaDecodeProblem: q must hold n_heads * head_dim floats");
  // Gather the rows through the view (any block table) into one contiguous
  // host block, then upload it: the device cache is a single block.
  std::vector<float> host_keys(static_cast<std::size_t>(capacity) * kv_dim);    // [capacity, kv_dim]
  std::vector<float> host_values(static_cast<std::size_t>(capacity) * kv_dim);  // [capacity, kv_dim]
  for (int t = 0; t < capacity; ++t) {
    std::copy_n(host_kv.key_row(t), kv_dim, host_keys.begin() + static_cast<std::ptrdiff_t>(t * kv_dim));
    std::copy_n(host_kv.value_row(t), kv_dim, host_values.begin() + static_cast<std::ptrdiff_t>(t * kv_dim));
  }
  s.keys = llm::cuda::DeviceBuffer<float>(std::span<const float>(host_keys));
  s.values = llm::cuda::DeviceBuffer<float>(std::span<const float>(host_values));
  const int zero = 0;
  s.block_table = llm::cuda::DeviceBuffer<int>(std::span<const int>(&zero, 1));
  s.query = llm::cuda::DeviceBuffer<float>(q);
  s.out = llm::cuda::DeviceBuffer<float>(q_floats);
  s.scores = llm::cuda::DeviceBuffer<float>(static_cast<std::size_t>(shape.n_heads) * capacity);
  s.expanded_keys = llm::cuda::DeviceBuffer<float>(static_cast<std::size_t>(capacity) * q_floats);
  s.expanded_values = llm::cuda::DeviceBuffer<float>(static_cast<std::size_t>(capacity) * q_floats);
  s.workspace = {s.scores.data(), s.expanded_keys.data(), s.expanded_values.data(), s.block_table.data(), capacity};
  s.device_kv.keys = s.keys.data();
  s.device_kv.values = s.values.data();
  s.device_kv.block_table = s.block_table.data();
  s.device_kv.block_size = capacity;
  s.device_kv.kv_dim = static_cast<int>(kv_dim);
}

CudaDecodeProblem::~CudaDecodeProblem() = default;

std::vector<float> CudaDecodeProblem::run(CudaDecodeAttentionFn fn, int length) {
  DeviceState& s = *state_;
  // Poison the output first so a kernel that writes nothing cannot pass.
  LLM_CUDA_CHECK(cudaMemset(s.out.data(), 0xff, s.out.bytes()));  // 0xffffffff is a NaN
  fn(s.shape, s.query.data(), s.device_kv, length, s.out.data(), s.workspace);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());  // a fault inside a kernel surfaces here
  std::vector<float> out(s.out.size());
  s.out.download(std::span<float>(out));
  return out;
}

llm::TimingStats CudaDecodeProblem::time(CudaDecodeAttentionFn fn, int length, int warmup, int runs) {
  DeviceState& s = *state_;
  return llm::cuda::time_cuda([&] { fn(s.shape, s.query.data(), s.device_kv, length, s.out.data(), s.workspace); },
                              warmup, runs, /*flush_l2=*/true);
}

}  // namespace step03
