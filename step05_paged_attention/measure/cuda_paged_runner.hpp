#pragma once
// Step 05's CUDA kernels from plain C++ (kernel_overhead.cpp, main.cpp,
// tests): the CUDA model with paged attention in its hook, and CudaKvLayouts,
// the same K/V rows on the GPU in a contiguous layout and in paged pools,
// which the decode kernels run and are timed on. No CUDA types here;
// cuda_paged_runner.cpp defines it in CUDA builds, and in a build without
// CUDA cuda_paged_runner_unavailable.cpp makes every call throw
// llm::DeviceError("... built without CUDA").
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "llm/attention.hpp"
#include "llm/harness/timer.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"

namespace step05 {

// The CUDA model (llm::cuda::CudaModel, unchanged: weights uploaded, cuBLAS
// products) with step05::cuda::paged_cuda_attention() in its attention hook:
// the paged decode kernel for every decode row of a batch, in one launch per
// layer, and the same kernel for prefill. It runs on any "cuda" KvCache (the
// model's own contiguous one or a paged one). Throws llm::InputError for a
// head_dim the CUDA model does not support, llm::DeviceError when no GPU is
// usable or in a build without CUDA.
std::unique_ptr<llm::Model> make_cuda_paged_model(const llm::ModelWeights& weights);

// Which decode kernel a CudaKvLayouts call runs.
enum class CudaDecodeKernel {
  Paged,       // step05::cuda::paged_decode_attention: any layout
  Contiguous,  // step05::cuda::contiguous_decode_attention: the contiguous layout
               // only (a paged one is an llm::InputError)
};

// K/V rows of n_seqs sequences on the GPU, the same rows in several layouts:
//   the contiguous layout  sequence s is block s of `capacity` rows
//                          (layout argument kContiguousLayout)
//   paged layouts          a pool of blocks of `block_size` rows, one per
//                          block size added (layout argument = that size)
// Decode and prefill run on any of them with the GPU's output copied back;
// decode can also be timed (CUDA events, L2 flushed before each run).
class CudaKvLayouts {
 public:
  static constexpr int kContiguousLayout = 0;

  // Device memory for the contiguous layout of n_seqs sequences of
  // `capacity` positions. Throws llm::InputError for a bad shape or size,
  // llm::DeviceError without a usable GPU (or out of memory).
  CudaKvLayouts(const llm::AttentionShape& shape, int n_seqs, int capacity);
  ~CudaKvLayouts();
  CudaKvLayouts(const CudaKvLayouts&) = delete;
  CudaKvLayouts& operator=(const CudaKvLayouts&) = delete;

  // Positions 0..rows-1 of `sequence` into the contiguous layout.
  // keys, values: host memory [rows, kv_dim] each, rows <= capacity.
  void upload_sequence(int sequence, std::span<const float> keys, std::span<const float> values);

  // Adds a paged layout of `block_size` >= 1 (replacing one of the same size):
  // a pool of n_seqs * ceil(capacity / block_size) blocks, filled on the GPU
  // from the contiguous layout (so upload the sequences first).
  // tables: host [n_seqs, ceil(capacity / block_size)], the physical block of
  // each logical block: a permutation of the pool's blocks (llm::InputError
  // otherwise), e.g. shuffled_block_tables().
  void add_paged_layout(int block_size, std::span<const std::int32_t> tables);

  // Decode: query i attends keys 0..lengths[i]-1 of sequence i in `layout`
  // and reads and writes row rows[i] of q and out (rows empty: row i).
  // q: host [n_rows, n_heads, head_dim] with n_rows >= n_seqs, lengths [n_seqs]
  // (1..capacity each), rows [n_seqs] or empty. Returns out [n_rows, n_heads,
  // head_dim]; it is filled with NaN before the run, so a row no query
  // writes stays NaN.
  std::vector<float> decode(CudaDecodeKernel kernel, int layout, std::span<const float> q,
                            std::span<const int> lengths, std::span<const int> rows = {});
  // Times the same launch (its inputs uploaded once, before the timed runs).
  llm::TimingStats time_decode(CudaDecodeKernel kernel, int layout, std::span<const float> q,
                               std::span<const int> lengths, int warmup, int runs);

  // Prefill (step05::cuda::paged_prefill_attention) of rows n_past..n_past+n_new-1
  // of `sequence` in `layout`: q, returned out [n_new, n_heads, head_dim] (host).
  std::vector<float> prefill(int layout, int sequence, std::span<const float> q, int n_past, int n_new);

 private:
  struct Impl;  // the DeviceBuffers (CUDA types) live in the .cpp
  std::unique_ptr<Impl> impl_;
};

}  // namespace step05
