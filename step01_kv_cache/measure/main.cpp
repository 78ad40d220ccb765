// Step 01: the KV cache.
//
// Generates the same tokens two ways, on the CPU and (when present) on CUDA:
//   0 recompute  every new token re-runs the whole prefix: step t costs O(t)
//   1 kv_cache   K and V of past tokens are kept: step t costs O(1) projections
// checks that both produce identical greedy tokens and matching logits, and
// prints time per token by position, total time, tokens/s, the speedup, and
// the KV cache's size by formula next to the bytes actually allocated.
// With --compare-runc, the cached decode is also timed beside llama2.c's run.c
// on the same checkpoint (--write-checkpoint writes any model as one).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/tokenizer.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/generated_text.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/harness/progress.hpp"
#include "llm/harness/result_rows.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/step_command_line.hpp"
#include "llm/harness/timer.hpp"
#include "step01_kv_cache/generation.hpp"
#include "step01_kv_cache/measure/runc_comparison.hpp"

namespace {

struct Step01Options {
  llm::CommonOptions common;
  int repeats = 5;  // --repeats: timed generations per variant
  std::string write_checkpoint;  // --write-checkpoint FILE: write the model as llama2.c files and stop
  std::string compare_runc;      // --compare-runc RUN: time llama2.c's run.c binary beside the cached decode
};

// Returns the exit status when the program should stop (--help, a bad flag, --list).
std::optional<int> parse_options(int argc, char** argv, Step01Options& options) {
  const auto exit_status = llm::parse_step_command_line(
      "Step 01: the KV cache. Generation with and without caching K/V, on CPU and CUDA.", argc, argv, options.common,
      [&options](CLI::App& app) {
        llm::at_least(app.add_option("--repeats", options.repeats, "timed runs per variant (median reported)"), 1);
        app.add_option("--write-checkpoint", options.write_checkpoint,
                       "write the model (a preset too) as a llama2.c checkpoint FILE and FILE's stem + "
                       "\".tokenizer.bin\", then stop");
        app.add_option("--compare-runc", options.compare_runc,
                       "path to a llama2.c run.c binary: time it beside the CPU cached decode on this model");
      },
      [] { llm::print_variant_list(step01::variants(), 10); });
  if (options.common.quick) {
    options.common.steps = std::min(options.common.steps, 48);
    options.repeats = 1;
  }
  return exit_status;
}

// One variant's generations on one device.
struct Measured {
  std::string device;
  llm::DType weights = llm::DType::F32;    // the model's weight element type (--dtype on CUDA)
  const llm::Variant<step01::GenerateFn>* variant;
  step01::GenerationResult first;          // tokens and logits of the first timed run
  llm::TimingStats total;                  // whole generation, over the repeats
  std::vector<double> median_token_ms;     // [n_generated] per-token median over the repeats
  double decode_tokens_per_s = 0.0;        // median over repeats of (n_generated - 1) / time after token 0,
                                           // how run.c counts: its timer starts after the first forward
};

Measured measure(const std::string& device, llm::Model& model, const llm::Variant<step01::GenerateFn>& variant,
                 std::span<const int> prompt, int positions, const llm::CommonOptions& options, int repeats) {
  Measured m{device, llm::DType::F32, &variant, {}, {}, {}};
  if (device == "cuda") m.weights = llm::compare_dtype(llm::cuda_run_options(options).dtype);
  // Warm-up: touches every weight and scratch buffer (and, on CUDA, loads the
  // kernels) so the timed runs measure steady state.
  {
    llm::Sampler sampler(model.config().vocab_size, options.temperature, options.top_p, options.seed);
    variant.fn(model, prompt, std::min(positions, static_cast<int>(prompt.size()) + 8), sampler);
  }
  std::vector<double> totals;                 // [repeats] whole-generation ms
  std::vector<double> decode_ms_per_token;    // [repeats] ms per token after the first
  std::vector<std::vector<double>> token_ms;  // [repeats][n_generated] ms per token
  for (int r = 0; r < repeats; ++r) {
    // Same seed every run: the same tokens.
    llm::Sampler sampler(model.config().vocab_size, options.temperature, options.top_p, options.seed);
    step01::GenerationResult result = variant.fn(model, prompt, positions, sampler);
    totals.push_back(result.total_ms);
    if (result.token_ms.size() > 1)
      decode_ms_per_token.push_back((result.total_ms - result.token_ms.front()) /
                                    static_cast<double>(result.token_ms.size() - 1));
    token_ms.push_back(result.token_ms);
    if (r == 0) m.first = std::move(result);
  }
  m.total = llm::TimingStats::from_samples(totals);
  if (!decode_ms_per_token.empty())
    m.decode_tokens_per_s = 1000.0 / llm::TimingStats::from_samples(decode_ms_per_token).median_ms;
  for (std::size_t t = 0; t < m.first.token_ms.size(); ++t) {
    std::vector<double> samples;  // [repeats] token t's ms
    for (const auto& run : token_ms)
      if (t < run.size()) samples.push_back(run[t]);
    m.median_token_ms.push_back(llm::TimingStats::from_samples(samples).median_ms);
  }
  return m;
}

// Every selected variant on every selected device, CPU first, one part of
// `progress` each; each device's model is freed before the next one's is built.
std::vector<Measured> measure_all(const llm::ModelWeights& weights, const std::vector<int>& selected,
                                  const llm::DeviceSelection& devices, std::span<const int> prompt, int positions,
                                  const Step01Options& options, llm::RunProgress& progress) {
  std::vector<Measured> runs;
  for (const std::string& device : llm::selected_device_names(devices)) {
    auto model = llm::make_model_on(device, weights, llm::cuda_run_options(options.common));
    for (const auto& variant : step01::variants())
      if (llm::is_selected(selected, variant.id)) {
        progress.start(fmt::format("{} {}: {} positions, {} timed generations", device, variant.name, positions,
                                   options.repeats));
        runs.push_back(measure(device, *model, variant, prompt, positions, options.common, options.repeats));
      }
  }
  return runs;
}

// Tokens identical, and logits within fp32 model tolerance up to (and at) the
// first differing token: after that the two runs condition on different text.
// Against the reference (fp32): fp32 rows must give its tokens and its logits
// to fp32 tolerance. Half-precision weights round every product, so a greedy
// token may flip where two logits are closer than that rounding: their logits
// are checked to the dtype's tolerance up to and including the first
// differing token (a flip passes only as a near-tie), and the tokens after
// it are not compared.
llm::CompareResult check(const Measured& got, const Measured& ref, int vocab) {
  const auto token_check = llm::compare_tokens(got.first.tokens, ref.first.tokens);
  const std::size_t same_prefix =
      std::min({got.first.tokens.size(), ref.first.tokens.size(),
                token_check.over_tolerance ? token_check.worst_index + 1 : got.first.tokens.size()});
  const std::size_t n = same_prefix * static_cast<std::size_t>(vocab);
  auto logit_check = llm::compare(std::span(got.first.logits).first(n), std::span(ref.first.logits).first(n),
                                  llm::model_logits_tolerance(got.weights));
  logit_check.ok = logit_check.ok && (token_check.ok || got.weights != llm::DType::F32);
  logit_check.size_mismatch = token_check.size_mismatch;
  return logit_check;
}

// Median per-token time in a small window around generated token `index`
// (single tokens take microseconds; one sample is mostly noise).
double window_median(const std::vector<double>& ms, std::size_t index) {
  const std::size_t lo = index >= 3 ? index - 3 : 0, hi = std::min(ms.size(), index + 4);
  return llm::TimingStats::from_samples(std::vector<double>(ms.begin() + lo, ms.begin() + hi)).median_ms;
}

// Per-position checkpoints (indices of generated tokens): the first, the
// quarter points and the last.
std::vector<std::size_t> position_checkpoints(std::size_t n_generated) {
  std::vector<std::size_t> checkpoints;
  for (int q = 0; q <= 4; ++q) checkpoints.push_back((n_generated - 1) * q / 4);
  checkpoints.erase(std::unique(checkpoints.begin(), checkpoints.end()), checkpoints.end());
  return checkpoints;
}

// Cached decode against the memory-bound floor: the bytes a step must read
// (weights + K/V so far, decode_bytes_per_token) over the measured time per
// token, at the first and the last checkpoint, and on CUDA as a fraction of
// the device-to-device copy bandwidth measured in the same run (the higher of
// its two readings, CopyBandwidth). Recompute rows are skipped: they read the
// weights once per step too, but do O(t) work per read.
struct DecodeBandwidth {
  std::size_t context;   // positions the token attends to
  double bytes;          // read per token
  double ms;             // median time per token there
  double gbps;
};
std::vector<DecodeBandwidth> decode_bandwidth(const Measured& m, const llm::ModelConfig& config,
                                              const std::vector<std::size_t>& checkpoints) {
  std::vector<DecodeBandwidth> out;
  if (m.variant->id != 1) return out;
  for (std::size_t checkpoint : {checkpoints.front(), checkpoints.back()}) {
    const std::size_t context = checkpoint + static_cast<std::size_t>(m.first.prompt_length);
    const double bytes = static_cast<double>(
        step01::decode_bytes_per_token(config, static_cast<long long>(context), m.weights == llm::DType::F32 ? 4 : 2));
    const double ms = window_median(m.median_token_ms, checkpoint);
    out.push_back({context, bytes, ms, bytes / (ms * 1e-3) / 1e9});
  }
  return out;
}

void add_bandwidth(llm::ResultRow& row, const std::vector<DecodeBandwidth>& bandwidth, double copy_gbps) {
  for (std::size_t i = 0; i < bandwidth.size(); ++i) {
    const std::string where = i == 0 ? "first" : "last";
    row.extra["decode_context_" + where] = static_cast<long long>(bandwidth[i].context);
    row.extra["decode_bytes_per_token_" + where] = bandwidth[i].bytes;
    row.extra["decode_gbps_" + where] = bandwidth[i].gbps;
    if (row.device == "cuda" && copy_gbps > 0) {
      row.extra["copy_gbps"] = copy_gbps;
      row.extra["fraction_of_copy_bandwidth_" + where] = bandwidth[i].gbps / copy_gbps;
    }
  }
}

llm::Results make_results(const llm::LoadedModel& loaded, const llm::DeviceSelection& devices,
                          std::size_t prompt_tokens, int positions, const Step01Options& options) {
  llm::Results results("step01_kv_cache", "KV cache: recompute the prefix vs cache K/V");
  results.set_device_info(llm::device_info_for(devices));
  results.set_config("model", loaded.name);
  results.set_config("model_config", loaded.weights.config.describe());
  results.set_config("prompt_tokens", static_cast<long long>(prompt_tokens));
  results.set_config("positions", static_cast<long long>(positions));
  results.set_config("temperature", static_cast<double>(options.common.temperature));
  results.set_config("repeats", static_cast<long long>(options.repeats));
  results.set_config("quick", options.common.quick);
  // The default run takes seconds already: --full is the same run.
  results.set_config("full", options.common.full);
  results.set_config("speedup_baseline", std::string("whole generation: recompute (variant 0) on the same device"));
  results.add_note("speedup = total time of recompute (variant 0) / this row's total time, same device and tokens");
  return results;
}

// One row per run: total time, tokens/s, speedup over the same device's
// recompute, the check against `reference`, time per token at each checkpoint.
void add_rows(llm::Results& results, const std::vector<Measured>& runs, const Measured& reference,
              const llm::ModelConfig& config, const std::vector<std::size_t>& checkpoints, double copy_gbps) {
  std::map<std::string, double> baseline_ms;  // per device: variant 0's total time
  for (const auto& m : runs)
    if (m.variant->id == 0) baseline_ms[m.device] = m.total.median_ms;
  for (const auto& m : runs) {
    const auto error = check(m, reference, config.vocab_size);
    const double speedup = baseline_ms.count(m.device) ? baseline_ms[m.device] / m.total.median_ms : 1.0;
    llm::ResultRow row = llm::timed_result_row(m.device, m.variant->id, m.variant->name, m.total, speedup, error);
    row.throughput_key = "tokens_per_s";
    row.throughput = static_cast<double>(m.first.tokens.size()) / (m.total.median_ms / 1000.0);
    row.extra["tokens_generated"] = static_cast<long long>(m.first.tokens.size());
    row.extra["tokens_identical"] = llm::compare_tokens(m.first.tokens, reference.first.tokens).ok;
    row.extra["kv_bytes_allocated"] = static_cast<long long>(m.first.kv_bytes_allocated);
    for (std::size_t checkpoint : checkpoints)
      if (checkpoint < m.median_token_ms.size())
        row.extra[fmt::format("ms_per_token_at_pos_{:04}", checkpoint + m.first.prompt_length)] =
            window_median(m.median_token_ms, checkpoint);
    add_bandwidth(row, decode_bandwidth(m, config, checkpoints), copy_gbps);
    llm::report_if_failed(m.device + " " + m.variant->name, error);
    results.add_row(std::move(row));
  }
}

// Time per token against position: recompute grows, the cache stays flat.
void print_time_per_token(const std::vector<Measured>& runs, const std::vector<std::size_t>& checkpoints,
                          int prompt_length) {
  fmt::print("time per generated token (median over repeats and a 7-token window), by position:\n");
  fmt::print("{:<6} {:<10}", "device", "variant");
  for (std::size_t checkpoint : checkpoints) fmt::print(" {:>10}", fmt::format("pos {}", checkpoint + prompt_length));
  fmt::print(" {:>8}\n", "last/1st");
  for (const auto& m : runs) {
    fmt::print("{:<6} {:<10}", m.device, m.variant->name);
    for (std::size_t checkpoint : checkpoints)
      fmt::print(" {:>10}", fmt::format("{:.4f} ms", window_median(m.median_token_ms, checkpoint)));
    fmt::print(" {:>7.1f}x\n", window_median(m.median_token_ms, checkpoints.back()) /
                                   window_median(m.median_token_ms, checkpoints.front()));
  }
}

// The GPU's device-to-device copy bandwidth (read + write), the ceiling of a
// memory-bound kernel, measured twice: on the card before any model is built
// on it, and again after the runs. A reading taken after a long run on a
// large model may differ from one taken before it (the card warm, gigabytes
// just freed), and one reading alone cannot say which is the card's; with
// both, "% of copy" divides by the higher, the best the card showed in this
// run. All zero without a GPU.
struct CopyBandwidth {
  double before_runs_gbps = 0.0;
  double after_runs_gbps = 0.0;
  double ceiling_gbps() const { return std::max(before_runs_gbps, after_runs_gbps); }
};

void print_bandwidth(const std::vector<Measured>& runs, const llm::ModelConfig& config,
                     const std::vector<std::size_t>& checkpoints, const CopyBandwidth& copy) {
  const double copy_gbps = copy.ceiling_gbps();
  fmt::print("\ncached decode vs the memory floor: bytes read per token (weights + K/V so far) / time per token{}\n",
             copy_gbps > 0 ? fmt::format("; measured device-to-device copy (read + write): {:.0f} GB/s before "
                                         "the runs, {:.0f} GB/s after; % of the higher",
                                         copy.before_runs_gbps, copy.after_runs_gbps)
                           : std::string());
  for (const auto& m : runs)
    for (const auto& b : decode_bandwidth(m, config, checkpoints))
      fmt::print("{:<6} {:<10} context {:>5}: {:>10} per token in {:>9.4f} ms = {:>7.1f} GB/s{}\n", m.device,
                 m.variant->name, b.context, llm::format_bytes(b.bytes), b.ms, b.gbps,
                 m.device == "cuda" && copy_gbps > 0 ? fmt::format(" = {:.0f}% of copy", 100.0 * b.gbps / copy_gbps)
                                                     : std::string());
}

// KV cache size: the formula, for this model and two real ones, and the bytes
// each device's cache allocated this run. Returns the formula's bytes for this
// run.
std::size_t print_cache_sizes(const std::vector<Measured>& runs, const std::string& model_name,
                              const llm::ModelConfig& config, int positions) {
  struct CacheRow {
    std::string name;
    int layers, kv_heads, head_dim, bytes_per_value;
    long long positions;
  };
  const std::vector<CacheRow> cache_rows = {
      {model_name + " (fp32, this run)", config.n_layers, config.n_kv_heads, config.head_dim(), 4, positions},
      {model_name + " (fp32, full context)", config.n_layers, config.n_kv_heads, config.head_dim(), 4, config.seq_len},
      {"Llama-2-7B (fp16, 4k context)", 32, 32, 128, 2, 4096},
      {"Llama-2-70B (fp16, 4k, GQA 8 KV heads)", 80, 8, 128, 2, 4096},
  };
  fmt::print("\nKV cache bytes = 2 x layers x kv_heads x head_dim x positions x bytes/value\n");
  fmt::print("{:<42} {:>7} {:>8} {:>8} {:>9} {:>13} {:>12}\n", "model", "layers", "kv_heads", "head_dim", "positions",
             "per token", "total");
  for (const auto& row : cache_rows) {
    const auto total = step01::kv_cache_bytes(row.layers, row.kv_heads, row.head_dim, row.positions, row.bytes_per_value);
    fmt::print("{:<42} {:>7} {:>8} {:>8} {:>9} {:>13} {:>12}\n", row.name, row.layers, row.kv_heads, row.head_dim,
               row.positions, llm::format_bytes(static_cast<double>(total) / row.positions),
               llm::format_bytes(static_cast<double>(total)));
  }
  const auto formula_this_run =
      step01::kv_cache_bytes(config.n_layers, config.n_kv_heads, config.head_dim(), positions, 4);
  for (const auto& m : runs)
    if (m.first.kv_bytes_allocated)
      fmt::print("allocated by the {} cache this run: {} ({} bytes; formula {} bytes)\n", m.device,
                 llm::format_bytes(static_cast<double>(m.first.kv_bytes_allocated)), m.first.kv_bytes_allocated,
                 formula_this_run);
  return formula_this_run;
}

// --write-checkpoint: the model as llama2.c files, for run.c or --model.
int write_checkpoint_and_stop(const llm::LoadedModel& loaded, const std::string& path) {
  const step01::Llama2cFiles files = step01::write_llama2c_files(loaded, path);
  fmt::print("wrote {} ({}) to {} and {}\n", loaded.name, loaded.weights.config.describe(), files.checkpoint,
             files.tokenizer);
  fmt::print("greedy decode with llama2.c's run.c:  run {} -z {} -t 0 -n 256\n", files.checkpoint, files.tokenizer);
  return 0;
}

// --compare-runc times the CPU cached decode from BOS: say so before any work.
void check_runc_request(const Step01Options& options, const std::vector<int>& selected,
                        const llm::DeviceSelection& devices) {
  if (options.compare_runc.empty()) return;
  if (!devices.cpu || !llm::is_selected(selected, 1))
    throw llm::InputError("--compare-runc compares the CPU kv_cache variant: run it with --device cpu or all and "
                          "--variant 1 (or all)");
  if (!options.common.prompt.empty() || options.common.temperature != 0.0f)
    throw llm::InputError("--compare-runc decodes greedily from BOS, as run.c -t 0 without -i does: drop --prompt "
                          "and --temperature");
}

// Removes the files a comparison wrote, however the comparison ends.
struct RemoveFilesOnExit {
  std::vector<std::string> paths;
  ~RemoveFilesOnExit() {
    for (const auto& path : paths) std::remove(path.c_str());
  }
};

// --compare-runc: run.c and the CPU cached decode on the same llama2.c file
// (this model, written to a temporary file), the same positions, one thread
// each, both counted from the second token. Bandwidth = bytes a token must
// read (weights + K/V at the middle position) x tokens/s.
void compare_with_runc(const llm::LoadedModel& loaded, const std::vector<Measured>& runs, int positions,
                       const Step01Options& options, llm::Results& results) {
  const auto ours = std::find_if(runs.begin(), runs.end(), [](const Measured& m) {
    return m.device == "cpu" && m.variant->id == 1;
  });
  const auto temporary = std::filesystem::temp_directory_path() / fmt::format("step01_runc_{}.bin", ::getpid());
  const step01::Llama2cFiles files = step01::write_llama2c_files(loaded, temporary.string());
  const llm::ModelConfig& config = loaded.weights.config;
  const RemoveFilesOnExit cleanup{{files.checkpoint, files.tokenizer}};
  const step01::RuncMeasurement runc = step01::measure_runc(options.compare_runc, files, positions, options.repeats);

  const double bytes = static_cast<double>(step01::decode_bytes_per_token(config, positions / 2));
  const double ratio = ours->decode_tokens_per_s / runc.median_tokens_per_s;
  const std::vector<int> bos = {llm::Tokenizer::kBos};
  // Our tokens as text through the tokenizer file run.c read (a preset's
  // unused ids have names there).
  const llm::Tokenizer written = llm::Tokenizer::load(files.tokenizer, config.vocab_size);
  const std::string our_text = llm::generated_text(written, bos, ours->first.tokens) + "\n";
  const auto first_difference = std::mismatch(our_text.begin(), our_text.end(), runc.text.begin(), runc.text.end());
  const bool same_text = our_text == runc.text;

  fmt::print("\ncached decode beside llama2.c's run.c: same file, {} positions from BOS, greedy, one thread each;\n"
             "tokens/s from the second token on (run.c's own count), median of {} runs; "
             "GB/s = {} read per token x tokens/s\n",
             positions, options.repeats, llm::format_bytes(bytes));
  fmt::print("{:<22} {:>10} {:>9} {:>9}\n", "program", "tok/s", "GB/s", "vs run.c");
  fmt::print("{:<22} {:>10.1f} {:>9.1f} {:>8.2f}x\n", "llama2.c run.c", runc.median_tokens_per_s,
             bytes * runc.median_tokens_per_s / 1e9, 1.0);
  fmt::print("{:<22} {:>10.1f} {:>9.1f} {:>8.2f}x\n", "cpu kv_cache (step 01)", ours->decode_tokens_per_s,
             bytes * ours->decode_tokens_per_s / 1e9, ratio);
  if (same_text)
    fmt::print("generated text: identical\n");
  else
    fmt::print("generated text: differs from character {} (run.c is built with -Ofast: its different summation "
               "order can flip a near-tie)\n", first_difference.first - our_text.begin());

  // The program's file name only: a folder would name the machine it ran on.
  results.set_config("runc_binary", std::filesystem::path(options.compare_runc).filename().string());
  results.set_config("runc_tokens_per_s", runc.median_tokens_per_s);
  results.set_config("runc_gbps", bytes * runc.median_tokens_per_s / 1e9);
  results.set_config("cpu_kv_cache_decode_tokens_per_s", ours->decode_tokens_per_s);
  results.set_config("cpu_kv_cache_decode_gbps", bytes * ours->decode_tokens_per_s / 1e9);
  results.set_config("cpu_kv_cache_vs_runc", ratio);
  results.set_config("runc_text_identical", same_text);
}

int run_step01(int argc, char** argv) {
  Step01Options options;
  if (const auto exit_status = parse_options(argc, argv, options)) return *exit_status;
  const std::vector<int> selected =
      llm::parse_variant_selection(options.common.variant, llm::variant_ids(step01::variants()));
  const llm::DeviceSelection devices = llm::select_devices(options.common.device);
  check_runc_request(options, selected, devices);

  // The model, the prompt and how far to generate.
  const llm::LoadedModel loaded = llm::load_model(options.common);
  if (!options.write_checkpoint.empty()) return write_checkpoint_and_stop(loaded, options.write_checkpoint);
  const llm::ModelConfig& config = loaded.weights.config;
  const std::vector<int> prompt = llm::encode_prompt(loaded, options.common);
  const int positions = llm::generation_positions(options.common, config, prompt.size());

  // Generate with each variant on each device; print the text, as llama2.c does.
  CopyBandwidth copy;
  if (devices.cuda) copy.before_runs_gbps = llm::cuda::measure_copy_bandwidth_gbps();
  const std::size_t generations = llm::selected_device_names(devices).size() * selected.size();
  llm::RunProgress progress("step01_kv_cache", static_cast<int>(generations) + (options.compare_runc.empty() ? 0 : 1));
  const std::vector<Measured> runs = measure_all(loaded.weights, selected, devices, prompt, positions, options, progress);
  const Measured& reference = runs.front();  // CPU recompute when selected: the plainest algorithm
  llm::print_generated_text(loaded.tokenizer, prompt, reference.first.tokens);

  // The results table: every run checked against the reference.
  llm::Results results = make_results(loaded, devices, prompt.size(), positions, options);
  const std::vector<std::size_t> checkpoints = position_checkpoints(reference.first.tokens.size());
  // The copy bandwidth's second reading, now that the models are gone.
  if (devices.cuda) {
    copy.after_runs_gbps = llm::cuda::measure_copy_bandwidth_gbps();
    results.set_config("cuda_copy_gbps_before_runs", copy.before_runs_gbps);
    results.set_config("cuda_copy_gbps_after_runs", copy.after_runs_gbps);
    results.set_config("cuda_copy_gbps", copy.ceiling_gbps());  // what "fraction_of_copy_bandwidth" divides by
  }
  add_rows(results, runs, reference, config, checkpoints, copy.ceiling_gbps());
  fmt::print("{}\n", results.format_table());

  // Time per token by position, decode against the memory floor, cache sizes.
  print_time_per_token(runs, checkpoints, reference.first.prompt_length);
  print_bandwidth(runs, config, checkpoints, copy);
  const std::size_t formula_this_run = print_cache_sizes(runs, loaded.name, config, positions);
  // In the JSON only: the table above has printed its config line.
  results.set_config("kv_bytes_formula_this_run", static_cast<long long>(formula_this_run));
  results.set_config("kv_bytes_per_token", static_cast<long long>(config.kv_bytes_per_token()));
  if (!options.compare_runc.empty()) {
    progress.start("llama2.c's run.c on the same model");
    compare_with_runc(loaded, runs, positions, options, results);
  }

  return llm::finish_run(results, options.common, devices);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_main(argc, argv, run_step01); }
