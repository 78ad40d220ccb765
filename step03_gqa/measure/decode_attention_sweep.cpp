#include "step03_gqa/measure/decode_attention_sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <span>

#include "llm/attention.hpp"
#include "llm/kv_cache.hpp"
#include "llm/harness/cpu_cache_flush.hpp"
#include "llm/harness/random_fill.hpp"
#include "step03_gqa/cuda_gqa_attention.hpp"
#include "step03_gqa/gqa_attention.hpp"

namespace step03 {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A one-layer model config with the attention dims of the sweep: enough for
// llm::CpuKvCache to size a real cache.
llm::ModelConfig attention_layer_config(int n_heads, int kv_heads, int head_dim, int capacity) {
  llm::ModelConfig c;
  c.dim = n_heads * head_dim;
  c.hidden_dim = 1;
  c.n_layers = 1;
  c.n_heads = n_heads;
  c.n_kv_heads = kv_heads;
  c.vocab_size = 1;
  c.seq_len = capacity;
  return c;
}

// Host bytes of K and V for `heads` heads at `context` positions (fp32).
double kv_bytes(const SweepOptions& o, int heads, int context) {
  return 2.0 * static_cast<double>(o.head_dim) * sizeof(float) * heads * context;
}

}  // namespace

namespace {

// One KV-head configuration: a real cache as long as its longest context (the
// shorter contexts read its first positions), and its GPU copy.
struct Configuration {
  int kv_heads = 0;
  llm::ModelConfig config;
  std::unique_ptr<llm::CpuKvCache> cache;
  llm::KvView view;
  std::unique_ptr<CudaDecodeProblem> device;
  std::size_t per_token_measured = 0;  // bytes_allocated() / capacity
};

// A cell being measured: its result and the variant's functions.
struct PendingCell {
  SweepCell cell;
  const Configuration* configuration;
  const DecodeAttentionFns* fns;
  std::vector<double> samples_ms;
};

}  // namespace

std::vector<int> contexts_that_fit(const SweepOptions& o, std::vector<std::string>* skipped) {
  std::vector<int> contexts;
  for (const int context : o.contexts) {
    double need = kv_bytes(o, o.n_heads, context);  // repeat_kv's copy: n_heads wide
    for (const int kv : o.kv_heads) need += kv_bytes(o, kv, context);
    if (need <= o.max_host_gib * kGiB)
      contexts.push_back(context);
    else if (skipped)
      skipped->push_back(fmt::format("context {}: the caches of all KV-head counts and the repeat_kv copy need "
                                     "{:.1f} GiB > --max-host-gib {}",
                                     context, need / kGiB, o.max_host_gib));
  }
  return contexts;
}

namespace {

// One Configuration per KV-head count, its cache filled with random K/V (and
// uploaded when CUDA runs). query: [n_heads, head_dim].
std::vector<Configuration> make_configurations(const SweepOptions& o, int capacity, const std::vector<float>& query) {
  std::vector<Configuration> configurations;
  for (const int kv_heads : o.kv_heads) {
    Configuration c;
    c.kv_heads = kv_heads;
    c.config = attention_layer_config(o.n_heads, kv_heads, o.head_dim, capacity);
    c.cache = std::make_unique<llm::CpuKvCache>(c.config, 1, capacity);
    c.view = c.cache->view(0, 0);
    const std::size_t kv_floats = static_cast<std::size_t>(capacity) * c.config.kv_dim();
    llm::fill_uniform(c.view.keys, kv_floats, o.seed + 1000 * kv_heads + 1);
    llm::fill_uniform(c.view.values, kv_floats, o.seed + 1000 * kv_heads + 2);
    c.per_token_measured = c.cache->bytes_allocated() / static_cast<std::size_t>(capacity);
    if (o.cuda)
      c.device = std::make_unique<CudaDecodeProblem>(llm::AttentionShape{o.n_heads, kv_heads, o.head_dim}, c.view,
                                                     capacity, query);
    configurations.push_back(std::move(c));
  }
  return configurations;
}

// Checks every cell of one context once against the reference (which also
// warms it up). CUDA cells are timed right away into `result`; the CPU cells
// are returned, to be timed round-robin.
std::vector<PendingCell> check_cells(const SweepOptions& o, const std::vector<Configuration>& configurations,
                                     const std::vector<float>& query, int context, SweepResult& result) {
  const std::size_t q_floats = query.size();
  const int length_array[1] = {context};
  const std::span<const int> lengths(length_array);  // [1] one sequence's valid positions
  std::vector<PendingCell> cpu_cells;
  for (const Configuration& c : configurations) {
    const llm::AttentionShape shape{o.n_heads, c.kv_heads, o.head_dim};
    const llm::KvView view_array[1] = {c.view};
    const std::span<const llm::KvView> views(view_array);  // [1]
    std::vector<float> reference(q_floats);  // [n_heads, head_dim]
    llm::cpu::reference_decode_attention(shape, query.data(), views, lengths, reference.data());
    for (const auto& v : variants()) {
      if (std::find(o.variant_ids.begin(), o.variant_ids.end(), v.id) == o.variant_ids.end()) continue;
      SweepCell cell;
      cell.variant_id = v.id;
      cell.variant_name = v.name;
      cell.n_heads = o.n_heads;
      cell.kv_heads = c.kv_heads;
      cell.context = context;
      cell.kv_bytes_per_token_formula = c.config.kv_bytes_per_token();
      cell.kv_bytes_per_token_measured = c.per_token_measured;
      cell.cache_bytes_at_context = c.config.kv_bytes_per_token() * static_cast<std::size_t>(context);
      if (o.cpu) {
        PendingCell pending{cell, &c, &v.fn, {}};
        pending.cell.device = "cpu";
        // Poison the output so a variant that writes nothing cannot pass.
        std::vector<float> out(q_floats, std::numeric_limits<float>::quiet_NaN());  // [n_heads, head_dim]
        v.fn.cpu(shape, query.data(), views, lengths, out.data());
        pending.cell.error = llm::compare(out, reference, llm::tolerance_for(llm::DType::F32));
        cpu_cells.push_back(std::move(pending));
      }
      if (o.cuda) {
        SweepCell gpu = cell;
        gpu.device = "cuda";
        const std::vector<float> out = c.device->run(v.fn.cuda, context);
        gpu.error = llm::compare(out, reference, llm::tolerance_for(llm::DType::F32));
        gpu.timing = c.device->time(v.fn.cuda, context, o.warmup, o.repeats);
        result.cells.push_back(std::move(gpu));
      }
    }
  }
  return cpu_cells;
}

// Times the CPU cells of one context round-robin: run r of every cell before
// run r+1 of any. The machine's background load drifts over seconds; with
// interleaving a slow spell spreads over all configurations instead of
// landing on whichever happened to be running, so the ratios between
// configurations (the point of the table) stay honest.
void time_round_robin(const SweepOptions& o, std::vector<PendingCell>& cpu_cells, const std::vector<float>& query,
                      int context, llm::CpuCacheFlusher* flusher, SweepResult& result) {
  const int length_array[1] = {context};
  const std::span<const int> lengths(length_array);  // [1]
  std::vector<float> out(query.size());  // [n_heads, head_dim]
  for (int run = 0; run < o.warmup + o.repeats; ++run) {
    for (PendingCell& p : cpu_cells) {
      const llm::AttentionShape shape{o.n_heads, p.configuration->kv_heads, o.head_dim};
      const llm::KvView view_array[1] = {p.configuration->view};
      const std::span<const llm::KvView> views(view_array);
      const double ms =
          llm::time_one_run([&] { p.fns->cpu(shape, query.data(), views, lengths, out.data()); }, flusher);
      if (run >= o.warmup) p.samples_ms.push_back(ms);
    }
  }
  for (PendingCell& p : cpu_cells) {
    p.cell.timing = llm::TimingStats::from_samples(std::move(p.samples_ms));
    result.cells.push_back(std::move(p.cell));
  }
}

}  // namespace

SweepResult run_decode_attention_sweep(const SweepOptions& o) {
  SweepResult result;
  std::unique_ptr<llm::CpuCacheFlusher> flusher;
  if (o.flush_caches && o.cpu) {
    flusher = std::make_unique<llm::CpuCacheFlusher>(0, o.flush_limit_bytes);
    result.flush_bytes = flusher->bytes();
  }
  const std::size_t q_floats = static_cast<std::size_t>(o.n_heads) * o.head_dim;
  std::vector<float> query(q_floats);  // [n_heads, head_dim], the same for every cell
  llm::fill_uniform(query.data(), q_floats, o.seed + 7);

  // All configurations live at once (so their timings can be interleaved,
  // below): the contexts that fit in the memory limit all together.
  const std::vector<int> contexts = contexts_that_fit(o, &result.skipped);
  if (contexts.empty()) return result;
  const int capacity = *std::max_element(contexts.begin(), contexts.end());
  const std::vector<Configuration> configurations = make_configurations(o, capacity, query);

  for (const int context : contexts) {
    if (o.progress) o.progress->start(fmt::format("decode attention at context {}", context));
    std::vector<PendingCell> cpu_cells = check_cells(o, configurations, query, context, result);
    time_round_robin(o, cpu_cells, query, context, flusher.get(), result);
  }
  // CPU rows first, then CUDA, each in (context, kv_heads, variant) order.
  std::stable_sort(result.cells.begin(), result.cells.end(),
                   [](const SweepCell& a, const SweepCell& b) { return a.device < b.device; });
  return result;
}

}  // namespace step03
