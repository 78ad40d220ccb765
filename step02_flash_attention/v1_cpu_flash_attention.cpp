// Variant 1: FlashAttention on the CPU, written out with plain loops
// (docs/02_flash_attention.md, sections 3 and 4, derive it).
//
// Softmax needs a row's max and sum, but both can be kept RUNNING. After key
// blocks 1..j a query row holds m (max score so far), l (sum of exp(s - m))
// and o (sum of exp(s - m) * v, unnormalized, [d]). A block with scores s_t
// updates them as
//   m' = max(m, max_t s_t)
//   l' = exp(m - m') * l + sum_t exp(s_t - m')
//   o' = exp(m - m') * o + sum_t exp(s_t - m') * v_t
// and the output is o / l at the end. Nothing of size Sq x Sk exists: one
// Br x Bc tile of scores is computed and consumed at once.
//
// Loop order (FlashAttention-2's): query blocks outside, key blocks inside,
// so a block's accumulator stays in cache; a causal block stops at its last
// visible key (about half the tiles skipped). The two tile products go
// through Eigen, as variant 0's whole-matrix ones do, so the comparison
// measures the algorithm, not a hand-written matmul; everything that IS the
// algorithm (tiling, masking, running max and sum, rescaling) is plain loops.
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "llm/exercise.hpp"
#include "step02_flash_attention/cpu_attention.hpp"

namespace step02::cpu {
namespace {

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using TileMap = Eigen::Map<RowMajorMatrix>;

// One query block's working set; every buffer is reused across blocks, heads
// and calls (thread_local below), so a timed run allocates nothing.
struct Tiles {
  std::vector<float> q;        // [Br, d]   query rows, pre-multiplied by 1/sqrt(d)
  std::vector<float> k;        // [Bc, d]   key block
  std::vector<float> v;        // [Bc, d]   value block
  std::vector<float> o;        // [Br, d]   unnormalized output accumulators
  std::vector<float> s;        // [Br, Bc]  scores of one tile, then their exp (P); the only "score" memory
  std::vector<float> row_max;  // [Sq]      running max m of every query row of the head
  std::vector<float> row_sum;  // [Sq]      running sum l of every query row of the head
  std::vector<float> rescale;  // [Br]      exp(m_old - m_new) of each row for the current tile

  void resize(int d, int seqlen_q) {
    q.resize(static_cast<std::size_t>(kBlockRows) * d);
    k.resize(static_cast<std::size_t>(kBlockCols) * d);
    v.resize(static_cast<std::size_t>(kBlockCols) * d);
    o.resize(static_cast<std::size_t>(kBlockRows) * d);
    s.resize(static_cast<std::size_t>(kBlockRows) * kBlockCols);
    row_max.resize(static_cast<std::size_t>(seqlen_q));
    row_sum.resize(static_cast<std::size_t>(seqlen_q));
    rescale.resize(static_cast<std::size_t>(kBlockRows));
  }
};

// Copies keys k0..k0+cols-1 of one KV head into tiles.k and tiles.v, through
// the view (the cache may be paged: consecutive positions need not be
// neighbours in memory).
void load_key_block(const AttentionProblem& p, const llm::KvView& kv, int kv_head, int k0, int cols, Tiles& tiles) {
  const int d = p.head_dim;
  for (int j = 0; j < cols; ++j) {
    const float* key = kv.key_row(k0 + j) + static_cast<std::size_t>(kv_head) * d;    // [d]
    const float* value = kv.value_row(k0 + j) + static_cast<std::size_t>(kv_head) * d;  // [d]
    std::copy(key, key + d, tiles.k.begin() + static_cast<std::ptrdiff_t>(j) * d);
    std::copy(value, value + d, tiles.v.begin() + static_cast<std::ptrdiff_t>(j) * d);
  }
}

// Copies the query rows q0..q0+rows-1 of head h into tiles.q, scaled by 1/sqrt(d).
void load_query_block(const AttentionProblem& p, const AttentionArgs& args, int h, int q0, int rows, float scale,
                      Tiles& tiles) {
  const int d = p.head_dim;
  for (int i = 0; i < rows; ++i) {
    const float* q_row = args.q + static_cast<std::size_t>(q0 + i) * p.q_row() + static_cast<std::size_t>(h) * d;
    for (int c = 0; c < d; ++c) tiles.q[static_cast<std::size_t>(i) * d + c] = q_row[c] * scale;
  }
}

// The online softmax of one tile, row by row: turns the scores s
// [rows, cols] of queries q0.. against keys k0.. into P = exp(s - m_new)
// (0 where masked), updates each row's running (m, l) and leaves the factor
// exp(m_old - m_new) that rescales its accumulator in tiles.rescale.
void online_softmax_tile(const AttentionProblem& p, TileMap& s, int q0, int k0, Tiles& tiles) {
  const auto rows = static_cast<int>(s.rows()), cols = static_cast<int>(s.cols());
  for (int i = 0; i < rows; ++i) {
    float* s_row = s.data() + static_cast<std::size_t>(i) * cols;  // [cols]
    // The causal mask inside a tile is a prefix: this row sees the
    // first `visible` keys of the block; the rest get p = 0.
    const int visible = std::max(0, std::min(cols, p.last_visible_key(q0 + i) - k0 + 1));
    if (visible == 0) {  // nothing new for this row: o and (m, l) stay as they are
      std::fill(s_row, s_row + cols, 0.0f);
      tiles.rescale[static_cast<std::size_t>(i)] = 1.0f;
      continue;
    }
    // BEGIN EXERCISE ex02.1
    float& m = tiles.row_max[static_cast<std::size_t>(q0 + i)];
    float& l = tiles.row_sum[static_cast<std::size_t>(q0 + i)];
    float tile_max = s_row[0];
    for (int j = 1; j < visible; ++j) tile_max = std::max(tile_max, s_row[j]);
    const float m_new = std::max(m, tile_max);
    // exp(m_old - m_new) <= 1; exp(-inf) = 0 on the row's first tile.
    tiles.rescale[static_cast<std::size_t>(i)] = std::exp(m - m_new);
    // p_j = exp(s_j - m_new), vectorized by Eigen (a scalar expf per
    // score would cost more than the products around it).
    Eigen::Map<Eigen::ArrayXf> probs(s_row, visible);
    probs = (probs - m_new).exp();
    std::fill(s_row + visible, s_row + cols, 0.0f);
    l = tiles.rescale[static_cast<std::size_t>(i)] * l + probs.sum();
    m = m_new;
    // END EXERCISE ex02.1
  }
}

// Normalizes once at the end: out = o / l (0 for a row that saw no key).
void write_normalized_block(const AttentionProblem& p, const AttentionArgs& args, int h, int q0, int rows,
                            const Tiles& tiles) {
  const int d = p.head_dim;
  for (int i = 0; i < rows; ++i) {
    const float l = tiles.row_sum[static_cast<std::size_t>(q0 + i)];
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    float* out = args.out + static_cast<std::size_t>(q0 + i) * p.q_row() + static_cast<std::size_t>(h) * d;
    const float* o = tiles.o.data() + static_cast<std::size_t>(i) * d;
    for (int c = 0; c < d; ++c) out[c] = o[c] * inv_l;
  }
}

}  // namespace

void flash_attention(const AttentionProblem& p, const AttentionArgs& args) {
  const int d = p.head_dim;
  const float scale = softmax_scale(d);
  thread_local Tiles tiles;
  tiles.resize(d, p.seqlen_q);

  for (int h = 0; h < p.n_heads; ++h) {
    const int kv_head = h / p.group();
    std::fill(tiles.row_max.begin(), tiles.row_max.end(), kMinusInfinity);
    std::fill(tiles.row_sum.begin(), tiles.row_sum.end(), 0.0f);

    for (int q0 = 0; q0 < p.seqlen_q; q0 += kBlockRows) {
      const int rows = std::min(kBlockRows, p.seqlen_q - q0);
      load_query_block(p, args, h, q0, rows, scale, tiles);
      std::fill(tiles.o.begin(), tiles.o.end(), 0.0f);
      // The block's last row sees the most keys; with a causal mask, key
      // blocks after its last visible key are skipped entirely.
      const int keys_needed = p.last_visible_key(q0 + rows - 1) + 1;

      for (int k0 = 0; k0 < keys_needed; k0 += kBlockCols) {
        const int cols = std::min(kBlockCols, p.seqlen_k - k0);
        load_key_block(p, args.kv, kv_head, k0, cols, tiles);

        // S = (Q / sqrt(d)) K^T for this tile: [rows, d] x [d, cols].
        TileMap s(tiles.s.data(), rows, cols);  // [rows, cols] (row stride cols)
        s.noalias() = TileMap(tiles.q.data(), rows, d) * TileMap(tiles.k.data(), cols, d).transpose();
        online_softmax_tile(p, s, q0, k0, tiles);  // S becomes P; (m, l) updated

        // o = rescale * o + P V: rescale each row, then one tile product.
        // BEGIN EXERCISE ex02.1
        for (int i = 0; i < rows; ++i)
          for (int c = 0; c < d; ++c) tiles.o[static_cast<std::size_t>(i) * d + c] *= tiles.rescale[static_cast<std::size_t>(i)];
        TileMap(tiles.o.data(), rows, d).noalias() += s * TileMap(tiles.v.data(), cols, d);
        // END EXERCISE ex02.1
      }
      write_normalized_block(p, args, h, q0, rows, tiles);
    }
  }
}

std::size_t flash_score_bytes(const AttentionProblem& p) {
  // The Br x Bc score tile plus (m, l) for every query row of the head.
  return (static_cast<std::size_t>(kBlockRows) * kBlockCols + 2 * static_cast<std::size_t>(p.seqlen_q)) *
         sizeof(float);
}

void flash_prefill(const llm::AttentionShape& shape, const float* q, const llm::KvView& kv, int n_past, int n_new,
                   float* out) {
  const PrefillCall call = prefill_call(shape, q, kv, n_past, n_new, out);
  flash_attention(call.problem, call.args);
}

}  // namespace step02::cpu
