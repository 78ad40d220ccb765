// PagedAttention decode on the GPU, fp32 (see cuda_paged_attention.hpp):
// step 02's split-KV decode generalized to many sequences of different
// lengths, GQA and K/V read through a block table.
//
//   1. partition kernel, grid (partition, KV head [x group chunk], query),
//      4 warps: thread block (p, j, i) runs the online softmax of the query
//      heads of KV head j over keys [p * P, (p + 1) * P) of query i's
//      sequence and writes a PARTIAL (m, l, o) per query head.
//   2. merge kernel, grid (query head, query):
//        M = max_p m_p,  l = sum_p 2^(m_p - M) l_p,  out = sum_p 2^(m_p - M) o_p / l
//      (not launched when there is one partition: kernel 1 normalizes).
// Invariant: every K/V row is read once per thread block, through the table
// (row of position p = table[p / B] * B + p % B); a warp's 32 lookups of 32
// consecutive keys are one load. The row addressing (PagedRows or
// ContiguousRows) and the queries (decode or prefill rows) are template
// policies: the only difference between the paged and contiguous kernels.
// Why this grid, the lane layouts, the loads in flight and the log2-domain
// softmax: docs/05_paged_attention.md, section 5 ("Inside the CUDA kernel").
#include <algorithm>

#include "llm/cuda/cuda_runtime_api.hpp"
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "exercise.cuh"
#include "llm/cuda/cuda_check.hpp"
#include "llm/errors.hpp"
#include "step05_paged_attention/cuda_paged_attention.hpp"

namespace step05::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// 4 warps: few enough to merge cheaply through shared memory, and the
// smallest partition (128 keys) still gives every warp a span of 32.
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMinBlocksPerSm = 3;  // the register budget (see partition_kernel)
constexpr int kSpanKeys = kWarpSize;  // keys a warp takes at a time: one table lookup per lane
constexpr int kPartitionUnit = 64;    // partitions are a multiple of this many keys (see above)
constexpr int kMinPartitionKeys = 128;  // one 32-key span per warp at least
constexpr int kMaxPartitions = 256;     // 32k keys at the minimum partition size
constexpr int kWantedBlocksPerSm = 8;  // ~2-3 waves at the 3+ resident blocks per SM the registers allow
constexpr int kMaxGridYZ = 65535;
constexpr int kMaxHeadDim = llm::cuda::kernels::kMaxHeadDim;  // 256, as the CUDA model
constexpr float kLog2e = 1.4426950408889634f;

static_assert(kPartitionUnit % kSpanKeys == 0 && kMinPartitionKeys % kPartitionUnit == 0);

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// How a warp's lanes split one head's dims, how many query heads a thread
// block keeps in registers (the "group tile") and how many keys a warp loads
// per step. One instance per compiled path:
//   Float4Lanes   head_dim 128: lane l holds dims 4l..4l+3, one float4 load
//                 per row; 8 query heads (q and accumulator: 32 + 32
//                 registers); 4 keys per step
//   Float2Lanes   head_dim 64: dims 2l, 2l+1, one float2 load; 8 heads; 4 keys
//   NarrowLanes   head_dim 1..32 (the real model's 8): lane l holds dim l,
//                 lanes past head_dim idle; 8 heads; 4 keys
//   WideLanes     any other head_dim up to 256: dims l, l+32, ..., l+224
//                 (scalar loads, still coalesced); 4 heads and 2 keys per
//                 step, which keeps it at the registers of the others
// 8 query heads per block covers the GQA groups of Llama-3 (4), Mistral (4),
// Qwen2 (7) and 70B models (8) in one block; a larger group (MQA) is split
// into chunks of 8 heads (see the top of the file).
template <int kDimsPerLane_, bool kVectorLoads_, int kGroupTile_, int kKeysPerStep_>
struct LaneLayout {
  static constexpr int kDimsPerLane = kDimsPerLane_;
  static constexpr bool kVectorLoads = kVectorLoads_;  // consecutive dims per lane (else strided by 32)
  static constexpr int kGroupTile = kGroupTile_;
  static constexpr int kKeysPerStep = kKeysPerStep_;
  static constexpr int kRowFloats = kDimsPerLane * kWarpSize;  // the largest head_dim it covers
  static_assert(kSpanKeys % kKeysPerStep == 0, "a step never crosses a span: its source lanes stay < 32");
};
using Float4Lanes = LaneLayout<4, true, 8, 4>;
using Float2Lanes = LaneLayout<2, true, 8, 4>;
using NarrowLanes = LaneLayout<1, false, 8, 4>;
using WideLanes = LaneLayout<kMaxHeadDim / kWarpSize, false, 4, 2>;

// Which dim of a head the x-th register of `lane` holds.
template <class Lanes>
__device__ __forceinline__ int lane_dim(int lane, int x) {
  return Lanes::kVectorLoads ? lane * Lanes::kDimsPerLane + x : lane + kWarpSize * x;
}

// This lane's dims of one head's row (`head_row` points at dim 0 of the
// head in a K or V row); zeros past head_dim.
template <class Lanes>
__device__ __forceinline__ void load_lane_dims(const float* head_row, int lane, int head_dim,
                                               float (&dims)[Lanes::kDimsPerLane]) {
  if constexpr (std::is_same_v<Lanes, Float4Lanes>) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(head_row) + lane);  // 16-byte aligned: checked on the host
    dims[0] = v.x;
    dims[1] = v.y;
    dims[2] = v.z;
    dims[3] = v.w;
  } else if constexpr (std::is_same_v<Lanes, Float2Lanes>) {
    const float2 v = __ldg(reinterpret_cast<const float2*>(head_row) + lane);  // 8-byte aligned: checked on the host
    dims[0] = v.x;
    dims[1] = v.y;
  } else {
#pragma unroll
    for (int x = 0; x < Lanes::kDimsPerLane; ++x) {
      const int d = lane_dim<Lanes>(lane, x);
      dims[x] = d < head_dim ? __ldg(head_row + d) : 0.0f;
    }
  }
}

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
  return value;  // every lane holds the sum
}

// --- Row addressing policies: where position `pos` of a view lives in its pool.

// A paged view: the block table maps the logical block pos / B to a physical
// block (KvView::row_index is the host's arithmetic). The lookup itself is
// written out where the kernel makes it, one key per lane (partition_kernel).
struct PagedRows {
  __device__ explicit PagedRows(const llm::KvView&) {}
};

// A contiguous view: one block holds every position, so its first row is
// read from the table once, and position p is that row + p.
struct ContiguousRows {
  std::size_t first_row;
  __device__ explicit ContiguousRows(const llm::KvView& kv)
      : first_row(static_cast<std::size_t>(kv.block_table[0]) * kv.block_size) {}
  __device__ std::size_t row(const llm::KvView&, int pos) const { return first_row + static_cast<std::size_t>(pos); }
};

// --- Query policies: what query i of the launch is.

// Decode: one query per sequence of the batch (kernels::DecodeQueries' device arrays).
struct DecodeQuerySource {
  const llm::KvView* views;  // [n_queries]
  const int* lengths;        // [n_queries]
  const int* rows;           // [n_queries] row of q and out, or null: row i
  __device__ llm::KvView view(int i) const { return views[i]; }
  __device__ int length(int i) const { return lengths[i]; }
  __device__ int row(int i) const { return rows != nullptr ? rows[i] : i; }
};

// Prefill: the n_new prompt rows of one sequence; row i sits at position
// n_past + i and sees keys 0..n_past+i (causal, bottom-right aligned).
struct PrefillQuerySource {
  llm::KvView kv;
  int n_past;
  __device__ llm::KvView view(int) const { return kv; }
  __device__ int length(int i) const { return n_past + i + 1; }
  __device__ int row(int i) const { return i; }
};

// The partial results in the workspace (unused with a single partition).
struct Partials {
  float* o;   // [n_queries, n_heads, partitions, head_dim] sum of 2^(s - m) v over the partition's keys
  float* ml;  // [n_queries, n_heads, partitions, 2] (m: max score in log2 units, l: sum of 2^(s - m))
};

// Kernel 1. Grid (partitions, n_kv_heads * group_chunks, n_queries), kThreads threads.
// q, out  [rows, n_heads, head_dim]; q_scale = log2(e) / sqrt(head_dim).
// __launch_bounds__(kThreads, kMinBlocksPerSm = 3): at most 170 registers
// per thread, so 3 blocks (12 warps, 48 KiB of K/V loads in flight at
// head_dim 128) fit on an SM. ptxas (CUDA 13, sm_90) uses 150-160
// registers for the float4 and wide paths, 96-113 for float2, 72-80 narrow,
// no spills (without the hint it chose 96 registers and a spill for the
// float2 decode path).
template <class Lanes, class Rows, class Queries>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    partition_kernel(llm::AttentionShape shape, const float* __restrict__ q, Queries queries, int partition_keys,
                     int group_chunks, float q_scale, Partials partials, float* __restrict__ out) {
  constexpr int kDims = Lanes::kDimsPerLane;
  constexpr int kGroup = Lanes::kGroupTile;
  constexpr int kKeysPerStep = Lanes::kKeysPerStep;
  // Each warp's final (m, l, o) per query head of the tile, for the merge of
  // the 4 warps: 4 warps x 8 heads x 128 dims x 4 B = 16 KiB at head_dim 128
  // (8 KiB at 64, 4 KiB narrow, 16 KiB wide).
  __shared__ float warp_max[kWarps][kGroup];
  __shared__ float warp_sum_of_weights[kWarps][kGroup];
  __shared__ float warp_accumulator[kWarps][kGroup][Lanes::kRowFloats];

  const int partition = static_cast<int>(blockIdx.x);
  const int kv_head = static_cast<int>(blockIdx.y) / group_chunks;
  const int chunk = static_cast<int>(blockIdx.y) % group_chunks;
  const int query = static_cast<int>(blockIdx.z);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int head_dim = shape.head_dim;
  const int group = shape.n_heads / shape.n_kv_heads;
  const int first_head = kv_head * group + chunk * kGroup;  // a KV head's query heads are adjacent
  const int heads = min(kGroup, group - chunk * kGroup);   // query heads of this block, 1..kGroup

  const int length = queries.length(query);
  const int begin = partition * partition_keys;
  // An empty partition (the sequence is shorter than the longest one) writes
  // nothing: the merge reads only partitions below ceil(length / P). The
  // whole block returns together, before any barrier.
  if (begin >= length) return;
  const int end = min(begin + partition_keys, length);

  const llm::KvView kv = queries.view(query);  // a register copy: its fields are read for every span
  const Rows rows(kv);
  const int q_row = queries.row(query);
  const std::size_t head_offset = static_cast<std::size_t>(kv_head) * head_dim;  // the head's dims in a K/V row
  const std::size_t row_floats = static_cast<std::size_t>(kv.kv_dim);

  // This lane's dims of the tile's query heads (pre-scaled into log2 units),
  // and the running state of each: max m, sum l of 2^(s - m), accumulator o.
  float q_part[kGroup][kDims];
  float running_max[kGroup], running_sum[kGroup], accumulator[kGroup][kDims];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    const float* q_head = q + (static_cast<std::size_t>(q_row) * shape.n_heads + first_head + g) * head_dim;
#pragma unroll
    for (int x = 0; x < kDims; ++x) {
      const int d = lane_dim<Lanes>(lane, x);
      q_part[g][x] = g < heads && d < head_dim ? q_head[d] * q_scale : 0.0f;
      accumulator[g][x] = 0.0f;
    }
    running_max[g] = -INFINITY;
    running_sum[g] = 0.0f;
  }

  for (int span = begin + warp * kSpanKeys; span < end; span += kWarps * kSpanKeys) {
    const int span_keys = min(kSpanKeys, end - span);
    // Lane j looks up key span + j: the span's table lookups in one load.
    // lane_offset: floats from the start of the pool to this key's KV head in
    // its K (and V) row; lanes past the span's end keep 0 and read nothing.
    unsigned long long lane_offset = 0ull;
    if constexpr (std::is_same_v<Rows, PagedRows>) {
      // BEGIN EXERCISE ex05.3
      // STUB: if (span == begin) LLM_CUDA_EXERCISE_TODO("ex05.3");  // one line per launch, not one per span
      // STUB: for (float& sum : running_sum) sum = llm::cuda::device::exercise_nan();  // every output divides by it: NaN
      if (lane < span_keys) {
        const int pos = span + lane;
        // The one table read of this key: logical block pos / B -> physical block.
        const std::int32_t physical_block = kv.block_table[pos / kv.block_size];
        const std::size_t pool_row = static_cast<std::size_t>(physical_block) * kv.block_size + pos % kv.block_size;
        // 64-bit: a pool may hold more than 2^31 floats.
        lane_offset = pool_row * row_floats + head_offset;
      }
      // END EXERCISE ex05.3
    } else {
      if (lane < span_keys) lane_offset = rows.row(kv, span + lane) * row_floats + head_offset;
    }
    for (int step = 0; step < span_keys; step += kKeysPerStep) {  // the same trip count in every lane
      // Load K and V of the step's keys first (8 loads in flight), then use them.
      float k_part[kKeysPerStep][kDims], v_part[kKeysPerStep][kDims];
#pragma unroll
      for (int k = 0; k < kKeysPerStep; ++k) {
        // Every lane takes part in the shuffle; a key past the span's end is skipped after it.
        const unsigned long long offset = __shfl_sync(kFullMask, lane_offset, step + k);
        if (step + k < span_keys) {
          load_lane_dims<Lanes>(kv.keys + offset, lane, head_dim, k_part[k]);
          load_lane_dims<Lanes>(kv.values + offset, lane, head_dim, v_part[k]);
        } else {
#pragma unroll
          for (int x = 0; x < kDims; ++x) k_part[k][x] = v_part[k][x] = 0.0f;
        }
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        if (g >= heads) break;  // uniform across the block
        float score[kKeysPerStep];
        float step_max = running_max[g];
#pragma unroll
        for (int k = 0; k < kKeysPerStep; ++k) {
          float partial = 0.0f;
#pragma unroll
          for (int x = 0; x < kDims; ++x) partial = fmaf(q_part[g][x], k_part[k][x], partial);
          // Every lane takes part in the butterfly; then a key past the
          // span's end scores -inf: weight 2^-inf = 0. Key 0 of a step is
          // always valid, so step_max is finite from here on.
          const float dot = warp_sum(partial);
          score[k] = step + k < span_keys ? dot : -INFINITY;
          step_max = fmaxf(step_max, score[k]);
        }
        // Rescale what was accumulated relative to the old max (0 for the
        // warp's first step, where running_max = -inf), then add the step.
        const float rescale = exp2f(running_max[g] - step_max);
        float step_sum = 0.0f;
#pragma unroll
        for (int x = 0; x < kDims; ++x) accumulator[g][x] *= rescale;
#pragma unroll
        for (int k = 0; k < kKeysPerStep; ++k) {
          const float weight = exp2f(score[k] - step_max);
          step_sum += weight;
#pragma unroll
          for (int x = 0; x < kDims; ++x) accumulator[g][x] = fmaf(weight, v_part[k][x], accumulator[g][x]);
        }
        running_sum[g] = running_sum[g] * rescale + step_sum;
        running_max[g] = step_max;
      }
    }
  }

  // Merge the 4 warps. A warp that saw no key has m = -inf, l = 0, o = 0: weight 0.
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    if (lane == 0) {
      warp_max[warp][g] = running_max[g];
      warp_sum_of_weights[warp][g] = running_sum[g];
    }
#pragma unroll
    for (int x = 0; x < kDims; ++x) warp_accumulator[warp][g][lane_dim<Lanes>(lane, x)] = accumulator[g][x];
  }
  __syncthreads();  // every warp's state is in shared memory
  const bool single_partition = gridDim.x == 1;
  for (int index = static_cast<int>(threadIdx.x); index < heads * head_dim; index += kThreads) {
    const int g = index / head_dim, d = index % head_dim;
    float block_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) block_max = fmaxf(block_max, warp_max[w][g]);
    float sum = 0.0f, value = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float weight = exp2f(warp_max[w][g] - block_max);  // block_max is finite: the partition has keys
      sum += weight * warp_sum_of_weights[w][g];
      value += weight * warp_accumulator[w][g][d];
    }
    const int h = first_head + g;
    if (single_partition) {
      // The partition is the whole sequence: normalize and write the output.
      out[(static_cast<std::size_t>(q_row) * shape.n_heads + h) * head_dim + d] = value / sum;
    } else {
      const std::size_t slot = (static_cast<std::size_t>(query) * shape.n_heads + h) * gridDim.x + partition;
      partials.o[slot * head_dim + d] = value;
      if (d == 0) {
        partials.ml[slot * 2 + 0] = block_max;
        partials.ml[slot * 2 + 1] = sum;
      }
    }
  }
}

// Kernel 2. Grid (n_heads, n_queries); threads split the head's dims.
template <class Queries>
__global__ void merge_kernel(llm::AttentionShape shape, Queries queries, int partitions, int partition_keys,
                             Partials partials, float* __restrict__ out) {
  const int h = static_cast<int>(blockIdx.x), query = static_cast<int>(blockIdx.y);
  const int head_dim = shape.head_dim;
  // Only the partitions this query's keys reach were written.
  const int used = min(partitions, ceil_div(queries.length(query), partition_keys));
  const std::size_t first = (static_cast<std::size_t>(query) * shape.n_heads + h) * partitions;
  float global_max = -INFINITY;
  for (int p = 0; p < used; ++p) global_max = fmaxf(global_max, partials.ml[(first + p) * 2]);
  float* out_head = out + (static_cast<std::size_t>(queries.row(query)) * shape.n_heads + h) * head_dim;
  for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += static_cast<int>(blockDim.x)) {
    float sum = 0.0f, value = 0.0f;
    for (int p = 0; p < used; ++p) {
      const float weight = exp2f(partials.ml[(first + p) * 2] - global_max);
      sum += weight * partials.ml[(first + p) * 2 + 1];
      value += weight * partials.o[(first + p) * head_dim + d];
    }
    out_head[d] = value / sum;
  }
}

// --- Host side.


void check_shape(const char* name, const llm::AttentionShape& s) {
  if (s.head_dim <= 0 || s.head_dim > kMaxHeadDim)
    throw llm::InputError(std::string(name) + ": head_dim " + std::to_string(s.head_dim) + " outside 1.." +
                          std::to_string(kMaxHeadDim));
  if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0)
    throw llm::InputError(std::string(name) + ": bad attention heads: " + std::to_string(s.n_heads) +
                          " query heads, " + std::to_string(s.n_kv_heads) + " KV heads");
}

void check_view(const char* name, const llm::AttentionShape& s, const llm::KvView& kv) {
  if (kv.element != llm::KvElement::Float32)
    throw llm::InputError(std::string(name) + " reads fp32 K/V; this view stores int8 rows");
  if (kv.kv_dim != s.n_kv_heads * s.head_dim)
    throw llm::InputError(std::string(name) + ": the view's rows hold " + std::to_string(kv.kv_dim) +
                          " floats, the shape needs n_kv_heads * head_dim = " +
                          std::to_string(s.n_kv_heads * s.head_dim));
  if (kv.block_size <= 0 || kv.block_table == nullptr || kv.keys == nullptr || kv.values == nullptr)
    throw llm::InputError(std::string(name) + ": the view has no block table, no pools or a block size < 1");
}

// Whether a view's pools allow the float4 (head_dim 128) or float2 (64)
// loads: every row offset is a multiple of head_dim floats, so the pools'
// base addresses decide.
bool vector_loads_fit(const llm::KvView& kv, int head_dim) {
  const std::uintptr_t bytes = head_dim == 128 ? 16 : head_dim == 64 ? 8 : 1;
  return reinterpret_cast<std::uintptr_t>(kv.keys) % bytes == 0 &&
         reinterpret_cast<std::uintptr_t>(kv.values) % bytes == 0;
}

template <class Lanes, class Rows, class Queries>
void launch_with(const char* name, const llm::AttentionShape& shape, const float* q, const Queries& queries,
                 int n_queries, int max_length, float* out, float* workspace, cudaStream_t stream) {
  constexpr int kGroup = Lanes::kGroupTile;
  const PartitionPlan plan = paged_decode_partitions(shape, n_queries, max_length);
  const int group_chunks = ceil_div(shape.n_heads / shape.n_kv_heads, kGroup);
  if (static_cast<long long>(shape.n_kv_heads) * group_chunks > kMaxGridYZ)
    throw llm::InputError(std::string(name) + ": more than 65535 (KV head, query-head chunk) pairs");
  Partials partials{nullptr, nullptr};
  if (plan.partitions > 1) {
    if (workspace == nullptr)
      throw llm::InputError(std::string(name) + ": needs a workspace of " +
                            std::to_string(paged_decode_workspace_floats(shape, n_queries, max_length)) + " floats");
    partials.o = workspace;
    partials.ml = workspace + static_cast<std::size_t>(n_queries) * shape.n_heads * plan.partitions * shape.head_dim;
  }
  const float q_scale = kLog2e / std::sqrt(static_cast<float>(shape.head_dim));
  const dim3 grid(static_cast<unsigned>(plan.partitions), static_cast<unsigned>(shape.n_kv_heads * group_chunks),
                  static_cast<unsigned>(n_queries));
  partition_kernel<Lanes, Rows, Queries><<<grid, kThreads, 0, stream>>>(shape, q, queries, plan.partition_keys,
                                                                           group_chunks, q_scale, partials, out);
  LLM_CUDA_CHECK_LAUNCH();
  if (plan.partitions > 1) {
    // One thread per dim (at least a warp, at most 256 threads).
    const int threads = std::min(kMaxHeadDim, ceil_div(shape.head_dim, kWarpSize) * kWarpSize);
    merge_kernel<Queries><<<dim3(static_cast<unsigned>(shape.n_heads), static_cast<unsigned>(n_queries)), threads, 0,
                            stream>>>(shape, queries, plan.partitions, plan.partition_keys, partials, out);
    LLM_CUDA_CHECK_LAUNCH();
  }
}

// Picks the compiled lane layout: the vector loads for head_dim 64 and 128
// when the pools are aligned for them, else the narrow (<= 32) or wide one.
template <class Rows, class Queries>
void launch(const char* name, const llm::AttentionShape& shape, const float* q, const Queries& queries,
            int n_queries, int max_length, bool vector_loads, float* out, float* workspace, cudaStream_t stream) {
  if (shape.head_dim == 128 && vector_loads)
    launch_with<Float4Lanes, Rows>(name, shape, q, queries, n_queries, max_length, out, workspace, stream);
  else if (shape.head_dim == 64 && vector_loads)
    launch_with<Float2Lanes, Rows>(name, shape, q, queries, n_queries, max_length, out, workspace, stream);
  else if (shape.head_dim <= NarrowLanes::kRowFloats)
    launch_with<NarrowLanes, Rows>(name, shape, q, queries, n_queries, max_length, out, workspace, stream);
  else
    launch_with<WideLanes, Rows>(name, shape, q, queries, n_queries, max_length, out, workspace, stream);
}

template <class Rows>
void decode_attention(const char* name, const llm::AttentionShape& shape, const float* q,
                      const llm::cuda::kernels::DecodeQueries& queries, float* out, float* workspace,
                      cudaStream_t stream) {
  check_shape(name, shape);
  if (queries.n_queries <= 0) return;
  if (queries.n_queries > kMaxGridYZ)
    throw llm::InputError(std::string(name) + ": " + std::to_string(queries.n_queries) +
                          " queries in one launch, at most 65535");
  if (queries.views == nullptr || queries.lengths == nullptr || queries.views_host == nullptr ||
      queries.lengths_host == nullptr)
    throw llm::InputError(std::string(name) + ": needs the views and lengths in device and host memory");
  // The host copies are checked here, so the kernel can trust every view and length.
  bool vector_loads = true;
  for (int i = 0; i < queries.n_queries; ++i) {
    const llm::KvView& kv = queries.views_host[i];
    const int length = queries.lengths_host[i];
    check_view(name, shape, kv);
    if (length < 1 || length > queries.max_length)
      throw llm::InputError(std::string(name) + ": query " + std::to_string(i) + " has length " +
                            std::to_string(length) + ", outside 1..max_length " + std::to_string(queries.max_length));
    if (std::is_same_v<Rows, ContiguousRows> && kv.block_size < length)
      throw llm::InputError(std::string(name) + ": query " + std::to_string(i) + "'s view has blocks of " +
                            std::to_string(kv.block_size) + " positions, fewer than its " + std::to_string(length) +
                            " keys: not a contiguous view (use paged_decode_attention)");
    vector_loads = vector_loads && vector_loads_fit(kv, shape.head_dim);
  }
  const DecodeQuerySource source{queries.views, queries.lengths, queries.rows};
  launch<Rows>(name, shape, q, source, queries.n_queries, queries.max_length, vector_loads, out, workspace, stream);
}

}  // namespace

PartitionPlan paged_decode_partitions(const llm::AttentionShape& shape, int n_queries, int max_length) {
  if (n_queries <= 0 || max_length <= 0) return {1, kPartitionUnit};
  // As many partitions as bring the launch to ~kWantedBlocksPerSm blocks per
  // SM, but none shorter than kMinPartitionKeys. On an H100 (132 SMs) with 8
  // KV heads: batch 1 at 32k keys gets 128 partitions of 256 keys (1024
  // blocks); batch 16 at 32k 9 of 3648 (1152 blocks); batch 1 at 1k 8 of 128.
  const long long base_blocks = static_cast<long long>(std::max(shape.n_kv_heads, 1)) * n_queries;
  const long long wanted_blocks = static_cast<long long>(kWantedBlocksPerSm) * llm::cuda::sm_count();
  const int by_occupancy = static_cast<int>(std::max(1LL, (wanted_blocks + base_blocks - 1) / base_blocks));
  const int by_length = std::max(1, max_length / kMinPartitionKeys);
  const int wanted = std::min({by_occupancy, by_length, kMaxPartitions});
  // Round each partition up to the unit; that may leave fewer partitions.
  PartitionPlan plan;
  plan.partition_keys = ceil_div(ceil_div(max_length, wanted), kPartitionUnit) * kPartitionUnit;
  plan.partitions = ceil_div(max_length, plan.partition_keys);
  return plan;
}

std::size_t paged_decode_workspace_floats(const llm::AttentionShape& shape, int n_queries, int max_length) {
  const PartitionPlan plan = paged_decode_partitions(shape, n_queries, max_length);
  if (plan.partitions <= 1) return 0;  // the partition kernel writes the output itself
  return static_cast<std::size_t>(n_queries) * shape.n_heads * plan.partitions *
         (static_cast<std::size_t>(shape.head_dim) + 2);
}

void paged_decode_attention(const llm::AttentionShape& shape, const float* q,
                            const llm::cuda::kernels::DecodeQueries& queries, float* out, float* workspace,
                            cudaStream_t stream) {
  decode_attention<PagedRows>("paged_decode_attention", shape, q, queries, out, workspace, stream);
}

void contiguous_decode_attention(const llm::AttentionShape& shape, const float* q,
                                 const llm::cuda::kernels::DecodeQueries& queries, float* out, float* workspace,
                                 cudaStream_t stream) {
  decode_attention<ContiguousRows>("contiguous_decode_attention", shape, q, queries, out, workspace, stream);
}

std::size_t paged_prefill_workspace_floats(const llm::AttentionShape& shape, int n_past, int n_new) {
  return paged_decode_workspace_floats(shape, n_new, n_past + n_new);
}

void paged_prefill_attention(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past,
                             int n_new, float* out, float* workspace, cudaStream_t stream) {
  const char* name = "paged_prefill_attention";
  check_shape(name, shape);
  check_view(name, shape, kv);
  if (n_past < 0 || n_new < 0)
    throw llm::InputError(std::string(name) + ": n_past " + std::to_string(n_past) + ", n_new " +
                          std::to_string(n_new) + " (both must be >= 0)");
  if (n_new == 0) return;
  if (n_new > kMaxGridYZ)
    throw llm::InputError(std::string(name) + ": " + std::to_string(n_new) + " prompt rows in one call, at most 65535");
  // Each prompt row is a decode query of its own over the same view. So K/V
  // are read once per row (mostly from L2: neighbouring rows read the same
  // blocks at about the same time), n_new times in all. A tiled prefill
  // kernel (step 02's FlashAttention) loads each K/V tile once for a whole
  // block of query rows and does the products on tensor cores; prefill is
  // compute bound, decode is not. Here prefill is the rare phase (one call
  // per prompt, then one decode per token) and the point of the step is the
  // block table, so one kernel serving both keeps the paged logic in one place.
  launch<PagedRows>(name, shape, q, PrefillQuerySource{kv, n_past}, n_new, n_past + n_new,
                    vector_loads_fit(kv, shape.head_dim), out, workspace, stream);
}

llm::cuda::CudaAttentionKernels paged_cuda_attention() {
  llm::cuda::CudaAttentionKernels kernels;
  kernels.prefill = &paged_prefill_attention;
  kernels.prefill_workspace = &paged_prefill_workspace_floats;
  kernels.decode = &paged_decode_attention;
  kernels.decode_workspace = &paged_decode_workspace_floats;
  return kernels;
}

}  // namespace step05::cuda
