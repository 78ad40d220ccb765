#pragma once
// Parts 2 and 3: the whole model quantized, run by the unchanged CPU and CUDA
// forwards through the Linear hook (and, for the int8 KV rows, through a
// cache of int8 rows behind the KvCache hook).
//   2. Speed: decode tokens/s per weight format (RTN), beside fp32 and, on
//      CUDA, fp16 (a GPU's own baseline), with the weight bytes each token
//      reads and the bandwidth that makes.
//   3. Quality (on a trained model: stories260K): each format x algorithm
//      against the fp32 model on held-out sequences the fp32 model sampled
//      (seeds apart from the calibration's): mean KL of the next-token
//      distributions, top-1 agreement, perplexity, and how many greedy tokens
//      match fp32's before the first difference.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/progress.hpp"
#include "llm/quality.hpp"
#include "llm/weights.hpp"
#include "step06_quantization/quantized_layers.hpp"
#include "step06_quantization/measure/weight_formats.hpp"

namespace step06 {

// What one model row stores: the weights' format and algorithm, and the KV cache's element.
struct ModelVariant {
  WeightFormat weights = std::nullopt;  // nullopt: not quantized, every matrix stored dense in `dense_dtype`
  QuantAlgorithm algorithm = QuantAlgorithm::Rtn;
  bool int8_kv = false;  // a paged cache of int8 rows with per-(position, head) scales
  // The element type of the unquantized model's matrices: fp32, or fp16 for
  // the CUDA-only row a GPU's quantized rows are fairly compared with.
  llm::cuda::WeightDtype dense_dtype = llm::cuda::WeightDtype::Float32;

  // The unquantized model in `dtype` with its own fp32 cache: the fp32 row,
  // the fp16 row on CUDA (what the speedup columns divide by).
  bool is_baseline(llm::cuda::WeightDtype dtype) const { return !weights && !int8_kv && dense_dtype == dtype; }
  std::string weights_name() const;  // "int4-g64", "fp32", "fp16"
  std::string name() const;          // "int4-g64 gptq", "fp32 + int8 kv", "fp16"
  int id() const;                    // the variant table's id of its weights (weight_formats.hpp)
};

struct ModelRow {
  std::string device;
  std::string model;  // "stories260K.bin", "preset small"
  ModelVariant variant;
  std::string skipped;               // why it did not run, else empty
  double weight_bytes = 0.0;         // bytes of the matrices one decode token reads (codes + scales, or dense_dtype's)
  double kv_bytes_per_position = 0.0;  // K and V (and scales) of one position, every layer
  double decode_ms_per_token = 0.0;  // median over repeats of the decode forwards' mean
  double tokens_per_s = 0.0;
  double speedup = 1.0;              // fp32's time per token / this one's, same device and model
  double speedup_vs_fp16 = 0.0;      // fp16's time per token / this one's, same device and model; 0: no fp16 row (cpu)
  double gb_per_s = 0.0;             // weight bytes / time per token
  std::optional<llm::NextTokenAgreement> agreement;  // vs fp32 on the held-out sequences (quality part only)
  double perplexity = 0.0;           // of the held-out sequences (teacher forced)
  double perplexity_fp32 = 0.0;
  int greedy_tokens_compared = 0;    // greedy from the prompt, fp32 vs this
  int greedy_matching_prefix = 0;    // tokens equal to fp32's before the first difference
  llm::CompareResult check;          // CUDA rows: logits vs the CPU run of the same quantized model (fp16: of fp32)
  bool ok = false;
};

struct ModelTableOptions {
  std::vector<std::string> devices = {"cpu"};
  std::vector<QuantFormat> formats;  // the quantized formats (fp32 always runs, and fp16 on every GPU)
  std::vector<QuantAlgorithm> algorithms = {QuantAlgorithm::Rtn, QuantAlgorithm::Gptq, QuantAlgorithm::Awq};
  bool quality = true;           // part 3 (a trained model); false: speed only (random weights)
  bool int8_kv_rows = true;
  std::vector<int> prompt;       // greedy runs start here (BOS first)
  int decode_positions = 128;    // positions of each timed greedy run, prompt included
  int repeats = 3;
  int calibration_sequences = 16, calibration_length = 128;
  int heldout_sequences = 8, heldout_length = 256;
  std::uint64_t seed = 42;
  // How every CUDA row runs (graphs, fusions, their folds, PDL, the GEMV's
  // loads: the step's command line); each row sets its own weights (`dtype`
  // is not read). The fp32 and fp16 rows run it as it is, the quantized
  // rows through CudaQuantizedModelOptions::run.
  llm::cuda::CudaRunOptions cuda;
  // Int4 rows decode on the int4 decode GEMV (false: on the persistent
  // kernel, the before row; --no-int4-gemv).
  bool int4_decode_gemv = true;
};

// `progress` (when given) notes each stage on stderr: calibration,
// quantizing each format, and each row's build, timing and check.
std::vector<ModelRow> run_model_table(const std::string& model_name, const llm::ModelWeights& weights,
                                      const ModelTableOptions& options, const llm::RunProgress* progress = nullptr);

}  // namespace step06
