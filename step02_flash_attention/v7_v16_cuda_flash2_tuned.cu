// Variants 7 to 16: variant 4's FlashAttention-2 taken towards its anchors'
// speed (FlashAttention-2 itself, PyTorch's SDPA), one change per variant.
// Each variant is the one before it plus one thing, so its row in step 02's
// table measures what that one thing buys:
//
//   7  cuda_flash2_async        K/V tiles double-buffered with cp.async: the copies of
//                               tile j + 1 fly while the tensor cores work on tile j
//   8  cuda_flash2_ldmatrix     fragments loaded with ldmatrix (.trans for V): one
//                               instruction per four registers, instead of 32-bit and
//                               16-bit loads with V packed by hand
//   9  cuda_flash2_128rows      128 query rows per block, 32 per warp: every K and V
//                               fragment feeds two mma instead of one
//   10 cuda_flash2_causal       the mask only on the tiles that cross the diagonal (or
//                               the end of the keys), and the heaviest query blocks first
//   11 cuda_flash2_tuned_fp16   16-bit output, as the model's next product reads it
//   12 cuda_flash2_tuned_bf16   the same in bf16
//   13 cuda_flash2_fast_softmax the softmax in FlashAttention-2's instructions: the scale
//                               folded into one FFMA per score, 2^x as one MUFU.EX2
//   14 cuda_flash2_lazy_rescale O rescaled only when a row's max grows by more than
//                               8 in the log2 domain (a factor 2^8), not on every
//                               tile whose max grows at all
//   15 cuda_flash2_hoisted_copies_fp16  each thread's cp.async addresses computed once,
//                               then moved by one add per copy
//   16 cuda_flash2_hoisted_copies_bf16  the same in bf16
//
// Variants 13 to 15 come from counting instructions: a profile put
// variant 11 at 1.5x PyTorch's instructions for the same tensor work, all of
// the excess in the ALU and FMA pipes. Its compiled inner loop spends them on
// exp2f's fix-up (four instructions per score) and a separate scale multiply
// (13), 128 multiplies per tile that rescale O (14), and the integer work of
// addressing every 16-byte copy from scratch (15). docs/02_flash_attention.md,
// section 5 ("Three rungs from counting instructions"), counts them.
//
// One kernel template does all ten: a variant is a Recipe, a struct that
// inherits the previous variant's recipe and switches one thing on (below),
// and every switch is an `if constexpr` at the place it changes. What stays
// is variant 4's algorithm: 4 warps own the block's query rows, the online
// softmax in registers, S and P never leave registers, exp2 with log2(e)
// folded into the scale, O normalized once at the end.
// The shared pieces (fragment layouts, mma, ldmatrix, cp.async, tile loads):
// flash2_mma.cuh. docs/02_flash_attention.md, section 5, walks through the
// ladder; section 8.2 measures it.
#include <cstdint>
#include <string>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "step02_flash_attention/cuda_attention.hpp"
#include "step02_flash_attention/cuda_common.cuh"
#include "step02_flash_attention/flash2_mma.cuh"

namespace step02::cuda {
namespace {

using detail::ceil_div;
using mma::kPad;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// --- The recipes: variant 4's choices, then one switch per variant. Variant
// 4 itself keeps its own kernel (v4_v5_cuda_flash2_mma.cu, the one to read
// first); this template starts at variant 7, so kAsyncCopy is always on here.
struct Variant4Recipe {
  static constexpr bool kAsyncCopy = false;     // K/V through registers between two barriers
  static constexpr bool kLdmatrix = false;      // fragments by 32-bit (Q, K) and 16-bit (V) loads
  static constexpr int kRowsPerWarp = 16;       // one mma M-tile per warp
  static constexpr bool kCausalSchedule = false;  // every tile masked; query blocks in order
  static constexpr bool kHalfOutput = false;    // fp32 output
  static constexpr bool kFastSoftmax = false;   // scale multiply, then exp2f (with its fix-up) of s - m
  static constexpr bool kLazyRescale = false;   // O rescaled on every tile whose max grows
  static constexpr bool kHoistedCopies = false;  // load_tile: each copy's addresses from its index
};
struct AsyncCopyRecipe : Variant4Recipe {  // variant 7
  static constexpr bool kAsyncCopy = true;
};
struct LdmatrixRecipe : AsyncCopyRecipe {  // variant 8
  static constexpr bool kLdmatrix = true;
};
struct Rows128Recipe : LdmatrixRecipe {  // variant 9
  // 32 rows = two M-tiles per warp, 4 warps = 128 rows per block: FlashAttention-2's
  // 128 x 64 tile for these head dims. More rows per warp reuse each K/V fragment
  // more, but each thread holds 2 x (d/8 + 8) x 4 fp32 accumulators (192 at d = 128):
  // 32 rows is as far as 255 registers go.
  static constexpr int kRowsPerWarp = 32;
};
struct CausalScheduleRecipe : Rows128Recipe {  // variant 10
  static constexpr bool kCausalSchedule = true;
};
struct HalfOutputRecipe : CausalScheduleRecipe {  // variants 11 and 12
  static constexpr bool kHalfOutput = true;
};
struct FastSoftmaxRecipe : HalfOutputRecipe {  // variant 13
  // The row max is taken over the raw scores and scaled once per row; each
  // score then costs one FFMA (s * scale - m) and one MUFU.EX2 (fast_exp2,
  // flash2_mma.cuh), where variant 11 pays an FMUL, an FADD and exp2f's four.
  static constexpr bool kFastSoftmax = true;
};
struct LazyRescaleRecipe : FastSoftmaxRecipe {  // variant 14
  static constexpr bool kLazyRescale = true;
};
struct HoistedCopiesRecipe : LazyRescaleRecipe {  // variants 15 and 16
  static constexpr bool kHoistedCopies = true;
};

// How many switches two recipes differ in: each rung of the ladder must
// change exactly one thing, or its row would not say what that thing buys.
template <class Before, class After>
constexpr int switches_changed() {
  return (Before::kAsyncCopy != After::kAsyncCopy) + (Before::kLdmatrix != After::kLdmatrix) +
         (Before::kRowsPerWarp != After::kRowsPerWarp) + (Before::kCausalSchedule != After::kCausalSchedule) +
         (Before::kHalfOutput != After::kHalfOutput) + (Before::kFastSoftmax != After::kFastSoftmax) +
         (Before::kLazyRescale != After::kLazyRescale) + (Before::kHoistedCopies != After::kHoistedCopies);
}
static_assert(switches_changed<Variant4Recipe, AsyncCopyRecipe>() == 1 &&
                  switches_changed<AsyncCopyRecipe, LdmatrixRecipe>() == 1 &&
                  switches_changed<LdmatrixRecipe, Rows128Recipe>() == 1 &&
                  switches_changed<Rows128Recipe, CausalScheduleRecipe>() == 1 &&
                  switches_changed<CausalScheduleRecipe, HalfOutputRecipe>() == 1 &&
                  switches_changed<HalfOutputRecipe, FastSoftmaxRecipe>() == 1 &&
                  switches_changed<FastSoftmaxRecipe, LazyRescaleRecipe>() == 1 &&
                  switches_changed<LazyRescaleRecipe, HoistedCopiesRecipe>() == 1,
              "each variant is the one before it plus one change");

// The block's shape for a recipe and head dim.
template <class Recipe, int kHeadDim>
struct TileShape {
  static constexpr int kMTiles = Recipe::kRowsPerWarp / 16;     // mma M-tiles per warp
  static constexpr int kRows = kWarps * Recipe::kRowsPerWarp;   // query rows per block: 64 or 128
  static constexpr int kStages = 2;                             // K/V buffers (double buffering)
  // Keys per K/V tile: 64 as variant 4 (8 n-tiles of 8), except at d = 128
  // with 32 rows per warp. There a thread holds 128 O accumulators, and 64
  // keys would add 64 scores: ptxas spills past 255 registers. 32 keys halve
  // the scores (FlashAttention-2's launch code picks 128 x 32 tiles at
  // d = 128 for some GPUs too); the cost is twice the barriers and O rescales
  // per key, which the second M-tile's reuse is meant to pay for.
  static constexpr int kKeys = (kMTiles == 2 && kHeadDim == 128) ? 32 : 64;
  static constexpr int kLd = kHeadDim + kPad;                   // shared row stride (elements)
  // Q [kRows][kLd], K and V [kStages][kKeys][kLd], 16 bits each. Largest at
  // d = 128 with 64 rows and 64 keys (variants 7 and 8): 85 KiB, two blocks
  // per SM on an A100 (164 KiB), two on an H100 (228 KiB); above 48 KiB a
  // kernel must opt in (allow_dynamic_shared_memory).
  static constexpr int kSharedBytes = (kRows + 2 * kStages * kKeys) * kLd * 2;
  // Q's A fragments stay in registers when they take at most 32 of them
  // (d = 64, or 16 rows per warp); at d = 128 with 32 rows they would take
  // 64, beside 192 accumulators: they are reloaded from shared memory with
  // ldmatrix before each k-step instead, as FlashAttention-2 does there.
  static constexpr bool kQInRegisters = kMTiles * (kHeadDim / 16) <= 8;
};

// Variant 14's threshold, in the log2 domain. A row keeps the max it last
// rescaled O to (its "stale" max) until a tile's max passes it by more than
// 8, so every P = 2^(s - stale max) is at most 2^8 = 256 instead of at most
// 1. That is safe in every place P goes: fp16's largest value is 65504 and
// bf16's 3e38, the fp32 P V sums and row sums grow by at most 256x (about
// 4 million for 16384 keys), and small P loses less to fp16's subnormals,
// not more. O / l at the end divides out whichever max O and l share. The
// 128 multiplies per tile that rescale O (at d = 128, 32 rows per warp) then
// run only on the tiles where some row of the warp moves its max that far:
// its first tile, and after that only where the scores jump (large logits).
// FlashAttention-4 made the same choice (rescale only when the max has
// changed enough to matter for the numbers).
constexpr float kLazyRescaleLog2Threshold = 8.0f;

// Variant 15's K/V copies. load_tile (flash2_mma.cuh) derives each 16-byte
// copy from its index: a row and a chunk, the row's bounds, a 64-bit
// address from (row x heads + head) x d, the shared address; for the 8 copies
// a thread makes per K/V tile that is most of the loop's integer
// instructions. But kThreads is a multiple of the chunks per row, so a thread
// copies the same chunk of every kRowStep-th row of every tile: its offsets
// are fixed for the whole kernel. They are computed once here; per tile a
// copy costs a 64-bit add and the cp.async, and only the one tile that runs
// past the end of the keys checks its rows.
template <int kHeadDim, int kTileRows>
class HoistedTileCopier {
 public:
  static constexpr int kChunks = kHeadDim / 8;           // 16-byte pieces per row
  static constexpr int kRowStep = kThreads / kChunks;    // rows between one thread's copies
  static constexpr int kCopies = kTileRows / kRowStep;   // copies per thread per tile
  static constexpr int kLd = kHeadDim + kPad;
  static_assert(kThreads % kChunks == 0 && kCopies * kRowStep == kTileRows, "a thread's copies repeat exactly");

  // heads, head: the tensor's [seqlen, heads, d] layout and this block's (KV) head.
  __device__ HoistedTileCopier(int heads, int head)
      : first_row_(static_cast<int>(threadIdx.x) / kChunks),
        shared_offset_(first_row_ * kLd + (static_cast<int>(threadIdx.x) % kChunks) * 8),
        row_pitch_(static_cast<std::size_t>(heads) * kHeadDim),
        source_offset_(static_cast<std::size_t>(first_row_) * row_pitch_ + static_cast<std::size_t>(head) * kHeadDim +
                       (threadIdx.x % kChunks) * 8) {}

  // Starts this thread's copies of rows row0 .. row0 + kTileRows - 1 of `src`
  // into `tile` [kTileRows][kLd], as load_tile<..., kAsync = true> does:
  // rows past `seqlen` zero-filled, the caller commits and waits.
  __device__ __forceinline__ void copy(std::uint16_t* tile, const std::uint16_t* __restrict__ src, int row0,
                                       int seqlen) const {
    const std::uint16_t* from = src + source_offset_ + static_cast<std::size_t>(row0) * row_pitch_;
    const std::size_t copy_pitch = kRowStep * row_pitch_;  // elements between two of this thread's rows
    std::uint16_t* to = tile + shared_offset_;
    if (row0 + kTileRows <= seqlen) {  // every row exists: all tiles but the last partial one
#pragma unroll
      for (int i = 0; i < kCopies; ++i, from += copy_pitch) mma::cp_async_16(to + i * kRowStep * kLd, from, true);
    } else {
      const int rows_left = seqlen - row0 - first_row_;  // this thread's rows that exist: i x kRowStep < rows_left
#pragma unroll
      for (int i = 0; i < kCopies; ++i, from += copy_pitch) {
        const bool valid = i * kRowStep < rows_left;
        // A missing row reads nothing (zero-fill) but still names an address:
        // the tensor's first row, as load_tile does.
        mma::cp_async_16(to + i * kRowStep * kLd, valid ? from : src + source_offset_ - first_row_ * row_pitch_,
                         valid);
      }
    }
  }

 private:
  int first_row_;              // threadIdx.x / kChunks: the first row of a tile this thread copies
  int shared_offset_;          // its element in the shared tile [kTileRows][kLd]
  std::size_t row_pitch_;      // elements between two rows (keys) in global memory: heads x d
  std::size_t source_offset_;  // its element of row 0 .. of the tensor, from src: row first_row_, this head, its chunk
};

// Which query block and head this block computes. Variant 4's grid is
// (query blocks, heads), query blocks in order. With the causal schedule the
// grid is (heads, query blocks) and the query blocks run last to first: under
// a causal mask the last block attends to every key and the first to 64 or
// 128, so the heaviest blocks of every head start first and the light ones
// fill the SMs at the end, instead of a tail of heavy blocks running alone.
struct BlockWork {
  int q_block;
  int head;
};
template <class Recipe>
__device__ __forceinline__ BlockWork block_work() {
  if constexpr (Recipe::kCausalSchedule)
    return {static_cast<int>(gridDim.y - 1 - blockIdx.y), static_cast<int>(blockIdx.x)};
  else
    return {static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y)};
}

// The A fragment (16 x 16, row-major) of rows row0..row0+15, columns
// 16 kk..16 kk+15 of a padded shared tile.
template <bool kLdmatrix, int kLd>
__device__ __forceinline__ void load_a_fragment(std::uint32_t (&a)[4], const std::uint16_t* tile, int row0, int kk,
                                                int lane) {
  if constexpr (kLdmatrix) {
    // Matrices 0..3 = (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7,
    // cols 8-15), (rows 8-15, cols 8-15): a[0..3] in the layout's order. Lane
    // l gives row l % 16 of the left (l < 16) or right (l >= 16) half.
    mma::ldmatrix_x4(a, tile + (row0 + lane % 16) * kLd + kk * 16 + (lane / 16) * 8);
  } else {
    mma::load_a_fragment_by_words<kLd>(a, tile, row0, kk, lane / 4, lane % 4);
  }
}

template <class Recipe, bool kBf16, int kHeadDim>
__global__ void __launch_bounds__(kThreads)
    flash2_tuned_kernel(const std::uint16_t* __restrict__ q, const std::uint16_t* __restrict__ k,
                        const std::uint16_t* __restrict__ v, float* __restrict__ out,
                        std::uint16_t* __restrict__ out16, int seqlen_q, int seqlen_k, int n_heads, int n_kv_heads,
                        int group, float scale_log2, bool causal) {
  using Shape = TileShape<Recipe, kHeadDim>;
  constexpr int kMTiles = Shape::kMTiles;
  constexpr int kRows = Shape::kRows;
  constexpr int kLd = Shape::kLd;
  static_assert(Recipe::kAsyncCopy, "variant 4's synchronous loads live in v4_v5_cuda_flash2_mma.cu");
  constexpr bool kLdmatrix = Recipe::kLdmatrix;
  constexpr int kKSteps = kHeadDim / 16;   // k-steps of S = Q K^T
  constexpr int kKeys = Shape::kKeys;
  constexpr int kKeyTiles = kKeys / 8;     // n-tiles of S (8 keys each)
  constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of O (8 dims each)
  extern __shared__ std::uint16_t smem[];
  std::uint16_t* q_s = smem;                                  // [kRows][kLd]
  std::uint16_t* k_s = q_s + kRows * kLd;                     // [kStages][kKeys][kLd]
  std::uint16_t* v_s = k_s + Shape::kStages * kKeys * kLd;    // [kStages][kKeys][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // fragment coordinates (flash2_mma.cuh)
  const BlockWork work = block_work<Recipe>();
  const int q0 = work.q_block * kRows;
  const int h = work.head, kv_head = h / group;
  const int warp_row0 = warp * Recipe::kRowsPerWarp;
  // This thread accumulates rows g (half 0) and g + 8 (half 1) of each of its
  // warp's M-tiles: query q0 + warp_row0 + 16 mt + 8 half + g. A fragment's
  // elements 0, 1 belong to half 0, elements 2, 3 to half 1. (Each row's
  // last visible key is recomputed where a tile is masked rather than kept:
  // at d = 128 with 32 rows per warp every register counts.)
  const int thread_row0 = q0 + warp_row0 + g;
  // Same values in every thread: all threads run the same tiles and barriers.
  const int keys_needed =
      detail::last_visible_key(min(q0 + kRows, seqlen_q) - 1, seqlen_q, seqlen_k, causal) + 1;
  const int n_tiles = keys_needed > 0 ? ceil_div(keys_needed, kKeys) : 0;
  // Keys every row of the block sees (its first row sees the fewest): a tile
  // wholly below this needs no mask.
  const int unmasked_keys = min(seqlen_k, detail::last_visible_key(q0, seqlen_q, seqlen_k, causal) + 1);

  const HoistedTileCopier<kHeadDim, kKeys> kv_copier(n_kv_heads, kv_head);  // variant 15's (K and V share it)
  const auto load_kv_tile = [&](int tile, int stage) {
    if constexpr (Recipe::kHoistedCopies) {
      kv_copier.copy(k_s + stage * kKeys * kLd, k, tile * kKeys, seqlen_k);
      kv_copier.copy(v_s + stage * kKeys * kLd, v, tile * kKeys, seqlen_k);
    } else {
      mma::load_tile<kHeadDim, kKeys, kThreads, /*kAsync=*/true>(k_s + stage * kKeys * kLd, k, tile * kKeys,
                                                                 seqlen_k, n_kv_heads, kv_head);
      mma::load_tile<kHeadDim, kKeys, kThreads, /*kAsync=*/true>(v_s + stage * kKeys * kLd, v, tile * kKeys,
                                                                 seqlen_k, n_kv_heads, kv_head);
    }
  };
  mma::load_tile<kHeadDim, kRows, kThreads, /*kAsync=*/true>(q_s, q, q0, seqlen_q, n_heads, h);
  if (n_tiles > 0) load_kv_tile(0, 0);  // in flight together with Q's copies
  mma::cp_async_commit();
  mma::cp_async_wait<0>();
  __syncthreads();  // the Q tile (and K/V tile 0) are complete before warps read their fragments

  // The warp's Q rows as A fragments, kept in registers where they fit.
  std::uint32_t q_frag[Shape::kQInRegisters ? kMTiles : 1][Shape::kQInRegisters ? kKSteps : 1][4];
  if constexpr (Shape::kQInRegisters) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
        load_a_fragment<kLdmatrix, kLd>(q_frag[mt][kk], q_s, warp_row0 + 16 * mt, kk, lane);
  }

  float o_acc[kMTiles][kDimTiles][4];  // unnormalized O: M-tile, dims 8n + 2t (+1), rows g / g + 8
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) o_acc[mt][n][0] = o_acc[mt][n][1] = o_acc[mt][n][2] = o_acc[mt][n][3] = 0.0f;
  float row_max[kMTiles][2];  // running max (log2 domain) of each of the thread's rows
  float row_sum[kMTiles][2];  // this thread's PART of the running sums (a quarter of each tile's columns)
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int k0 = tile * kKeys;
    const int stage = tile % 2;
    // Variant 4 loads a tile between two barriers and computes after it. Here
    // one barrier per tile does two jobs: after it, every thread's copies of
    // this tile are visible to the whole block (each thread has just waited
    // for its own), and every warp is done with the previous tile, whose
    // buffer the next copies overwrite.
    mma::cp_async_wait<0>();
    __syncthreads();
    if (tile + 1 < n_tiles) load_kv_tile(tile + 1, 1 - stage);  // flies during this tile's math
    mma::cp_async_commit();  // (an empty group on the last tile: the counting stays simple)
    const std::uint16_t* k_tile = k_s + stage * kKeys * kLd;  // [kKeys][kLd]
    const std::uint16_t* v_tile = v_s + stage * kKeys * kLd;  // [kKeys][kLd]

    // S = Q K^T for the warp's rows x the tile's keys: kMTiles x kKeyTiles C fragments.
    float s[kMTiles][kKeyTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      std::uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if constexpr (Shape::kQInRegisters) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = q_frag[mt][kk][i];
        } else {
          load_a_fragment<kLdmatrix, kLd>(a[mt], q_s, warp_row0 + 16 * mt, kk, lane);
        }
      }
      // B = K^T: B[dim][key] = K[key][dim], so B's "column" g is key row 8n + g.
      if constexpr (kLdmatrix) {
        // Two n-tiles per ldmatrix: matrices (keys 8n.., dims 16kk..), (keys
        // 8n.., dims 16kk+8..), (keys 8n+8.., dims 16kk..), (keys 8n+8..,
        // dims 16kk+8..) = b0, b1 of n-tile n, then of n-tile n + 1.
#pragma unroll
        for (int n = 0; n < kKeyTiles; n += 2) {
          std::uint32_t b[4];
          mma::ldmatrix_x4(b, k_tile + (n * 8 + lane % 8 + (lane / 16) * 8) * kLd + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma::mma_16x8x16<kBf16>(s[mt][n], a[mt], b[0], b[1]);
            mma::mma_16x8x16<kBf16>(s[mt][n + 1], a[mt], b[2], b[3]);
          }
        }
      } else {
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
          std::uint32_t b[2];  // variant 4's way: two 32-bit loads
          mma::load_key_fragment_by_words<kLd>(b, k_tile, n, kk, g, t);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) mma::mma_16x8x16<kBf16>(s[mt][n], a[mt], b[0], b[1]);
        }
      }
    }

    // Scale into the log2 domain and mask keys past each row's last visible
    // key (which also covers keys past seqlen_k). With the causal schedule,
    // only a tile that reaches past the block's first row's last key needs
    // the compare at all: under a causal mask that is the one or two tiles
    // on the diagonal; without one, the last partial tile. The branch is the
    // same for the whole block (k0, unmasked_keys), so no warp diverges.
    const bool mask_this_tile = !Recipe::kCausalSchedule || k0 + kKeys > unmasked_keys;
    std::uint32_t p_frag[kMTiles][kKeys / 16][4];  // P as A fragments of O += P V (16 keys each)
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + n * 8 + 2 * t + (e % 2);
          const bool visible =
              !mask_this_tile ||
              key <= detail::last_visible_key(thread_row0 + 16 * mt + 8 * (e / 2), seqlen_q, seqlen_k, causal);
          if constexpr (Recipe::kFastSoftmax)
            s[mt][n][e] = visible ? s[mt][n][e] : -INFINITY;  // raw: scaled inside the exponent below
          else
            s[mt][n][e] = visible ? __fmul_rn(s[mt][n][e], scale_log2) : -INFINITY;  // as variant 4 (its comment)
          tile_max[e / 2] = fmaxf(tile_max[e / 2], s[mt][n][e]);
        }
      float rescale[2], base[2], tile_sum[2] = {0.0f, 0.0f};
      bool max_moved = false;  // did either of this thread's rows take a new max (so O must be rescaled)?
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // A row's 64 columns are spread over the 4 threads of a quad (t = 0..3,
        // neighbouring lanes): two butterfly shuffles give all four the row max.
#pragma unroll
        for (int offset = 1; offset <= 2; offset *= 2)
          tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], offset));
        // The tile's max in the log2 domain. Variant 13 scales the raw max
        // here, once per row: scale_log2 > 0 and rounding is monotonic, so
        // this is the max of the scaled scores, the same bits as variant 11's.
        const float tile_max_log2 = Recipe::kFastSoftmax ? tile_max[half] * scale_log2 : tile_max[half];
        float m_new = fmaxf(row_max[mt][half], tile_max_log2);
        // Variant 14 keeps the stale max unless the tile passes it by more
        // than the threshold (-inf + 8 = -inf: a row's first visible key
        // always sets its max).
        if (Recipe::kLazyRescale && !(tile_max_log2 > row_max[mt][half] + kLazyRescaleLog2Threshold))
          m_new = row_max[mt][half];
        // A row with no visible key so far has m_new = -inf; subtracting 0
        // instead keeps exp2(-inf - (-inf)) = NaN out: every p and the rescale are 0.
        base[half] = m_new == -INFINITY ? 0.0f : m_new;
        const bool moved = m_new != row_max[mt][half];
        if (Recipe::kLazyRescale && !moved)
          rescale[half] = 1.0f;  // exactly, whatever ex2.approx gives for 0 (the skip below relies on it)
        else
          rescale[half] = Recipe::kFastSoftmax ? mma::fast_exp2(row_max[mt][half] - base[half])
                                               : exp2f(row_max[mt][half] - base[half]);
        max_moved = max_moved || moved;
        row_max[mt][half] = m_new;
      }
      // P = exp2(S - m), this thread's share of the row sums, and P rounded to
      // 16 bits as the A fragments of the second product (n-tiles 2ks, 2ks + 1).
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (Recipe::kFastSoftmax)  // one FFMA, one MUFU.EX2 (s = -inf gives 2^-inf = 0)
            s[mt][n][e] = mma::fast_exp2(fmaf(s[mt][n][e], scale_log2, -base[e / 2]));
          else
            s[mt][n][e] = exp2f(s[mt][n][e] - base[e / 2]);
        }
        tile_sum[0] += s[mt][n][0] + s[mt][n][1];  // added in variant 4's order: the same bits
        tile_sum[1] += s[mt][n][2] + s[mt][n][3];
      }
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks) {
        p_frag[mt][ks][0] = mma::pack2<kBf16>(s[mt][2 * ks][0], s[mt][2 * ks][1]);
        p_frag[mt][ks][1] = mma::pack2<kBf16>(s[mt][2 * ks][2], s[mt][2 * ks][3]);
        p_frag[mt][ks][2] = mma::pack2<kBf16>(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
        p_frag[mt][ks][3] = mma::pack2<kBf16>(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) row_sum[mt][half] = rescale[half] * row_sum[mt][half] + tile_sum[half];
      // Variant 14 skips the O rescale when no row of the warp took a new max
      // (a row that did not has rescale = 2^0 = 1, so the skip changes no
      // bit). The vote keeps the branch the same for the whole warp: a branch
      // taken by some lanes only would run both ways for all of them.
      if (!Recipe::kLazyRescale || __any_sync(0xffffffffu, max_moved)) {
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
          o_acc[mt][n][0] *= rescale[0];
          o_acc[mt][n][1] *= rescale[0];
          o_acc[mt][n][2] *= rescale[1];
          o_acc[mt][n][3] *= rescale[1];
        }
      }
    }

    // O += P V, 16 keys per k-step. B = V[key][dim]: b0 = V[16ks + 2t, +1][8n + g],
    // b1 = V[16ks + 8 + 2t, +1][8n + g]: two keys of one dim per register.
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      if constexpr (kLdmatrix) {
        // ldmatrix.trans hands each lane two rows of one column: matrices
        // (keys 16ks.., dims 8n..), (keys 16ks+8.., dims 8n..), then the same
        // for dims 8n+8..: b0, b1 of n-tile n, then of n-tile n + 1.
#pragma unroll
        for (int n = 0; n < kDimTiles; n += 2) {
          std::uint32_t b[4];
          mma::ldmatrix_x4</*kTransposed=*/true>(b, v_tile + (ks * 16 + lane % 16) * kLd + (n + lane / 16) * 8);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma::mma_16x8x16<kBf16>(o_acc[mt][n], p_frag[mt][ks], b[0], b[1]);
            mma::mma_16x8x16<kBf16>(o_acc[mt][n + 1], p_frag[mt][ks], b[2], b[3]);
          }
        }
      } else {
        // Variant 4's way: four 16-bit loads packed by hand per n-tile.
#pragma unroll
        for (int n = 0; n < kDimTiles; ++n) {
          std::uint32_t b[2];
          mma::load_value_fragment_by_halves<kLd>(b, v_tile, ks, n, g, t);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
            mma::mma_16x8x16<kBf16>(o_acc[mt][n], p_frag[mt][ks], b[0], b[1]);
        }
      }
    }
  }

  // The full row sums (the quad's four parts, added once), then O / l (0 for
  // a row that saw no key), written as fp32 or as 16 bits.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[mt][half];
#pragma unroll
      for (int offset = 1; offset <= 2; offset *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int row = thread_row0 + 16 * mt + 8 * half;
      if (row >= seqlen_q) continue;
      const std::size_t row_offset = (static_cast<std::size_t>(row) * n_heads + h) * kHeadDim;
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        const int dim = n * 8 + 2 * t;
        const float lo = o_acc[mt][n][2 * half] * inv, hi = o_acc[mt][n][2 * half + 1] * inv;
        // A quad writes 16 contiguous bytes (8 of fp16) of a row per n-tile;
        // the rows' pieces meet in L2 before DRAM. Staging O through shared
        // memory for 16-byte stores would save instructions on an output
        // written once per block: not where this kernel's time goes.
        if constexpr (Recipe::kHalfOutput)
          *reinterpret_cast<std::uint32_t*>(out16 + row_offset + dim) = mma::pack2<kBf16>(lo, hi);
        else
          *reinterpret_cast<float2*>(out + row_offset + dim) = make_float2(lo, hi);
      }
    }
  }
}

template <class Recipe, bool kBf16, int kHeadDim>
void launch(const AttentionProblem& p, const AttentionArgs& args, const char* name) {
  using Shape = TileShape<Recipe, kHeadDim>;
  const auto kernel = flash2_tuned_kernel<Recipe, kBf16, kHeadDim>;
  detail::allow_dynamic_shared_memory(kernel, Shape::kSharedBytes, name);
  const int q_blocks = ceil_div(p.seqlen_q, Shape::kRows);
  const dim3 grid = Recipe::kCausalSchedule ? dim3(p.n_heads, q_blocks) : dim3(q_blocks, p.n_heads);
  if (grid.y > 65535u)  // gridDim.y's limit (x has 2^31 - 1)
    throw llm::InputError(std::string(name) + ": " + std::to_string(grid.y) +
                          (Recipe::kCausalSchedule ? " query blocks" : " heads") + " exceed the grid's 65535");
  if (Recipe::kHalfOutput ? args.out16 == nullptr : args.out == nullptr)
    throw llm::InputError(std::string(name) + (Recipe::kHalfOutput ? ": needs a 16-bit output (args.out16)"
                                                                   : ": needs an fp32 output (args.out)"));
  kernel<<<grid, kThreads, Shape::kSharedBytes, detail::stream_of(args)>>>(
      args.q16, args.k16, args.v16, args.out, args.out16, p.seqlen_q, p.seqlen_k, p.n_heads, p.n_kv_heads,
      p.group(), softmax_scale(p.head_dim) * detail::kLog2e, p.causal);
  LLM_CUDA_CHECK_LAUNCH();
}

// cp.async needs code compiled for sm_80+: refused in words, not trapped.
// Decided once per process per dtype (the timing loops call back to back).
template <bool kBf16>
void require_tuned_image(const char* name) {
  static const std::string why = tensor_core_unavailable(
      kBf16 ? "bf16 tensor-core mma with cp.async" : "fp16 tensor-core mma with cp.async",
      kFlash2TunedMinComputeCapability, flash2_tuned_kernel_image(), llm::cuda::compute_capability());
  if (!why.empty()) throw llm::DeviceError(std::string(name) + ": " + why);
}

template <class Recipe, bool kBf16>
void flash2_tuned(const AttentionProblem& p, const AttentionArgs& args, const char* name) {
  if (const char* why = fused_unsupported(p)) throw llm::InputError(std::string(name) + ": " + why);
  require_tuned_image<kBf16>(name);
  if (p.head_dim == 64) launch<Recipe, kBf16, 64>(p, args, name);
  else launch<Recipe, kBf16, 128>(p, args, name);
}

}  // namespace

void flash2_async_copy_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2_tuned<AsyncCopyRecipe, false>(p, args, "cuda_flash2_async");
}
void flash2_ldmatrix_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2_tuned<LdmatrixRecipe, false>(p, args, "cuda_flash2_ldmatrix");
}
void flash2_128_rows_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2_tuned<Rows128Recipe, false>(p, args, "cuda_flash2_128rows");
}
void flash2_causal_schedule_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2_tuned<CausalScheduleRecipe, false>(p, args, "cuda_flash2_causal");
}
void flash2_tuned_fp16_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2_tuned<HalfOutputRecipe, false>(p, args, "cuda_flash2_tuned_fp16");
}
void flash2_tuned_bf16_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2_tuned<HalfOutputRecipe, true>(p, args, "cuda_flash2_tuned_bf16");
}
void flash2_fast_softmax_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2_tuned<FastSoftmaxRecipe, false>(p, args, "cuda_flash2_fast_softmax");
}
void flash2_lazy_rescale_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2_tuned<LazyRescaleRecipe, false>(p, args, "cuda_flash2_lazy_rescale");
}
void flash2_hoisted_copies_fp16_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2_tuned<HoistedCopiesRecipe, false>(p, args, "cuda_flash2_hoisted_copies_fp16");
}
void flash2_hoisted_copies_bf16_attention(const AttentionProblem& p, const AttentionArgs& args) {
  flash2_tuned<HoistedCopiesRecipe, true>(p, args, "cuda_flash2_hoisted_copies_bf16");
}
// Every recipe and dtype is compiled in the same pass: one instance speaks for all.
KernelImage flash2_tuned_kernel_image() {
  return detail::kernel_image_of(flash2_tuned_kernel<AsyncCopyRecipe, false, 64>);
}

}  // namespace step02::cuda
