#pragma once
// CudaModel: the transformer on the GPU. The same forward as CpuModel
// (common/src/cpu/cpu_model.cpp), line for line: own kernels for the
// embedding, RMSNorm, RoPE, attention and SwiGLU (kernels.cuh,
// split_kv_decode_attention.cuh), the CudaLinear hook for the products
// (cuBLAS SGEMM for fp32 weights, half_linear.hpp for fp16/bf16). Weights are
// uploaded once. A forward uploads its plan with one copy, queues everything
// on one stream and waits once, for the logits.
//
// Decode is where fixed costs hurt: a token of a 22-layer model is ~350
// kernel launches of a few microseconds of host work each, more than the GPU
// needs to read a small model's weights. So a decode forward (every row its
// own sequence) is captured once into a CUDA graph per (rows, context bucket,
// K/V element type) and replayed: one launch per token instead of hundreds.
// Replay runs the captured kernels with the captured arguments, so everything
// that changes from token to token (positions, lengths, cache views, token
// ids) lives in device memory the kernels read: the plan blob. A short run
// of rows of one sequence (speculative decoding's verification) counts as
// decode queries, so it is replayed too.
#include <cstddef>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cuda_attention.hpp"
#include "cuda_kv_cache.hpp"
#include "cuda_linear.hpp"
#include "cuda_stream.hpp"
#include "half_linear.hpp"  // HalfCudaLinear: cuda_linear_factory's fp16/bf16 layers
#include "llm/attention.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"

namespace llm::cuda {

// Fewer launches where a launch is all a kernel costs (decode at batch 1
// moves a few KiB through each of these). Each switch is its own variant:
// the model computes the same thing either way (fp32 sums of the products
// may change order; add+norm is bit-identical).
struct CudaFusions {
  // wq, wk, wv as one [n_heads*head_dim + 2*kv_dim, dim] product; its rows
  // are read in place by the fused RoPE + K/V append below (so this switch
  // brings that kernel along).
  bool qkv_product = false;
  // w1, w3 as one [2*hidden_dim, dim] product; SwiGLU reads both halves.
  bool gate_up_product = false;
  // The residual add and the RMSNorm after it in one kernel.
  bool residual_norm = false;
  // RoPE of Q and K and the K/V append in one kernel (separate products).
  bool rope_kv_write = false;
  // Each RMSNorm folded into the products that read its output, each
  // residual add into the product before it, and (with gate_up_product)
  // SwiGLU into w2 (CudaLinear::forward_fused): no norm, add or SwiGLU
  // kernel is left between the products. Used where every product of the
  // forward fuses that many rows (the half-precision layers fuse any count:
  // the GEMV in its own launch, cuBLAS's path in the kernel that rounds its
  // input and in cuBLAS's beta); elsewhere (fp32, step 06's layers) the
  // model falls back to the kernels above. Each GEMV block recomputes its
  // rows' sum of squares (a few KiB from L2) rather than wait for a kernel
  // of its own. The results are the same bits (on cuBLAS's path, where
  // cuBLAS computes the same product for beta 0 and 1; a test asks it, then
  // checks).
  bool norm_in_product = false;
  // Split-KV decode attention merges its splits' partial results in the
  // last split block to finish (DecodeQueries::merge_tickets) instead of a
  // merge kernel of its own: past 64 keys, one launch a layer fewer. The
  // same bits either way.
  bool merge_in_split_kernel = false;
  // With qkv_product: RoPE and the K/V append done by the QKV product on its
  // outputs (ProductFusion::rope) instead of by the kernel after it, one
  // launch a layer fewer. Where the product fuses that many rows (the
  // half-precision layers; the CUDA-core GEMV in its own launch, its other
  // paths with the kernel after them) and the cache stores fp32 rows (an
  // int8 row's scale needs a whole head first: there the kernel stays). The
  // same bits either way.
  bool rope_in_qkv_product = false;

  static CudaFusions all() { return {true, true, true, true, true, true, true}; }
  static CudaFusions none() { return {}; }
};

struct CudaModelOptions {
  CudaLinearFactory linear_factory = dense_cuda_linear_factory();
  CudaAttentionKernels attention;
  // Off by default: one product per Linear site. The command-line model
  // (cuda_model_options) turns them all on (--no-fusions: off), and so does
  // step 06's quantized model, which stacks the sites' quantized matrices
  // for the fused products.
  CudaFusions fusions;
  // Replay CUDA graphs for decode forwards (false: every kernel launched from
  // the host, the before row). Graphs are only used where the decode kernel
  // says its launches are stable (CudaAttentionKernels::graph_bucket).
  bool graphs = true;
  // Programmatic dependent launch (programmatic_launch.cuh, sm_90 and
  // later): each kernel of a forward after its first may start while the
  // kernel before it finishes, and a product requests its first weights
  // then (false: each kernel starts once the one before has finished, the
  // before row). The same results to the bit either way.
  bool programmatic_launches = true;
  // Each product's GEMV asks L2 for the first weights of the product the
  // forward runs after it, once its own are read (weight_prefetch.hpp;
  // CudaLinear::set_next_product_lines): the next product's first loads then
  // hit L2. Off by default: on a GPU it measured slower (chapter 01, section
  // 5.14; --gemv-prefetch-next turns it on). The same bits either way.
  bool prefetch_next_product = false;
};

// The linear factory of a weight element type: DenseCudaLinear (fp32) or
// HalfCudaLinear (fp16, bf16, whose products of 1..max_gemv_rows rows run
// `gemv`, more rows cuBLAS, their weights requested as `loads` says).
// max_gemv_rows outside 1..kMaxGemvRows: the half layers throw InputError as
// they are made (fp32 has no GEMV, and ignores all three).
CudaLinearFactory cuda_linear_factory(WeightDtype dtype, HalfGemvKernel gemv = HalfGemvKernel::CudaCores,
                                      int max_gemv_rows = kMaxGemvRows, HalfGemvLoads loads = {});

// The model a command line asks for (make_cuda_model): the products of
// run.dtype through cuda_linear_factory, graphs, programmatic launches, and
// every fusion unless run.fusions is false, less the folds switched off. A
// step with its own products (step 06) replaces linear_factory.
CudaModelOptions cuda_model_options(const CudaRunOptions& run);

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
  void set_attention(CudaAttentionKernels kernels) {
    attention_ = kernels;
    graphs_.clear();  // captured with the old kernels
    ran_eagerly_.clear();
  }
  void set_graphs(bool enabled) { graphs_enabled_ = enabled; }
  // Decode graphs captured so far (one per key; for tests and reports).
  std::size_t graphs_captured() const { return graphs_.size(); }
  // The stream every forward runs on (for timing or for queuing more work).
  cudaStream_t stream() const { return stream_.get(); }

 private:
  struct Layer {
    DeviceBuffer<float> attention_norm;  // [dim]
    std::unique_ptr<CudaLinear> wq, wk, wv;  // unless fusions_.qkv_product
    std::unique_ptr<CudaLinear> wqkv;        // [q_width + 2*kv_dim, dim] rows of wq, wk, wv (fused)
    std::unique_ptr<CudaLinear> wo;
    DeviceBuffer<float> ffn_norm;        // [dim]
    std::unique_ptr<CudaLinear> w1, w3;  // unless fusions_.gate_up_product
    std::unique_ptr<CudaLinear> w13;     // [2*hidden_dim, dim] rows of w1 then w3 (fused)
    std::unique_ptr<CudaLinear> w2;
    // Every product of the layer, whichever are fused, in the order a
    // forward runs them.
    std::vector<CudaLinear*> linears() const;
  };
  // Runs of up to this many rows of one sequence are attended as decode
  // queries (plan() says why): the half GEMV's row limit, past which a
  // forward is a prefill in every sense. It stays kMaxGemvRows when the
  // products send fewer rows to the GEMV (CudaRunOptions::max_gemv_rows):
  // it decides the attention and the graph replay, which do not depend on
  // the products' path, so a comparison of the two paths changes nothing else.
  static constexpr int kShortRunRows = kMaxGemvRows;
  // A run of more rows of one sequence: prefill attention.
  struct PrefillRun {
    int first_row;  // its first row in the batch
    int n_rows;
    int sequence;
    int n_past;     // position of the first row = cached positions before it
  };

  // Where each array of the plan sits in the plan blob (byte offsets).
  struct PlanLayout {
    std::size_t row_views = 0, decode_views = 0;  // KvView arrays first (pointer-aligned)
    std::size_t tokens = 0, positions = 0, decode_rows = 0, decode_lengths = 0, logit_rows = 0;
    std::size_t bytes = 0;
  };
  // What makes two decode forwards replay the same graph: the same launches
  // with the same arguments.
  struct GraphKey {
    int rows;
    int logit_rows;     // rows that get logits (the classifier's launch)
    int decode_bucket;  // CudaAttentionKernels::graph_bucket of the longest context
    KvElement element;  // write_kv_rows and the attention read it
    auto operator<=>(const GraphKey&) const = default;
  };
  // An instantiated graph that destroys itself.
  class DecodeGraph {
   public:
    explicit DecodeGraph(cudaGraphExec_t exec) : exec_(exec) {}
    ~DecodeGraph();
    DecodeGraph(const DecodeGraph&) = delete;
    DecodeGraph& operator=(const DecodeGraph&) = delete;
    void launch(cudaStream_t stream) const;

   private:
    cudaGraphExec_t exec_;
  };

  void plan(const TokenBatch& batch, const KvCache& cache, LogitsFor which);
  void ensure_scratch(int rows, std::size_t workspace_floats);
  // Copies the plan into the pinned blob and queues its one upload.
  void upload_plan(const TokenBatch& batch);
  // Every kernel of a forward after the upload, up to the logits on the
  // device: what a graph captures.
  void enqueue_layers(const KvCache& cache, int rows);
  // The input of the products after an RMSNorm: xb_ (the norm ran as a
  // kernel), or the residual stream x_ with the norm folded into each product.
  struct NormedInput {
    const float* rows;    // [rows, dim]
    ProductFusion fusion;  // input_norm set when folded
  };
  void attention_block(int layer, const KvCache& cache, int rows, const NormedInput& input);
  // Whether this forward folds the norms and adds into its products
  // (CudaFusions::norm_in_product and every product fuses `rows`).
  bool folds_norms(int rows, int logit_rows) const {
    return rows >= 1 && rows <= fold_max_rows_ && logit_rows >= 1 && logit_rows <= fold_max_rows_;
  }
  // y [rows, out] = W input, queued on the model's stream.
  void multiply(const CudaLinear& linear, const NormedInput& input, int rows, float* y) const;
  // The decode graph of `key`, captured now if it is not there yet.
  const DecodeGraph& decode_graph(const GraphKey& key, const KvCache& cache, int rows);

  ModelConfig config_;
  AttentionShape shape_;
  CudaAttentionKernels attention_;
  CudaFusions fusions_;
  // The most rows a forward may have for the norms to be folded: the least
  // max_fused_rows of the model's products (0 without norm_in_product).
  int fold_max_rows_ = 0;
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
  std::vector<int> logit_rows_host_;         // [n_out] batch rows that get logits, in increasing order
  int decode_max_length_ = 0;                // max of decode_lengths_host_

  // The plan as the kernels read it: one blob, laid out by upload_plan,
  // written on the host into pinned memory and uploaded with one copy.
  //   row_views [n_layers, rows] KvView, decode_views [n_layers, n_decode]
  //   KvView, tokens [rows], positions [rows], decode_rows [n_decode],
  //   decode_lengths [n_decode], logit_rows [n_out] ints
  PinnedBuffer<std::byte> plan_host_;   // [PlanLayout::bytes]
  DeviceBuffer<std::byte> plan_device_; // [PlanLayout::bytes]; the typed views below point into it
  const int* tokens_ = nullptr;
  const int* positions_ = nullptr;
  const KvView* row_views_ = nullptr;
  const int* decode_rows_ = nullptr;
  const int* decode_lengths_ = nullptr;
  const KvView* decode_views_ = nullptr;
  const int* logit_rows_ = nullptr;
  PinnedBuffer<float> logits_pinned_;   // [n_out, vocab_size] what forward returns

  bool graphs_enabled_ = true;
  bool programmatic_launches_ = true;  // CudaModelOptions::programmatic_launches
  std::map<GraphKey, std::unique_ptr<DecodeGraph>> graphs_;
  std::set<GraphKey> ran_eagerly_;  // keys whose first forward ran without a graph

  // Device scratch, grown on demand, reused across calls. "rows" = batch rows.
  // Growing any of it frees the old memory, which captured graphs point at:
  // ensure_scratch drops the graphs when it grows.
  int scratch_rows_ = 0;
  DeviceBuffer<float> x_;               // [rows, dim]        residual stream
  DeviceBuffer<float> xb_;              // [rows, dim]        normalized input of a block
  DeviceBuffer<float> q_;               // [rows, n_heads*head_dim]
  DeviceBuffer<float> k_;               // [rows, kv_dim]
  DeviceBuffer<float> v_;               // [rows, kv_dim]
  DeviceBuffer<float> attn_out_;        // [rows, n_heads*head_dim]
  DeviceBuffer<float> proj_;            // [rows, dim]        output of wo / w2
  DeviceBuffer<float> gate_;            // [rows, hidden_dim] w1 x, then silu(w1 x) * w3 x
  DeviceBuffer<float> up_;              // [rows, hidden_dim] w3 x
  DeviceBuffer<float> qkv_;             // [rows, q_width + 2*kv_dim] fused QKV product
  DeviceBuffer<float> gate_up_;         // [rows, 2*hidden_dim]       fused gate/up product
  DeviceBuffer<float> final_rows_;      // [rows with logits, dim] rows picked for the classifier
  DeviceBuffer<float> final_normed_;    // [rows with logits, dim] after the final RMSNorm
  DeviceBuffer<float> logits_;          // [rows with logits, vocab_size]
  // Attention workspace, as large as the kernels ask. For the naive kernels
  // that is every score of the largest prefill run, [n_new, n_heads,
  // n_past + n_new] floats: O(N^2) memory (512 MiB for a 2048-token prompt
  // with 32 heads), exactly what FlashAttention (step 02) does without.
  DeviceBuffer<float> workspace_;
  // [split_kv_decode_merge_tickets(shape, rows)] the decode attention's
  // merge tickets (kernels::DecodeQueries::merge_tickets), one per (decode
  // row, KV head, head chunk), when merge_in_split_kernel: zeroed when
  // grown, and left zero by every launch. A buffer of their own: prefill's
  // scores in workspace_ would overwrite them.
  DeviceBuffer<unsigned int> merge_tickets_;
};

}  // namespace llm::cuda
