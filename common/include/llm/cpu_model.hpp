#pragma once
// CpuModel: the reference transformer on the CPU. Products go through the
// Linear hook (Eigen by default), attention through the AttentionKernels hook.
#include <memory>
#include <vector>

#include "llm/attention.hpp"
#include "llm/cpu_ops.hpp"
#include "llm/linear.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"

namespace llm {

struct CpuModelOptions {
  LinearFactory linear_factory = dense_linear_factory();
  cpu::AttentionKernels attention;
};

class CpuModel final : public Model {
 public:
  explicit CpuModel(const ModelWeights& weights, CpuModelOptions options = {});

  const ModelConfig& config() const override { return config_; }
  std::string device_name() const override { return "cpu"; }
  std::unique_ptr<KvCache> make_cache(int num_sequences, int capacity) const override;
  std::span<const float> forward(const TokenBatch& batch, KvCache& cache,
                                 LogitsFor which = LogitsFor::LastRowOfEachSequence) override;

  void set_attention(cpu::AttentionKernels kernels) { attention_ = kernels; }
  // Bytes of weights one forward row reads (what decode streams per token).
  std::size_t weight_bytes() const;
  // Bytes of weights the model holds: the matrices, the norms and the
  // embedding table, which a tied classifier in fp32 shares (stored once).
  std::size_t stored_weight_bytes() const;

 private:
  struct Layer {
    std::vector<float> attention_norm;  // [dim]
    std::unique_ptr<Linear> wq, wk, wv, wo;
    std::vector<float> ffn_norm;        // [dim]
    std::unique_ptr<Linear> w1, w2, w3;
  };
  void attention_block(int layer, const TokenBatch& batch, const KvCache& cache);
  void ensure_scratch(int rows);

  ModelConfig config_;
  std::vector<float> token_embedding_;  // [vocab_size, dim]; empty when embedding_rows_ is the classifier's
  const float* embedding_rows_ = nullptr;  // [vocab_size, dim] the table the lookup reads
  std::vector<Layer> layers_;           // [n_layers]
  std::vector<float> final_norm_;       // [dim]
  std::unique_ptr<Linear> classifier_;  // [vocab_size, dim]
  cpu::RopeTable rope_;
  cpu::AttentionKernels attention_;

  // Activations for up to `scratch_rows_` batch rows, reused across calls.
  int scratch_rows_ = 0;
  std::vector<float> x_;          // [rows, dim]        residual stream
  std::vector<float> xb_;         // [rows, dim]        normalized input of a block
  std::vector<float> q_;          // [rows, n_heads*head_dim]
  std::vector<float> k_;          // [rows, kv_dim]
  std::vector<float> v_;          // [rows, kv_dim]
  std::vector<float> attn_out_;   // [rows, n_heads*head_dim]
  std::vector<float> proj_;       // [rows, dim]        output of wo / w2
  std::vector<float> gate_;       // [rows, hidden_dim] w1 x, then silu(w1 x) * w3 x
  std::vector<float> up_;         // [rows, hidden_dim] w3 x
  std::vector<float> logits_;     // [rows with logits, vocab_size]
  std::vector<float> final_rows_; // [rows with logits, dim]
  // Decode queries of a mixed batch, gathered for the decode kernel.
  std::vector<KvView> decode_views_;   // [decode rows]
  std::vector<int> decode_lengths_;    // [decode rows] positions visible to each query
  std::vector<int> decode_rows_;       // [decode rows] their row in the batch
  std::vector<float> decode_q_;        // [decode rows, n_heads*head_dim]
  std::vector<float> decode_out_;      // [decode rows, n_heads*head_dim]
};

}  // namespace llm
