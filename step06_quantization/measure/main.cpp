// Step 06: quantization.
//
// Decode at small batch is memory-bound: a token costs about the bytes of
// weights it reads. Stored in 8 or 4 bits, with the kernel dequantizing in
// registers, the same model reads 4-7x fewer bytes than fp32. Three parts,
// one results JSON (--json), each with its own table:
//   1. Kernels: the quantized product alone (formats x batch 1/16; --full
//      1/4/16) on this model's and the small preset's matrices (--full adds
//      Llama-2-7B's): GB/s, % of the measured bandwidth, speedup over fp32
//      (CPU) / cuBLAS fp16 (CUDA).
//   2. Speed: greedy decode of the unchanged model with quantized Linear
//      layers, on the small preset (random weights) and on this model,
//      against fp32 weights and, on CUDA, fp16 weights (a GPU's baseline).
//   3. Quality: each format x algorithm (RTN, GPTQ, AWQ) and the int8 KV
//      cache against the fp32 model on held-out text: KL, top-1, perplexity.
// The targets (CPU and CUDA speedups, GPTQ/AWQ below RTN) are printed and
// written to the JSON as met or missed; only broken checks fail the run.
// With --compare-llama-bench, llama.cpp's llama-bench decodes GGUFs of the
// same checkpoint beside this model's CPU rows (measure/llama_bench.hpp).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/harness/progress.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/step_command_line.hpp"
#include "step06_quantization/measure/kernel_table.hpp"
#include "step06_quantization/measure/llama_bench.hpp"
#include "step06_quantization/measure/model_table.hpp"
#include "step06_quantization/measure/report.hpp"
#include "step06_quantization/measure/weight_formats.hpp"

namespace {

// The sizes of each run when their flags are not given. The default run
// runs four formats instead of seven, leaves out Llama-2-7B's kernel shapes
// (1.4 GB of host memory) and batch 4, times fewer runs, flushes the CPU
// caches and probes the bandwidth with at most 256 MiB, and calibrates and
// measures quality on half the sequences: seconds, under 1 GB. --full is what
// the chapter quotes.
struct RunSizeSettings {
  const char* variants;       // the formats when neither --variant nor --formats is given
  const char* batches;        // part 1's rows per product
  int kernel_repeats;         // part 1's timed runs per cell
  int calibration_sequences;  // GPTQ/AWQ
  int heldout_sequences;      // quality
  int small_decode_positions;  // part 2 on the small preset
  int small_repeats;
};
// Formats: --quick fp32, int8, int4-g32, int4-g128 and int8 activations with
// int8 and int4sym-g32 weights; the default fp32, int8, int4-g64 and nf4
// (int8 vs int4 vs NormalFloat, each fitting a 64-column layer), and int8 and
// int4-g64 again with int8 activations (the same bytes, the other product);
// --full every row of --list.
constexpr RunSizeSettings kQuickRun{"0,1,2,4,8,9", "1,4", 1, 4, 2, 8, 1};
constexpr RunSizeSettings kDefaultRun{"0,1,3,6,8,10", "1,16", 3, 8, 4, 32, 3};
constexpr RunSizeSettings kFullRun{"all", "1,4,16", 5, 16, 8, 128, 5};

struct Step06Options {
  llm::CommonOptions common;
  std::string formats;                      // --formats: names (int4-g256, ...) instead of --variant's table rows
  std::string algorithms = "rtn,gptq,awq";  // --algorithms (part 3)
  std::string batches;                      // --batches (part 1; empty: by run size)
  int repeats = 0;                          // --repeats: timed runs per kernel cell (median; 0: by run size)
  bool no_flush = false;                    // --no-flush: warm CPU caches between kernel runs
  bool no_llama = false;                    // --no-llama: skip the Llama-2-7B kernel shapes of a --full run
  bool no_quality = false;                  // --no-quality: speed only (a random-weight preset too big to calibrate)
  int calibration_sequences = 0;            // --calibration-sequences (GPTQ/AWQ; 0: by run size)
  int heldout_sequences = 0;                // --heldout-sequences (quality; 0: by run size)
  std::string llama_bench;                  // --compare-llama-bench BIN: llama.cpp's llama-bench beside the CPU rows
  std::vector<std::string> llama_ggufs;     // --llama-gguf FILE[,FILE...]: GGUFs of this model for llama-bench
  bool no_int4_gemv = false;                // --no-int4-gemv: int4 rows decode on the persistent kernel
};

std::optional<int> parse_options(int argc, char** argv, Step06Options& options) {
  return llm::parse_step_command_line(
      "Step 06: quantization. int8/int4/NF4 weights (RTN, GPTQ, AWQ) dequantized in registers, and an int8 KV "
      "cache: kernel speed, decode speed, and quality against fp32.",
      argc, argv, options.common, [&options](CLI::App& app) {
        app.add_option("--formats", options.formats,
                       "quantized formats by name instead of --variant: int8, int4-gN, int4sym-gN, nf4, nf4-gN "
                       "(N a multiple of 32), comma-separated");
        app.add_option("--algorithms", options.algorithms, "quality part: rtn, gptq, awq (comma-separated)")
            ->capture_default_str();
        app.add_option("--batches", options.batches,
                       fmt::format("kernel part: rows per product (1-64; default {}, --full {})", kDefaultRun.batches,
                                   kFullRun.batches));
        llm::in_range(app.add_option("--repeats", options.repeats,
                                     fmt::format("timed runs per kernel cell, median reported (default {}, --full {})",
                                                 kDefaultRun.kernel_repeats, kFullRun.kernel_repeats)),
                      1, 1000);
        app.add_flag("--no-flush", options.no_flush, "do not evict the CPU caches between timed kernel runs");
        app.add_flag("--no-llama", options.no_llama,
                     "--full without the Llama-2-7B kernel shapes (about 1.4 GB of host memory; the default and "
                     "--quick runs leave them out anyway)");
        app.add_flag("--no-quality", options.no_quality,
                     "skip part 3 (quality): speed only, e.g. for a large preset whose weights are random anyway");
        llm::in_range(app.add_option("--calibration-sequences", options.calibration_sequences,
                                     fmt::format("GPTQ/AWQ calibration: sequences sampled from the fp32 model "
                                                 "(default {}, --full {})",
                                                 kDefaultRun.calibration_sequences, kFullRun.calibration_sequences)),
                      1, 4096);
        llm::in_range(app.add_option("--heldout-sequences", options.heldout_sequences,
                                     fmt::format("quality: held-out sequences (default {}, --full {})",
                                                 kDefaultRun.heldout_sequences, kFullRun.heldout_sequences)),
                      1, 4096);
        app.add_option("--compare-llama-bench", options.llama_bench,
                       "path to llama.cpp's llama-bench binary: time it on the --llama-gguf files beside this "
                       "model's CPU decode rows (one thread each)");
        app.add_flag("--no-int4-gemv", options.no_int4_gemv,
                     "CUDA int4 rows decode on the persistent tensor-core kernel instead of the int4 decode GEMV, "
                     "which also folds the norms, SwiGLU, residual adds and RoPE into its launches (the before row)");
        app.add_option("--llama-gguf", options.llama_ggufs,
                       "GGUF files of this same checkpoint for --compare-llama-bench, any llama.cpp type (F32, Q8_0, "
                       "Q4_0 are paired with fp32, int8, 4-bit rows), comma-separated")
            ->delimiter(',');
      },
      [] { llm::print_variant_list(step06::weight_formats(), 15); },
      {{{"--temperature", "--top-p"},
        "its decode is greedy, and its calibration and held-out text is sampled at temperature 1 without top-p"},
       // The fp16 row runs on CUDA whatever --dtype says: it is a baseline, as fp32 is.
       {{"--dtype"},
        "its weight formats are its own variants, measured against fp32 and, on CUDA, the fp16 model; the other "
        "CUDA switches apply to every CUDA row"}});
}

const RunSizeSettings& run_size_settings(const llm::CommonOptions& common) {
  return llm::by_run_size<const RunSizeSettings&>(common, kQuickRun, kDefaultRun, kFullRun);
}

// The run size's values for the flags not given. --quick: seconds on a slow
// CI core: fewer formats, one timed run, warm caches.
void apply_run_size(Step06Options& options) {
  const RunSizeSettings& run = run_size_settings(options.common);
  if (options.common.variant == "all" && options.formats.empty()) options.common.variant = run.variants;
  if (options.batches.empty()) options.batches = run.batches;
  if (options.repeats == 0) options.repeats = run.kernel_repeats;
  if (options.calibration_sequences == 0) options.calibration_sequences = run.calibration_sequences;
  if (options.heldout_sequences == 0) options.heldout_sequences = run.heldout_sequences;
  if (!options.common.quick) return;
  options.no_flush = true;
  options.common.steps = std::min(options.common.steps, 32);
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> names;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    names.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return names;
}

std::vector<step06::QuantAlgorithm> parse_algorithms(const std::string& text) {
  std::vector<step06::QuantAlgorithm> algorithms;
  for (const std::string& name : split_commas(text)) {
    bool known = false;
    using step06::QuantAlgorithm;
    for (const auto algorithm : {QuantAlgorithm::Rtn, QuantAlgorithm::Gptq, QuantAlgorithm::Awq})
      if (name == step06::algorithm_name(algorithm)) {
        algorithms.push_back(algorithm);
        known = true;
      }
    if (!known) throw llm::InputError(fmt::format("--algorithms: unknown algorithm '{}' (rtn, gptq, awq)", name));
  }
  return algorithms;
}

// The formats to run: --formats by name (each must fit this model's layers:
// asked for by name, a group larger than a layer is an error), else the
// --variant rows of the table (a row that does not fit a layer is skipped
// and says so). fp32 is the baseline and always runs.
std::vector<step06::QuantFormat> selected_formats(const Step06Options& options, const llm::ModelConfig& config) {
  std::vector<step06::QuantFormat> formats;
  if (!options.formats.empty()) {
    if (options.common.variant != "all")
      throw llm::InputError("--formats and --variant both pick formats: give one of them");
    for (const std::string& name : split_commas(options.formats)) {
      const step06::QuantFormat format = step06::QuantFormat::parse(name);  // InputError: unknown, bad group
      step06::check_layer_fits(format, config.dim, std::min(config.dim, config.hidden_dim));
      formats.push_back(format);
    }
    return formats;
  }
  for (const int id : llm::parse_variant_selection(options.common.variant, llm::variant_ids(step06::weight_formats())))
    if (const step06::WeightFormat& format = step06::weight_format(id).fn) formats.push_back(*format);
  return formats;
}

// Every part's settings from the flags, checked before any work.
struct Plan {
  step06::KernelTableOptions kernels;
  std::vector<step06::KernelShape> shapes;
  step06::ModelTableOptions small_speed;  // part 2 on the small preset (random weights: speed only)
  step06::ModelTableOptions this_model;   // parts 2 and 3 on the loaded model
  bool trained_weights = false;
};
Plan plan_from(const Step06Options& options, const llm::LoadedModel& loaded, const llm::DeviceSelection& devices,
               const std::vector<int>& prompt, int positions) {
  Plan plan;
  const std::vector<step06::QuantFormat> formats = selected_formats(options, loaded.weights.config);
  plan.kernels.formats = formats;
  plan.kernels.batches = llm::parse_positive_int_list(options.batches, "--batches");
  for (const int rows : plan.kernels.batches)
    if (rows > 64) throw llm::InputError(fmt::format("--batches: {} rows (at most 64)", rows));
  plan.kernels.repeats = options.repeats;
  plan.kernels.flush_caches = !options.no_flush;
  plan.kernels.buffer_limit_bytes = options.common.full ? llm::kFullRunFlushLimit : llm::kDefaultRunFlushLimit;
  plan.kernels.cpu = devices.cpu;
  plan.kernels.cuda = devices.cuda;
  plan.kernels.seed = options.common.seed;
  plan.shapes = step06::kernel_shapes(loaded.weights.config, options.common.full && !options.no_llama);

  plan.trained_weights = !options.common.model_path.empty();
  plan.this_model.devices = llm::selected_device_names(devices);
  plan.this_model.formats = formats;
  plan.this_model.algorithms = parse_algorithms(options.algorithms);
  plan.this_model.quality = !options.no_quality;
  plan.this_model.prompt = prompt;
  plan.this_model.decode_positions = positions;
  plan.this_model.repeats = options.common.quick ? 1 : 3;
  plan.this_model.calibration_sequences = options.calibration_sequences;
  plan.this_model.heldout_sequences = options.heldout_sequences;
  const int context = loaded.weights.config.seq_len;
  plan.this_model.calibration_length = std::min(context, options.common.quick ? 64 : 128);
  plan.this_model.heldout_length = std::min(context, options.common.quick ? 64 : 256);
  plan.this_model.seed = options.common.seed;
  plan.this_model.cuda = llm::cuda_run_options(options.common);
  plan.this_model.int4_decode_gemv = !options.no_int4_gemv;

  // The small preset: the dims of stories15M, larger than the caches, where
  // decode is memory-bound. Speed only, on fewer positions (its tokens are the slowest of the run).
  plan.small_speed = plan.this_model;
  plan.small_speed.quality = false;
  plan.small_speed.prompt = {1};  // BOS
  plan.small_speed.decode_positions = run_size_settings(options.common).small_decode_positions;
  plan.small_speed.repeats = run_size_settings(options.common).small_repeats;  // one core's timings wander: a median
  return plan;
}

llm::Results make_results(const Step06Options& options, const llm::LoadedModel& loaded,
                          const llm::DeviceSelection& devices, const Plan& plan) {
  llm::Results results("step06_quantization", "quantization: int8/int4 weights dequantized in registers, int8 KV");
  results.set_device_info(llm::device_info_for(devices));
  results.set_config("model", loaded.name);
  results.set_config("model_config", loaded.weights.config.describe());
  results.set_config("trained_weights", plan.trained_weights);
  results.set_config("kernel_batches", options.batches);
  results.set_config("kernel_repeats", static_cast<long long>(options.repeats));
  results.set_config("cpu_caches_flushed", plan.kernels.flush_caches);
  results.set_config("algorithms", options.algorithms);
  results.set_config("calibration", fmt::format("{} sequences x {} positions sampled from the fp32 model (seeds {}+)",
                                                plan.this_model.calibration_sequences,
                                                plan.this_model.calibration_length, options.common.seed + 1000));
  results.set_config("heldout", fmt::format("{} sequences x {} positions sampled from the fp32 model (seeds {}+)",
                                            plan.this_model.heldout_sequences, plan.this_model.heldout_length,
                                            options.common.seed + 2000));
  results.set_config("decode_positions", static_cast<long long>(plan.this_model.decode_positions));
  results.set_config("small_decode_positions", static_cast<long long>(plan.small_speed.decode_positions));
  results.set_config("speedup_baseline", std::string("kernels: fp32 Eigen (cpu) / cuBLAS fp16 (cuda), same shape and "
                                                     "rows; models: fp32 weights on the same device and model "
                                                     "(speedup_vs_fp16, cuda: fp16 weights)"));
  results.set_config("quick", options.common.quick);
  results.set_config("full", options.common.full);
  results.set_config("llama_kernel_shapes", options.common.full && !options.no_llama);
  results.set_config("int4_decode_gemv", plan.this_model.int4_decode_gemv);
  return results;
}

int run_step06(int argc, char** argv) {
  Step06Options options;
  if (const auto exit_status = parse_options(argc, argv, options)) return *exit_status;
  apply_run_size(options);
  const llm::DeviceSelection devices = llm::select_devices(options.common.device);
  step06::check_llama_bench_request(options.llama_bench, options.llama_ggufs, devices.cpu);
  const llm::LoadedModel loaded = llm::load_model(options.common);
  const std::vector<int> prompt = llm::encode_prompt(loaded, options.common);
  const int positions = llm::generation_positions(options.common, loaded.weights.config, prompt.size());
  const Plan plan = plan_from(options, loaded, devices, prompt, positions);  // every flag checked before any work

  llm::RunProgress progress("step06_quantization", 3 + static_cast<int>(options.llama_ggufs.size()));
  // 1. The kernels alone.
  progress.start("the quantized products alone, per shape, format and batch");
  const step06::KernelTable kernels = step06::run_kernel_table(plan.shapes, plan.kernels);
  // 2. Decode speed on the small preset (memory-bound dims, random weights).
  progress.start("decode speed of the small preset in every weight format");
  const std::vector<step06::ModelRow> small_speed = step06::run_model_table(
      "preset small", llm::random_weights(llm::find_preset("small").config, options.common.seed), plan.small_speed);
  // 2 and 3. This model: speed, and quality against fp32.
  progress.start(fmt::format("{}: decode speed and quality against fp32 in every weight format", loaded.name));
  const std::vector<step06::ModelRow> this_model =
      step06::run_model_table(loaded.name, loaded.weights, plan.this_model, &progress);
  // llama.cpp on the same checkpoint: as many decode forwards as this model's rows timed.
  const int llama_decode_tokens = plan.this_model.decode_positions - static_cast<int>(plan.this_model.prompt.size());
  const std::vector<step06::LlamaComparison> llama_comparisons = step06::pair_with_llama(
      step06::run_llama_bench_files(options.llama_bench, options.llama_ggufs, llama_decode_tokens,
                                    plan.this_model.repeats, progress),
      this_model);

  llm::Results results = make_results(options, loaded, devices, plan);
  const double cuda_copy_gbps = devices.cuda ? llm::cuda::measure_copy_bandwidth_gbps() : 0.0;
  if (cuda_copy_gbps > 0) results.set_config("cuda_copy_gbps", cuda_copy_gbps);
  results.set_config("cpu_read_gbps", kernels.cpu_read_gbps);
  step06::add_kernel_rows(results, kernels, cuda_copy_gbps);
  step06::add_model_rows(results, small_speed, "speed", kernels.cpu_read_gbps, cuda_copy_gbps);
  step06::add_model_rows(results, this_model, "quality", kernels.cpu_read_gbps, cuda_copy_gbps);
  fmt::print("{}\n", results.format_header());
  step06::print_kernel_table(kernels, cuda_copy_gbps);
  std::vector<step06::ModelRow> speed_rows = small_speed;
  speed_rows.insert(speed_rows.end(), this_model.begin(), this_model.end());
  step06::print_speed_table(speed_rows, kernels.cpu_read_gbps, cuda_copy_gbps);
  if (plan.this_model.quality) step06::print_quality_table(this_model, plan.trained_weights);
  step06::print_llama_comparison(llama_comparisons, loaded.name, llama_decode_tokens, plan.this_model.repeats);
  step06::add_llama_rows(results, llama_comparisons);
  step06::report_targets(results, {&kernels, &small_speed, &this_model, plan.trained_weights});
  return llm::finish_run(results, options.common, devices);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_main(argc, argv, run_step06); }
