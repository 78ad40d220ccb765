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
//      the merge, per query head:
//        M = max_s m_s,  l = sum_s 2^(m_s - M) l_s,  out = sum_s 2^(m_s - M) o_s / l
//      The merge runs in the last split block of each (query, KV head,
//      head chunk) to finish, found with a ticket counter
//      (device::takes_last_ticket, with which the half GEMV adds its column
//      slices too, half_linear.cu): the split kernel
//      is the only launch. Without tickets (DecodeQueries::merge_tickets
//      null: the before row) it is kernel 2 (merge kernel), grid (query
//      heads, queries), the same arithmetic in the same order, so the same
//      bits. With one split, kernel 1 normalizes and writes `out` itself
//      and there is nothing to merge.
//      Why in the last block: at a long context every layer's attention
//      would otherwise be two launches, and the second one (a few KiB of
//      partials) costs what a launch costs; the last block finds the
//      partials in L2, written microseconds before.
// 2. The group-aware read (step 03's cuda_gqa_attention.cu). With GQA the
//    `group` query heads of a KV head read the same K and V rows. A block
//    serves one KV head and (up to 8 of) its query heads: each K/V row is
//    read from memory once, into shared memory, and used there by every
//    head of the block, so the bytes read are those of the KV heads, not of
//    the query heads.
// 3. One block-table lookup per cache block (step 05's cuda_paged_attention.cu).
//    A cache (KvView) is a block table over a pool of blocks of block_size
//    rows: position p is row table[p / B] * B + p % B. For each tile of keys
//    (below), the lane of the first key of each cache block among a warp's
//    keys reads the table and hands the entry to the lanes of the block's
//    other keys (a shuffle): one table read per cache block and tile (and
//    warp of keys); a contiguous cache is one block of `capacity` rows.
//
// Inside a block: tiles in shared memory. A split block (128 threads, 4
// warps) walks its keys in TILES of kTileKeys keys. For each tile:
//   load    the block copies the tile's K and V rows of its KV head into
//           shared memory, as floats (int8 codes converted; their per-key
//           scales go to two small arrays). Thread t loads elements t,
//           t + 128, ... of the tile in row order, so a warp reads 32
//           consecutive elements of a row at a time (coalesced).
//   scores  thread t computes whole dot products q_h . k_key for key
//           t % kTileKeys and some of the block's heads, from the K tile and
//           the block's query heads (in shared memory since the start,
//           pre-scaled by log2(e) / sqrt(head_dim)): no shuffles per key.
//   softmax one warp per head (2 heads per warp at 8 heads) takes the max and
//           the sum of the tile's scores of its head (one max and one sum
//           reduction per head and tile, not per key), updates that head's
//           running max and sum, and turns the scores into weights
//           p = 2^(score - new max) in place.
//   P.V     thread t owns some (head, dim) outputs in registers across tiles:
//           acc = acc * rescale + sum over the tile's keys of p * v[dim].
// Every K/V element is read from global memory once per block, and the
// dependent chains are whole dot products and per-dim sums, not 5-step
// shuffle reductions per (key, head) as in a warp-per-key layout.
// The next tile's block-table entries are read during the scores phase, so
// only the K/V loads of a tile (issued 16 elements per thread at a time)
// wait for memory; the other blocks of the SM run meanwhile.
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

#include "device_formulas.cuh"
#include "programmatic_launch.cuh"
#include "llm/cuda/cuda_check.hpp"
#include "llm/errors.hpp"

namespace llm::cuda::kernels {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarpMask = 0xffffffffu;
// 4 warps (128 threads) per split block: enough threads to load a tile with
// many loads in flight and to give every (head, key) score and every
// (head, dim) output a thread, few enough that the 4 barriers per tile are
// cheap.
constexpr int kWarpsPerBlock = 4;
constexpr int kThreadsPerBlock = kWarpsPerBlock * kWarpSize;
// The register budget: at least 4 blocks of 128 threads per SM caps ptxas at
// 65536 / (4 x 128) = 128 registers per thread, which most layouts use in
// full. ptxas (CUDA 13) fits them without spills (kLoadBatch), but for one
// layout no preset runs, since the last split block merges (the call to
// merge_block_heads): head_dim 256 with 8 heads per block, on sm_75 only
// (12 bytes). Shared memory (at most ~42 KiB per block, SharedTile) allows 5
// blocks per SM.
constexpr int kMinBlocksPerSm = 4;
// A split covers at least 64 keys: one tile at head_dim <= 64 (TinyLlama's
// 64), 2 at 128, 4 at 256. Each split costs a fixed amount beyond its keys:
// loading the query heads, the first tile's memory latency, writing
// head_dim + 2 floats per query head that the merge reads back (the last
// split block by default, the merge kernel with the merge folding off; at
// head_dim 64 and a group of 8: 8 x 66 floats against 64 x 2 x 64 floats of
// K/V, ~6%). Shorter splits give more blocks at batch 1 (a model with 4 KV
// heads gets 4 blocks per 64 keys) but twice the partials; longer ones leave
// SMs idle at batch 1.
constexpr int kMinKeysPerSplit = 64;
// The smallest bucket: every max_length up to 64 gets the same launch (one
// split, one kernel), so a graph captured at position 1 replays up to 64.
constexpr int kSmallestBucket = kMinKeysPerSplit;
// At most 128 splits: 8k keys at the minimum split length. With 8 KV heads
// that is 1024 blocks for a single query, ~8 per SM of an H100 (132 SMs),
// enough to pull its bandwidth; more splits would only add partials. Longer
// contexts get longer splits instead (16k keys: 128 splits of 128).
constexpr int kMaxSplits = 128;
// The largest bucket: 2^30 keys, far beyond any cache, keeps the bucket
// arithmetic inside int.
constexpr int kLargestBucket = 1 << 30;
// Query heads per block: up to 8, which covers the GQA groups of Llama 3 (4),
// Mistral (4), Qwen2 (7), TinyLlama and 70B-class models (8) in one block; a
// larger group (MQA) is cut into chunks of 8 heads, each chunk a block of
// its own (it reads the same K/V rows again, mostly from L2).
constexpr int kMaxHeadsPerBlock = 8;
// Grid dimensions y and z are limited to 65535 by CUDA.
constexpr int kMaxGridYZ = 65535;
constexpr float kLog2e = 1.4426950408889634f;

static_assert((kMinKeysPerSplit & (kMinKeysPerSplit - 1)) == 0 && (kMaxSplits & (kMaxSplits - 1)) == 0,
              "powers of two: keys_per_split = bucket / splits is exact");

constexpr int ceil_div(int numerator, int denominator) { return (numerator + denominator - 1) / denominator; }

// How a block lays out its tile and divides each phase among its threads,
// for one range of head_dim and one number of query heads per block.
// kHeadFloats is head_dim rounded up to 32, 64, 128 or 256; a head's dims
// past head_dim are 0 in every shared buffer (the query's and the tile's),
// so they add 0 to every dot product and are never written out.
// The tile: 64 keys up to head_dim 64, then 4096 floats of K (and of V):
// 32 keys at 128, 16 at 256. That keeps the K and V tiles at 16 KiB each
// and the whole SharedTile under the 48 KiB of static shared memory
// (~42 KiB at head_dim 256 with 8 heads), keeps every thread's share of a
// tile at 16..32 elements of K and as many of V, and divides the 64 keys of
// the smallest split into whole tiles.
template <int kHeadFloats_, int kHeads_>
struct TileLayout {
  static constexpr int kHeadFloats = kHeadFloats_;
  static constexpr int kHeads = kHeads_;
  static constexpr int kTileKeys = kHeadFloats <= 64 ? 64 : 4096 / kHeadFloats;
  // K tile rows are kHeadFloats + 4 floats apart. The scores phase has the
  // threads of a warp read float4s of DIFFERENT keys at the same dims; a
  // 16-byte read is served 8 threads at a time, and with rows 4 floats (4
  // banks) past a multiple of 32 banks apart, 8 consecutive keys fall in 8
  // different 4-bank groups: no bank conflict. (Unpadded, all 8 would hit
  // the same banks.) The pad keeps every row 16-byte aligned.
  static constexpr int kKeyStride = kHeadFloats + 4;
  // Load: every thread's share of the tile's K (and V) elements.
  static constexpr int kLoadsPerThread = kTileKeys * kHeadFloats / kThreadsPerBlock;
  // Load: elements per thread loaded before any is stored (copy_tile); the
  // largest that ptxas (CUDA 13, sm_90) keeps in 128 registers without spills.
  static constexpr int kLoadBatch = kHeadFloats <= 32 ? 8 : 16;
  // Block-table lookup: warps 0..kRowWarps-1 find the pool rows, one key per lane.
  static constexpr int kRowWarps = ceil_div(kTileKeys, kWarpSize);
  // Scores: thread t takes key t % kTileKeys and heads t / kTileKeys +
  // j * kScoreHeadLanes.
  static constexpr int kScoreHeadLanes = kThreadsPerBlock / kTileKeys;
  static constexpr int kScoreHeadsPerThread = ceil_div(kHeads, kScoreHeadLanes);
  // Softmax: warp w takes heads w + j * kWarpsPerBlock; lane l the keys l + 32 c.
  static constexpr int kSoftmaxHeadsPerWarp = ceil_div(kHeads, kWarpsPerBlock);
  static constexpr int kScoresPerLane = ceil_div(kTileKeys, kWarpSize);
  // P.V: thread t owns dims t % kOutputDimLanes + x * kOutputDimLanes of
  // heads t / kOutputDimLanes + j * kOutputHeadLanes. A warp covers 32
  // consecutive dims of one head: its V reads are consecutive floats (no
  // bank conflict) and its weight reads are one address (a broadcast).
  static constexpr int kOutputDimLanes = kHeadFloats < kThreadsPerBlock ? kHeadFloats : kThreadsPerBlock;
  static constexpr int kOutputHeadLanes = kThreadsPerBlock / kOutputDimLanes;
  static constexpr int kOutputDimsPerThread = kHeadFloats / kOutputDimLanes;
  static constexpr int kOutputHeadsPerThread = ceil_div(kHeads, kOutputHeadLanes);

  static_assert(kHeadFloats % kWarpSize == 0 && kHeadFloats <= kMaxHeadDim);
  static_assert(kHeads >= 1 && kHeads <= kMaxHeadsPerBlock);
  static_assert(kTileKeys % 4 == 0 && kTileKeys <= kThreadsPerBlock, "float4 weight reads; one score thread per key");
  static_assert(kMinKeysPerSplit % kTileKeys == 0, "a split is whole tiles");
  static_assert((kTileKeys * kHeadFloats) % kThreadsPerBlock == 0, "every thread loads the same share");
  static_assert(kLoadsPerThread % kLoadBatch == 0, "whole load batches");
};

// The block's shared memory. Dims past head_dim and keys past the split's
// end hold 0 (never garbage: 0 x NaN would poison a sum).
template <class Layout>
struct SharedTile {
  // [kTileKeys, kKeyStride]: the tile's K rows (the last 4 floats of a row are padding, never read)
  alignas(16) float keys[Layout::kTileKeys][Layout::kKeyStride];
  // [kTileKeys, kHeadFloats]: the tile's V rows
  alignas(16) float values[Layout::kTileKeys][Layout::kHeadFloats];
  // [kHeads, kHeadFloats]: the block's query heads, times log2(e) / sqrt(head_dim), loaded once
  alignas(16) float queries[Layout::kHeads][Layout::kHeadFloats];
  // [kHeads, kTileKeys]: the tile's scores (log2 units), then in place its
  // softmax weights (int8: times each key's V scale), -inf / 0 past the end
  alignas(16) float scores[Layout::kHeads][Layout::kTileKeys];
  // [kTileKeys]: pool row of each key of the tile being loaded
  std::size_t key_rows[Layout::kTileKeys];
  // [kTileKeys]: int8 scales of the tile's keys (unused for fp32)
  float key_scales[Layout::kTileKeys];
  float value_scales[Layout::kTileKeys];
  // [kHeads]: each head's factor for the accumulators at this tile
  // (2^(old max - new max)), running max (log2 units) and running sum
  float head_rescale[Layout::kHeads];
  float head_max[Layout::kHeads];
  float head_sum[Layout::kHeads];
};

__device__ __forceinline__ float warp_sum(float value) {
  // Butterfly: afterwards every lane holds the sum of all 32.
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullWarpMask, value, offset);
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(kFullWarpMask, value, offset));
  return value;
}

// Component i (a constant after unrolling) of a float4.
__device__ __forceinline__ float component(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// --- Reading one KV head of a cached row, per element type. A new element
// (fp16, ...) is one more specialization and one more branch in split_kernel.
//
// key(row, dim) / value(row, dim): element `dim` of KV head `kv_head` in
// pool row `row`, as stored (Raw); to_float() converts it when the tile is
// written to shared memory, so the load itself is not waited for until
// then. key_scale(row) / value_scale(row): the factor a key's score and
// its softmax weight must be multiplied by (kScaled: int8 only).
template <KvElement kElement>
struct CachedHead;

template <>
struct CachedHead<KvElement::Float32> {
  using Raw = float;
  static constexpr bool kScaled = false;
  const float* keys;
  const float* values;
  std::size_t row_floats;   // kv_dim: floats from one pool row to the next
  std::size_t head_offset;  // kv_head * head_dim: the head's first float in a row

  __device__ CachedHead(const KvView& view, int kv_head, int head_dim)
      : keys(view.keys),
        values(view.values),
        row_floats(static_cast<std::size_t>(view.kv_dim)),
        head_offset(static_cast<std::size_t>(kv_head) * head_dim) {}

  __device__ __forceinline__ Raw key(std::size_t row, int dim) const {
    return __ldg(keys + row * row_floats + head_offset + dim);
  }
  __device__ __forceinline__ Raw value(std::size_t row, int dim) const {
    return __ldg(values + row * row_floats + head_offset + dim);
  }
  __device__ __forceinline__ float key_scale(std::size_t) const { return 1.0f; }
  __device__ __forceinline__ float value_scale(std::size_t) const { return 1.0f; }
  __device__ static __forceinline__ float to_float(Raw raw) { return raw; }
};

// Int8: value = int8 * scale, one scale per (position, KV head), as
// store_int8_head (llm/kv_int8.hpp) wrote them. The tile holds the codes;
// the scales are applied once per key (to the score, and to the key's
// softmax weight) instead of once per element.
template <>
struct CachedHead<KvElement::Int8> {
  using Raw = std::int8_t;
  static constexpr bool kScaled = true;
  const std::int8_t* keys;
  const std::int8_t* values;
  const float* key_scales;
  const float* value_scales;
  std::size_t row_elements;  // kv_dim
  std::size_t head_offset;   // kv_head * head_dim
  int scales_per_row;        // KV heads: kv_dim / the view's head_dim (KvView::key_row_scales)
  int kv_head;

  __device__ CachedHead(const KvView& view, int kv_head_, int head_dim)
      : keys(view.keys_int8),
        values(view.values_int8),
        key_scales(view.key_scales),
        value_scales(view.value_scales),
        row_elements(static_cast<std::size_t>(view.kv_dim)),
        head_offset(static_cast<std::size_t>(kv_head_) * head_dim),
        scales_per_row(view.kv_dim / view.head_dim),
        kv_head(kv_head_) {}

  __device__ __forceinline__ Raw key(std::size_t row, int dim) const {
    return __ldg(keys + row * row_elements + head_offset + dim);
  }
  __device__ __forceinline__ Raw value(std::size_t row, int dim) const {
    return __ldg(values + row * row_elements + head_offset + dim);
  }
  __device__ __forceinline__ float key_scale(std::size_t row) const {
    return __ldg(key_scales + row * static_cast<std::size_t>(scales_per_row) + kv_head);
  }
  __device__ __forceinline__ float value_scale(std::size_t row) const {
    return __ldg(value_scales + row * static_cast<std::size_t>(scales_per_row) + kv_head);
  }
  __device__ static __forceinline__ float to_float(Raw raw) { return static_cast<float>(raw); }
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
  // [n_queries, n_kv_heads * head_chunks] ticket counters, zero between
  // launches, or null: the merge kernel merges (DecodeQueries::merge_tickets).
  unsigned int* merge_tickets;
};

// The heads block (split, y, query) serves: KV head y / head_chunks and, of
// its `group` query heads (adjacent: kv_head * group ...), chunk
// y % head_chunks of layout_heads heads (the layout's kHeads; the last
// chunk may have fewer).
struct BlockHeads {
  int kv_head;
  int first_head;   // the first query head of the block
  int block_heads;  // 1..layout_heads query heads
};
__device__ __forceinline__ BlockHeads block_query_heads(const SplitKernelArgs& args, int layout_heads) {
  const int group = args.shape.n_heads / args.shape.n_kv_heads;
  const int kv_head = static_cast<int>(blockIdx.y) / args.head_chunks;
  const int chunk = static_cast<int>(blockIdx.y) % args.head_chunks;
  return {kv_head, kv_head * group + chunk * layout_heads, min(layout_heads, group - chunk * layout_heads)};
}

// --- The block-table lookup of a tile, in two steps so that the table read
// of the next tile is in flight while the current tile's scores are
// computed. Called by warps 0..kRowWarps-1 only (all 32 lanes: step 2
// shuffles); lane l of warp w stands for key w * 32 + l of the tile whose
// first position is tile_first.
//
// Step 1: the table entry of the lane's key's cache block, read only by the
// lane of the block's first key among the warp's keys (lane 0, or a key at
// offset 0 of its cache block); every other lane returns 0.
template <class Layout>
__device__ __forceinline__ int read_table_entry(const KvView& view, int tile_first, int end, int warp, int lane) {
  const int key = warp * kWarpSize + lane;
  const int position = tile_first + key;
  if (key >= Layout::kTileKeys || position >= end) return 0;
  const int offset = position % view.block_size;
  return lane == 0 || offset == 0 ? view.block_table[position / view.block_size] : 0;
}

// Step 2: every key's pool row into tile.key_rows. The lane that read the
// entry of a key's cache block is `offset` lanes back (the key at offset 0),
// or lane 0 if that key is in an earlier warp or tile: both are valid keys
// of the same cache block, so they read the same entry.
template <class Layout>
__device__ __forceinline__ void publish_key_rows(const KvView& view, int tile_first, int end, int warp, int lane,
                                                 int table_entry, SharedTile<Layout>& tile) {
  const int key = warp * kWarpSize + lane;
  const int position = tile_first + key;
  const int offset = position % view.block_size;
  const int source_lane = lane - min(lane, offset);
  const int physical_block = __shfl_sync(kFullWarpMask, table_entry, source_lane);
  if (key < Layout::kTileKeys && position < end)
    tile.key_rows[key] = static_cast<std::size_t>(physical_block) * view.block_size + offset;
}

// Copies the tile with `tile_keys` keys whose pool rows are in
// tile.key_rows into shared memory: thread `thread` takes elements
// thread + i * kThreadsPerBlock of K (and of V) in row order, 0 past the
// tile's keys and past head_dim (every element of both tiles is written),
// and key `thread`'s int8 scales (0 past the tile's keys).
// kLoadBatch elements are loaded before any of them is stored, so that many
// loads per thread are in flight at once; a larger batch (all of a thread's
// share) made ptxas keep every address live and spill (TileLayout::kLoadBatch).
template <class Layout, KvElement kElement>
__device__ __forceinline__ void copy_tile(const CachedHead<kElement>& cached, SharedTile<Layout>& tile,
                                          int tile_keys, int head_dim, int thread) {
  using Cached = CachedHead<kElement>;
  constexpr int kLoadBatch = Layout::kLoadBatch;
  for (int first = 0; first < Layout::kLoadsPerThread; first += kLoadBatch) {
    typename Cached::Raw keys[kLoadBatch], values[kLoadBatch];
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      const int element = thread + (first + b) * kThreadsPerBlock;
      const int key = element / Layout::kHeadFloats, dim = element % Layout::kHeadFloats;
      keys[b] = values[b] = typename Cached::Raw{0};
      if (key < tile_keys && dim < head_dim) {
        const std::size_t row = tile.key_rows[key];
        keys[b] = cached.key(row, dim);
        values[b] = cached.value(row, dim);
      }
    }
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      const int element = thread + (first + b) * kThreadsPerBlock;
      const int key = element / Layout::kHeadFloats, dim = element % Layout::kHeadFloats;
      tile.keys[key][dim] = Cached::to_float(keys[b]);
      tile.values[key][dim] = Cached::to_float(values[b]);
    }
  }
  if constexpr (Cached::kScaled) {
    if (thread < Layout::kTileKeys) {
      const bool valid = thread < tile_keys;
      const std::size_t row = valid ? tile.key_rows[thread] : 0;
      tile.key_scales[thread] = valid ? cached.key_scale(row) : 0.0f;
      tile.value_scales[thread] = valid ? cached.value_scale(row) : 0.0f;
    }
  }
}

// Who wrote the partials a merge reads, which decides how it loads them:
//   ThisLaunch     other blocks of the same split kernel (the last split
//                  block's merge): through L2 (__ldcg), as L1 is not kept
//                  coherent across SMs within a launch and could serve a
//                  stale line of them;
//   EarlierKernel  the split kernel before it (the merge kernel): through
//                  the read-only path (__ldg), the load the compiler made of
//                  the merge kernel's own plain loads through const
//                  __restrict__ pointers before the last block merged too.
//                  L1 then serves the stats that every warp of a head, and
//                  both loops below, read again, instead of L2 each time.
// The same values either way: only the load instruction differs.
enum class PartialsWrittenBy { ThisLaunch, EarlierKernel };

template <PartialsWrittenBy kWriter>
__device__ __forceinline__ float load_partial(const float* address) {
  if constexpr (kWriter == PartialsWrittenBy::ThisLaunch)
    return __ldcg(address);
  else
    return __ldg(address);
}

// The merge of one output element: (query, head, dim) from the partials of
// its `splits` splits, in split order. Every split is read, the empty ones
// included (weight 2^(-inf - M) = 0), so the merge needs no lengths. Both
// mergers call it, so both evaluate the same expression in the same order:
// the same bits (kWriter changes the loads, not the arithmetic).
template <PartialsWrittenBy kWriter>
__device__ __forceinline__ float merged_output(int n_heads, int head_dim, int splits, int query, int head, int dim,
                                               const float* partial_outputs, const float* partial_stats) {
  const std::size_t first_slot = (static_cast<std::size_t>(query) * n_heads + head) * splits;
  float global_max = -INFINITY;
  for (int s = 0; s < splits; ++s)
    global_max = fmaxf(global_max, load_partial<kWriter>(partial_stats + (first_slot + s) * 2));
  float sum = 0.0f, value = 0.0f;
  if (global_max != -INFINITY) {  // else no split saw a key (a length of 0, which callers never pass)
    for (int s = 0; s < splits; ++s) {
      const float weight = exp2f(load_partial<kWriter>(partial_stats + (first_slot + s) * 2) - global_max);
      sum += weight * load_partial<kWriter>(partial_stats + (first_slot + s) * 2 + 1);
      value += weight * load_partial<kWriter>(partial_outputs + (first_slot + s) * head_dim + dim);
    }
  }
  return sum > 0.0f ? value / sum : 0.0f;
}

// The last split block's merge: query heads [first_head, first_head +
// block_heads), every dim, into row batch_row of out. A call, not inlined,
// with its inputs by value: the split kernel already uses all 128 registers
// its launch bounds allow, and inlined, the merge made ptxas (CUDA 13) spill
// in three layouts of 8 heads per block (kMinBlocksPerSm).
__device__ __noinline__ void merge_block_heads(const float* partial_outputs, const float* partial_stats, float* out,
                                               int n_heads, int head_dim, int query, int batch_row, int first_head,
                                               int block_heads) {
  const int splits = static_cast<int>(gridDim.x);
  for (int index = static_cast<int>(threadIdx.x); index < block_heads * head_dim;
       index += static_cast<int>(blockDim.x)) {
    const int head = first_head + index / head_dim, dim = index % head_dim;
    out[(static_cast<std::size_t>(batch_row) * n_heads + head) * head_dim + dim] =
        merged_output<PartialsWrittenBy::ThisLaunch>(n_heads, head_dim, splits, query, head, dim, partial_outputs,
                                                     partial_stats);
  }
}

// The body of block (split, KV head x chunk, query) for one element type.
template <class Layout, KvElement kElement>
__device__ __forceinline__ void attend_split(const SplitKernelArgs& args, const KvView& view,
                                             SharedTile<Layout>& tile) {
  using Cached = CachedHead<kElement>;
  constexpr int kHeads = Layout::kHeads;
  constexpr int kHeadFloats = Layout::kHeadFloats;
  constexpr int kTileKeys = Layout::kTileKeys;

  const int split = static_cast<int>(blockIdx.x);
  const int splits = static_cast<int>(gridDim.x);
  const int query = static_cast<int>(blockIdx.z);
  const int thread = static_cast<int>(threadIdx.x);
  const int warp = thread / kWarpSize;
  const int lane = thread % kWarpSize;
  const int head_dim = args.shape.head_dim;
  const int n_heads = args.shape.n_heads;
  const auto [kv_head, first_head, block_heads] = block_query_heads(args, kHeads);

  const int length = args.lengths[query];
  const int batch_row = args.rows != nullptr ? args.rows[query] : query;
  const int begin = split * args.keys_per_split;
  const int end = min(begin + args.keys_per_split, length);  // <= begin: an empty split
  const int n_tiles = end > begin ? ceil_div(end - begin, kTileKeys) : 0;
  const Cached cached(view, kv_head, head_dim);

  // --- Setup: the query heads, the running statistics, the first tile's rows.
  // Heads past block_heads (a group smaller than the layout's) are zero:
  // their scores are 0 and their outputs are never written.
  for (int index = thread; index < kHeads * kHeadFloats; index += kThreadsPerBlock) {
    const int g = index / kHeadFloats, dim = index % kHeadFloats;
    tile.queries[g][dim] =
        g < block_heads && dim < head_dim
            ? args.q[(static_cast<std::size_t>(batch_row) * n_heads + first_head + g) * head_dim + dim] *
                  args.q_scale_log2
            : 0.0f;
  }
  if (thread < kHeads) {  // what an empty split writes: (m = -inf, l = 0)
    tile.head_max[thread] = -INFINITY;
    tile.head_sum[thread] = 0.0f;
  }
  if (n_tiles > 0 && warp < Layout::kRowWarps)  // block-uniform, warp-uniform
    publish_key_rows(view, begin, end, warp, lane, read_table_entry<Layout>(view, begin, end, warp, lane), tile);
  __syncthreads();  // the query heads, the statistics and the first tile's rows are in shared memory

  // The softmax state of the heads this warp reduces (warp + j * 4), the
  // same every tile, so it stays in registers (lane-uniform).
  float running_max[Layout::kSoftmaxHeadsPerWarp], running_sum[Layout::kSoftmaxHeadsPerWarp];
#pragma unroll
  for (int j = 0; j < Layout::kSoftmaxHeadsPerWarp; ++j) {
    running_max[j] = -INFINITY;
    running_sum[j] = 0.0f;
  }
  // The outputs this thread owns (P.V phase), unnormalized.
  float accumulator[Layout::kOutputHeadsPerThread][Layout::kOutputDimsPerThread];
#pragma unroll
  for (int j = 0; j < Layout::kOutputHeadsPerThread; ++j)
#pragma unroll
    for (int x = 0; x < Layout::kOutputDimsPerThread; ++x) accumulator[j][x] = 0.0f;
  const int output_dim_lane = thread % Layout::kOutputDimLanes;
  const int output_head_lane = thread / Layout::kOutputDimLanes;

  for (int t = 0; t < n_tiles; ++t) {
    const int tile_first = begin + t * kTileKeys;
    const int tile_keys = min(kTileKeys, end - tile_first);  // >= 1: key 0 of every tile is valid
    const int next_first = tile_first + kTileKeys;
    const bool has_next = next_first < end;  // block-uniform

    // Barrier 1: every thread is done with the previous tile's K, V,
    // scales, weights and rescale factors (scores, softmax, P.V phases)
    // before copy_tile overwrites K, V and the scales (and the scores phase
    // the weights). Its rows (key_rows) were published before barrier 3 of
    // the previous iteration, or before the setup barrier.
    __syncthreads();
    copy_tile(cached, tile, tile_keys, head_dim, thread);
    // Barrier 2: the whole tile is in shared memory before any thread
    // computes a score from it, and every thread is done reading key_rows
    // before they are overwritten with the next tile's.
    __syncthreads();

    // The next tile's table entries: read now, used after the scores.
    int next_table_entry = 0;
    if (has_next && warp < Layout::kRowWarps)
      next_table_entry = read_table_entry<Layout>(view, next_first, end, warp, lane);

    // --- Scores: (head, key) pairs; 4 partial sums per head (one per float4
    // component) keep the FMA chains short.
    {
      const int key = thread % kTileKeys;
      const int head_lane = thread / kTileKeys;
      float4 dot[Layout::kScoreHeadsPerThread];
#pragma unroll
      for (int j = 0; j < Layout::kScoreHeadsPerThread; ++j) dot[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4* key_row = reinterpret_cast<const float4*>(tile.keys[key]);
#pragma unroll 8
      for (int d4 = 0; d4 < kHeadFloats / 4; ++d4) {
        const float4 k = key_row[d4];
#pragma unroll
        for (int j = 0; j < Layout::kScoreHeadsPerThread; ++j) {
          // A head past kHeads (fewer heads than score lanes) reads the last
          // head's row and its score is not written.
          const int g = min(head_lane + j * Layout::kScoreHeadLanes, kHeads - 1);
          const float4 q = reinterpret_cast<const float4*>(tile.queries[g])[d4];  // one address per warp
          dot[j].x = fmaf(q.x, k.x, dot[j].x);
          dot[j].y = fmaf(q.y, k.y, dot[j].y);
          dot[j].z = fmaf(q.z, k.z, dot[j].z);
          dot[j].w = fmaf(q.w, k.w, dot[j].w);
        }
      }
      const float key_scale = Cached::kScaled ? tile.key_scales[key] : 1.0f;
#pragma unroll
      for (int j = 0; j < Layout::kScoreHeadsPerThread; ++j) {
        const int g = head_lane + j * Layout::kScoreHeadLanes;
        if (g < kHeads)
          tile.scores[g][key] =
              key < tile_keys ? ((dot[j].x + dot[j].y) + (dot[j].z + dot[j].w)) * key_scale : -INFINITY;
      }
    }

    if (has_next && warp < Layout::kRowWarps)
      publish_key_rows(view, next_first, end, warp, lane, next_table_entry, tile);
    // Barrier 3: every score of the tile is in shared memory before a warp
    // reduces a head's row of them; the next tile's rows are too, before
    // the next iteration's copy_tile reads them. (Every thread read the
    // current tile's rows in copy_tile, before barrier 2, so overwriting
    // them after barrier 2 is safe.)
    __syncthreads();

    // --- Online softmax: warp w updates heads w, w + 4.
#pragma unroll
    for (int j = 0; j < Layout::kSoftmaxHeadsPerWarp; ++j) {
      const int g = warp + j * kWarpsPerBlock;
      if (g >= kHeads) continue;  // warp-uniform
      float score[Layout::kScoresPerLane];
      float tile_max = -INFINITY;
#pragma unroll
      for (int c = 0; c < Layout::kScoresPerLane; ++c) {
        const int key = lane + c * kWarpSize;
        score[c] = key < kTileKeys ? tile.scores[g][key] : -INFINITY;
        tile_max = fmaxf(tile_max, score[c]);
      }
      // Finite: key 0 of the tile is valid. On the first tile running_max
      // is -inf and the rescale is 2^-inf = 0 (the accumulators are 0 anyway).
      const float new_max = fmaxf(running_max[j], warp_max(tile_max));
      const float rescale = exp2f(running_max[j] - new_max);
      float tile_sum = 0.0f;
#pragma unroll
      for (int c = 0; c < Layout::kScoresPerLane; ++c) {
        const int key = lane + c * kWarpSize;
        const float weight = exp2f(score[c] - new_max);  // 0 for a key past the end (-inf)
        tile_sum += weight;
        if (key < kTileKeys) tile.scores[g][key] = Cached::kScaled ? weight * tile.value_scales[key] : weight;
      }
      running_sum[j] = running_sum[j] * rescale + warp_sum(tile_sum);
      running_max[j] = new_max;
      if (lane == 0) {
        tile.head_rescale[g] = rescale;
        tile.head_max[g] = new_max;
        tile.head_sum[g] = running_sum[j];
      }
    }
    // Barrier 4: every head's weights and rescale factor are in shared
    // memory before the P.V phase reads them.
    __syncthreads();

    // --- P.V: acc = acc * rescale + sum over the tile's keys of p * v.
    float4 weights[Layout::kOutputHeadsPerThread];
#pragma unroll
    for (int j = 0; j < Layout::kOutputHeadsPerThread; ++j) {
      const float rescale = tile.head_rescale[min(output_head_lane + j * Layout::kOutputHeadLanes, kHeads - 1)];
#pragma unroll
      for (int x = 0; x < Layout::kOutputDimsPerThread; ++x) accumulator[j][x] *= rescale;
    }
#pragma unroll 4
    for (int k4 = 0; k4 < kTileKeys / 4; ++k4) {
#pragma unroll
      for (int j = 0; j < Layout::kOutputHeadsPerThread; ++j) {
        // A head past kHeads reads the last head's weights; it is never written.
        const int g = min(output_head_lane + j * Layout::kOutputHeadLanes, kHeads - 1);
        weights[j] = reinterpret_cast<const float4*>(tile.scores[g])[k4];  // keys 4 k4 .. 4 k4 + 3
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
        for (int x = 0; x < Layout::kOutputDimsPerThread; ++x) {
          const float value = tile.values[4 * k4 + kk][output_dim_lane + x * Layout::kOutputDimLanes];
#pragma unroll
          for (int j = 0; j < Layout::kOutputHeadsPerThread; ++j)
            accumulator[j][x] = fmaf(component(weights[j], kk), value, accumulator[j][x]);
        }
      }
    }
  }

  // --- The result. head_max and head_sum were last written before barrier
  // 4 of the last tile (or before the setup barrier: an empty split), and
  // no thread writes them after it: no barrier is needed.
#pragma unroll
  for (int j = 0; j < Layout::kOutputHeadsPerThread; ++j) {
    const int g = output_head_lane + j * Layout::kOutputHeadLanes;
    if (g >= block_heads) continue;
    const int head = first_head + g;
    const float sum = tile.head_sum[g];
#pragma unroll
    for (int x = 0; x < Layout::kOutputDimsPerThread; ++x) {
      const int dim = output_dim_lane + x * Layout::kOutputDimLanes;
      if (dim >= head_dim) continue;
      if (splits == 1) {
        // The split is the whole sequence: normalize and write the output (a
        // query with no key at all, which callers never pass, gets zeros).
        args.out[(static_cast<std::size_t>(batch_row) * n_heads + head) * head_dim + dim] =
            sum > 0.0f ? accumulator[j][x] / sum : 0.0f;
      } else {
        const std::size_t slot = (static_cast<std::size_t>(query) * n_heads + head) * splits + split;
        args.partial_outputs[slot * head_dim + dim] = accumulator[j][x];
        if (dim == 0) {
          args.partial_stats[slot * 2 + 0] = tile.head_max[g];
          args.partial_stats[slot * 2 + 1] = sum;
        }
      }
    }
  }
}

// Kernel 1. Grid (splits, n_kv_heads * head_chunks, n_queries), kThreadsPerBlock threads.
// The element type is read from the query's view (uniform across a block),
// so the launch does not depend on the host copies of the views.
template <class Layout>
__global__ void __launch_bounds__(kThreadsPerBlock, kMinBlocksPerSm) split_kernel(SplitKernelArgs args) {
  __shared__ SharedTile<Layout> tile;
  // Its queries and newest keys are written by the kernels before it: the
  // RoPE kernel (rope_and_write_kv; unfused, rope and write_kv_rows) or,
  // with the RoPE folded in (CudaFusions::rope_in_qkv_product), the QKV
  // product's last writes. Nothing to do ahead of them.
  wait_then_let_next_kernel_launch();
  const KvView view = args.views[blockIdx.z];  // a register copy: its fields are read for every tile
  if (view.element == KvElement::Int8)
    attend_split<Layout, KvElement::Int8>(args, view, tile);
  else
    attend_split<Layout, KvElement::Float32>(args, view, tile);
  // Several splits: the last of a query's split blocks merges them. Uniform
  // over the grid (every block of the launch takes the branch or none
  // does), so every thread reaches the ticket's barriers.
  if (gridDim.x > 1 && args.merge_tickets != nullptr) {
    const int query = static_cast<int>(blockIdx.z);
    // A ticket per (query, KV head, head chunk): device_formulas.cuh.
    unsigned int* ticket_counter = args.merge_tickets + static_cast<std::size_t>(query) * gridDim.y + blockIdx.y;
    if (device::takes_last_ticket(ticket_counter, gridDim.x)) {
      const BlockHeads heads = block_query_heads(args, Layout::kHeads);
      merge_block_heads(args.partial_outputs, args.partial_stats, args.out, args.shape.n_heads, args.shape.head_dim,
                        query, args.rows != nullptr ? args.rows[query] : query, heads.first_head, heads.block_heads);
    }
  }
}

// Kernel 2, only without tickets. Grid (n_heads, n_queries); one thread per
// dim of the head (blockDim = head_dim rounded up to whole warps).
__global__ void merge_kernel(AttentionShape shape, const int* __restrict__ rows, int splits,
                             const float* __restrict__ partial_outputs, const float* __restrict__ partial_stats,
                             float* __restrict__ out) {
  const int head = static_cast<int>(blockIdx.x), query = static_cast<int>(blockIdx.y);
  const int dim = static_cast<int>(threadIdx.x);
  const int head_dim = shape.head_dim;
  wait_then_let_next_kernel_launch();  // before any return: every block waits (programmatic_launch.cuh)
  if (dim >= head_dim) return;  // no barrier follows
  const int batch_row = rows != nullptr ? rows[query] : query;
  out[(static_cast<std::size_t>(batch_row) * shape.n_heads + head) * head_dim + dim] =
      merged_output<PartialsWrittenBy::EarlierKernel>(shape.n_heads, head_dim, splits, query, head, dim,
                                                      partial_outputs, partial_stats);
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

// The smallest power of two >= group, at most kMaxHeadsPerBlock: a group of
// 3 runs in blocks of 4 heads, 12 (MQA-like) in 2 blocks of 8.
int heads_per_block(int group) {
  int heads = 1;
  while (heads < group && heads < kMaxHeadsPerBlock) heads *= 2;
  return heads;
}

template <int kHeadFloats, int kHeads>
void launch_split_kernel(const SplitKernelArgs& args, dim3 grid, cudaStream_t stream) {
  launch_kernel(split_kernel<TileLayout<kHeadFloats, kHeads>>, grid, kThreadsPerBlock, 0, stream, args);
}

template <int kHeadFloats>
void launch_split_kernel_for(int heads, const SplitKernelArgs& args, dim3 grid, cudaStream_t stream) {
  switch (heads) {
    case 1: launch_split_kernel<kHeadFloats, 1>(args, grid, stream); return;
    case 2: launch_split_kernel<kHeadFloats, 2>(args, grid, stream); return;
    case 4: launch_split_kernel<kHeadFloats, 4>(args, grid, stream); return;
    case 8: launch_split_kernel<kHeadFloats, 8>(args, grid, stream); return;
    default: break;
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

std::size_t split_kv_decode_merge_tickets(const AttentionShape& shape, int n_queries) {
  check_shape(shape);
  const int group = shape.n_heads / shape.n_kv_heads;
  const int head_chunks = ceil_div(group, heads_per_block(group));
  return static_cast<std::size_t>(std::max(n_queries, 0)) * static_cast<std::size_t>(shape.n_kv_heads) *
         static_cast<std::size_t>(head_chunks);
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
  // head_dim rounded up to the layout's width: 32, 64, 128 or 256.
  const int head_floats = shape.head_dim <= 32 ? 32 : shape.head_dim <= 64 ? 64 : shape.head_dim <= 128 ? 128 : 256;
  const int heads = heads_per_block(group);
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
    args.merge_tickets = queries.merge_tickets;  // null: the merge kernel below
  }

  const dim3 grid(static_cast<unsigned>(split.splits), static_cast<unsigned>(shape.n_kv_heads * head_chunks),
                  static_cast<unsigned>(n_queries));
  switch (head_floats) {
    case 32: launch_split_kernel_for<32>(heads, args, grid, stream); break;
    case 64: launch_split_kernel_for<64>(heads, args, grid, stream); break;
    case 128: launch_split_kernel_for<128>(heads, args, grid, stream); break;
    default: launch_split_kernel_for<256>(heads, args, grid, stream); break;
  }

  if (split.splits > 1 && args.merge_tickets == nullptr) {
    // One thread per dim: head_dim rounded up to whole warps (32..256).
    const int merge_threads = ceil_div(shape.head_dim, kWarpSize) * kWarpSize;
    const dim3 merge_grid(static_cast<unsigned>(shape.n_heads), static_cast<unsigned>(n_queries));
    launch_kernel(merge_kernel, merge_grid, merge_threads, 0, stream, shape, queries.rows, split.splits,
                  args.partial_outputs, args.partial_stats, out);
  }
}

}  // namespace llm::cuda::kernels
