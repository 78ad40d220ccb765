// The CUDA model's decode attention (declared in split_kv_decode_attention.cuh).
//
// Decode is memory bound: each query row is one vector per head, and every
// byte of K and V it attends to is used once per query head. Three ideas of
// the course make it fast, and this kernel combines them:
//
// 1. Split-KV (Flash-Decoding, step 02's v6_cuda_split_kv_decode.cu). One
//    thread block per (query, head) walking every key serially leaves most
//    of a GPU idle at batch 1 and makes time grow with the context. Instead
//    the keys of each query are cut into `splits` ranges, one thread block
//    each, running the online softmax over its range:
//      kernel 1 (split kernel), grid (splits, KV heads x head chunks, queries):
//        block (s, g, i) writes a PARTIAL (m_s, l_s, o_s) per query head:
//        m_s the largest score of its keys, l_s = sum 2^(score - m_s),
//        o_s = sum 2^(score - m_s) v (unnormalized);
//      kernel 2 (merge kernel), grid (query heads, queries):
//        M = max_s m_s,  l = sum_s 2^(m_s - M) l_s,  out = sum_s 2^(m_s - M) o_s / l
//      With one split, kernel 1 normalizes and writes `out` itself and
//      kernel 2 is not launched: short contexts cost one launch.
// 2. The group-aware read (step 03's cuda_gqa_attention.cu). With GQA the
//    `group` query heads of a KV head read the same K and V rows. A block
//    serves one KV head and (up to 8 of) its query heads: each K/V row is
//    loaded into registers once and used for every head of the group, so
//    the bytes read are those of the KV heads, not of the query heads.
// 3. One block-table lookup per cache block (step 05's cuda_paged_attention.cu).
//    A cache (KvView) is a block table over a pool of blocks of block_size
//    rows: position p is row table[p / B] * B + p % B. A block walks its key
//    range cache block by cache block: one table read gives the first row of
//    the block, the keys inside follow it. A contiguous cache is one block
//    of `capacity` rows: one lookup per split.
//
// CUDA graphs: the split depends only on a power-of-two bucket of
// max_length (split_kv_decode_split), and each query's view, length and row
// are read inside the kernels from the device arrays, so a captured launch
// stays right while the lengths change within the bucket. A split past a
// query's length is empty: it writes the partial (m = -inf, l = 0, o = 0),
// which the merge weighs 0 (split 0 of a query with >= 1 key is never empty).
//
// The softmax runs in the log2 domain: q is multiplied once by
// log2(e) / sqrt(head_dim), so 2^(q.k * log2(e) / sqrt(d)) = e^(q.k / sqrt(d))
// and every exponential is an exp2f (m is in log2 units throughout, in both
// kernels). All arithmetic is fp32.
#include "split_kv_decode_attention.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "llm/cuda/cuda_check.hpp"
#include "llm/errors.hpp"

namespace llm::cuda::kernels {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarpMask = 0xffffffffu;
// 4 warps (128 threads) per split block. Each warp runs its own online
// softmax over every 4th group of keys of the split, so the warps never wait
// for each other inside the key loop (no per-key __syncthreads); they meet
// once, at the end, to merge 4 states through shared memory. 4 is few enough
// for that merge to be cheap and for 3 blocks (12 warps) to fit an SM's
// registers (kMinBlocksPerSm), and enough that the smallest split (128 keys)
// still gives every warp 32 keys.
constexpr int kWarpsPerBlock = 4;
constexpr int kThreadsPerBlock = kWarpsPerBlock * kWarpSize;
// The register budget: at least 3 blocks of 128 threads per SM caps ptxas at
// 65536 / (3 x 128) = 170 registers per thread. ptxas (CUDA 13, sm_90) then
// uses 168 at head_dim 128 with 8 heads per block, 90..161 for the other
// layouts, without spills; left free it took up to 255 (2 blocks per SM) and
// spilled in some layouts. 12 warps per SM, each with the K and V rows of 4
// keys in flight (4 KiB at head_dim 128), keep ~48 KiB of loads in flight
// per SM, above the ~20 KiB an H100's bandwidth x latency asks of each SM.
constexpr int kMinBlocksPerSm = 3;
// A split covers at least 128 keys. Each split costs a fixed amount beyond
// its keys: loading the query, merging 4 warps, writing head_dim + 2 floats
// per query head that the merge kernel reads back. At 128 keys that is about
// 2% of the K/V bytes the split reads (head_dim 128: 128 keys x 2 x 512 B =
// 128 KiB against ~8 x 520 B of partials for a group of 8), and 128 keys
// still fill every warp's key loop (32 keys each). Measured on an H100
// (fp32, 32 query heads, head_dim 64 and 128, groups 1, 4, 8): 64 keys was
// faster at batch 1 for 256..1024 keys (fewer keys per warp, shorter
// chains), but 10-20% slower at batch 16..64 and at batch 1 with 4096 keys
// (twice the partials to write and merge).
constexpr int kMinKeysPerSplit = 128;
// The smallest bucket: every max_length up to 128 gets the same launch (one
// split, one kernel), so a graph captured at position 1 replays up to 128.
constexpr int kSmallestBucket = kMinKeysPerSplit;
// At most 128 splits: 16k keys at the minimum split length. With 8 KV heads
// that is 1024 blocks for a single query, ~8 per SM of an H100 (132 SMs),
// enough to pull its bandwidth; more splits would only add partials. Longer
// contexts get longer splits instead (32k keys: 128 splits of 256).
constexpr int kMaxSplits = 128;
// The largest bucket: 2^30 keys, far beyond any cache, keeps the bucket
// arithmetic inside int.
constexpr int kLargestBucket = 1 << 30;
// Query heads per block: up to 8, which covers the GQA groups of Llama 3 (4),
// Mistral (4), Qwen2 (7) and 70B-class models (8) in one block; a larger group
// (MQA) is cut into chunks of 8 heads, each chunk a block of its own (it
// reads the same K/V rows again, mostly from L2). Each head costs
// 2 * kDimsPerLane registers (its query dims and its accumulator), so
// head_dim 256 (8 dims per lane) takes 4 heads per block to stay within the
// registers of the others.
constexpr int kMaxHeadsPerBlock = 8;
constexpr int max_heads_per_block(int dims_per_lane) { return dims_per_lane <= 4 ? kMaxHeadsPerBlock : 4; }
// Grid dimensions y and z are limited to 65535 by CUDA.
constexpr int kMaxGridYZ = 65535;
constexpr float kLog2e = 1.4426950408889634f;

static_assert(kMinKeysPerSplit % (kWarpsPerBlock * kWarpSize) == 0, "the smallest split gives every warp whole spans");
static_assert((kMinKeysPerSplit & (kMinKeysPerSplit - 1)) == 0 && (kMaxSplits & (kMaxSplits - 1)) == 0,
              "powers of two: keys_per_split = bucket / splits is exact");

// How a warp holds one head of a K or V row, and how many query heads a
// block serves. Lane l holds dims l, l + 32, ..., l + 32 (kDimsPerLane - 1):
// a warp reads a row as kDimsPerLane loads of 32 consecutive elements
// (coalesced: 128 bytes per fp32 load), any head_dim works (a lane's dims
// past head_dim read as 0), and no alignment is needed beyond the element's.
// One layout per range of head_dim, chosen from the shape alone:
//   head_dim  1..32  1 dim per lane  (the tiny model's 8: lanes 8..31 idle)
//   head_dim 33..64  2               (64)
//   head_dim 65..128 4               (128)
//   head_dim 129..256 8              (256)
// Each warp loads the K and V rows of kKeysPerWarpStep keys before using
// them, so several loads are in flight per warp: 4 keys (head_dim 128:
// 8 loads of 4 KiB in all per warp step), 2 at 8 dims per lane, which keeps
// the staging registers (keys x dims x 2) at 32.
template <int kDimsPerLane_, int kHeadsPerBlock_>
struct LaneLayout {
  static constexpr int kDimsPerLane = kDimsPerLane_;
  static constexpr int kHeadsPerBlock = kHeadsPerBlock_;
  static constexpr int kHeadFloats = kDimsPerLane * kWarpSize;  // the largest head_dim it covers
  static constexpr int kKeysPerWarpStep = kDimsPerLane <= 4 ? 4 : 2;
  static constexpr int kKeysPerBlockStep = kKeysPerWarpStep * kWarpsPerBlock;
  static_assert(kHeadsPerBlock >= 1 && kHeadsPerBlock <= max_heads_per_block(kDimsPerLane));
};

__device__ __forceinline__ float warp_sum(float value) {
  // Butterfly: afterwards every lane holds the sum of all 32.
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullWarpMask, value, offset);
  return value;
}

// --- Reading one KV head of a cached row, per element type. A new element
// (fp16, ...) is one more specialization and one more branch in split_kernel.
//
// load(): this lane's dims of KV head `kv_head` in pool row `row` of K and
// of V, as floats, and the factor each must be multiplied by (the int8
// scales; 1 for fp32). Dims past head_dim are 0.
template <KvElement kElement>
struct CachedHead;

template <>
struct CachedHead<KvElement::Float32> {
  const float* keys;
  const float* values;
  std::size_t row_floats;   // kv_dim: floats from one pool row to the next
  std::size_t head_offset;  // kv_head * head_dim: the head's first float in a row
  int head_dim;

  __device__ CachedHead(const KvView& view, int kv_head, int head_dim_)
      : keys(view.keys),
        values(view.values),
        row_floats(static_cast<std::size_t>(view.kv_dim)),
        head_offset(static_cast<std::size_t>(kv_head) * head_dim_),
        head_dim(head_dim_) {}

  template <int kDims>
  __device__ __forceinline__ void load(std::size_t row, int lane, float (&key)[kDims], float (&value)[kDims],
                                       float& key_scale, float& value_scale) const {
    const std::size_t first = row * row_floats + head_offset;
#pragma unroll
    for (int x = 0; x < kDims; ++x) {
      const int dim = lane + x * kWarpSize;
      key[x] = dim < head_dim ? __ldg(keys + first + dim) : 0.0f;
      value[x] = dim < head_dim ? __ldg(values + first + dim) : 0.0f;
    }
    key_scale = 1.0f;
    value_scale = 1.0f;
  }
};

// Int8: value = int8 * scale, one scale per (position, KV head), as
// store_int8_head (llm/kv_int8.hpp) wrote them. The scale is applied once
// per key (to the dot product, and to the key's softmax weight) instead of
// once per element.
template <>
struct CachedHead<KvElement::Int8> {
  const std::int8_t* keys;
  const std::int8_t* values;
  const float* key_scales;
  const float* value_scales;
  std::size_t row_elements;  // kv_dim
  std::size_t head_offset;   // kv_head * head_dim
  int scales_per_row;        // KV heads: kv_dim / the view's head_dim (KvView::key_row_scales)
  int kv_head;
  int head_dim;

  __device__ CachedHead(const KvView& view, int kv_head_, int head_dim_)
      : keys(view.keys_int8),
        values(view.values_int8),
        key_scales(view.key_scales),
        value_scales(view.value_scales),
        row_elements(static_cast<std::size_t>(view.kv_dim)),
        head_offset(static_cast<std::size_t>(kv_head_) * head_dim_),
        scales_per_row(view.kv_dim / view.head_dim),
        kv_head(kv_head_),
        head_dim(head_dim_) {}

  template <int kDims>
  __device__ __forceinline__ void load(std::size_t row, int lane, float (&key)[kDims], float (&value)[kDims],
                                       float& key_scale, float& value_scale) const {
    const std::size_t first = row * row_elements + head_offset;
#pragma unroll
    for (int x = 0; x < kDims; ++x) {
      const int dim = lane + x * kWarpSize;
      key[x] = dim < head_dim ? static_cast<float>(__ldg(keys + first + dim)) : 0.0f;
      value[x] = dim < head_dim ? static_cast<float>(__ldg(values + first + dim)) : 0.0f;
    }
    const std::size_t scale_index = row * static_cast<std::size_t>(scales_per_row) + kv_head;
    key_scale = __ldg(key_scales + scale_index);
    value_scale = __ldg(value_scales + scale_index);
  }
};

// Everything the split kernel takes: the shape, the split, device pointers.
struct SplitKernelArgs {
  AttentionShape shape;
  const float* q;        // [batch rows, n_heads, head_dim]
  const KvView* views;   // [n_queries] device memory
  const int* lengths;    // [n_queries] device memory
  const int* rows;       // [n_queries] device memory, or null: query i is row i
  int keys_per_split;
  int head_chunks;       // blocks per KV head: ceil(group / heads per block)
  float q_scale_log2;    // log2(e) / sqrt(head_dim)
  float* out;            // [batch rows, n_heads, head_dim]; written when there is one split
  // The workspace, used when there are several splits (slot = (query, head, split)):
  float* partial_outputs;  // [n_queries, n_heads, splits, head_dim] o_s, unnormalized
  float* partial_stats;    // [n_queries, n_heads, splits, 2] (m_s in log2 units, l_s)
};

// Each warp's final state, for the merge of the block's warps.
// 4 warps x 8 heads x 128 floats x 4 B = 16 KiB of accumulators at head_dim
// 128 (16 KiB at 256 with 4 heads; less for the narrower layouts).
template <class Lanes>
struct WarpStates {
  float running_max[kWarpsPerBlock][Lanes::kHeadsPerBlock];
  float running_sum[kWarpsPerBlock][Lanes::kHeadsPerBlock];
  float accumulator[kWarpsPerBlock][Lanes::kHeadsPerBlock][Lanes::kHeadFloats];
};

// The body of block (split, KV head x chunk, query) for one element type.
template <class Lanes, KvElement kElement>
__device__ __forceinline__ void attend_split(const SplitKernelArgs& args, const KvView& view,
                                             WarpStates<Lanes>& states) {
  constexpr int kDims = Lanes::kDimsPerLane;
  constexpr int kHeads = Lanes::kHeadsPerBlock;
  constexpr int kKeys = Lanes::kKeysPerWarpStep;

  const int split = static_cast<int>(blockIdx.x);
  const int splits = static_cast<int>(gridDim.x);
  const int kv_head = static_cast<int>(blockIdx.y) / args.head_chunks;
  const int chunk = static_cast<int>(blockIdx.y) % args.head_chunks;
  const int query = static_cast<int>(blockIdx.z);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int head_dim = args.shape.head_dim;
  const int n_heads = args.shape.n_heads;
  const int group = n_heads / args.shape.n_kv_heads;
  const int first_head = kv_head * group + chunk * kHeads;  // a KV head's query heads are adjacent
  const int block_heads = min(kHeads, group - chunk * kHeads);  // 1..kHeads query heads in this block

  const int length = args.lengths[query];
  const int batch_row = args.rows != nullptr ? args.rows[query] : query;
  const int begin = split * args.keys_per_split;
  const int end = min(begin + args.keys_per_split, length);  // <= begin: an empty split

  // This lane's dims of the block's query heads, in log2 units, and the
  // running state of each: max score, sum of weights, weighted sum of V.
  float query_dims[kHeads][kDims];
  float running_max[kHeads], running_sum[kHeads], accumulator[kHeads][kDims];
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    // Heads past block_heads (a group smaller than the layout's) stay zero and unused.
    const int head = first_head + min(g, block_heads - 1);
    const float* query_head = args.q + (static_cast<std::size_t>(batch_row) * n_heads + head) * head_dim;
#pragma unroll
    for (int x = 0; x < kDims; ++x) {
      const int dim = lane + x * kWarpSize;
      query_dims[g][x] = g < block_heads && dim < head_dim ? query_head[dim] * args.q_scale_log2 : 0.0f;
      accumulator[g][x] = 0.0f;
    }
    running_max[g] = -INFINITY;
    running_sum[g] = 0.0f;
  }

  const CachedHead<kElement> cached(view, kv_head, head_dim);
  const int block_size = view.block_size;
  // Walk [begin, end) one cache block at a time: positions first..last-1 of
  // logical block b are rows physical * B + (p - b * B) of the pool. The next
  // block's table entry is read before this block's rows are, so the lookup
  // is in flight with them.
  int physical_block = begin < end ? view.block_table[begin / block_size] : 0;
  for (int first = begin; first < end;) {
    const int logical_block = first / block_size;
    const int last = min(end, (logical_block + 1) * block_size);
    const int next_physical_block = last < end ? view.block_table[last / block_size] : 0;
    const std::size_t block_first_row = static_cast<std::size_t>(physical_block) * block_size;
    const int block_first_position = logical_block * block_size;

    // The block's keys in steps of kKeysPerBlockStep; warp w takes keys
    // step + w * kKeys .. + kKeys - 1 of each step (its first is < last).
    for (int warp_first = first + warp * kKeys; warp_first < last; warp_first += Lanes::kKeysPerBlockStep) {
      // Load the K and V rows of the warp's keys first (all in flight at once).
      float key_dims[kKeys][kDims], value_dims[kKeys][kDims], key_scale[kKeys], value_scale[kKeys];
#pragma unroll
      for (int k = 0; k < kKeys; ++k) {
        const int position = warp_first + k;
        if (position < last) {  // the same for every lane: no divergence
          const std::size_t row = block_first_row + static_cast<std::size_t>(position - block_first_position);
          cached.template load<kDims>(row, lane, key_dims[k], value_dims[k], key_scale[k], value_scale[k]);
        } else {
#pragma unroll
          for (int x = 0; x < kDims; ++x) key_dims[k][x] = value_dims[k][x] = 0.0f;
          key_scale[k] = value_scale[k] = 0.0f;
        }
      }
      // ... then use every row for every query head of the block.
#pragma unroll
      for (int g = 0; g < kHeads; ++g) {
        if (g >= block_heads) continue;  // uniform across the block
        float scores[kKeys];
        float step_max = running_max[g];
#pragma unroll
        for (int k = 0; k < kKeys; ++k) {
          float partial = 0.0f;
#pragma unroll
          for (int x = 0; x < kDims; ++x) partial = fmaf(query_dims[g][x], key_dims[k][x], partial);
          // Every lane takes part in the butterfly; a key past `last` then
          // scores -inf (weight 2^-inf = 0). Key 0 of the step is valid, so
          // step_max is finite from here on.
          const float dot = warp_sum(partial) * key_scale[k];
          scores[k] = warp_first + k < last ? dot : -INFINITY;
          step_max = fmaxf(step_max, scores[k]);
        }
        // Rescale what was accumulated against the old max (by 0 on the
        // warp's first step, where running_max = -inf), then add the step.
        const float rescale = exp2f(running_max[g] - step_max);
        float step_sum = 0.0f;
#pragma unroll
        for (int x = 0; x < kDims; ++x) accumulator[g][x] *= rescale;
#pragma unroll
        for (int k = 0; k < kKeys; ++k) {
          const float weight = exp2f(scores[k] - step_max);
          step_sum += weight;
          const float value_weight = weight * value_scale[k];
#pragma unroll
          for (int x = 0; x < kDims; ++x) accumulator[g][x] = fmaf(value_weight, value_dims[k][x], accumulator[g][x]);
        }
        running_sum[g] = running_sum[g] * rescale + step_sum;
        running_max[g] = step_max;
      }
    }
    first = last;
    physical_block = next_physical_block;
  }

  // Merge the warps' states. A warp that saw no key has (-inf, 0, 0).
#pragma unroll
  for (int g = 0; g < kHeads; ++g) {
    if (lane == 0) {
      states.running_max[warp][g] = running_max[g];
      states.running_sum[warp][g] = running_sum[g];
    }
#pragma unroll
    for (int x = 0; x < kDims; ++x) states.accumulator[warp][g][lane + x * kWarpSize] = accumulator[g][x];
  }
  __syncthreads();  // every warp's state is in shared memory (the only barrier of the kernel)

  for (int index = static_cast<int>(threadIdx.x); index < block_heads * head_dim; index += kThreadsPerBlock) {
    const int g = index / head_dim, dim = index % head_dim;
    float block_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarpsPerBlock; ++w) block_max = fmaxf(block_max, states.running_max[w][g]);
    // An empty split (no warp saw a key) has block_max = -inf: measure the
    // weights from 0 instead, so each is 2^-inf = 0 rather than 2^NaN, and
    // the split's partial is (m = -inf, l = 0, o = 0).
    const float reference_max = block_max == -INFINITY ? 0.0f : block_max;
    float sum = 0.0f, value = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      const float weight = exp2f(states.running_max[w][g] - reference_max);
      sum += weight * states.running_sum[w][g];
      value += weight * states.accumulator[w][g][dim];
    }
    const int head = first_head + g;
    if (splits == 1) {
      // The split is the whole sequence: normalize and write the output (a
      // query with no key at all, which callers never pass, gets zeros).
      args.out[(static_cast<std::size_t>(batch_row) * n_heads + head) * head_dim + dim] =
          sum > 0.0f ? value / sum : 0.0f;
    } else {
      const std::size_t slot = (static_cast<std::size_t>(query) * n_heads + head) * splits + split;
      args.partial_outputs[slot * head_dim + dim] = value;
      if (dim == 0) {
        args.partial_stats[slot * 2 + 0] = block_max;
        args.partial_stats[slot * 2 + 1] = sum;
      }
    }
  }
}

// Kernel 1. Grid (splits, n_kv_heads * head_chunks, n_queries), kThreadsPerBlock threads.
// The element type is read from the query's view (uniform across a block),
// so the launch does not depend on the host copies of the views.
template <class Lanes>
__global__ void __launch_bounds__(kThreadsPerBlock, kMinBlocksPerSm) split_kernel(SplitKernelArgs args) {
  __shared__ WarpStates<Lanes> states;
  const KvView view = args.views[blockIdx.z];  // a register copy: its fields are read for every cache block
  if (view.element == KvElement::Int8)
    attend_split<Lanes, KvElement::Int8>(args, view, states);
  else
    attend_split<Lanes, KvElement::Float32>(args, view, states);
}

// Kernel 2. Grid (n_heads, n_queries); one thread per dim of the head
// (blockDim = head_dim rounded up to whole warps). Every split of every
// query is read, the empty ones included (weight 2^(-inf - M) = 0), so the
// merge needs no lengths.
__global__ void merge_kernel(AttentionShape shape, const int* __restrict__ rows, int splits,
                             const float* __restrict__ partial_outputs, const float* __restrict__ partial_stats,
                             float* __restrict__ out) {
  const int head = static_cast<int>(blockIdx.x), query = static_cast<int>(blockIdx.y);
  const int dim = static_cast<int>(threadIdx.x);
  const int head_dim = shape.head_dim;
  if (dim >= head_dim) return;  // no barrier follows
  const std::size_t first_slot = (static_cast<std::size_t>(query) * shape.n_heads + head) * splits;
  float global_max = -INFINITY;
  for (int s = 0; s < splits; ++s) global_max = fmaxf(global_max, partial_stats[(first_slot + s) * 2]);
  float sum = 0.0f, value = 0.0f;
  if (global_max != -INFINITY) {  // else no split saw a key (a length of 0, which callers never pass)
    for (int s = 0; s < splits; ++s) {
      const float weight = exp2f(partial_stats[(first_slot + s) * 2] - global_max);
      sum += weight * partial_stats[(first_slot + s) * 2 + 1];
      value += weight * partial_outputs[(first_slot + s) * head_dim + dim];
    }
  }
  const int batch_row = rows != nullptr ? rows[query] : query;
  out[(static_cast<std::size_t>(batch_row) * shape.n_heads + head) * head_dim + dim] = sum > 0.0f ? value / sum : 0.0f;
}

// --- Host side.

void check_shape(const AttentionShape& shape) {
  if (shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim)
    throw InputError("split_kv_decode_attention: head_dim " + std::to_string(shape.head_dim) + " outside 1.." +
                     std::to_string(kMaxHeadDim));
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 ||
      shape.n_heads > kMaxGridYZ)
    throw InputError("split_kv_decode_attention: bad attention heads: " + std::to_string(shape.n_heads) +
                     " query heads, " + std::to_string(shape.n_kv_heads) + " KV heads");
}

// The host copies of the queries, when the caller passes them, against the
// shape: the kernels trust every view and length. Nothing read here reaches
// a launch.
void check_host_queries(const AttentionShape& shape, const DecodeQueries& queries) {
  if (queries.views_host == nullptr || queries.lengths_host == nullptr) return;
  for (int i = 0; i < queries.n_queries; ++i) {
    const KvView& view = queries.views_host[i];
    const int length = queries.lengths_host[i];
    const std::string which = "split_kv_decode_attention: query " + std::to_string(i);
    if (length < 1 || length > queries.max_length)
      throw InputError(which + " has length " + std::to_string(length) + ", outside 1..max_length " +
                       std::to_string(queries.max_length));
    if (view.kv_dim != shape.n_kv_heads * shape.head_dim)
      throw InputError(which + ": its view has rows of " + std::to_string(view.kv_dim) +
                       " values, the shape needs n_kv_heads * head_dim = " +
                       std::to_string(shape.n_kv_heads * shape.head_dim));
    // Int8 rows have one scale per view.head_dim values (KvView::key_row_scales).
    if (view.element == KvElement::Int8 && view.head_dim != shape.head_dim)
      throw InputError(which + ": its int8 view has scales per " + std::to_string(view.head_dim) +
                       " values, the shape's heads have " + std::to_string(shape.head_dim));
    if (view.block_size <= 0 || view.block_table == nullptr)
      throw InputError(which + ": its view has no block table or a block size below 1");
    const bool has_pools =
        view.element == KvElement::Float32
            ? view.keys != nullptr && view.values != nullptr
            : view.element == KvElement::Int8 && view.keys_int8 != nullptr && view.values_int8 != nullptr &&
                  view.key_scales != nullptr && view.value_scales != nullptr;
    if (!has_pools) throw InputError(which + ": its view has no K/V pools of its element type (fp32 or int8)");
  }
}

constexpr int ceil_div(int numerator, int denominator) { return (numerator + denominator - 1) / denominator; }

// The smallest power of two >= group, at most the layout's heads per block:
// a group of 3 runs in blocks of 4 heads, 12 (MQA-like) in 2 blocks of 8.
int heads_per_block(int group, int dims_per_lane) {
  const int cap = max_heads_per_block(dims_per_lane);
  int heads = 1;
  while (heads < group && heads < cap) heads *= 2;
  return heads;
}

template <int kDims, int kHeads>
void launch_split_kernel(const SplitKernelArgs& args, dim3 grid, cudaStream_t stream) {
  split_kernel<LaneLayout<kDims, kHeads>><<<grid, kThreadsPerBlock, 0, stream>>>(args);
  LLM_CUDA_CHECK_LAUNCH();
}

template <int kDims>
void launch_split_kernel_for(int heads, const SplitKernelArgs& args, dim3 grid, cudaStream_t stream) {
  switch (heads) {
    case 1: launch_split_kernel<kDims, 1>(args, grid, stream); return;
    case 2: launch_split_kernel<kDims, 2>(args, grid, stream); return;
    case 4: launch_split_kernel<kDims, 4>(args, grid, stream); return;
    default:
      if constexpr (max_heads_per_block(kDims) >= 8) {
        launch_split_kernel<kDims, 8>(args, grid, stream);
        return;
      }
  }
  throw InputError("split_kv_decode_attention: no kernel for " + std::to_string(heads) + " heads per block");
}

}  // namespace

DecodeSplit split_kv_decode_split(int max_length) {
  if (max_length > kLargestBucket)
    throw InputError("split_kv_decode_attention: max_length " + std::to_string(max_length) + " above 2^30");
  int bucket = kSmallestBucket;
  while (bucket < max_length) bucket *= 2;
  const int splits = std::clamp(bucket / kMinKeysPerSplit, 1, kMaxSplits);
  return {splits, bucket / splits};  // splits * keys_per_split = bucket >= max_length
}

std::size_t split_kv_decode_workspace_floats(const AttentionShape& shape, int n_queries, int max_length) {
  const DecodeSplit split = split_kv_decode_split(max_length);
  if (n_queries <= 0 || split.splits <= 1) return 0;  // one split writes out directly
  // partial_outputs [n_queries, n_heads, splits, head_dim] + partial_stats [n_queries, n_heads, splits, 2]
  return static_cast<std::size_t>(n_queries) * static_cast<std::size_t>(shape.n_heads) *
         static_cast<std::size_t>(split.splits) * (static_cast<std::size_t>(shape.head_dim) + 2);
}

void split_kv_decode_attention(const AttentionShape& shape, const float* q, const DecodeQueries& queries,
                               float* out, float* workspace, cudaStream_t stream) {
  check_shape(shape);
  const int n_queries = queries.n_queries;
  if (n_queries <= 0) return;
  if (n_queries > kMaxGridYZ)
    throw InputError("split_kv_decode_attention: " + std::to_string(n_queries) + " queries in one call, at most " +
                     std::to_string(kMaxGridYZ));
  if (queries.views == nullptr || queries.lengths == nullptr)
    throw InputError("split_kv_decode_attention: needs the views and lengths in device memory");
  if (queries.max_length < 1)
    throw InputError("split_kv_decode_attention: max_length " + std::to_string(queries.max_length) +
                     " (every query sees at least its own key)");
  check_host_queries(shape, queries);

  const int group = shape.n_heads / shape.n_kv_heads;
  const int dims_per_lane = shape.head_dim <= 32 ? 1 : shape.head_dim <= 64 ? 2 : shape.head_dim <= 128 ? 4 : 8;
  const int heads = heads_per_block(group, dims_per_lane);
  const int head_chunks = ceil_div(group, heads);
  if (static_cast<long long>(shape.n_kv_heads) * head_chunks > kMaxGridYZ)
    throw InputError("split_kv_decode_attention: more than 65535 (KV head, head chunk) blocks per split");

  const DecodeSplit split = split_kv_decode_split(queries.max_length);
  SplitKernelArgs args{};
  args.shape = shape;
  args.q = q;
  args.views = queries.views;
  args.lengths = queries.lengths;
  args.rows = queries.rows;
  args.keys_per_split = split.keys_per_split;
  args.head_chunks = head_chunks;
  args.q_scale_log2 = kLog2e / std::sqrt(static_cast<float>(shape.head_dim));
  args.out = out;
  if (split.splits > 1) {
    if (workspace == nullptr)
      throw InputError("split_kv_decode_attention: needs a workspace of " +
                       std::to_string(split_kv_decode_workspace_floats(shape, n_queries, queries.max_length)) +
                       " floats");
    args.partial_outputs = workspace;
    args.partial_stats =
        workspace + static_cast<std::size_t>(n_queries) * shape.n_heads * split.splits * shape.head_dim;
  }

  const dim3 grid(static_cast<unsigned>(split.splits), static_cast<unsigned>(shape.n_kv_heads * head_chunks),
                  static_cast<unsigned>(n_queries));
  switch (dims_per_lane) {
    case 1: launch_split_kernel_for<1>(heads, args, grid, stream); break;
    case 2: launch_split_kernel_for<2>(heads, args, grid, stream); break;
    case 4: launch_split_kernel_for<4>(heads, args, grid, stream); break;
    default: launch_split_kernel_for<8>(heads, args, grid, stream); break;
  }

  if (split.splits > 1) {
    // One thread per dim: head_dim rounded up to whole warps (32..256).
    const int merge_threads = ceil_div(shape.head_dim, kWarpSize) * kWarpSize;
    const dim3 merge_grid(static_cast<unsigned>(shape.n_heads), static_cast<unsigned>(n_queries));
    merge_kernel<<<merge_grid, merge_threads, 0, stream>>>(shape, queries.rows, split.splits, args.partial_outputs,
                                                           args.partial_stats, out);
    LLM_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace llm::cuda::kernels
