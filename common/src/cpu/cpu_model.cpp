#include "llm/cpu_model.hpp"

#include <fmt/format.h>

#include <cstring>

#include "llm/errors.hpp"

namespace llm {

CpuModel::CpuModel(const ModelWeights& w, CpuModelOptions options)
    : config_(w.config),
      final_norm_(w.final_norm),
      rope_(w.config.seq_len, w.config.head_dim(), w.config.rope_theta),
      attention_(options.attention) {
  const ModelConfig& c = config_;
  c.validate();
  const int q_width = c.n_heads * c.head_dim();
  const auto& make = options.linear_factory;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
    Layer layer;
    layer.attention_norm = lw.attention_norm;
    layer.wq = make(lw.wq, q_width, c.dim, {l, LinearRole::Query});
    layer.wk = make(lw.wk, c.kv_dim(), c.dim, {l, LinearRole::Key});
    layer.wv = make(lw.wv, c.kv_dim(), c.dim, {l, LinearRole::Value});
    layer.wo = make(lw.wo, c.dim, q_width, {l, LinearRole::Output});
    layer.ffn_norm = lw.ffn_norm;
    layer.w1 = make(lw.w1, c.hidden_dim, c.dim, {l, LinearRole::Gate});
    layer.w2 = make(lw.w2, c.dim, c.hidden_dim, {l, LinearRole::Down});
    layer.w3 = make(lw.w3, c.hidden_dim, c.dim, {l, LinearRole::Up});
    layers_.push_back(std::move(layer));
  }
  classifier_ = make(w.classifier_matrix(), c.vocab_size, c.dim, {-1, LinearRole::Classifier});
  // A tied classifier that kept its fp32 weights is the embedding table: read
  // the rows from there instead of storing the matrix twice.
  if (c.shared_classifier && classifier_->dense_weight() != nullptr) {
    embedding_rows_ = classifier_->dense_weight();
  } else {
    token_embedding_ = w.token_embedding;
    embedding_rows_ = token_embedding_.data();
  }
}

std::size_t CpuModel::stored_weight_bytes() const {
  std::size_t floats = token_embedding_.size() + final_norm_.size();
  for (const Layer& l : layers_) floats += l.attention_norm.size() + l.ffn_norm.size();
  return weight_bytes() + floats * sizeof(float);
}

std::unique_ptr<KvCache> CpuModel::make_cache(int num_sequences, int capacity) const {
  return std::make_unique<CpuKvCache>(config_, num_sequences, capacity);
}

std::size_t CpuModel::weight_bytes() const {
  std::size_t bytes = classifier_->weight_bytes();
  for (const Layer& l : layers_)
    bytes += l.wq->weight_bytes() + l.wk->weight_bytes() + l.wv->weight_bytes() + l.wo->weight_bytes() +
             l.w1->weight_bytes() + l.w2->weight_bytes() + l.w3->weight_bytes();
  return bytes;
}

void CpuModel::ensure_scratch(int rows) {
  if (rows <= scratch_rows_) return;
  const ModelConfig& c = config_;
  const auto r = static_cast<std::size_t>(rows);
  const std::size_t q_width = static_cast<std::size_t>(c.n_heads) * c.head_dim();
  x_.resize(r * c.dim);
  xb_.resize(r * c.dim);
  q_.resize(r * q_width);
  k_.resize(r * c.kv_dim());
  v_.resize(r * c.kv_dim());
  attn_out_.resize(r * q_width);
  proj_.resize(r * c.dim);
  gate_.resize(r * c.hidden_dim);
  up_.resize(r * c.hidden_dim);
  logits_.resize(r * c.vocab_size);
  final_rows_.resize(r * c.dim);
  scratch_rows_ = rows;
}

// Attention sub-block of one layer: project, rotate, append K/V to the cache,
// attend. Reads xb_ [rows, dim], writes attn_out_ [rows, n_heads*head_dim].
void CpuModel::attention_block(int layer_index, const TokenBatch& batch, const KvCache& cache) {
  const ModelConfig& c = config_;
  const Layer& layer = layers_[static_cast<std::size_t>(layer_index)];
  const int rows = batch.size();
  const int q_width = c.n_heads * c.head_dim();
  const int kv_dim = c.kv_dim();
  const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim()};

  layer.wq->forward(xb_.data(), rows, q_.data());  // q_ [rows, n_heads*head_dim]
  layer.wk->forward(xb_.data(), rows, k_.data());  // k_ [rows, kv_dim]
  layer.wv->forward(xb_.data(), rows, v_.data());  // v_ [rows, kv_dim]

  for (int r = 0; r < rows; ++r) {
    const int pos = batch.positions[r];
    float* q_row = q_.data() + static_cast<std::size_t>(r) * q_width;
    float* k_row = k_.data() + static_cast<std::size_t>(r) * kv_dim;
    cpu::rope(q_row, c.n_heads, c.head_dim(), pos, rope_);
    cpu::rope(k_row, c.n_kv_heads, c.head_dim(), pos, rope_);
    // Append this token's K and V to its sequence's cache, in the cache's
    // element type: later tokens read them instead of recomputing them (the
    // whole point of step 01).
    store_kv_row(cache.view(layer_index, batch.sequences[r]), pos, k_row,
                 v_.data() + static_cast<std::size_t>(r) * kv_dim);
  }

  // Each sequence's rows form one run. A run of several rows is a prefill
  // (many queries, causal among themselves); single rows are decode queries,
  // handed to the decode kernel together.
  decode_views_.clear();
  decode_lengths_.clear();
  decode_rows_.clear();
  for (int r0 = 0; r0 < rows;) {
    int r1 = r0 + 1;
    while (r1 < rows && batch.sequences[r1] == batch.sequences[r0]) ++r1;
    const KvView view = cache.view(layer_index, batch.sequences[r0]);
    if (r1 - r0 == 1) {
      decode_views_.push_back(view);
      decode_lengths_.push_back(batch.positions[r0] + 1);
      decode_rows_.push_back(r0);
    } else {
      attention_.prefill(shape, q_.data() + static_cast<std::size_t>(r0) * q_width, view, batch.positions[r0],
                         r1 - r0, attn_out_.data() + static_cast<std::size_t>(r0) * q_width);
    }
    r0 = r1;
  }
  if (decode_rows_.empty()) return;
  const auto n_decode = static_cast<int>(decode_rows_.size());
  const bool rows_are_leading = decode_rows_.back() == n_decode - 1;  // rows 0..n-1: no gather needed
  if (rows_are_leading) {
    attention_.decode(shape, q_.data(), decode_views_, decode_lengths_, attn_out_.data());
    return;
  }
  decode_q_.resize(static_cast<std::size_t>(n_decode) * q_width);
  decode_out_.resize(decode_q_.size());
  for (int i = 0; i < n_decode; ++i)
    std::memcpy(decode_q_.data() + static_cast<std::size_t>(i) * q_width,
                q_.data() + static_cast<std::size_t>(decode_rows_[i]) * q_width, sizeof(float) * q_width);
  attention_.decode(shape, decode_q_.data(), decode_views_, decode_lengths_, decode_out_.data());
  for (int i = 0; i < n_decode; ++i)
    std::memcpy(attn_out_.data() + static_cast<std::size_t>(decode_rows_[i]) * q_width,
                decode_out_.data() + static_cast<std::size_t>(i) * q_width, sizeof(float) * q_width);
}

std::span<const float> CpuModel::forward(const TokenBatch& batch, KvCache& cache, LogitsFor which) {
  check_cache(config_, device_name(), cache, attention_.reads(cache.element()));
  validate_batch(config_, batch, cache);
  reserve_batch(batch, cache);

  const ModelConfig& c = config_;
  const int rows = batch.size();
  const std::size_t dim = c.dim;
  ensure_scratch(rows);

  // x [rows, dim] = embedding rows of the tokens.
  for (int r = 0; r < rows; ++r)
    std::memcpy(x_.data() + r * dim, embedding_rows_ + static_cast<std::size_t>(batch.tokens[r]) * dim,
                sizeof(float) * dim);

  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& layer = layers_[static_cast<std::size_t>(l)];
    // --- attention: x += wo . attention(rope(wq xb), rope(wk xb), wv xb), xb = rmsnorm(x)
    for (int r = 0; r < rows; ++r)
      cpu::rmsnorm(xb_.data() + r * dim, x_.data() + r * dim, layer.attention_norm.data(), c.dim, c.norm_eps);
    attention_block(l, batch, cache);
    layer.wo->forward(attn_out_.data(), rows, proj_.data());  // proj_ [rows, dim]
    cpu::add_inplace(x_.data(), proj_.data(), rows * c.dim);

    // --- feed-forward: x += w2 . (silu(w1 xb) * w3 xb), xb = rmsnorm(x)
    for (int r = 0; r < rows; ++r)
      cpu::rmsnorm(xb_.data() + r * dim, x_.data() + r * dim, layer.ffn_norm.data(), c.dim, c.norm_eps);
    layer.w1->forward(xb_.data(), rows, gate_.data());  // gate_ [rows, hidden_dim]
    layer.w3->forward(xb_.data(), rows, up_.data());    // up_   [rows, hidden_dim]
    cpu::swiglu(gate_.data(), up_.data(), rows * c.hidden_dim);
    layer.w2->forward(gate_.data(), rows, proj_.data());  // proj_ [rows, dim]
    cpu::add_inplace(x_.data(), proj_.data(), rows * c.dim);
  }
  for (int r = 0; r < rows; ++r) cache.mark_written(batch.sequences[r], batch.positions[r]);

  // Final norm and classifier, only for the rows whose logits are wanted.
  int n_out = 0;
  for (int r = 0; r < rows; ++r) {
    const bool last_of_sequence = r + 1 == rows || batch.sequences[r + 1] != batch.sequences[r];
    if (which == LogitsFor::AllRows || last_of_sequence) {
      cpu::rmsnorm(final_rows_.data() + static_cast<std::size_t>(n_out) * dim, x_.data() + r * dim,
                   final_norm_.data(), c.dim, c.norm_eps);
      ++n_out;
    }
  }
  classifier_->forward(final_rows_.data(), n_out, logits_.data());  // logits_ [n_out, vocab]
  return {logits_.data(), static_cast<std::size_t>(n_out) * c.vocab_size};
}

}  // namespace llm
