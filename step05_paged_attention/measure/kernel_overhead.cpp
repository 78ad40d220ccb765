#include "step05_paged_attention/measure/kernel_overhead.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <span>

#include "llm/attention.hpp"
#include "llm/errors.hpp"
#include "llm/kv_cache.hpp"
#include "llm/harness/cpu_cache_flush.hpp"
#include "llm/harness/random_fill.hpp"
#include "step05_paged_attention/measure/cuda_paged_runner.hpp"
#include "step05_paged_attention/paged_attention.hpp"
#include "step05_paged_attention/measure/shuffled_kv_pool.hpp"

namespace step05 {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

void check_options(const KernelOverheadOptions& o) {
  if (o.n_heads <= 0 || o.n_kv_heads <= 0 || o.head_dim <= 0 || o.n_heads % o.n_kv_heads != 0)
    throw llm::InputError(fmt::format("kernel overhead: {} query heads, {} KV heads, head_dim {}: n_heads must be a "
                                      "positive multiple of n_kv_heads",
                                      o.n_heads, o.n_kv_heads, o.head_dim));
  const auto all_positive = [](const std::vector<int>& values) {
    for (const int v : values)
      if (v <= 0) return false;
    return !values.empty();
  };
  if (!all_positive(o.contexts) || !all_positive(o.block_sizes) || !all_positive(o.batches))
    throw llm::InputError("kernel overhead: contexts, block sizes and batches must be non-empty lists of positive "
                          "numbers");
  if (o.repeats < 1 || o.warmup < 0)
    throw llm::InputError(fmt::format("kernel overhead: repeats {} (>= 1), warmup {} (>= 0)", o.repeats, o.warmup));
}

// The seeds of sequence s's K and V (fill_uniform streams): the same rows for
// a sequence whatever the context, batch, layout or device.
std::uint64_t key_seed(const KernelOverheadOptions& o, int s) { return o.seed + 1000 + 2 * static_cast<std::uint64_t>(s); }
std::uint64_t value_seed(const KernelOverheadOptions& o, int s) { return key_seed(o, s) + 1; }
// The shuffle of the paged layout of one block size (CPU and CUDA use the same).
std::uint64_t layout_seed(const KernelOverheadOptions& o, int block_size) {
  return o.seed + static_cast<std::uint64_t>(block_size);
}

// The cells of one (device, context, batch), contiguous first.
struct CellGroup {
  std::vector<KernelOverheadCell> cells;

  void add(const std::string& device, int context, int batch, int block_size, std::size_t kv_bytes,
           llm::CompareResult error) {
    KernelOverheadCell c;
    c.device = device;
    c.context = context;
    c.batch = batch;
    c.block_size = block_size;
    c.kv_bytes_read = kv_bytes;
    c.error = error;
    cells.push_back(std::move(c));
  }
  // GB/s and the overhead vs cells[0] (the contiguous cell), once timed.
  void finish(std::vector<KernelOverheadCell>& out) {
    const double baseline_ms = cells.front().timing.median_ms;
    for (KernelOverheadCell& c : cells) {
      c.gb_per_s = c.timing.median_ms > 0.0 ? static_cast<double>(c.kv_bytes_read) / (c.timing.median_ms * 1e6) : 0.0;
      c.overhead_percent = baseline_ms > 0.0 ? (c.timing.median_ms / baseline_ms - 1.0) * 100.0 : 0.0;
      if (c.block_size == 0) c.overhead_percent = 0.0;
      out.push_back(std::move(c));
    }
  }
};

// One host layout of the CPU cells: the views the kernel reads.
struct CpuLayout {
  int block_size = 0;                     // 0: contiguous
  std::unique_ptr<ShuffledKvPool> pool;   // null for the contiguous layout
  std::vector<llm::KvView> views;         // [batch]
  std::vector<double> samples_ms;
};

// The CPU cells of one (context, batch): check each layout once, then time
// them round-robin (run r of every layout before run r+1 of any), so a slow
// spell of the machine spreads over all layouts instead of landing on one
// (step 03 does the same).
void measure_cpu(const KernelOverheadOptions& o, const llm::AttentionShape& shape, const llm::CpuKvCache& cache,
                 int context, int batch, std::span<const float> query, std::span<const float> reference,
                 std::size_t kv_bytes, llm::CpuCacheFlusher* flusher, std::vector<KernelOverheadCell>& out) {
  std::vector<CpuLayout> layouts(1);
  for (int s = 0; s < batch; ++s) layouts[0].views.push_back(cache.view(0, s));
  for (const int block_size : o.block_sizes) {
    CpuLayout l;
    l.block_size = block_size;
    l.pool = std::make_unique<ShuffledKvPool>(layouts[0].views, context, block_size, layout_seed(o, block_size));
    l.views = l.pool->views();
    layouts.push_back(std::move(l));
  }
  const std::vector<int> lengths(static_cast<std::size_t>(batch), context);  // every sequence at the full context
  std::vector<float> output(query.size());                                 // [batch, n_heads, head_dim]
  CellGroup group;
  for (const CpuLayout& l : layouts) {
    // Poisoned first, so a row the kernel does not write fails the check.
    std::fill(output.begin(), output.end(), std::numeric_limits<float>::quiet_NaN());
    paged_decode_attention(shape, query.data(), l.views, lengths, output.data());
    group.add("cpu", context, batch, l.block_size, kv_bytes,
              llm::compare(output, reference, llm::tolerance_for(llm::DType::F32)));
  }
  for (int run = 0; run < o.warmup + o.repeats; ++run) {
    for (CpuLayout& l : layouts) {
      const double ms = llm::time_one_run(
          [&] { paged_decode_attention(shape, query.data(), l.views, lengths, output.data()); }, flusher);
      if (run >= o.warmup) l.samples_ms.push_back(ms);
    }
  }
  for (std::size_t i = 0; i < layouts.size(); ++i)
    group.cells[i].timing = llm::TimingStats::from_samples(std::move(layouts[i].samples_ms));
  group.finish(out);
}

// The CUDA cells of one (context, batch): the sequences are already in the
// contiguous device layout; the paged pools are built from it on the GPU.
void measure_cuda(const KernelOverheadOptions& o, CudaKvLayouts& device, int context, int batch,
                  std::span<const float> query, std::span<const float> reference, std::size_t kv_bytes,
                  std::vector<KernelOverheadCell>& out) {
  const std::vector<int> lengths(static_cast<std::size_t>(batch), context);
  CellGroup group;
  const auto measure = [&](CudaDecodeKernel kernel, int layout) {
    const std::vector<float> output = device.decode(kernel, layout, query, lengths);
    group.add("cuda", context, batch, layout, kv_bytes, llm::compare(output, reference, llm::tolerance_for(llm::DType::F32)));
    group.cells.back().timing = device.time_decode(kernel, layout, query, lengths, o.warmup, o.repeats);
  };
  measure(CudaDecodeKernel::Contiguous, CudaKvLayouts::kContiguousLayout);
  for (const int block_size : o.block_sizes) {
    const int blocks_per_sequence = (context + block_size - 1) / block_size;
    const std::vector<std::int32_t> tables =
        shuffled_block_tables(batch, blocks_per_sequence, layout_seed(o, block_size));  // the CPU pool's order
    device.add_paged_layout(block_size, tables);
    measure(CudaDecodeKernel::Paged, block_size);
  }
  group.finish(out);
}

}  // namespace

KernelOverheadResult run_kernel_overhead(const KernelOverheadOptions& o) {
  check_options(o);
  KernelOverheadResult result;
  std::unique_ptr<llm::CpuCacheFlusher> flusher;
  if (o.cpu && o.flush_caches) {
    flusher = std::make_unique<llm::CpuCacheFlusher>(0, o.flush_limit_bytes);
    result.flush_bytes = flusher->bytes();
  }
  const llm::AttentionShape shape{o.n_heads, o.n_kv_heads, o.head_dim};
  const std::size_t kv_dim = static_cast<std::size_t>(o.n_kv_heads) * o.head_dim;
  const std::size_t q_row = static_cast<std::size_t>(o.n_heads) * o.head_dim;
  std::vector<KernelOverheadCell> cpu_cells, cuda_cells;

  for (const int context : o.contexts) {
    for (const int batch : o.batches) {
      const std::size_t kv_bytes = 2 * static_cast<std::size_t>(batch) * context * kv_dim * sizeof(float);
      const bool run_cpu = o.cpu && static_cast<double>(kv_bytes) <= o.max_host_gib * kGiB;
      if (o.cpu && !run_cpu)
        result.skipped.push_back(fmt::format("cpu, context {}, batch {}: K/V of {:.2f} GiB > --max-host-gib {}",
                                             context, batch, static_cast<double>(kv_bytes) / kGiB, o.max_host_gib));
      if (!run_cpu && !o.cuda) continue;

      std::vector<float> query(static_cast<std::size_t>(batch) * q_row);  // [batch, n_heads, head_dim]
      llm::fill_uniform(query.data(), query.size(), o.seed);
      // Host K/V: every sequence when the CPU cells run; else one sequence at
      // a time, which only feeds the reference and the upload to the GPU.
      llm::CpuKvCache cache(one_layer_config(shape, context), run_cpu ? batch : 1, context);
      std::unique_ptr<CudaKvLayouts> device;
      if (o.cuda) device = std::make_unique<CudaKvLayouts>(shape, batch, context);
      std::vector<float> reference(query.size());  // [batch, n_heads, head_dim]
      const int one_length[1] = {context};
      for (int s = 0; s < batch; ++s) {
        const llm::KvView view = cache.view(0, run_cpu ? s : 0);
        const std::size_t floats = static_cast<std::size_t>(context) * kv_dim;
        float* keys = view.key_row(0);  // [context, kv_dim]: the sequence's rows (view.keys is the layer's pool)
        float* values = view.value_row(0);
        llm::fill_uniform(keys, floats, key_seed(o, s));
        llm::fill_uniform(values, floats, value_seed(o, s));
        const llm::KvView one_view[1] = {view};
        llm::cpu::reference_decode_attention(shape, query.data() + s * q_row, one_view, one_length,
                                             reference.data() + s * q_row);
        if (device) device->upload_sequence(s, std::span<const float>(keys, floats), std::span<const float>(values, floats));
      }
      if (run_cpu) measure_cpu(o, shape, cache, context, batch, query, reference, kv_bytes, flusher.get(), cpu_cells);
      if (device) measure_cuda(o, *device, context, batch, query, reference, kv_bytes, cuda_cells);
    }
  }
  result.cells = std::move(cpu_cells);
  result.cells.insert(result.cells.end(), std::make_move_iterator(cuda_cells.begin()),
                      std::make_move_iterator(cuda_cells.end()));
  return result;
}

}  // namespace step05
