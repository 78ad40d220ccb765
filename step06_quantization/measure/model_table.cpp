#include "step06_quantization/measure/model_table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <span>

#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/harness/timer.hpp"
#include "llm/sampler.hpp"
#include "llm/token_batch.hpp"
#include "step05_paged_attention/paged_kv_cache.hpp"
#include "step06_quantization/measure/weight_formats.hpp"

namespace step06 {

std::string ModelVariant::weights_name() const {
  return weights ? weights->name() : llm::cuda::to_string(dense_dtype);
}

std::string ModelVariant::name() const {
  const std::string stored =
      weights ? fmt::format("{} {}", weights->name(), algorithm_name(algorithm)) : weights_name();
  return int8_kv ? stored + " + int8 kv" : stored;
}

int ModelVariant::id() const {
  if (!weights && dense_dtype == llm::cuda::WeightDtype::Float16) return kFp16ModelVariantId;
  return variant_id_of(weights);
}

namespace {

constexpr int kKvBlockSize = 16;  // the int8 cache's blocks (step 05's default)

// A one-sequence cache of `capacity` positions for `model`: its own fp32
// cache, or a paged cache of int8 rows.
std::unique_ptr<llm::KvCache> make_cache(llm::Model& model, bool int8_kv, int capacity) {
  if (!int8_kv) return model.make_cache(1, capacity);
  step05::PagedKvCacheOptions options;
  options.num_sequences = 1;
  options.block_size = kKvBlockSize;
  options.n_blocks = step05::blocks_for_sequences(1, capacity, kKvBlockSize);
  options.element = llm::KvElement::Int8;
  return step05::make_paged_kv_cache(model.device_name(), model.config(), options);
}

// Bytes of K and V of one position in every layer: fp32 rows, or int8 rows
// plus one fp32 scale per KV head.
double kv_bytes_per_position(const llm::ModelConfig& config, bool int8_kv) {
  const double per_row = int8_kv ? config.kv_dim() + 4.0 * config.n_kv_heads : 4.0 * config.kv_dim();
  return 2.0 * config.n_layers * per_row;
}

// Bytes of one weight of a dense (unquantized) matrix: a float, or one
// 16-bit half (fp16, bf16).
double dense_weight_bytes(llm::cuda::WeightDtype dtype) {
  return dtype == llm::cuda::WeightDtype::Float32 ? sizeof(float) : sizeof(std::uint16_t);
}

// Bytes of the matrices one decode token reads: each quantized matrix's
// codes and scales, the others' dense weights in `dense_dtype`.
double weight_bytes_per_token(const llm::ModelWeights& weights, const QuantizedLayers* layers,
                              llm::cuda::WeightDtype dense_dtype) {
  double bytes = 0.0;
  for (const llm::LinearSite& site : linear_sites(weights.config)) {
    if (layers != nullptr && layers->matrices.contains(site)) {
      bytes += static_cast<double>(layers->matrices.at(site).bytes());
    } else {
      const LayerWeights layer = layer_weights(weights, site);
      bytes += dense_weight_bytes(dense_dtype) * layer.out_features * layer.in_features;
    }
  }
  return bytes;
}

// How the unquantized rows (fp32, fp16) run on CUDA: the table's options
// with the row's weights. Every row of a GPU runs the same switches, so two
// rows differ only in their weights' format and in what their products can
// fold (the fp16 products and the int4 decode GEMV fold the norms and adds
// into their launches; fp32's cuBLAS and the int8 and NF4 kernels cannot,
// and the model runs those as kernels of their own).
llm::cuda::CudaRunOptions unquantized_run_options(const ModelTableOptions& options, llm::cuda::WeightDtype dtype) {
  llm::cuda::CudaRunOptions run = options.cuda;
  run.dtype = dtype;
  return run;
}

// Logits at every position of `sequence` ([length, vocab]), one all-rows forward.
std::vector<float> logits_over(llm::Model& model, bool int8_kv, const std::vector<int>& sequence) {
  auto cache = make_cache(model, int8_kv, static_cast<int>(sequence.size()));
  const std::span<const float> logits =
      model.forward(llm::TokenBatch::prefill(sequence, 0, 0), *cache, llm::LogitsFor::AllRows);
  return {logits.begin(), logits.end()};
}

// Greedy decode timing: `repeats` runs (after a warm-up) of one prefill over
// the prompt, then one forward per position feeding the argmax token, up to
// `positions` positions; time per token of the decode forwards (the prefill
// excluded), median over runs. Unlike a generation loop, BOS does not stop it:
// every variant times the same number of forwards (random weights may well
// predict BOS at once). Returns the greedy tokens of the last run too.
struct DecodeTiming {
  double ms_per_token = 0.0;
  std::vector<int> tokens;  // [positions - prompt + 1] greedy tokens, the prompt excluded
};
DecodeTiming time_decode(llm::Model& model, bool int8_kv, const std::vector<int>& prompt, int positions,
                         int repeats) {
  const int prompt_length = static_cast<int>(prompt.size());
  if (prompt_length < 1 || positions <= prompt_length)
    throw llm::InputError(fmt::format("decode timing: {} positions leave no decode step after a prompt of {}",
                                      positions, prompt_length));
  DecodeTiming timing;
  std::vector<double> per_token_ms;
  for (int run = 0; run <= repeats; ++run) {  // run 0: warm-up
    auto cache = make_cache(model, int8_kv, positions);
    std::vector<int> tokens = {llm::argmax(model.forward(llm::TokenBatch::prefill(prompt, 0, 0), *cache))};
    const llm::Stopwatch decode_time;
    for (int position = prompt_length; position < positions; ++position)
      tokens.push_back(llm::argmax(model.forward(llm::TokenBatch::single(tokens.back(), position, 0), *cache)));
    if (run > 0) per_token_ms.push_back(decode_time.elapsed_ms() / (positions - prompt_length));
    timing.tokens = std::move(tokens);
  }
  timing.ms_per_token = llm::TimingStats::from_samples(per_token_ms).median_ms;
  return timing;
}

int matching_prefix(const std::vector<int>& a, const std::vector<int>& b) {
  const auto [end_a, end_b] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<int>(end_a - a.begin());
}

// Quantized weights and an int8 KV cache together: the GPU's quantized
// kernels round x to fp16 (the "A16"), so its K and V rows differ from the
// CPU's in the fourth significant digit, and some of their int8 codes round
// to the neighbouring step. A flipped code moves its value by one
// quantization step at most: the size of the error int8 KV adds over fp32 KV,
// which the CPU measures here on the same tokens (max |int8 KV - fp32 KV
// logits|). The GPU's logits are then within that error of its own fp32-KV
// logits, which are within the fp16 tolerance of the CPU's fp32-KV logits,
// which are within that error of the CPU's int8-KV logits: twice the error,
// on top of the fp16 tolerance. A wrong row, scale or block moves logits by
// their own size, far past it.
double kv_code_flip_allowance(llm::Model& cpu_model, const std::vector<int>& sequence,
                              const std::vector<float>& cpu_int8_kv_logits) {
  const std::vector<float> fp32_kv_logits = logits_over(cpu_model, false, sequence);
  return 2.0 * llm::compare(cpu_int8_kv_logits, fp32_kv_logits, llm::Tolerance{0.0, 0.0}).max_abs_err;
}

// One model's logits over the held-out sequences, pooled, and what they predict.
struct HeldoutLogits {
  std::vector<float> every_position;  // [positions of every sequence, vocab]
  std::vector<float> predicting;      // [positions - 1 per sequence, vocab]: position t predicts token t + 1
  std::vector<int> next_tokens;       // [positions - 1 per sequence] the tokens they predict (teacher forcing)
};
HeldoutLogits heldout_logits(llm::Model& model, bool int8_kv, const std::vector<std::vector<int>>& heldout) {
  const int vocab = model.config().vocab_size;
  HeldoutLogits pooled;
  for (const std::vector<int>& sequence : heldout) {
    const std::vector<float> logits = logits_over(model, int8_kv, sequence);
    pooled.every_position.insert(pooled.every_position.end(), logits.begin(), logits.end());
    pooled.predicting.insert(pooled.predicting.end(), logits.begin(), logits.end() - vocab);  // all but the last row
    pooled.next_tokens.insert(pooled.next_tokens.end(), sequence.begin() + 1, sequence.end());
  }
  return pooled;
}

// What every row of one run shares: the sequences quality is measured on and
// the fp32 model's logits over them (computed once, on the CPU).
struct Reference {
  std::vector<std::vector<int>> heldout;  // [sequences][length]
  HeldoutLogits fp32;
  double perplexity = 0.0;                // fp32's, of the held-out sequences
};

// Mean KL / top-1 / perplexity of `model` on the held-out sequences against
// the fp32 logits (all positions of all sequences pooled).
void measure_quality(llm::Model& model, bool int8_kv, const Reference& reference, ModelRow& row) {
  const int vocab = model.config().vocab_size;
  const HeldoutLogits candidate = heldout_logits(model, int8_kv, reference.heldout);
  row.agreement = llm::compare_next_token_distributions(reference.fp32.every_position, candidate.every_position, vocab);
  row.perplexity = llm::perplexity(candidate.predicting, candidate.next_tokens, vocab);
  row.perplexity_fp32 = reference.perplexity;
}

// Each row's time against its device's baselines: fp32's, and fp16's where
// the device has an fp16 row (a GPU; 0 elsewhere). Set once every row of the
// device has run: the fp32 row runs before the fp16 one.
void set_speedups(std::span<ModelRow> device_rows) {
  const auto baseline_ms_per_token = [device_rows](llm::cuda::WeightDtype dtype) {
    for (const ModelRow& row : device_rows)
      if (row.variant.is_baseline(dtype)) return row.decode_ms_per_token;
    return 0.0;
  };
  const double fp32_ms = baseline_ms_per_token(llm::cuda::WeightDtype::Float32);
  const double fp16_ms = baseline_ms_per_token(llm::cuda::WeightDtype::Float16);
  for (ModelRow& row : device_rows) {
    if (!row.skipped.empty()) continue;
    row.speedup = fp32_ms / row.decode_ms_per_token;
    row.speedup_vs_fp16 = fp16_ms / row.decode_ms_per_token;
  }
}

}  // namespace

std::vector<ModelRow> run_model_table(const std::string& model_name, const llm::ModelWeights& weights,
                                      const ModelTableOptions& options, const llm::RunProgress* progress) {
  const auto note = [progress](const std::string& what) {
    if (progress != nullptr) progress->note(what);
  };
  const llm::ModelConfig& config = weights.config;
  Reference reference;
  std::unique_ptr<Calibration> calibration;
  if (options.quality) {
    note("calibration and held-out text sampled from the fp32 model on the CPU");
    llm::CpuModel fp32_cpu(weights);
    // Calibration and held-out text: both sampled from the fp32 model, with
    // seeds that never overlap, so quality is measured on text GPTQ/AWQ never saw.
    calibration = record_calibration(weights, sample_sequences(fp32_cpu, options.calibration_sequences,
                                                               options.calibration_length, options.seed + 1000));
    reference.heldout =
        sample_sequences(fp32_cpu, options.heldout_sequences, options.heldout_length, options.seed + 2000);
    reference.fp32 = heldout_logits(fp32_cpu, false, reference.heldout);
    reference.perplexity = llm::perplexity(reference.fp32.predicting, reference.fp32.next_tokens, config.vocab_size);
  }

  // The variants after the baselines (fp32, and fp16 on a GPU), in table
  // order: each format x algorithm, then the int8 KV rows.
  std::vector<ModelVariant> variants;
  for (const QuantFormat& format : options.formats)
    for (const QuantAlgorithm algorithm : options.quality ? options.algorithms : std::vector{QuantAlgorithm::Rtn})
      variants.push_back({.weights = format, .algorithm = algorithm});
  if (options.int8_kv_rows) {
    variants.push_back({.int8_kv = true});
    for (const QuantFormat& format : options.formats)
      if (format.scheme == QuantScheme::Int8PerChannel && !format.int8_activations())
        variants.push_back({.weights = format, .int8_kv = true});
  }

  // Quantize each (format, algorithm) once; every device runs the same codes.
  std::map<std::pair<std::string, QuantAlgorithm>, QuantizedLayers> quantized;  // (format name, algorithm)
  std::map<std::pair<std::string, QuantAlgorithm>, std::string> skipped;       // why it could not quantize
  for (const ModelVariant& variant : variants) {
    const auto key = std::pair{format_name(variant.weights), variant.algorithm};
    if (!variant.weights || quantized.contains(key) || skipped.contains(key)) continue;
    ModelQuantization quantization;
    quantization.format = *variant.weights;
    quantization.algorithm = variant.algorithm;
    try {
      note(fmt::format("quantizing the weights: {}", describe(quantization)));
      quantized.emplace(key, quantize_layers(weights, quantization, calibration.get()));
    } catch (const llm::InputError& error) {
      skipped.emplace(key, error.what());  // e.g. a group larger than a layer's input
    }
  }

  std::vector<ModelRow> rows;
  for (const std::string& device : options.devices) {
    const std::size_t first_row_of_device = rows.size();
    std::vector<int> fp32_greedy;

    // The device's rows in table order: fp32, a GPU's fp16 baseline (real
    // inference on a GPU stores unquantized weights in fp16, so that is what
    // its quantized rows replace), then the variants. Each runs on `layers`
    // (nullptr: unquantized weights) or is skipped, saying why.
    struct PlannedRow {
      ModelVariant variant;
      const QuantizedLayers* layers = nullptr;
      std::string skipped = {};  // empty: the row runs
    };
    std::vector<PlannedRow> planned = {{.variant = {}}};
    if (device != "cpu") planned.push_back({.variant = {.dense_dtype = llm::cuda::WeightDtype::Float16}});
    for (const ModelVariant& variant : variants) {
      const auto key = std::pair{format_name(variant.weights), variant.algorithm};
      const bool cpu_only = device != "cpu" && variant.weights && variant.weights->int8_activations();
      if (const auto found = skipped.find(key); found != skipped.end() || cpu_only)
        planned.push_back(
            {.variant = variant, .skipped = cpu_only ? std::string(kInt8ActivationsCpuOnly) : found->second});
      else
        planned.push_back({.variant = variant, .layers = variant.weights ? &quantized.at(key) : nullptr});
    }

    // The CPU models a GPU row's logits are checked against, one per set of
    // weights (nullptr: fp32), built at the first row that needs it and
    // dropped after the last: the fp32 one checks the fp32, fp16 and fp32 +
    // int8 KV rows, an int8 one its row and its int8 KV row. Building a GPU
    // preset's CPU model copies every weight on one thread.
    std::map<const QuantizedLayers*, std::unique_ptr<llm::Model>> cpu_check_models;
    std::map<const QuantizedLayers*, int> checks_left;  // rows still to check against each
    if (device != "cpu")
      for (const PlannedRow& planned_row : planned)
        if (planned_row.skipped.empty()) ++checks_left[planned_row.layers];
    const auto cpu_check_model = [&](const QuantizedLayers* layers) -> llm::Model& {
      std::unique_ptr<llm::Model>& model = cpu_check_models[layers];
      if (!model)
        model = layers ? make_quantized_model_on("cpu", weights, *layers) : llm::make_model_on("cpu", weights);
      return *model;
    };
    const auto checked_against = [&](const QuantizedLayers* layers) {
      if (--checks_left[layers] == 0) cpu_check_models.erase(layers);
    };

    const auto run_row = [&](const ModelVariant& variant, const QuantizedLayers* layers) {
      ModelRow row;
      row.device = device;
      row.model = model_name;
      row.variant = variant;
      note(fmt::format("{} {}: building the model", device, variant.name()));
      std::unique_ptr<llm::Model> model =
          layers ? make_quantized_model_on(device, weights, *layers, {options.cuda, options.int4_decode_gemv})
                 : llm::make_model_on(device, weights, unquantized_run_options(options, variant.dense_dtype));
      row.weight_bytes = weight_bytes_per_token(weights, layers, variant.dense_dtype);
      row.kv_bytes_per_position = kv_bytes_per_position(config, variant.int8_kv);
      note(fmt::format("{} {}: timing greedy decode, {} positions, {} runs", device, variant.name(),
                       options.decode_positions, options.repeats));
      const DecodeTiming decode =
          time_decode(*model, variant.int8_kv, options.prompt, options.decode_positions, options.repeats);
      row.decode_ms_per_token = decode.ms_per_token;
      row.tokens_per_s = 1e3 / decode.ms_per_token;
      row.gb_per_s = row.weight_bytes / (decode.ms_per_token * 1e-3) / 1e9;
      const bool is_fp32 = variant.is_baseline(llm::cuda::WeightDtype::Float32);
      if (is_fp32) fp32_greedy = decode.tokens;
      row.greedy_tokens_compared = static_cast<int>(fp32_greedy.size());
      row.greedy_matching_prefix = matching_prefix(decode.tokens, fp32_greedy);
      if (options.quality && device == "cpu") {
        if (is_fp32) {  // the reference itself: its logits are reference.fp32's
          row.agreement = llm::NextTokenAgreement{0, 0.0, 0.0, 1.0};
          row.perplexity = row.perplexity_fp32 = reference.perplexity;
        } else {
          note(fmt::format("{} {}: quality on the held-out text", device, variant.name()));
          measure_quality(*model, variant.int8_kv, reference, row);
        }
      }
      row.ok = true;
      if (device != "cpu") {
        // The GPU runs the same codes as the CPU (the fp16 row: the same
        // weights, rounded): its logits over the prompt and the greedy tokens
        // match the CPU model's (the fp16 row's: the fp32 model's).
        note(fmt::format("{} {}: its logits against the CPU model's", device, variant.name()));
        std::vector<int> checked = options.prompt;  // [positions] the prompt and the greedy tokens
        checked.insert(checked.end(), decode.tokens.begin(), decode.tokens.end());
        checked.resize(std::min<std::size_t>(checked.size(), static_cast<std::size_t>(options.decode_positions)));
        llm::Model& cpu_model = cpu_check_model(layers);
        // fp32 weights: cuBLAS fp32 against Eigen, the fp32 model tolerance. The
        // quantized kernels round x to fp16 as they stage it (the "A16") and
        // keep the group scales in fp16, the fp16 row's weights are rounded to
        // fp16, and an int8 KV row can round one step the other way: the fp16
        // model tolerance (the only half-precision dense_dtype this table
        // builds is fp16). Quantized weights and int8 KV together: plus the
        // int8 KV codes' flips (kv_code_flip_allowance).
        const bool fp16_rounding =
            layers != nullptr || variant.int8_kv || variant.dense_dtype != llm::cuda::WeightDtype::Float32;
        llm::Tolerance tolerance = llm::model_logits_tolerance(fp16_rounding ? llm::DType::F16 : llm::DType::F32);
        const std::vector<float> cpu_logits = logits_over(cpu_model, variant.int8_kv, checked);
        if (layers != nullptr && variant.int8_kv)
          tolerance.abs_tol += kv_code_flip_allowance(cpu_model, checked, cpu_logits);
        row.check = llm::compare(logits_over(*model, variant.int8_kv, checked), cpu_logits, tolerance);
        row.ok = row.check.ok;
        checked_against(layers);
      }
      rows.push_back(std::move(row));
    };
    for (const PlannedRow& planned_row : planned) {
      if (planned_row.skipped.empty()) {
        run_row(planned_row.variant, planned_row.layers);
        continue;
      }
      ModelRow row;
      row.device = device;
      row.model = model_name;
      row.variant = planned_row.variant;
      row.skipped = planned_row.skipped;
      row.ok = true;  // not run: a format that does not fit this model's layers, or not this device's
      rows.push_back(std::move(row));
    }
    set_speedups(std::span(rows).subspan(first_row_of_device));
  }
  return rows;
}

}  // namespace step06
