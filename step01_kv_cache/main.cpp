// Step 01: the KV cache.
//
// Generates the same tokens two ways, on the CPU and (when present) on CUDA:
//   0 recompute  every new token re-runs the whole prefix: step t costs O(t)
//   1 kv_cache   K and V of past tokens are kept: step t costs O(1) projections
// checks that both produce identical greedy tokens and matching logits, and
// prints time per token by position, total time, tokens/s, the speedup, and
// the KV cache's size by formula next to the bytes actually allocated.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "llm/cpu_model.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/timer.hpp"
#include "step01_kv_cache/generation.hpp"

namespace {

struct Measured {
  std::string device;
  const llm::Variant<step01::GenerateFn>* variant;
  step01::GenerationResult first;          // tokens and logits of the first timed run
  llm::TimingStats total;                  // whole generation, over the repeats
  std::vector<double> median_token_ms;     // [n_generated] per-token median over the repeats
};

std::unique_ptr<llm::Model> make_model(const std::string& device, const llm::ModelWeights& weights) {
  if (device == "cpu") return std::make_unique<llm::CpuModel>(weights);
  return llm::cuda::make_cuda_model(weights);
}

Measured measure(const std::string& device, llm::Model& model, const llm::Variant<step01::GenerateFn>& variant,
                 std::span<const int> prompt, int positions, const llm::CommonOptions& o, int repeats) {
  Measured m{device, &variant, {}, {}, {}};
  // Warm-up: touches every weight and scratch buffer (and, on CUDA, loads the
  // kernels) so the timed runs measure steady state.
  {
    llm::Sampler sampler(model.config().vocab_size, o.temperature, o.top_p, o.seed);
    variant.fn(model, prompt, std::min(positions, static_cast<int>(prompt.size()) + 8), sampler);
  }
  std::vector<double> totals;
  std::vector<std::vector<double>> token_ms;
  for (int r = 0; r < repeats; ++r) {
    llm::Sampler sampler(model.config().vocab_size, o.temperature, o.top_p, o.seed);  // same seed: same tokens
    step01::GenerationResult result = variant.fn(model, prompt, positions, sampler);
    totals.push_back(result.total_ms);
    token_ms.push_back(result.token_ms);
    if (r == 0) m.first = std::move(result);
  }
  m.total = llm::TimingStats::from_samples(totals);
  for (std::size_t t = 0; t < m.first.token_ms.size(); ++t) {
    std::vector<double> samples;
    for (const auto& run : token_ms)
      if (t < run.size()) samples.push_back(run[t]);
    m.median_token_ms.push_back(llm::TimingStats::from_samples(samples).median_ms);
  }
  return m;
}

// Tokens identical, and logits within fp32 model tolerance up to (and at) the
// first differing token: after that the two runs condition on different text.
llm::CompareResult check(const Measured& got, const Measured& ref, int vocab) {
  const auto token_check = llm::compare_tokens(got.first.tokens, ref.first.tokens);
  const std::size_t same_prefix =
      std::min({got.first.tokens.size(), ref.first.tokens.size(),
                token_check.over_tolerance ? token_check.worst_index + 1 : got.first.tokens.size()});
  const std::size_t n = same_prefix * static_cast<std::size_t>(vocab);
  auto logit_check = llm::compare(std::span(got.first.logits).first(n), std::span(ref.first.logits).first(n),
                                  llm::model_logits_tolerance(llm::DType::F32));
  logit_check.ok = logit_check.ok && token_check.ok;
  logit_check.size_mismatch = token_check.size_mismatch;
  return logit_check;
}

// Median per-token time in a small window around generated token `index`
// (single tokens take microseconds; one sample is mostly noise).
double window_median(const std::vector<double>& ms, std::size_t index) {
  const std::size_t lo = index >= 3 ? index - 3 : 0, hi = std::min(ms.size(), index + 4);
  return llm::TimingStats::from_samples(std::vector<double>(ms.begin() + lo, ms.begin() + hi)).median_ms;
}

// Cached decode against the memory-bound floor: the bytes a step must read
// (weights + K/V so far, decode_bytes_per_token) over the measured time per
// token, at the first and the last checkpoint, and on CUDA as a fraction of
// the device-to-device copy bandwidth measured in the same run. Recompute
// rows are skipped: they read the weights once per step too, but do O(t)
// work per read.
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
  for (std::size_t c : {checkpoints.front(), checkpoints.back()}) {
    const std::size_t context = c + static_cast<std::size_t>(m.first.prompt_length);
    const double bytes = static_cast<double>(step01::decode_bytes_per_token(config, static_cast<long long>(context)));
    const double ms = window_median(m.median_token_ms, c);
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

void print_bandwidth(const std::vector<Measured>& runs, const llm::ModelConfig& config,
                     const std::vector<std::size_t>& checkpoints, double copy_gbps) {
  fmt::print("\ncached decode vs the memory floor: bytes read per token (weights + K/V so far) / time per token{}\n",
             copy_gbps > 0 ? fmt::format("; measured device-to-device copy: {:.0f} GB/s (read + write)", copy_gbps)
                           : std::string());
  for (const auto& m : runs)
    for (const auto& b : decode_bandwidth(m, config, checkpoints))
      fmt::print("{:<6} {:<10} context {:>5}: {:>10} per token in {:>9.4f} ms = {:>7.1f} GB/s{}\n", m.device,
                 m.variant->name, b.context, llm::format_bytes(b.bytes), b.ms, b.gbps,
                 m.device == "cuda" && copy_gbps > 0 ? fmt::format(" = {:.0f}% of copy", 100.0 * b.gbps / copy_gbps)
                                                     : std::string());
}

int body(int argc, char** argv) {
  CLI::App app{"Step 01: the KV cache. Generation with and without caching K/V, on CPU and CUDA."};
  llm::CommonOptions o;
  int repeats = 5;
  llm::add_common_options(app, o);
  app.add_option("--repeats", repeats, "timed runs per variant (median reported)")->check(CLI::PositiveNumber);
  if (const auto status = llm::parse_command_line(app, argc, argv)) return *status;

  const auto& table = step01::variants();
  if (o.list_variants) {
    for (const auto& v : table) fmt::print("{:>3}  {:<10} {}\n", v.id, v.name, v.what_changed);
    return 0;
  }
  if (o.quick) {
    o.steps = std::min(o.steps, 48);
    repeats = 1;
  }
  const std::vector<int> selected = llm::parse_variant_selection(o.variant, llm::variant_ids(table));
  const llm::DeviceSelection devices = llm::select_devices(o.device);

  llm::LoadedModel loaded = llm::load_model(o);
  const llm::ModelConfig& config = loaded.weights.config;
  const std::vector<int> prompt = loaded.tokenizer.encode(o.prompt, /*add_bos=*/true, /*add_eos=*/false);
  // llama2.c caps -n at the context length; so do we.
  const int positions = std::min(o.steps, config.seq_len);
  if (static_cast<int>(prompt.size()) > positions)
    throw llm::InputError(fmt::format("the prompt is {} tokens but --steps is {} (and the context {})", prompt.size(),
                                      positions, config.seq_len));

  std::vector<Measured> runs;
  for (const std::string device : {"cpu", "cuda"}) {
    if ((device == "cpu" && !devices.cpu) || (device == "cuda" && !devices.cuda)) continue;
    auto model = make_model(device, loaded.weights);
    for (const auto& v : table)
      if (std::find(selected.begin(), selected.end(), v.id) != selected.end())
        runs.push_back(measure(device, *model, v, prompt, positions, o, repeats));
  }
  const Measured& reference = runs.front();  // CPU recompute when selected: the plainest algorithm

  // The text, as llama2.c prints it (no BOS, printable pieces only).
  {
    int previous = prompt.back();
    std::string text;
    for (std::size_t i = 1; i < prompt.size(); ++i) text += loaded.tokenizer.decode_printable(prompt[i - 1], prompt[i]);
    for (int token : reference.first.tokens) {
      if (token == llm::Tokenizer::kBos) break;
      text += loaded.tokenizer.decode_printable(previous, token);
      previous = token;
    }
    fmt::print("{}\n\n", text);
  }

  llm::Results results("step01_kv_cache", "KV cache: recompute the prefix vs cache K/V");
  results.set_device_info(llm::device_info_for(devices));
  results.set_config("model", loaded.name);
  results.set_config("model_config", config.describe());
  results.set_config("prompt_tokens", static_cast<long long>(prompt.size()));
  results.set_config("positions", static_cast<long long>(positions));
  results.set_config("temperature", static_cast<double>(o.temperature));
  results.set_config("repeats", static_cast<long long>(repeats));
  results.set_config("quick", o.quick);

  // Per-position checkpoints: first, quarter points, last generated token.
  const std::size_t n_generated = reference.first.tokens.size();
  std::vector<std::size_t> checkpoints;
  for (int q = 0; q <= 4; ++q) checkpoints.push_back((n_generated - 1) * q / 4);
  checkpoints.erase(std::unique(checkpoints.begin(), checkpoints.end()), checkpoints.end());

  // The memory-bound ceiling of this GPU, measured now (after the models are gone).
  const double copy_gbps = devices.cuda ? llm::cuda::measure_copy_bandwidth_gbps() : 0.0;
  if (copy_gbps > 0) results.set_config("cuda_copy_gbps", copy_gbps);
  std::map<std::string, double> baseline_ms;  // per device: variant 0's total time
  for (const auto& m : runs)
    if (m.variant->id == 0) baseline_ms[m.device] = m.total.median_ms;
  for (const auto& m : runs) {
    const auto error = check(m, reference, config.vocab_size);
    llm::ResultRow row;
    row.device = m.device;
    row.variant = m.variant->name;
    row.id = m.variant->id;
    row.time_ms = m.total.median_ms;
    row.speedup = baseline_ms.count(m.device) ? baseline_ms[m.device] / m.total.median_ms : 1.0;
    row.max_rel_err = error.max_rel_err;
    row.ok = error.ok;
    row.throughput_key = "tokens_per_s";
    row.throughput = static_cast<double>(m.first.tokens.size()) / (m.total.median_ms / 1000.0);
    row.extra["tokens_generated"] = static_cast<long long>(m.first.tokens.size());
    row.extra["time_min_ms"] = m.total.min_ms;
    row.extra["time_max_ms"] = m.total.max_ms;
    row.extra["max_abs_err"] = error.max_abs_err;
    row.extra["tokens_identical"] = llm::compare_tokens(m.first.tokens, reference.first.tokens).ok;
    row.extra["kv_bytes_allocated"] = static_cast<long long>(m.first.kv_bytes_allocated);
    for (std::size_t c : checkpoints)
      if (c < m.median_token_ms.size())
        row.extra[fmt::format("ms_per_token_at_pos_{:04}", c + m.first.prompt_length)] =
            window_median(m.median_token_ms, c);
    add_bandwidth(row, decode_bandwidth(m, config, checkpoints), copy_gbps);
    if (!error.ok) std::fprintf(stderr, "check failed for %s %s: %s\n", m.device.c_str(), m.variant->name.c_str(),
                                error.summary().c_str());
    results.add_row(std::move(row));
  }
  fmt::print("{}\n", results.format_table());

  // Time per token against position: recompute grows, the cache stays flat.
  fmt::print("time per generated token (median over repeats and a 7-token window), by position:\n");
  fmt::print("{:<6} {:<10}", "device", "variant");
  for (std::size_t c : checkpoints) fmt::print(" {:>10}", fmt::format("pos {}", c + reference.first.prompt_length));
  fmt::print(" {:>8}\n", "last/1st");
  for (const auto& m : runs) {
    fmt::print("{:<6} {:<10}", m.device, m.variant->name);
    for (std::size_t c : checkpoints) fmt::print(" {:>10}", fmt::format("{:.4f} ms", window_median(m.median_token_ms, c)));
    fmt::print(" {:>7.1f}x\n", window_median(m.median_token_ms, checkpoints.back()) /
                                   window_median(m.median_token_ms, checkpoints.front()));
  }

  print_bandwidth(runs, config, checkpoints, copy_gbps);

  // KV cache size: the formula, for this model and two real ones.
  struct CacheRow {
    std::string name;
    int layers, kv_heads, head_dim, bytes;
    long long positions;
  };
  const std::vector<CacheRow> cache_rows = {
      {loaded.name + " (fp32, this run)", config.n_layers, config.n_kv_heads, config.head_dim(), 4, positions},
      {loaded.name + " (fp32, full context)", config.n_layers, config.n_kv_heads, config.head_dim(), 4, config.seq_len},
      {"Llama-2-7B (fp16, 4k context)", 32, 32, 128, 2, 4096},
      {"Llama-2-70B (fp16, 4k, GQA 8 KV heads)", 80, 8, 128, 2, 4096},
  };
  fmt::print("\nKV cache bytes = 2 x layers x kv_heads x head_dim x positions x bytes/value\n");
  fmt::print("{:<42} {:>7} {:>8} {:>8} {:>9} {:>13} {:>12}\n", "model", "layers", "kv_heads", "head_dim", "positions",
             "per token", "total");
  for (const auto& c : cache_rows) {
    const auto total = step01::kv_cache_bytes(c.layers, c.kv_heads, c.head_dim, c.positions, c.bytes);
    fmt::print("{:<42} {:>7} {:>8} {:>8} {:>9} {:>13} {:>12}\n", c.name, c.layers, c.kv_heads, c.head_dim,
               c.positions, llm::format_bytes(static_cast<double>(total) / c.positions),
               llm::format_bytes(static_cast<double>(total)));
  }
  const auto formula_this_run =
      step01::kv_cache_bytes(config.n_layers, config.n_kv_heads, config.head_dim(), positions, 4);
  for (const auto& m : runs)
    if (m.first.kv_bytes_allocated)
      fmt::print("allocated by the {} cache this run: {} ({} bytes; formula {} bytes)\n", m.device,
                 llm::format_bytes(static_cast<double>(m.first.kv_bytes_allocated)), m.first.kv_bytes_allocated,
                 formula_this_run);
  results.set_config("kv_bytes_formula_this_run", static_cast<long long>(formula_this_run));
  results.set_config("kv_bytes_per_token", static_cast<long long>(config.kv_bytes_per_token()));

  return llm::finish_run(results, o, devices);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_main(argc, argv, body); }
