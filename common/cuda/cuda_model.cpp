#include "cuda_model.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "kernels.cuh"
#include "llm/cpu_ops.hpp"
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"

namespace llm::cuda {
namespace {

// Checks what the kernels rely on before any GPU memory is touched: a valid
// config, a head the attention kernels can hold, and every tensor of the size
// its shape says (a short vector would become an out-of-bounds read on the
// GPU, where nothing checks bounds). Returns the config.
const ModelConfig& checked_config(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  c.validate();
  if (c.head_dim() > kernels::kMaxHeadDim)
    throw InputError(fmt::format("the CUDA baseline supports head_dim up to {} (this model has {})",
                                 kernels::kMaxHeadDim, c.head_dim()));
  auto expect = [](const std::vector<float>& tensor, std::size_t size, const std::string& name) {
    if (tensor.size() != size)
      throw InputError(fmt::format("weights: {} has {} values, expected {}", name, tensor.size(), size));
  };
  const auto dim = static_cast<std::size_t>(c.dim);
  expect(w.token_embedding, static_cast<std::size_t>(c.vocab_size) * dim, "token_embedding");
  expect(w.final_norm, dim, "final_norm");
  if (w.layers.size() != static_cast<std::size_t>(c.n_layers))
    throw InputError(fmt::format("weights: {} layers, the config says {}", w.layers.size(), c.n_layers));
  for (const LayerWeights& lw : w.layers) {
    expect(lw.attention_norm, dim, "attention_norm");
    expect(lw.ffn_norm, dim, "ffn_norm");
  }
  return c;  // the matrices are checked by DenseCudaLinear
}

DeviceBuffer<float> to_device(const std::vector<float>& host) {
  return DeviceBuffer<float>(std::span<const float>(host));
}

}  // namespace

CudaModel::CudaModel(const ModelWeights& w, CudaModelOptions options)
    : config_(checked_config(w)),
      shape_{config_.n_heads, config_.n_kv_heads, config_.head_dim()},
      attention_(options.attention),
      final_norm_(to_device(w.final_norm)) {
  const ModelConfig& c = config_;
  const int q_width = c.n_heads * c.head_dim();
  const auto& make = options.linear_factory;
  const cublasHandle_t cublas = cublas_.get();
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
    Layer layer;
    layer.attention_norm = to_device(lw.attention_norm);
    layer.wq = make(lw.wq, q_width, c.dim, {l, LinearRole::Query}, cublas);
    layer.wk = make(lw.wk, c.kv_dim(), c.dim, {l, LinearRole::Key}, cublas);
    layer.wv = make(lw.wv, c.kv_dim(), c.dim, {l, LinearRole::Value}, cublas);
    layer.wo = make(lw.wo, c.dim, q_width, {l, LinearRole::Output}, cublas);
    layer.ffn_norm = to_device(lw.ffn_norm);
    layer.w1 = make(lw.w1, c.hidden_dim, c.dim, {l, LinearRole::Gate}, cublas);
    layer.w2 = make(lw.w2, c.dim, c.hidden_dim, {l, LinearRole::Down}, cublas);
    layer.w3 = make(lw.w3, c.hidden_dim, c.dim, {l, LinearRole::Up}, cublas);
    layers_.push_back(std::move(layer));
  }
  classifier_ = make(w.classifier_matrix(), c.vocab_size, c.dim, {-1, LinearRole::Classifier}, cublas);
  // A tied classifier that kept its fp32 weights is the embedding table: the
  // lookup reads its rows instead of a second copy in GPU memory.
  if (c.shared_classifier && classifier_->dense_weight() != nullptr) {
    embedding_rows_ = classifier_->dense_weight();
  } else {
    token_embedding_ = to_device(w.token_embedding);
    embedding_rows_ = token_embedding_.data();
  }

  // The RoPE angles come from the CPU's own table (computed in float on the
  // host), so both devices rotate by bit-identical cos/sin values.
  const cpu::RopeTable rope(c.seq_len, c.head_dim(), c.rope_theta);
  const std::size_t table_floats = static_cast<std::size_t>(c.seq_len) * (c.head_dim() / 2);
  rope_cos_ = DeviceBuffer<float>(std::span<const float>(rope.cos_row(0), table_floats));
  rope_sin_ = DeviceBuffer<float>(std::span<const float>(rope.sin_row(0), table_floats));
}

std::unique_ptr<KvCache> CudaModel::make_cache(int num_sequences, int capacity) const {
  return std::make_unique<CudaKvCache>(config_, num_sequences, capacity);
}

std::size_t CudaModel::weight_bytes() const {
  std::size_t bytes = classifier_->weight_bytes();
  for (const Layer& l : layers_)
    bytes += l.wq->weight_bytes() + l.wk->weight_bytes() + l.wv->weight_bytes() + l.wo->weight_bytes() +
             l.w1->weight_bytes() + l.w2->weight_bytes() + l.w3->weight_bytes();
  return bytes;
}

// The host half of a forward: which rows form prefill runs, which are decode
// queries, which get logits, and the cache view of every row in every layer.
// The grouping is CpuModel's: each sequence's rows form one run; a run of
// several rows is a prefill, single rows are decode queries.
void CudaModel::plan(const TokenBatch& batch, const KvCache& cache, LogitsFor which) {
  const int rows = batch.size();
  const int n_layers = config_.n_layers;

  row_views_host_.resize(static_cast<std::size_t>(n_layers) * rows);
  for (int l = 0; l < n_layers; ++l)
    for (int r = 0; r < rows; ++r)
      row_views_host_[static_cast<std::size_t>(l) * rows + r] = cache.view(l, batch.sequences[r]);

  prefill_runs_.clear();
  decode_rows_host_.clear();
  decode_lengths_host_.clear();
  for (int r0 = 0; r0 < rows;) {
    int r1 = r0 + 1;
    while (r1 < rows && batch.sequences[r1] == batch.sequences[r0]) ++r1;
    if (r1 - r0 == 1) {
      decode_rows_host_.push_back(r0);
      decode_lengths_host_.push_back(batch.positions[r0] + 1);  // the query sees itself and everything before
    } else {
      prefill_runs_.push_back({r0, r1 - r0, batch.sequences[r0], batch.positions[r0]});
    }
    r0 = r1;
  }
  const auto n_decode = static_cast<int>(decode_rows_host_.size());
  decode_max_length_ = 0;
  for (int len : decode_lengths_host_) decode_max_length_ = std::max(decode_max_length_, len);
  decode_views_host_.resize(static_cast<std::size_t>(n_layers) * n_decode);
  for (int l = 0; l < n_layers; ++l)
    for (int i = 0; i < n_decode; ++i)
      decode_views_host_[static_cast<std::size_t>(l) * n_decode + i] =
          row_views_host_[static_cast<std::size_t>(l) * rows + decode_rows_host_[static_cast<std::size_t>(i)]];

  logit_rows_host_.clear();
  for (int r = 0; r < rows; ++r) {
    const bool last_of_sequence = r + 1 == rows || batch.sequences[r + 1] != batch.sequences[r];
    if (which == LogitsFor::AllRows || last_of_sequence) logit_rows_host_.push_back(r);
  }
}

void CudaModel::ensure_scratch(int rows, std::size_t workspace_floats) {
  workspace_.ensure(workspace_floats);
  if (rows <= scratch_rows_) return;
  const ModelConfig& c = config_;
  const auto r = static_cast<std::size_t>(rows);
  const std::size_t q_width = static_cast<std::size_t>(c.n_heads) * c.head_dim();
  const auto layers = static_cast<std::size_t>(c.n_layers);
  tokens_.ensure(r);
  positions_.ensure(r);
  row_views_.ensure(layers * r);
  decode_rows_.ensure(r);
  decode_lengths_.ensure(r);
  decode_views_.ensure(layers * r);
  logit_rows_.ensure(r);
  x_.ensure(r * c.dim);
  xb_.ensure(r * c.dim);
  q_.ensure(r * q_width);
  k_.ensure(r * c.kv_dim());
  v_.ensure(r * c.kv_dim());
  attn_out_.ensure(r * q_width);
  proj_.ensure(r * c.dim);
  gate_.ensure(r * c.hidden_dim);
  up_.ensure(r * c.hidden_dim);
  final_rows_.ensure(r * c.dim);
  final_normed_.ensure(r * c.dim);
  logits_.ensure(r * c.vocab_size);
  scratch_rows_ = rows;
}

// Attention sub-block of one layer: project, rotate, append K/V to the cache,
// attend. Reads xb_ [rows, dim], writes attn_out_ [rows, n_heads*head_dim].
void CudaModel::attention_block(int layer_index, const KvCache& cache, int rows) {
  const ModelConfig& c = config_;
  const Layer& layer = layers_[static_cast<std::size_t>(layer_index)];
  const std::size_t q_width = static_cast<std::size_t>(c.n_heads) * c.head_dim();
  cudaStream_t stream = stream_.get();

  layer.wq->forward(xb_.data(), rows, q_.data(), stream);  // q_ [rows, n_heads*head_dim]
  layer.wk->forward(xb_.data(), rows, k_.data(), stream);  // k_ [rows, kv_dim]
  layer.wv->forward(xb_.data(), rows, v_.data(), stream);  // v_ [rows, kv_dim]
  kernels::rope(q_.data(), rows, c.n_heads, c.head_dim(), positions_.data(), rope_cos_.data(), rope_sin_.data(),
                stream);
  kernels::rope(k_.data(), rows, c.n_kv_heads, c.head_dim(), positions_.data(), rope_cos_.data(),
                rope_sin_.data(), stream);
  // Append every row's K and V to its sequence's cache before any attention
  // runs: a prefill run's queries attend to the run's own keys.
  // The cache's element type decides how (fp32 copy, int8 quantization).
  kernels::write_kv_rows(k_.data(), v_.data(), row_views_.data() + static_cast<std::size_t>(layer_index) * rows,
                         positions_.data(), rows, c.kv_dim(), c.head_dim(), cache.element(), stream);

  // Prefill runs one launch each; the launches run in order on the stream, so
  // they share the workspace.
  for (const PrefillRun& run : prefill_runs_) {
    const std::size_t offset = static_cast<std::size_t>(run.first_row) * q_width;
    attention_.prefill(shape_, q_.data() + offset, cache.view(layer_index, run.sequence), run.n_past, run.n_rows,
                       attn_out_.data() + offset, workspace_.data(), stream);
  }
  // All decode queries in one launch; they read and write their own rows.
  const auto n_decode = static_cast<int>(decode_rows_host_.size());
  if (n_decode > 0) {
    const std::size_t layer_offset = static_cast<std::size_t>(layer_index) * n_decode;
    kernels::DecodeQueries queries;
    queries.views = decode_views_.data() + layer_offset;
    queries.lengths = decode_lengths_.data();
    queries.rows = decode_rows_.data();
    queries.views_host = decode_views_host_.data() + layer_offset;
    queries.lengths_host = decode_lengths_host_.data();
    queries.rows_host = decode_rows_host_.data();
    queries.n_queries = n_decode;
    queries.max_length = decode_max_length_;
    attention_.decode(shape_, q_.data(), queries, attn_out_.data(), workspace_.data(), stream);
  }
}

std::span<const float> CudaModel::forward(const TokenBatch& batch, KvCache& cache, LogitsFor which) {
  check_cache(config_, device_name(), cache, attention_.reads(cache.element()));
  validate_batch(config_, batch, cache);
  reserve_batch(batch, cache);  // room for the rows; block tables on the device

  const ModelConfig& c = config_;
  const int rows = batch.size();
  const std::size_t dim = c.dim;
  cudaStream_t stream = stream_.get();

  plan(batch, cache, which);
  std::size_t workspace_floats = 0;
  if (!decode_rows_host_.empty())
    workspace_floats =
        attention_.decode_workspace(shape_, static_cast<int>(decode_rows_host_.size()), decode_max_length_);
  for (const PrefillRun& run : prefill_runs_)
    workspace_floats = std::max(workspace_floats, attention_.prefill_workspace(shape_, run.n_past, run.n_rows));
  ensure_scratch(rows, workspace_floats);

  // The plan goes to the GPU (small copies, queued before the kernels that
  // read them; the host vectors stay untouched until the next forward, after
  // this one has synchronized).
  tokens_.upload_async(batch.tokens, stream);
  positions_.upload_async(batch.positions, stream);
  row_views_.upload_async(row_views_host_, stream);
  decode_rows_.upload_async(decode_rows_host_, stream);
  decode_lengths_.upload_async(decode_lengths_host_, stream);
  decode_views_.upload_async(decode_views_host_, stream);
  logit_rows_.upload_async(logit_rows_host_, stream);

  // x [rows, dim] = embedding rows of the tokens.
  kernels::gather_rows(x_.data(), embedding_rows_, tokens_.data(), rows, c.dim, stream);

  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& layer = layers_[static_cast<std::size_t>(l)];
    // --- attention: x += wo . attention(rope(wq xb), rope(wk xb), wv xb), xb = rmsnorm(x)
    kernels::rmsnorm(xb_.data(), x_.data(), layer.attention_norm.data(), rows, c.dim, c.norm_eps, stream);
    attention_block(l, cache, rows);
    layer.wo->forward(attn_out_.data(), rows, proj_.data(), stream);  // proj_ [rows, dim]
    kernels::add_inplace(x_.data(), proj_.data(), rows * dim, stream);

    // --- feed-forward: x += w2 . (silu(w1 xb) * w3 xb), xb = rmsnorm(x)
    kernels::rmsnorm(xb_.data(), x_.data(), layer.ffn_norm.data(), rows, c.dim, c.norm_eps, stream);
    layer.w1->forward(xb_.data(), rows, gate_.data(), stream);  // gate_ [rows, hidden_dim]
    layer.w3->forward(xb_.data(), rows, up_.data(), stream);    // up_   [rows, hidden_dim]
    kernels::swiglu(gate_.data(), up_.data(), static_cast<std::size_t>(rows) * c.hidden_dim, stream);
    layer.w2->forward(gate_.data(), rows, proj_.data(), stream);  // proj_ [rows, dim]
    kernels::add_inplace(x_.data(), proj_.data(), rows * dim, stream);
  }
  for (int r = 0; r < rows; ++r) cache.mark_written(batch.sequences[r], batch.positions[r]);

  // Final norm and classifier, only for the rows whose logits are wanted.
  const auto n_out = static_cast<int>(logit_rows_host_.size());
  kernels::gather_rows(final_rows_.data(), x_.data(), logit_rows_.data(), n_out, c.dim, stream);  // [n_out, dim]
  kernels::rmsnorm(final_normed_.data(), final_rows_.data(), final_norm_.data(), n_out, c.dim, c.norm_eps, stream);
  classifier_->forward(final_normed_.data(), n_out, logits_.data(), stream);  // logits_ [n_out, vocab]

  logits_host_.resize(static_cast<std::size_t>(n_out) * c.vocab_size);
  logits_.download_async(logits_host_, stream);
  stream_.synchronize();  // the one wait of the forward: the logits are on the host
  return logits_host_;
}

std::unique_ptr<Model> make_cuda_model(const ModelWeights& weights) {
  const DeviceStatus status = device_status();
  if (!status.usable) throw DeviceError("cannot run the CUDA model: " + status.reason);
  return std::make_unique<CudaModel>(weights);
}

}  // namespace llm::cuda
