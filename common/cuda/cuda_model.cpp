#include "cuda_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "kernels.cuh"
#include "programmatic_launch.cuh"
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

// The rows of several [*, in] matrices, one after another: the matrix of a
// fused product whose output row is their outputs side by side.
std::vector<float> stacked_rows(std::initializer_list<const std::vector<float>*> matrices) {
  std::size_t floats = 0;
  for (const std::vector<float>* matrix : matrices) floats += matrix->size();
  std::vector<float> stacked;
  stacked.reserve(floats);  // one allocation: growing it matrix by matrix copied and touched it again
  for (const std::vector<float>* matrix : matrices) stacked.insert(stacked.end(), matrix->begin(), matrix->end());
  return stacked;
}

}  // namespace

CudaModel::CudaModel(const ModelWeights& w, CudaModelOptions options)
    : config_(checked_config(w)),
      shape_{config_.n_heads, config_.n_kv_heads, config_.head_dim()},
      attention_(options.attention),
      fusions_(options.fusions),
      final_norm_(to_device(w.final_norm)),
      graphs_enabled_(options.graphs),
      programmatic_launches_(options.programmatic_launches) {
  const ModelConfig& c = config_;
  cublas_.bind_to_stream(stream_.get());  // every product runs on stream_, with no allocation inside cuBLAS
  const int q_width = c.n_heads * c.head_dim();
  const auto& make = options.linear_factory;
  const cublasHandle_t cublas = cublas_.get();
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& lw = w.layers[static_cast<std::size_t>(l)];
    Layer layer;
    layer.attention_norm = to_device(lw.attention_norm);
    if (fusions_.qkv_product) {
      // Sited as the query: the factories that build fused layers ignore the
      // role (dense, half); step 06's role-keyed factories run unfused.
      layer.wqkv = make(stacked_rows({&lw.wq, &lw.wk, &lw.wv}), q_width + 2 * c.kv_dim(), c.dim,
                        {l, LinearRole::Query}, cublas);
    } else {
      layer.wq = make(lw.wq, q_width, c.dim, {l, LinearRole::Query}, cublas);
      layer.wk = make(lw.wk, c.kv_dim(), c.dim, {l, LinearRole::Key}, cublas);
      layer.wv = make(lw.wv, c.kv_dim(), c.dim, {l, LinearRole::Value}, cublas);
    }
    layer.wo = make(lw.wo, c.dim, q_width, {l, LinearRole::Output}, cublas);
    layer.ffn_norm = to_device(lw.ffn_norm);
    if (fusions_.gate_up_product) {
      layer.w13 = make(stacked_rows({&lw.w1, &lw.w3}), 2 * c.hidden_dim, c.dim, {l, LinearRole::Gate}, cublas);
    } else {
      layer.w1 = make(lw.w1, c.hidden_dim, c.dim, {l, LinearRole::Gate}, cublas);
      layer.w3 = make(lw.w3, c.hidden_dim, c.dim, {l, LinearRole::Up}, cublas);
    }
    layer.w2 = make(lw.w2, c.dim, c.hidden_dim, {l, LinearRole::Down}, cublas);
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

  // Each product hands its GEMV the first weights of the one after it: QKV
  // (or Q, K, V) -> wo -> gate/up (or gate, up) -> w2 -> the next layer's
  // QKV, and the last w2 -> the classifier. Layers without the GEMV give no
  // lines and ignore the ones they are given.
  if (options.prefetch_next_product) {
    std::vector<CudaLinear*> run_order;
    for (const Layer& layer : layers_)
      for (CudaLinear* linear : layer.linears()) run_order.push_back(linear);
    run_order.push_back(classifier_.get());
    for (std::size_t p = 0; p + 1 < run_order.size(); ++p)
      run_order[p]->set_next_product_lines(run_order[p + 1]->first_weight_lines());
  }

  // Once here, not per forward: the products are fixed from now on.
  if (fusions_.norm_in_product) {
    fold_max_rows_ = classifier_->max_fused_rows();
    for (const Layer& layer : layers_)
      for (const CudaLinear* linear : layer.linears())
        fold_max_rows_ = std::min(fold_max_rows_, linear->max_fused_rows());
  }
}

std::unique_ptr<KvCache> CudaModel::make_cache(int num_sequences, int capacity) const {
  return std::make_unique<CudaKvCache>(config_, num_sequences, capacity);
}

std::vector<CudaLinear*> CudaModel::Layer::linears() const {
  std::vector<CudaLinear*> all;
  for (const auto* linear : {&wq, &wk, &wv, &wqkv, &wo, &w1, &w3, &w13, &w2})
    if (*linear) all.push_back(linear->get());
  return all;
}

std::size_t CudaModel::weight_bytes() const {
  std::size_t bytes = classifier_->weight_bytes();
  for (const Layer& layer : layers_)
    for (const CudaLinear* linear : layer.linears()) bytes += linear->weight_bytes();
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
    // A run of a few rows (a speculative verification, a small chunk) is
    // attended as that many decode queries, query r seeing the keys up to its
    // own position (causal): its K/V rows are appended before any attention
    // runs, so each query finds the run's earlier rows in the cache. That
    // keeps the forward a decode batch, replayed from a graph, and spares the
    // naive prefill kernel's score round trip. Only where the prefill kernel
    // is that naive one: a step that plugs in its own (step 02's
    // FlashAttention) gets every run of several rows.
    const bool short_run = r1 - r0 <= kShortRunRows && attention_.prefill == kernels::prefill_attention;
    if (r1 - r0 == 1 || short_run) {
      for (int r = r0; r < r1; ++r) {
        decode_rows_host_.push_back(r);
        decode_lengths_host_.push_back(batch.positions[r] + 1);  // the query sees itself and everything before
      }
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
  if (workspace_floats > workspace_.size()) {
    graphs_.clear();  // they point at the workspace about to be freed
    workspace_.ensure(workspace_floats);
  }
  if (rows <= scratch_rows_) return;
  graphs_.clear();  // every buffer below moves
  const ModelConfig& c = config_;
  const auto r = static_cast<std::size_t>(rows);
  const std::size_t q_width = static_cast<std::size_t>(c.n_heads) * c.head_dim();
  for (const Layer& layer : layers_)
    for (CudaLinear* linear : layer.linears()) linear->reserve_rows(rows);
  classifier_->reserve_rows(rows);
  x_.ensure(r * c.dim);
  xb_.ensure(r * c.dim);
  q_.ensure(r * q_width);
  k_.ensure(r * c.kv_dim());
  v_.ensure(r * c.kv_dim());
  attn_out_.ensure(r * q_width);
  proj_.ensure(r * c.dim);
  gate_.ensure(r * c.hidden_dim);
  if (!fusions_.gate_up_product) up_.ensure(r * c.hidden_dim);
  if (fusions_.qkv_product) qkv_.ensure(r * (q_width + 2 * static_cast<std::size_t>(c.kv_dim())));
  if (fusions_.gate_up_product) gate_up_.ensure(r * 2 * static_cast<std::size_t>(c.hidden_dim));
  final_rows_.ensure(r * c.dim);
  final_normed_.ensure(r * c.dim);
  logits_.ensure(r * c.vocab_size);
  if (fusions_.merge_in_split_kernel) {
    merge_tickets_.ensure(kernels::split_kv_decode_merge_tickets(shape_, rows));
    merge_tickets_.zero(stream_.get());  // queued before any kernel that takes a ticket
  }
  scratch_rows_ = rows;
}

namespace {

// Rounds `offset` up to a multiple of `alignment` (a power of two).
std::size_t align_up(std::size_t offset, std::size_t alignment) { return (offset + alignment - 1) & ~(alignment - 1); }

}  // namespace

void CudaModel::upload_plan(const TokenBatch& batch) {
  const auto rows = static_cast<std::size_t>(batch.size());
  const std::size_t n_decode = decode_rows_host_.size(), n_out = logit_rows_host_.size();
  const auto layers = static_cast<std::size_t>(config_.n_layers);
  // The views hold pointers: they go first, at offset 0 (cudaMalloc and
  // cudaMallocHost memory is aligned for anything); each array after them
  // starts on a 16-byte boundary.
  PlanLayout layout;
  std::size_t offset = 0;
  auto place = [&offset](std::size_t bytes) {
    const std::size_t at = offset;
    offset = align_up(offset + bytes, 16);
    return at;
  };
  layout.row_views = place(layers * rows * sizeof(KvView));
  layout.decode_views = place(layers * n_decode * sizeof(KvView));
  layout.tokens = place(rows * sizeof(int));
  layout.positions = place(rows * sizeof(int));
  layout.decode_rows = place(n_decode * sizeof(int));
  layout.decode_lengths = place(n_decode * sizeof(int));
  layout.logit_rows = place(n_out * sizeof(int));
  layout.bytes = offset;

  plan_host_.ensure(layout.bytes);
  if (layout.bytes > plan_device_.size()) {
    graphs_.clear();  // they read the blob about to be freed
    plan_device_.ensure(layout.bytes);
  }
  std::byte* host = plan_host_.data();
  auto copy_in = [host](std::size_t at, const auto* values, std::size_t count) {
    if (count > 0) std::memcpy(host + at, values, count * sizeof(*values));
  };
  copy_in(layout.row_views, row_views_host_.data(), row_views_host_.size());
  copy_in(layout.decode_views, decode_views_host_.data(), decode_views_host_.size());
  copy_in(layout.tokens, batch.tokens.data(), rows);
  copy_in(layout.positions, batch.positions.data(), rows);
  copy_in(layout.decode_rows, decode_rows_host_.data(), n_decode);
  copy_in(layout.decode_lengths, decode_lengths_host_.data(), n_decode);
  copy_in(layout.logit_rows, logit_rows_host_.data(), n_out);

  // The kernels' typed pointers into the device blob. For a decode batch of a
  // given size they are the same every token, which is what lets a captured
  // graph read this token's plan.
  std::byte* device = plan_device_.data();
  row_views_ = reinterpret_cast<const KvView*>(device + layout.row_views);
  decode_views_ = reinterpret_cast<const KvView*>(device + layout.decode_views);
  tokens_ = reinterpret_cast<const int*>(device + layout.tokens);
  positions_ = reinterpret_cast<const int*>(device + layout.positions);
  decode_rows_ = reinterpret_cast<const int*>(device + layout.decode_rows);
  decode_lengths_ = reinterpret_cast<const int*>(device + layout.decode_lengths);
  logit_rows_ = reinterpret_cast<const int*>(device + layout.logit_rows);
  // One copy for the whole plan, from pinned memory: truly asynchronous, and
  // queued before the kernels that read it.
  LLM_CUDA_CHECK(cudaMemcpyAsync(device, host, layout.bytes, cudaMemcpyHostToDevice, stream_.get()));
}

// Attention sub-block of one layer: project, rotate, append K/V to the cache,
// attend. Reads the normed input [rows, dim], writes attn_out_ [rows,
// n_heads*head_dim].
void CudaModel::attention_block(int layer_index, const KvCache& cache, int rows, const NormedInput& input) {
  const ModelConfig& c = config_;
  const Layer& layer = layers_[static_cast<std::size_t>(layer_index)];
  const std::size_t q_width = static_cast<std::size_t>(c.n_heads) * c.head_dim();
  cudaStream_t stream = stream_.get();

  // Q, K, V of every row, rotated, and K/V appended to each row's sequence
  // before any attention runs: a prefill run's queries attend to the run's
  // own keys. The cache's element type decides how K/V are stored (fp32
  // copy, int8 quantization).
  const KvView* layer_views = row_views_ + static_cast<std::size_t>(layer_index) * rows;  // [rows]
  const auto project = [&](const CudaLinear& linear, float* out) { multiply(linear, input, rows, out); };
  kernels::QkvRows in{};
  // The QKV product rotates and appends its own outputs (the product's
  // fusion also carries the norm when that is folded in).
  const bool rope_in_product = fusions_.qkv_product && fusions_.rope_in_qkv_product &&
                               cache.element() == KvElement::Float32 && layer.wqkv->fuses(rows);
  if (rope_in_product) {
    ProductFusion fusion = input.fusion;
    fusion.rope = {.q_out = q_.data(),
                   .views = layer_views,
                   .positions = positions_,
                   .cos_table = rope_cos_.data(),
                   .sin_table = rope_sin_.data(),
                   .n_heads = c.n_heads,
                   .n_kv_heads = c.n_kv_heads,
                   .head_dim = c.head_dim()};
    // Writes q_ and the cache rows; qkv_ only on the paths that run the
    // RoPE kernel after the product (half_linear.hpp).
    layer.wqkv->forward_fused(input.rows, rows, qkv_.data(), fusion, stream);
  } else if (fusions_.qkv_product) {
    project(*layer.wqkv, qkv_.data());  // qkv_ [rows, q_width + 2*kv_dim]
    const int stride = static_cast<int>(q_width) + 2 * c.kv_dim();
    in = {qkv_.data(), qkv_.data() + q_width, qkv_.data() + q_width + c.kv_dim(), stride, stride, stride};
  } else {
    project(*layer.wq, q_.data());  // q_ [rows, n_heads*head_dim]
    project(*layer.wk, k_.data());  // k_ [rows, kv_dim]
    project(*layer.wv, v_.data());  // v_ [rows, kv_dim]
    in = {q_.data(), k_.data(), v_.data(), static_cast<int>(q_width), c.kv_dim(), c.kv_dim()};
  }
  // The fused QKV product's rows are read in place by the fused kernel (its
  // strides), so that product brings the kernel along, unless it did the
  // kernel's work itself.
  if (fusions_.qkv_product || fusions_.rope_kv_write) {
    if (!rope_in_product)
      kernels::rope_and_write_kv(in, q_.data(), k_.data(), v_.data(), layer_views, positions_, rows, c.n_heads,
                                 c.n_kv_heads, c.head_dim(), rope_cos_.data(), rope_sin_.data(), cache.element(),
                                 stream);
  } else {
    kernels::rope(q_.data(), rows, c.n_heads, c.head_dim(), positions_, rope_cos_.data(), rope_sin_.data(), stream);
    kernels::rope(k_.data(), rows, c.n_kv_heads, c.head_dim(), positions_, rope_cos_.data(), rope_sin_.data(),
                  stream);
    kernels::write_kv_rows(k_.data(), v_.data(), layer_views, positions_, rows, c.kv_dim(), c.head_dim(),
                           cache.element(), stream);
  }

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
    queries.views = decode_views_ + layer_offset;
    queries.lengths = decode_lengths_;
    queries.rows = decode_rows_;
    queries.views_host = decode_views_host_.data() + layer_offset;
    queries.lengths_host = decode_lengths_host_.data();
    queries.rows_host = decode_rows_host_.data();
    queries.n_queries = n_decode;
    queries.max_length = decode_max_length_;
    if (fusions_.merge_in_split_kernel) queries.merge_tickets = merge_tickets_.data();
    attention_.decode(shape_, q_.data(), queries, attn_out_.data(), workspace_.data(), stream);
  }
}

// y = W input: the plain product, or the one with the norm folded in.
void CudaModel::multiply(const CudaLinear& linear, const NormedInput& input, int rows, float* y) const {
  if (input.fusion.input_norm != nullptr)
    linear.forward_fused(input.rows, rows, y, input.fusion, stream_.get());
  else
    linear.forward(input.rows, rows, y, stream_.get());
}

// Every kernel of the forward after the plan's upload, up to the logits in
// device memory. Eager forwards call it directly; a decode graph is a
// recording of one call.
void CudaModel::enqueue_layers(const KvCache& cache, int rows) {
  const ModelConfig& c = config_;
  const std::size_t dim = c.dim;
  cudaStream_t stream = stream_.get();
  const auto n_out = static_cast<int>(logit_rows_host_.size());
  const bool fold = folds_norms(rows, n_out);

  // x [rows, dim] = embedding rows of the tokens. The forward's first kernel
  // follows the plan's copy, not a kernel: it starts as any launch does.
  kernels::gather_rows(x_.data(), embedding_rows_, tokens_, rows, c.dim, stream);
  // Every later kernel of ours may start while the one before it finishes
  // (programmatic_launch.cuh); cuBLAS's and a step's own kernels start as
  // before.
  const OverlapLaunches overlap(programmatic_launches_);

  // What the products after `norm` read: x_ with the norm folded in, or xb_,
  // where the norm's kernel (below) has put rmsnorm(x).
  const auto normed = [&](const DeviceBuffer<float>& norm) {
    return fold ? NormedInput{x_.data(), ProductFusion{.input_norm = norm.data(), .norm_eps = c.norm_eps}}
                : NormedInput{xb_.data(), {}};
  };
  // x += W input, then xb = rmsnorm(x) with `next_norm` (none: the add
  // alone). Folded: the product adds itself to x, and the norm waits in the
  // next products.
  const auto add_to_residual = [&](const CudaLinear& linear, const float* input,
                                   const DeviceBuffer<float>* next_norm) {
    if (fold) {
      linear.forward_fused(input, rows, x_.data(), ProductFusion{.accumulate = true}, stream);
      return;
    }
    linear.forward(input, rows, proj_.data(), stream);  // proj_ [rows, dim]
    if (next_norm != nullptr && fusions_.residual_norm) {
      kernels::add_rmsnorm(x_.data(), proj_.data(), next_norm->data(), xb_.data(), rows, c.dim, c.norm_eps, stream);
      return;
    }
    kernels::add_inplace(x_.data(), proj_.data(), rows * dim, stream);
    if (next_norm != nullptr)
      kernels::rmsnorm(xb_.data(), x_.data(), next_norm->data(), rows, c.dim, c.norm_eps, stream);
  };

  // The first layer's norm; every later norm comes with the residual add
  // before it.
  if (!fold)
    kernels::rmsnorm(xb_.data(), x_.data(), layers_.front().attention_norm.data(), rows, c.dim, c.norm_eps, stream);
  for (int l = 0; l < c.n_layers; ++l) {
    const Layer& layer = layers_[static_cast<std::size_t>(l)];
    // --- attention: x += wo . attention(rope(wq xb), rope(wk xb), wv xb), then xb = rmsnorm(x)
    attention_block(l, cache, rows, normed(layer.attention_norm));
    add_to_residual(*layer.wo, attn_out_.data(), &layer.ffn_norm);

    // --- feed-forward: x += w2 . (silu(w1 xb) * w3 xb), then xb = the next layer's rmsnorm(x)
    const NormedInput ffn_input = normed(layer.ffn_norm);
    const bool last = l + 1 == c.n_layers;
    const DeviceBuffer<float>* next_norm = last ? nullptr : &layers_[static_cast<std::size_t>(l) + 1].attention_norm;
    if (fusions_.gate_up_product && fold) {
      // SwiGLU folded into w2 as well: w2 reads both halves of the gate/up rows.
      multiply(*layer.w13, ffn_input, rows, gate_up_.data());  // gate_up_ [rows, 2*hidden_dim]
      layer.w2->forward_fused(gate_up_.data(), rows, x_.data(),
                              ProductFusion{.swiglu_of_gate_up = true, .accumulate = true}, stream);
    } else {
      if (fusions_.gate_up_product) {
        multiply(*layer.w13, ffn_input, rows, gate_up_.data());  // gate_up_ [rows, 2*hidden_dim]
        kernels::swiglu_from_fused(gate_.data(), gate_up_.data(), rows, c.hidden_dim, stream);
      } else {
        multiply(*layer.w1, ffn_input, rows, gate_.data());  // gate_ [rows, hidden_dim]
        multiply(*layer.w3, ffn_input, rows, up_.data());    // up_   [rows, hidden_dim]
        kernels::swiglu(gate_.data(), up_.data(), static_cast<std::size_t>(rows) * c.hidden_dim, stream);
      }
      add_to_residual(*layer.w2, gate_.data(), next_norm);
    }
  }

  // Final norm and classifier, only for the rows whose logits are wanted:
  // gathered into final_rows_, or, when every row gets logits (a decode
  // batch, a verify pass: logit rows are the batch's rows in order), x_
  // itself, and the gather (a copy) is not launched.
  const float* final_rows = x_.data();  // [n_out, dim]
  if (n_out != rows) {
    kernels::gather_rows(final_rows_.data(), x_.data(), logit_rows_, n_out, c.dim, stream);
    final_rows = final_rows_.data();
  }
  if (fold) {
    classifier_->forward_fused(final_rows, n_out, logits_.data(),
                               ProductFusion{.input_norm = final_norm_.data(), .norm_eps = c.norm_eps}, stream);
  } else {
    kernels::rmsnorm(final_normed_.data(), final_rows, final_norm_.data(), n_out, c.dim, c.norm_eps, stream);
    classifier_->forward(final_normed_.data(), n_out, logits_.data(), stream);  // logits_ [n_out, vocab]
  }
}

CudaModel::DecodeGraph::~DecodeGraph() {
  if (exec_ != nullptr) static_cast<void>(cudaGraphExecDestroy(exec_));
}

void CudaModel::DecodeGraph::launch(cudaStream_t stream) const { LLM_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

const CudaModel::DecodeGraph& CudaModel::decode_graph(const GraphKey& key, const KvCache& cache, int rows) {
  if (const auto found = graphs_.find(key); found != graphs_.end()) return *found->second;
  cudaStream_t stream = stream_.get();
  // Capture: the launches below are recorded into `graph`, not run. Thread-
  // local mode: only this thread's calls are checked for what capture forbids
  // (a cudaMalloc, a synchronous copy), so another thread's model is free.
  LLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    enqueue_layers(cache, rows);
  } catch (...) {
    static_cast<void>(cudaStreamEndCapture(stream, &graph));  // leave the stream usable, then rethrow
    if (graph != nullptr) static_cast<void>(cudaGraphDestroy(graph));
    throw;
  }
  LLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  static_cast<void>(cudaGraphDestroy(graph));  // the executable graph is a copy
  LLM_CUDA_CHECK(instantiated);
  return *graphs_.emplace(key, std::make_unique<DecodeGraph>(exec)).first->second;
}

std::span<const float> CudaModel::forward(const TokenBatch& batch, KvCache& cache, LogitsFor which) {
  check_cache(config_, device_name(), cache, attention_.reads(cache.element()));
  validate_batch(config_, batch, cache);
  reserve_batch(batch, cache);  // room for the rows; block tables on the device

  const ModelConfig& c = config_;
  const int rows = batch.size();
  cudaStream_t stream = stream_.get();

  plan(batch, cache, which);
  std::size_t workspace_floats = 0;
  if (!decode_rows_host_.empty())
    workspace_floats =
        attention_.decode_workspace(shape_, static_cast<int>(decode_rows_host_.size()), decode_max_length_);
  for (const PrefillRun& run : prefill_runs_)
    workspace_floats = std::max(workspace_floats, attention_.prefill_workspace(shape_, run.n_past, run.n_rows));
  ensure_scratch(rows, workspace_floats);
  upload_plan(batch);

  // A batch of decode queries only (single rows and short runs) replays its
  // graph; anything with a prefill run, or a decode kernel without stable
  // launches, is launched kernel by kernel.
  const int bucket = attention_.graph_bucket(decode_max_length_);
  const GraphKey key{rows, static_cast<int>(logit_rows_host_.size()), bucket, cache.element()};
  if (graphs_enabled_ && prefill_runs_.empty() && bucket >= 0 && ran_eagerly_.contains(key)) {
    decode_graph(key, cache, rows).launch(stream);
  } else {
    // The first forward of a key runs eagerly: it loads every kernel it uses
    // (CUDA loads modules lazily, on first launch) and lets cuBLAS pick and
    // set up its kernels, none of which may happen during a capture.
    enqueue_layers(cache, rows);
    if (prefill_runs_.empty() && bucket >= 0) ran_eagerly_.insert(key);
  }
  for (int r = 0; r < rows; ++r) cache.mark_written(batch.sequences[r], batch.positions[r]);

  const std::size_t n_logits = logit_rows_host_.size() * static_cast<std::size_t>(c.vocab_size);
  logits_pinned_.ensure(n_logits);
  LLM_CUDA_CHECK(cudaMemcpyAsync(logits_pinned_.data(), logits_.data(), n_logits * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream));
  stream_.synchronize();  // the one wait of the forward: the logits are on the host
  return {logits_pinned_.data(), n_logits};
}

CudaLinearFactory cuda_linear_factory(WeightDtype dtype, HalfGemvKernel gemv, int max_gemv_rows,
                                      HalfGemvLoads loads) {
  switch (dtype) {
    case WeightDtype::Float32: return dense_cuda_linear_factory();
    case WeightDtype::Float16: return half_cuda_linear_factory(HalfType::Float16, gemv, max_gemv_rows, loads);
    case WeightDtype::BFloat16:
      return half_cuda_linear_factory(HalfType::BFloat16, gemv, max_gemv_rows, loads);
  }
  throw InputError("unknown weight dtype");
}

CudaModelOptions cuda_model_options(const CudaRunOptions& run) {
  CudaModelOptions options;
  options.linear_factory =
      cuda_linear_factory(run.dtype, run.gemv, run.max_gemv_rows,
                          {.prefetch_first_weights = run.gemv_prefetch,
                           .pipelined = run.gemv_pipelining,
                           .whole_wave_split = run.gemv_wave_fit});
  options.graphs = run.graphs;
  options.programmatic_launches = run.programmatic_launches;
  options.prefetch_next_product = run.gemv_prefetch_next;
  options.fusions = run.fusions ? CudaFusions::all() : CudaFusions::none();
  if (!run.fold_norms) options.fusions.norm_in_product = false;
  options.fusions.merge_in_split_kernel = run.fusions && run.fold_merge;
  if (!run.fold_rope) options.fusions.rope_in_qkv_product = false;
  return options;
}

std::unique_ptr<Model> make_cuda_model(const ModelWeights& weights, const CudaRunOptions& run) {
  const DeviceStatus status = device_status();
  if (!status.usable) throw DeviceError("cannot run the CUDA model: " + status.reason);
  return std::make_unique<CudaModel>(weights, cuda_model_options(run));
}

}  // namespace llm::cuda
