#include "step05_paged_attention/paged_attention.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "llm/errors.hpp"
#include "llm/exercise.hpp"

namespace step05 {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// [rows, head_dim] of one KV head, read in place from a block: consecutive
// positions are kv_dim floats apart (the other KV heads sit in between).
using CachedRows = Eigen::Map<const RowMajorMatrix, 0, Eigen::OuterStride<>>;

// Keys scored at a time within one block. A block longer than this (a
// contiguous "block" is the whole sequence) is cut into tiles of this many
// keys, so the score scratch stays small (kMaxTileKeys x group floats)
// whatever the context. 16, vLLM's default block size, for two reasons:
// 16 keys x kv_dim 1024 x 4 B = 64 KiB of K (and as much of V) per tile,
// which stays in L2 while every KV head's group uses it (the tile length:
// docs/05_paged_attention.md, section 5); and the contiguous walk and a paged one of
// blocks of 16 then run the same tiles, so part 2's overhead at block 16 is
// the table lookups alone (blocks of 8 add tiles half as long; blocks of 32
// and more are cut in tiles of 16 and pay one lookup per block).
constexpr int kMaxTileKeys = 16;

void check_shape(const llm::AttentionShape& s) {
  if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 || s.n_heads % s.n_kv_heads != 0)
    throw llm::InputError("step05 paged attention needs n_heads a positive multiple of n_kv_heads and head_dim > 0 "
                          "(got " + std::to_string(s.n_heads) + " query heads, " + std::to_string(s.n_kv_heads) +
                          " KV heads, head_dim " + std::to_string(s.head_dim) + ")");
}

void check_view(const llm::AttentionShape& s, const llm::KvView& kv) {
  if (kv.element != llm::KvElement::Float32)
    throw llm::InputError("step05 paged attention reads fp32 K/V; this view stores int8 rows (read it with "
                          "common's reference kernels)");
  if (kv.kv_dim != s.n_kv_heads * s.head_dim)
    throw llm::InputError("step05 paged attention: the view's rows hold " + std::to_string(kv.kv_dim) +
                          " floats, the shape needs n_kv_heads * head_dim = " +
                          std::to_string(s.n_kv_heads * s.head_dim));
  if (kv.block_size <= 0 || kv.block_table == nullptr || kv.keys == nullptr || kv.values == nullptr)
    throw llm::InputError("step05 paged attention: the view has no block table, no pools or a block size < 1");
}

// Scratch of one query row, reused across calls (thread_local below).
struct OnlineSoftmax {
  std::vector<float> running_max;  // [n_heads] largest score seen so far
  std::vector<float> running_sum;  // [n_heads] sum of exp(score - running_max) over the keys seen
  std::vector<float> accumulator;  // [n_heads, head_dim] sum of exp(score - running_max) * v
  std::vector<float> scores;       // [kMaxTileKeys, group] column-major: the tile's scores, one column per query head

  void reset(const llm::AttentionShape& s) {
    running_max.assign(static_cast<std::size_t>(s.n_heads), -std::numeric_limits<float>::infinity());
    running_sum.assign(static_cast<std::size_t>(s.n_heads), 0.0f);
    accumulator.assign(static_cast<std::size_t>(s.n_heads) * s.head_dim, 0.0f);
    scores.resize(static_cast<std::size_t>(kMaxTileKeys) * (s.n_heads / s.n_kv_heads));
  }
};

// One tile of `rows` consecutive pool rows (keys and values point at its
// first row) against the `group` query heads of KV head `kv_head`.
// q      [n_heads, head_dim] the query row
void attend_tile(const llm::AttentionShape& s, const float* q, const float* keys, const float* values, int kv_dim,
                 int rows, int kv_head, OnlineSoftmax& state) {
  const int group = s.n_heads / s.n_kv_heads;
  const int hd = s.head_dim;
  // Divide by sqrt(head_dim) (not multiply by its inverse) as the reference does.
  const float scale = std::sqrt(static_cast<float>(hd));
  const std::size_t first_head = static_cast<std::size_t>(kv_head) * group;  // the group's heads are adjacent
  const CachedRows k(keys + static_cast<std::size_t>(kv_head) * hd, rows, hd, Eigen::OuterStride<>(kv_dim));
  const CachedRows v(values + static_cast<std::size_t>(kv_head) * hd, rows, hd, Eigen::OuterStride<>(kv_dim));
  const Eigen::Map<const RowMajorMatrix> group_queries(q + first_head * hd, group, hd);  // [group, hd]
  Eigen::Map<Eigen::MatrixXf> scores(state.scores.data(), rows, group);                  // [rows, group]

  // Each K row of the tile is loaded once for the whole group: [rows, hd] x [hd, group].
  scores.noalias() = k * group_queries.transpose();
  scores /= scale;
  // Online softmax, per query head: the new maximum m' = max(m, tile max);
  // what was accumulated relative to m is rescaled by exp(m - m') (0 on the
  // first tile, where m = -inf); the tile's scores become exp(s - m').
  for (int g = 0; g < group; ++g) {
    const std::size_t h = first_head + static_cast<std::size_t>(g);
    auto column = scores.col(g).array();
    const float new_max = std::max(state.running_max[h], column.maxCoeff());
    const float rescale = std::exp(state.running_max[h] - new_max);
    column = (column - new_max).exp();
    state.running_sum[h] = state.running_sum[h] * rescale + column.sum();
    Eigen::Map<Eigen::VectorXf>(state.accumulator.data() + h * hd, hd) *= rescale;
    state.running_max[h] = new_max;
  }
  // accumulator^T [hd, group] += V^T [hd, rows] x P [rows, group]: each V row
  // read once for the group. A row-major [group, hd] block of the
  // accumulator is a column-major [hd, group] matrix: no copy.
  Eigen::Map<Eigen::MatrixXf> group_accumulator(state.accumulator.data() + first_head * hd, hd, group);
  group_accumulator.noalias() += v.transpose() * scores;
}

// One query row (all heads) against keys 0..n_keys-1 of a view, block by block.
// q    [n_heads, head_dim]
// out  [n_heads, head_dim]
void attend_one_query(const llm::AttentionShape& s, const float* q, const llm::KvView& kv, int n_keys, float* out) {
  thread_local OnlineSoftmax state;
  state.reset(s);
  // BEGIN EXERCISE ex05.2
  const auto row_floats = static_cast<std::size_t>(kv.kv_dim);
  for (int first_key = 0; first_key < n_keys; first_key += kv.block_size) {
    // The one table lookup of this block: every row below is addressed from it.
    const std::int32_t physical_block = kv.block_table[first_key / kv.block_size];
    const int block_keys = std::min(kv.block_size, n_keys - first_key);
    const std::size_t block_row = static_cast<std::size_t>(physical_block) * kv.block_size;  // first pool row
    for (int t0 = 0; t0 < block_keys; t0 += kMaxTileKeys) {
      const int rows = std::min(kMaxTileKeys, block_keys - t0);
      const std::size_t tile_offset = (block_row + t0) * row_floats;  // [rows, kv_dim] from here on
      // KV head by KV head inside the tile: the tile's rows (all heads) are
      // read in address order while they sit in cache (see step 03).
      for (int kv_head = 0; kv_head < s.n_kv_heads; ++kv_head)
        attend_tile(s, q, kv.keys + tile_offset, kv.values + tile_offset, kv.kv_dim, rows, kv_head, state);
    }
  }
  // END EXERCISE ex05.2
  // out_h = accumulator_h / running_sum_h: the division the softmax deferred.
  const std::size_t hd = static_cast<std::size_t>(s.head_dim);
  for (std::size_t h = 0; h < static_cast<std::size_t>(s.n_heads); ++h)
    for (std::size_t d = 0; d < hd; ++d) out[h * hd + d] = state.accumulator[h * hd + d] / state.running_sum[h];
}

}  // namespace

void paged_decode_attention(const llm::AttentionShape& shape, const float* q, std::span<const llm::KvView> kv,
                            std::span<const int> lengths, float* out) {
  check_shape(shape);
  if (kv.size() != lengths.size())
    throw llm::InputError("paged_decode_attention: " + std::to_string(kv.size()) + " views but " +
                          std::to_string(lengths.size()) + " lengths");
  const std::size_t row = static_cast<std::size_t>(shape.n_heads) * shape.head_dim;
  for (std::size_t s = 0; s < kv.size(); ++s) {
    check_view(shape, kv[s]);
    if (lengths[s] < 1)
      throw llm::InputError("paged_decode_attention: sequence " + std::to_string(s) + " has length " +
                            std::to_string(lengths[s]) + " (a decode query sees at least its own key)");
    attend_one_query(shape, q + s * row, kv[s], lengths[s], out + s * row);
  }
}

void paged_prefill_attention(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past,
                             int n_new, float* out) {
  check_shape(shape);
  check_view(shape, kv);
  if (n_past < 0 || n_new < 0)
    throw llm::InputError("paged_prefill_attention: n_past " + std::to_string(n_past) + ", n_new " +
                          std::to_string(n_new) + " (both must be >= 0)");
  const std::size_t row = static_cast<std::size_t>(shape.n_heads) * shape.head_dim;
  // Causal, bottom-right aligned: query i sits at position n_past + i and
  // sees keys 0..n_past+i. Each query walks the blocks on its own, so K/V are
  // read once per query, as in common's reference; a tiled prefill (step 02's
  // FlashAttention) would share each block among all the queries that see it.
  for (int i = 0; i < n_new; ++i)
    attend_one_query(shape, q + static_cast<std::size_t>(i) * row, kv, n_past + i + 1,
                     out + static_cast<std::size_t>(i) * row);
}

llm::cpu::AttentionKernels paged_cpu_attention() {
  llm::cpu::AttentionKernels kernels;
  kernels.prefill = &paged_prefill_attention;
  kernels.decode = &paged_decode_attention;
  return kernels;
}

}  // namespace step05
