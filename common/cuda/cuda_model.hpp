#pragma once
// CudaModel: the fp32 baseline transformer on the GPU. The same forward as
// CpuModel (common/src/cpu/cpu_model.cpp), line for line: own kernels for the
// embedding, RMSNorm, RoPE, attention and SwiGLU (kernels.cuh), cuBLAS behind
// the CudaLinear hook for the products. Weights are uploaded once; a forward
// queues everything on one stream and waits once, for the logits.
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda_attention.hpp"
#include "cuda_kv_cache.hpp"
#include "cuda_linear.hpp"
#include "cuda_stream.hpp"
#include "llm/attention.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"

namespace llm::cuda {

struct CudaModelOptions {
  CudaLinearFactory linear_factory = dense_cuda_linear_factory();
  CudaAttentionKernels attention;
};

class CudaModel final : public Model {
 public:
  // Uploads every weight. Throws InputError for a config the kernels do not
  // support (head_dim > 256) or tensors of the wrong size, DeviceError when the
  // GPU fails (out of memory, no device).
  explicit CudaModel(const ModelWeights& weights, CudaModelOptions options = {});

  const ModelConfig& config() const override { return config_; }
  std::string device_name() const override { return "cuda"; }
  // A CudaKvCache (device memory); forward takes any KvCache whose
  // device_name() is "cuda".
  std::unique_ptr<KvCache> make_cache(int num_sequences, int capacity) const override;
  // As CpuModel::forward; the returned logits are host memory, valid until the
  // next forward.
  std::span<const float> forward(const TokenBatch& batch, KvCache& cache,
                                 LogitsFor which = LogitsFor::LastRowOfEachSequence) override;

  // Bytes of weights one forward row reads (what decode streams per token).
  std::size_t weight_bytes() const;
  void set_attention(CudaAttentionKernels kernels) { attention_ = kernels; }
  // The stream every forward runs on (for timing or for queuing more work).
  cudaStream_t stream() const { return stream_.get(); }

 private:
  struct Layer {
    DeviceBuffer<float> attention_norm;  // [dim]
    std::unique_ptr<CudaLinear> wq, wk, wv, wo;
    DeviceBuffer<float> ffn_norm;        // [dim]
    std::unique_ptr<CudaLinear> w1, w2, w3;
  };
  // A run of several rows of one sequence: prefill attention.
  struct PrefillRun {
    int first_row;  // its first row in the batch
    int n_rows;
    int sequence;
    int n_past;     // position of the first row = cached positions before it
  };

  void plan(const TokenBatch& batch, const KvCache& cache, LogitsFor which);
  void ensure_scratch(int rows, std::size_t workspace_floats);
  void attention_block(int layer, const KvCache& cache, int rows);

  ModelConfig config_;
  AttentionShape shape_;
  CudaAttentionKernels attention_;
  // Declared first, destroyed last: everything below may still have work
  // queued on the stream or use the handle.
  CudaStream stream_;
  CublasHandle cublas_;

  DeviceBuffer<float> token_embedding_;  // [vocab_size, dim]; empty when embedding_rows_ is the classifier's
  const float* embedding_rows_ = nullptr;  // [vocab_size, dim] device table the lookup reads
  std::vector<Layer> layers_;            // [n_layers]
  DeviceBuffer<float> final_norm_;       // [dim]
  std::unique_ptr<CudaLinear> classifier_;  // [vocab_size, dim]
  DeviceBuffer<float> rope_cos_;         // [seq_len, head_dim/2] from cpu::RopeTable
  DeviceBuffer<float> rope_sin_;         // [seq_len, head_dim/2]

  // The plan of one forward, built on the host, then uploaded.
  std::vector<KvView> row_views_host_;       // [n_layers, rows] cache view of each row's sequence
  std::vector<PrefillRun> prefill_runs_;     // runs of > 1 rows
  std::vector<int> decode_rows_host_;        // [n_decode] batch row of each single-row run
  std::vector<int> decode_lengths_host_;     // [n_decode] keys visible to it (position + 1)
  std::vector<KvView> decode_views_host_;    // [n_layers, n_decode]
  std::vector<int> logit_rows_host_;         // [n_out] batch rows that get logits
  int decode_max_length_ = 0;                // max of decode_lengths_host_
  std::vector<float> logits_host_;           // [n_out, vocab_size] what forward returns

  // Device scratch, grown on demand, reused across calls. "rows" = batch rows.
  int scratch_rows_ = 0;
  DeviceBuffer<int> tokens_;            // [rows]
  DeviceBuffer<int> positions_;         // [rows]
  DeviceBuffer<KvView> row_views_;      // [n_layers, rows]
  DeviceBuffer<int> decode_rows_;       // [n_decode]
  DeviceBuffer<int> decode_lengths_;    // [n_decode]
  DeviceBuffer<KvView> decode_views_;   // [n_layers, n_decode]
  DeviceBuffer<int> logit_rows_;        // [n_out]
  DeviceBuffer<float> x_;               // [rows, dim]        residual stream
  DeviceBuffer<float> xb_;              // [rows, dim]        normalized input of a block
  DeviceBuffer<float> q_;               // [rows, n_heads*head_dim]
  DeviceBuffer<float> k_;               // [rows, kv_dim]
  DeviceBuffer<float> v_;               // [rows, kv_dim]
  DeviceBuffer<float> attn_out_;        // [rows, n_heads*head_dim]
  DeviceBuffer<float> proj_;            // [rows, dim]        output of wo / w2
  DeviceBuffer<float> gate_;            // [rows, hidden_dim] w1 x, then silu(w1 x) * w3 x
  DeviceBuffer<float> up_;              // [rows, hidden_dim] w3 x
  DeviceBuffer<float> final_rows_;      // [rows with logits, dim] rows picked for the classifier
  DeviceBuffer<float> final_normed_;    // [rows with logits, dim] after the final RMSNorm
  DeviceBuffer<float> logits_;          // [rows with logits, vocab_size]
  // Attention workspace, as large as the kernels ask. For the naive kernels
  // that is every score of the largest prefill run, [n_new, n_heads,
  // n_past + n_new] floats: O(N^2) memory (512 MiB for a 2048-token prompt
  // with 32 heads), exactly what FlashAttention (step 02) does without.
  DeviceBuffer<float> workspace_;
};

}  // namespace llm::cuda
