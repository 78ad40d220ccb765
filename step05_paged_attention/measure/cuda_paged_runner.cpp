// CudaKvLayouts and the paged CUDA model, for CUDA builds: device copies of
// the same K/V rows in a contiguous layout and in paged pools, the decode and
// prefill kernels of cuda_paged_attention.cu run on them into a NaN-poisoned
// output, and CUDA-event timing (llm::cuda::time_cuda flushes the L2 before
// each run).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

// common/cuda (a public include directory of llm_common in CUDA builds):
// CudaModel, CudaModelOptions. Inside namespace step05, cuda:: is
// step05::cuda, so the model's types are spelled llm::cuda::...
#include "cuda_model.hpp"
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/cuda/cuda_timer.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/errors.hpp"
#include "step05_paged_attention/cuda_paged_attention.hpp"
#include "step05_paged_attention/measure/cuda_paged_runner.hpp"

namespace step05 {

using llm::cuda::DeviceBuffer;

std::unique_ptr<llm::Model> make_cuda_paged_model(const llm::ModelWeights& weights) {
  const llm::cuda::DeviceStatus status = llm::cuda::device_status();
  if (!status.usable) throw llm::DeviceError("cannot run the CUDA model: " + status.reason);
  llm::cuda::CudaModelOptions options;  // dense cuBLAS products, as the baseline
  // All four functions: the model sizes its attention workspace by asking the
  // workspace functions, so the baseline's O(N^2) score buffer never exists.
  options.attention = cuda::paged_cuda_attention();
  return std::make_unique<llm::cuda::CudaModel>(weights, options);
}

namespace {

// One layout of the K/V rows on the device.
struct DeviceLayout {
  int block_size = 0;
  int blocks_per_sequence = 0;
  DeviceBuffer<float> keys;           // [n_blocks * block_size, kv_dim]
  DeviceBuffer<float> values;         // [n_blocks * block_size, kv_dim]
  DeviceBuffer<std::int32_t> tables;  // [n_seqs, blocks_per_sequence]
  std::vector<llm::KvView> views_host;  // [n_seqs] views of device memory, in host memory
  DeviceBuffer<llm::KvView> views;      // [n_seqs] the same, in device memory
};

void make_views(DeviceLayout& layout, int n_seqs, const llm::AttentionShape& shape) {
  layout.views_host.clear();
  for (int s = 0; s < n_seqs; ++s) {
    llm::KvView v;
    v.keys = layout.keys.data();
    v.values = layout.values.data();
    v.block_table = layout.tables.data() + static_cast<std::size_t>(s) * layout.blocks_per_sequence;
    v.block_size = layout.block_size;
    v.kv_dim = shape.n_kv_heads * shape.head_dim;
    v.head_dim = shape.head_dim;
    layout.views_host.push_back(v);
  }
  layout.views = DeviceBuffer<llm::KvView>(std::span<const llm::KvView>(layout.views_host));
}

}  // namespace

struct CudaKvLayouts::Impl {
  llm::AttentionShape shape;
  int n_seqs = 0;
  int capacity = 0;
  std::size_t kv_dim = 0;
  DeviceLayout contiguous;          // block s = sequence s, `capacity` rows
  std::vector<DeviceLayout> paged;  // one per block size added
  // Inputs and outputs of the last launch.
  DeviceBuffer<float> q;            // [n_rows, n_heads, head_dim]
  DeviceBuffer<float> out;          // [n_rows, n_heads, head_dim]
  DeviceBuffer<float> workspace;    // grown to the largest need
  DeviceBuffer<int> lengths;        // [n_seqs]
  DeviceBuffer<int> rows;           // [n_seqs]
  std::vector<int> lengths_host;    // [n_seqs]

  std::size_t row_floats() const { return static_cast<std::size_t>(shape.n_heads) * shape.head_dim; }

  const DeviceLayout& layout(int block_size) const {
    if (block_size == kContiguousLayout) return contiguous;
    for (const DeviceLayout& l : paged)
      if (l.block_size == block_size) return l;
    throw llm::InputError("CudaKvLayouts: no paged layout of block size " + std::to_string(block_size) +
                          " (add_paged_layout first)");
  }

  // Uploads q, lengths and rows and returns the launch's queries (the host
  // copies point at this object's vectors and the layout's views).
  llm::cuda::kernels::DecodeQueries prepare_decode(const DeviceLayout& l, std::span<const float> q_host,
                                                   std::span<const int> lengths_in, std::span<const int> rows_in) {
    if (lengths_in.size() != static_cast<std::size_t>(n_seqs))
      throw llm::InputError("CudaKvLayouts::decode: " + std::to_string(lengths_in.size()) + " lengths for " +
                            std::to_string(n_seqs) + " sequences");
    const std::size_t n_rows = q_host.size() / row_floats();
    if (q_host.size() % row_floats() != 0 || n_rows < static_cast<std::size_t>(n_seqs))
      throw llm::InputError("CudaKvLayouts::decode: q must hold whole rows of n_heads * head_dim floats, at least "
                            "one per sequence");
    if (!rows_in.empty()) {
      if (rows_in.size() != static_cast<std::size_t>(n_seqs))
        throw llm::InputError("CudaKvLayouts::decode: rows must name one row per sequence");
      for (const int r : rows_in)
        if (r < 0 || static_cast<std::size_t>(r) >= n_rows)
          throw llm::InputError("CudaKvLayouts::decode: row " + std::to_string(r) + " outside q");
    }
    int max_length = 0;
    for (const int length : lengths_in) {
      if (length < 1 || length > capacity)
        throw llm::InputError("CudaKvLayouts::decode: length " + std::to_string(length) + " outside 1.." +
                              std::to_string(capacity));
      max_length = std::max(max_length, length);
    }
    lengths_host.assign(lengths_in.begin(), lengths_in.end());
    q.ensure(q_host.size());
    q.upload(q_host);
    out.ensure(q_host.size());
    lengths.ensure(lengths_host.size());
    lengths.upload(std::span<const int>(lengths_host));
    if (!rows_in.empty()) {
      rows.ensure(rows_in.size());
      rows.upload(rows_in);
    }
    workspace.ensure(cuda::paged_decode_workspace_floats(shape, n_seqs, max_length));

    llm::cuda::kernels::DecodeQueries queries;
    queries.views = l.views.data();
    queries.lengths = lengths.data();
    queries.rows = rows_in.empty() ? nullptr : rows.data();
    queries.views_host = l.views_host.data();
    queries.lengths_host = lengths_host.data();
    queries.rows_host = rows_in.empty() ? nullptr : rows_in.data();
    queries.n_queries = n_seqs;
    queries.max_length = max_length;
    return queries;
  }

  // Queues one launch of `kernel` on the legacy default stream (the stream
  // llm::cuda::time_cuda records its events on).
  void launch(CudaDecodeKernel kernel, const llm::cuda::kernels::DecodeQueries& queries) {
    const auto fn = kernel == CudaDecodeKernel::Paged ? &cuda::paged_decode_attention
                                                      : &cuda::contiguous_decode_attention;
    fn(shape, q.data(), queries, out.data(), workspace.data(), nullptr);
  }

  // Output of the last launch after waiting for it; n floats.
  std::vector<float> download_out(std::size_t n) {
    LLM_CUDA_CHECK(cudaDeviceSynchronize());  // faults inside a kernel surface here
    std::vector<float> host(n);
    out.download(std::span<float>(host));
    return host;
  }
};

CudaKvLayouts::CudaKvLayouts(const llm::AttentionShape& shape, int n_seqs, int capacity)
    : impl_(std::make_unique<Impl>()) {
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 || shape.n_heads % shape.n_kv_heads != 0)
    throw llm::InputError("CudaKvLayouts: bad attention shape");
  if (n_seqs < 1 || capacity < 1)
    throw llm::InputError("CudaKvLayouts: needs at least one sequence of one position");
  const llm::cuda::DeviceStatus status = llm::cuda::device_status();
  if (!status.usable) throw llm::DeviceError("CudaKvLayouts: " + status.reason);
  Impl& m = *impl_;
  m.shape = shape;
  m.n_seqs = n_seqs;
  m.capacity = capacity;
  m.kv_dim = static_cast<std::size_t>(shape.n_kv_heads) * shape.head_dim;
  const std::size_t floats = static_cast<std::size_t>(n_seqs) * capacity * m.kv_dim;
  m.contiguous.block_size = capacity;
  m.contiguous.blocks_per_sequence = 1;
  m.contiguous.keys = DeviceBuffer<float>(floats);
  m.contiguous.values = DeviceBuffer<float>(floats);
  m.contiguous.keys.zero();
  m.contiguous.values.zero();
  std::vector<std::int32_t> block_ids(static_cast<std::size_t>(n_seqs));
  for (int s = 0; s < n_seqs; ++s) block_ids[static_cast<std::size_t>(s)] = s;  // sequence s is block s
  m.contiguous.tables = DeviceBuffer<std::int32_t>(std::span<const std::int32_t>(block_ids));
  make_views(m.contiguous, n_seqs, shape);
}

CudaKvLayouts::~CudaKvLayouts() = default;

void CudaKvLayouts::upload_sequence(int sequence, std::span<const float> keys, std::span<const float> values) {
  Impl& m = *impl_;
  if (sequence < 0 || sequence >= m.n_seqs)
    throw llm::InputError("CudaKvLayouts::upload_sequence: no sequence " + std::to_string(sequence));
  if (keys.size() != values.size() || keys.size() % m.kv_dim != 0 ||
      keys.size() / m.kv_dim > static_cast<std::size_t>(m.capacity))
    throw llm::InputError("CudaKvLayouts::upload_sequence: keys and values must be the same whole rows, at most "
                          "capacity of them");
  const std::size_t offset = static_cast<std::size_t>(sequence) * m.capacity * m.kv_dim;
  LLM_CUDA_CHECK(cudaMemcpy(m.contiguous.keys.data() + offset, keys.data(), keys.size_bytes(), cudaMemcpyHostToDevice));
  LLM_CUDA_CHECK(
      cudaMemcpy(m.contiguous.values.data() + offset, values.data(), values.size_bytes(), cudaMemcpyHostToDevice));
}

void CudaKvLayouts::add_paged_layout(int block_size, std::span<const std::int32_t> tables) {
  Impl& m = *impl_;
  if (block_size < 1) throw llm::InputError("CudaKvLayouts: block_size must be >= 1");
  const int blocks_per_sequence = (m.capacity + block_size - 1) / block_size;
  const std::size_t n_blocks = static_cast<std::size_t>(m.n_seqs) * blocks_per_sequence;
  if (tables.size() != n_blocks)
    throw llm::InputError("CudaKvLayouts::add_paged_layout: " + std::to_string(tables.size()) +
                          " table entries, expected n_seqs * ceil(capacity / block_size) = " +
                          std::to_string(n_blocks));
  std::vector<bool> taken(n_blocks, false);
  for (const std::int32_t block : tables) {
    if (block < 0 || static_cast<std::size_t>(block) >= n_blocks || taken[static_cast<std::size_t>(block)])
      throw llm::InputError("CudaKvLayouts::add_paged_layout: the tables must be a permutation of the pool's " +
                            std::to_string(n_blocks) + " blocks");
    taken[static_cast<std::size_t>(block)] = true;
  }
  DeviceLayout layout;
  layout.block_size = block_size;
  layout.blocks_per_sequence = blocks_per_sequence;
  const std::size_t pool_floats = n_blocks * block_size * m.kv_dim;
  layout.keys = DeviceBuffer<float>(pool_floats);
  layout.values = DeviceBuffer<float>(pool_floats);
  layout.keys.zero();  // the rows of a last, partial block past capacity
  layout.values.zero();
  layout.tables = DeviceBuffer<std::int32_t>(tables);
  // Block by block, device to device: logical block j of sequence s (rows
  // j*B.. of its contiguous block) goes to physical block tables[s][j].
  for (int s = 0; s < m.n_seqs; ++s) {
    for (int j = 0; j < blocks_per_sequence; ++j) {
      const int rows = std::min(block_size, m.capacity - j * block_size);
      const std::size_t from = (static_cast<std::size_t>(s) * m.capacity + static_cast<std::size_t>(j) * block_size) *
                               m.kv_dim;
      const std::size_t to =
          static_cast<std::size_t>(tables[static_cast<std::size_t>(s) * blocks_per_sequence + j]) * block_size *
          m.kv_dim;
      const std::size_t bytes = static_cast<std::size_t>(rows) * m.kv_dim * sizeof(float);
      LLM_CUDA_CHECK(cudaMemcpyAsync(layout.keys.data() + to, m.contiguous.keys.data() + from, bytes,
                                     cudaMemcpyDeviceToDevice, nullptr));
      LLM_CUDA_CHECK(cudaMemcpyAsync(layout.values.data() + to, m.contiguous.values.data() + from, bytes,
                                     cudaMemcpyDeviceToDevice, nullptr));
    }
  }
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  make_views(layout, m.n_seqs, m.shape);
  std::erase_if(m.paged, [&](const DeviceLayout& l) { return l.block_size == block_size; });
  m.paged.push_back(std::move(layout));
}

std::vector<float> CudaKvLayouts::decode(CudaDecodeKernel kernel, int layout, std::span<const float> q,
                                         std::span<const int> lengths, std::span<const int> rows) {
  Impl& m = *impl_;
  const llm::cuda::kernels::DecodeQueries queries = m.prepare_decode(m.layout(layout), q, lengths, rows);
  // 0xFF bytes are a NaN in every float: a row the kernel does not write fails the check.
  LLM_CUDA_CHECK(cudaMemset(m.out.data(), 0xFF, q.size_bytes()));
  m.launch(kernel, queries);
  return m.download_out(q.size());
}

llm::TimingStats CudaKvLayouts::time_decode(CudaDecodeKernel kernel, int layout, std::span<const float> q,
                                            std::span<const int> lengths, int warmup, int runs) {
  Impl& m = *impl_;
  const llm::cuda::kernels::DecodeQueries queries = m.prepare_decode(m.layout(layout), q, lengths, {});
  return llm::cuda::time_cuda([&] { m.launch(kernel, queries); }, warmup, runs, /*flush_l2=*/true);
}

std::vector<float> CudaKvLayouts::prefill(int layout, int sequence, std::span<const float> q, int n_past,
                                          int n_new) {
  Impl& m = *impl_;
  const DeviceLayout& l = m.layout(layout);
  if (sequence < 0 || sequence >= m.n_seqs)
    throw llm::InputError("CudaKvLayouts::prefill: no sequence " + std::to_string(sequence));
  if (n_past < 0 || n_new < 1 || n_past + n_new > m.capacity)
    throw llm::InputError("CudaKvLayouts::prefill: rows " + std::to_string(n_past) + ".." +
                          std::to_string(n_past + n_new - 1) + " outside the capacity " + std::to_string(m.capacity));
  if (q.size() != static_cast<std::size_t>(n_new) * m.row_floats())
    throw llm::InputError("CudaKvLayouts::prefill: q must hold n_new rows of n_heads * head_dim floats");
  m.q.ensure(q.size());
  m.q.upload(q);
  m.out.ensure(q.size());
  LLM_CUDA_CHECK(cudaMemset(m.out.data(), 0xFF, q.size_bytes()));
  m.workspace.ensure(cuda::paged_prefill_workspace_floats(m.shape, n_past, n_new));
  cuda::paged_prefill_attention(m.shape, m.q.data(), l.views_host[static_cast<std::size_t>(sequence)], n_past, n_new,
                                m.out.data(), m.workspace.data(), nullptr);
  return m.download_out(q.size());
}

}  // namespace step05
