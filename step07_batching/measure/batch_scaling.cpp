#include "step07_batching/measure/batch_scaling.hpp"

#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <span>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"  // at_least, in_range
#include "llm/harness/result_rows.hpp"
#include "llm/linear.hpp"
#include "step01_kv_cache/generation.hpp"  // decode_bytes_per_token
#include "llm/harness/cpu_cache_flush.hpp"  // last_level_cache_bytes
#include "llm/harness/random_fill.hpp"
#include "step05_paged_attention/paged_kv_cache.hpp"
#include "step07_batching/measure/workload.hpp"  // PromptSource

namespace step07 {

namespace {

// --- Counting ---------------------------------------------------------------

// Parameters one forward row reads: every matrix (the classifier included),
// the norms and the one embedding row it looks up. Step 01's bytes per
// decode token at context 0, in fp32, counted back in parameters.
double parameters_per_row(const llm::ModelConfig& config) {
  return static_cast<double>(step01::decode_bytes_per_token(config, 0)) / sizeof(float);
}

// FLOPs of one forward: 2 per weight per row through a matrix (the
// classifier only for the rows that get logits; the norms and the embedding
// row are a rounding error, counted as if they were matrix weights), and
// for attention 4 x dim per (row, attended position) per layer: 2 for q.k
// and 2 for p.v, over n_heads x head_dim = dim values. Softmax, RoPE and the
// norms' own arithmetic are left out: O(dim) per row, not O(dim^2).
double forward_flops(const llm::ModelConfig& config, double rows, double rows_with_logits,
                     double attended_positions) {
  const double classifier = static_cast<double>(config.vocab_size) * config.dim;
  const double other_parameters = parameters_per_row(config) - classifier;
  return 2.0 * other_parameters * rows + 2.0 * classifier * rows_with_logits +
         4.0 * config.dim * config.n_layers * attended_positions;
}

// A prefill of `positions` rows of one sequence from position 0: row i
// attends i + 1 positions (causal), only the last row gets logits.
double prefill_flops(const llm::ModelConfig& config, int positions) {
  const double p = positions;
  return forward_flops(config, p, 1.0, p * (p + 1.0) / 2.0);
}

// --- The device's ceilings, measured ----------------------------------------

// A read of the whole buffer, summed so no compiler can skip it (Eigen's sum
// is vectorized, with several accumulators, so the loads, not the adds, set
// the pace).
float sum_of(std::span<const float> buffer) {
  return Eigen::Map<const Eigen::VectorXf>(buffer.data(), static_cast<Eigen::Index>(buffer.size())).sum();
}

// One core's streaming read bandwidth: the median time to read a buffer of
// twice the last-level cache (the replacement policy is not strict LRU),
// between 64 MiB and `max_bytes`. One core, because the CPU model runs on
// one thread. The cap: a server's OS reports the whole socket's L3, of which
// one core uses its own core complex's slice (tens of MiB), so a few hundred
// MiB already stream from DRAM, while touching each new page costs more
// than reading it (a buffer of a GiB would take seconds to set up). A
// forward whose bytes fit in the cache may read them faster than this
// (print_batch_scaling says when).
double measure_cpu_read_bandwidth_gbps(std::size_t last_level_cache, std::size_t max_bytes, int runs,
                                       std::string& how) {
  const std::size_t min_bytes = std::min<std::size_t>(std::size_t{64} << 20, max_bytes);
  const std::size_t bytes = std::clamp<std::size_t>(2 * last_level_cache, min_bytes, max_bytes);
  std::vector<float> buffer(bytes / sizeof(float), 1.0f);  // [bytes / 4], every page touched before the timing
  volatile float sink = 0.0f;
  const llm::TimingStats read = llm::time_cpu([&] { sink = sink + sum_of(buffer); }, 1, runs);
  how = fmt::format("streaming read of {} on one core, median of {}", llm::format_bytes(static_cast<double>(bytes)),
                    runs);
  return static_cast<double>(bytes) / (read.median_ms * 1e6);
}

// The bandwidth ceiling of `device`: the CPU's read above; on the GPU
// common's device-to-device copy (bytes read plus written; the practical
// ceiling memory-bound kernels are judged against).
double measure_bandwidth_gbps(const std::string& device, std::size_t last_level_cache,
                              const BatchScalingOptions& options, std::string& how) {
  if (device == "cpu")
    return measure_cpu_read_bandwidth_gbps(last_level_cache, options.max_read_buffer_bytes, options.repeats, how);
  how = "device-to-device copy of 1 GiB (read + write), median of 10";
  return llm::cuda::measure_copy_bandwidth_gbps();
}

// The CPU's compute ceiling: the FLOP rate of the CPU model's own product
// (llm::DenseLinear) at a shape where arithmetic, not memory, sets the pace:
// 256 rows (a blocked Eigen matrix-matrix product, past the small-batch
// path) against a 1024 x 1024 matrix (4 MiB), each weight used 256 times
// per read. 2 x rows x out x in FLOPs.
double measure_cpu_product_gflops(int runs, std::uint64_t seed, std::string& how) {
  constexpr int kRows = 256, kOut = 1024, kIn = 1024;
  std::vector<float> weight(static_cast<std::size_t>(kOut) * kIn);  // [out, in]
  llm::fill_uniform(weight.data(), weight.size(), seed);
  const llm::DenseLinear product(weight, kOut, kIn);
  std::vector<float> x(static_cast<std::size_t>(kRows) * kIn);  // [rows, in]
  llm::fill_uniform(x.data(), x.size(), seed + 1);
  std::vector<float> y(static_cast<std::size_t>(kRows) * kOut);  // [rows, out]
  const llm::TimingStats time = llm::time_cpu([&] { product.forward(x.data(), kRows, y.data()); }, 1, runs);
  how = fmt::format("the CPU model's product, {} rows x {}x{} weights, median of {}", kRows, kOut, kIn, runs);
  return 2.0 * kRows * kOut * kIn / (time.median_ms * 1e6);
}

// --- The sequences and their cache ------------------------------------------

// [max rows] one sequence per slot: `context` + 1 seeded token ids, BOS
// first. Positions 0..context-1 go into the cache by a prefill; token
// `context` is the decode row's input.
std::vector<std::vector<int>> make_sequences(const llm::ModelConfig& config, const BatchScalingOptions& options,
                                             int n_sequences) {
  const PromptSource source(nullptr, config.vocab_size, options.seed);
  std::vector<std::vector<int>> sequences;
  for (int s = 0; s < n_sequences; ++s)
    sequences.push_back(source.prompt(options.context + 1, static_cast<std::uint64_t>(s)));
  return sequences;
}

// Prefills every sequence into its slot, one forward each, and returns the
// FLOP rate of the median prefill: the rate this model's products and
// attention reach on this device when a forward has `context` rows to share
// each weight among (norms, softmax and launches count as time, not FLOPs,
// so it sits below the hardware's peak).
double fill_cache_and_measure_prefill(llm::Model& model, llm::KvCache& cache,
                                      const std::vector<std::vector<int>>& sequences, int context, std::string& how) {
  std::vector<double> prefill_ms;  // [sequences] the first one also warms up: the median ignores it
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    const std::span<const int> prompt(sequences[s].data(), static_cast<std::size_t>(context));
    llm::Stopwatch watch;
    model.forward(llm::TokenBatch::prefill(prompt, 0, static_cast<int>(s)), cache);
    prefill_ms.push_back(watch.elapsed_ms());
  }
  const llm::TimingStats prefill = llm::TimingStats::from_samples(std::move(prefill_ms));
  how = fmt::format("this model's prefill of {} rows, median of {}", context, prefill.runs);
  return prefill_flops(model.config(), context) / (prefill.median_ms * 1e6);
}

// The decode rows of sequences 0..rows-1: token `context` of each, at
// position `context` (each rewrites the same position on every repeat).
llm::TokenBatch decode_batch(const std::vector<std::vector<int>>& sequences, int context, int rows) {
  llm::TokenBatch batch;
  for (int s = 0; s < rows; ++s)
    batch.add(sequences[static_cast<std::size_t>(s)][static_cast<std::size_t>(context)], context, s);
  return batch;
}

// [sequences, vocab] each sequence's logits from a 1-row forward alone.
std::vector<float> solo_logits(llm::Model& model, llm::KvCache& cache, const std::vector<std::vector<int>>& sequences,
                               int context) {
  std::vector<float> logits;
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    const std::span<const float> row =
        model.forward(llm::TokenBatch::single(sequences[s][static_cast<std::size_t>(context)], context,
                                              static_cast<int>(s)),
                      cache);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

// --- Options ----------------------------------------------------------------

void check_options(const BatchScalingOptions& options, const llm::ModelConfig& config) {
  if (options.rows.empty() || *std::min_element(options.rows.begin(), options.rows.end()) < 1)
    throw llm::InputError("batch scaling: rows must be a non-empty list of positive numbers");
  if (options.context < 1 || options.context + 1 > config.seq_len)
    throw llm::InputError(fmt::format("batch scaling: context {} needs 1..{} (the model's seq_len {} minus the "
                                      "decode row)",
                                      options.context, config.seq_len - 1, config.seq_len));
  if (options.repeats < 1 || options.warmup < 0 || options.block_size < 1)
    throw llm::InputError(fmt::format("batch scaling: repeats {} (>= 1), warmup {} (>= 0), block size {} (>= 1)",
                                      options.repeats, options.warmup, options.block_size));
}

std::vector<int> ascending_unique(std::vector<int> rows) {
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

std::size_t bytes_per_value(llm::DType type) { return type == llm::DType::F32 ? sizeof(float) : 2; }

// One row count: the check against the solo logits, then the timed forwards.
BatchScalingPoint measure_point(llm::Model& model, llm::KvCache& cache, const std::vector<std::vector<int>>& sequences,
                                std::span<const float> solo, int rows, const BatchScalingOptions& options) {
  const llm::TokenBatch batch = decode_batch(sequences, options.context, rows);
  BatchScalingPoint point;
  point.rows = rows;
  const std::size_t vocab = static_cast<std::size_t>(model.config().vocab_size);
  point.logits = llm::compare(model.forward(batch, cache), solo.first(static_cast<std::size_t>(rows) * vocab),
                              llm::same_rounding_logits_tolerance(options.weight_type));
  // A wall clock on either device: forward() returns the logits in host
  // memory, so on the GPU it has waited for every kernel and the copy back
  // (the copy is part of a decode step's cost anyway).
  point.forward = llm::time_cpu([&] { model.forward(batch, cache); }, options.warmup, options.repeats);
  point.ms_per_token = point.forward.median_ms / rows;
  point.tokens_per_s = 1000.0 / point.ms_per_token;
  return point;
}

// The compute ceiling: on the CPU its product at its best; on the GPU this
// model's prefill (the step has no CUDA code of its own to time cuBLAS
// with): a ceiling this model reaches, below the datasheet's.
void set_compute_ceiling(const std::string& device, const BatchScalingOptions& options,
                         const std::string& prefill_how, BatchScaling& result) {
  DeviceCeilings& ceilings = result.ceilings;
  if (device == "cpu") {
    ceilings.compute_gflop_per_s =
        measure_cpu_product_gflops(options.repeats, options.seed, ceilings.compute_measured_by);
  } else {
    ceilings.compute_gflop_per_s = result.prefill_gflop_per_s;
    ceilings.compute_measured_by = prefill_how;
  }
}

}  // namespace

void add_batch_scaling_flags(CLI::App& app, BatchScalingOptions& options) {
  llm::in_range(app.add_option("--scaling-rows", options.rows, "part 1: decode rows per forward, e.g. 1,2,4,8,16,32,64")
                    ->delimiter(','),
                1, 1 << 16)
      ->capture_default_str();
  llm::in_range(app.add_option("--scaling-context", options.context, "part 1: positions cached in every sequence"), 1,
                1 << 20)
      ->capture_default_str();
}

void apply_quick(BatchScalingOptions& options) {
  std::vector<int> rows;
  for (const int n : options.rows)
    if (n <= 16) rows.push_back(n);
  options.rows = rows.empty() ? std::vector<int>{1} : rows;
  options.context = std::min(options.context, 32);
  options.warmup = 1;
  options.repeats = 3;
  options.max_read_buffer_bytes = std::min<std::size_t>(options.max_read_buffer_bytes, std::size_t{64} << 20);
}

DecodeRoofline decode_roofline(const llm::ModelConfig& config, int rows, int context,
                               std::size_t weight_bytes_per_value, std::size_t kv_bytes_per_value,
                               const DeviceCeilings& ceilings) {
  DecodeRoofline roofline;
  roofline.rows = rows;
  roofline.context = context;
  const double attended = static_cast<double>(rows) * (context + 1);  // every row sees its own position too
  roofline.weight_bytes = parameters_per_row(config) * static_cast<double>(weight_bytes_per_value);
  roofline.kv_bytes = attended * static_cast<double>(config.kv_bytes_per_token(kv_bytes_per_value));
  roofline.flops = forward_flops(config, rows, rows, attended);
  roofline.memory_ms = roofline.bytes() / (ceilings.bandwidth_gb_per_s * 1e6);
  roofline.compute_ms = roofline.flops / (ceilings.compute_gflop_per_s * 1e6);
  return roofline;
}

BatchScaling measure_batch_scaling(const std::string& device, llm::Model& model, const BatchScalingOptions& options) {
  const llm::ModelConfig& config = model.config();
  check_options(options, config);
  BatchScaling result;
  result.device = device;
  result.weight_type = options.weight_type;
  result.config = config;
  result.context = options.context;
  if (device == "cpu") result.last_level_cache_bytes = llm::last_level_cache_bytes();
  result.ceilings.bandwidth_gb_per_s =
      measure_bandwidth_gbps(device, result.last_level_cache_bytes, options, result.ceilings.bandwidth_measured_by);

  // One slot per sequence of the largest batch, each holding context + 1
  // positions (the decode row's own included) in blocks of its own.
  const std::vector<int> rows = ascending_unique(options.rows);
  const int n_sequences = rows.back();
  step05::PagedKvCacheOptions cache_options;
  cache_options.num_sequences = n_sequences;
  cache_options.block_size = options.block_size;
  cache_options.n_blocks = step05::blocks_for_sequences(n_sequences, options.context + 1, options.block_size);
  const auto cache = step05::make_paged_kv_cache(device, config, cache_options);

  const std::vector<std::vector<int>> sequences = make_sequences(config, options, n_sequences);
  std::string prefill_how;
  result.prefill_gflop_per_s = fill_cache_and_measure_prefill(model, *cache, sequences, options.context, prefill_how);
  set_compute_ceiling(device, options, prefill_how, result);
  const std::vector<float> solo = solo_logits(model, *cache, sequences, options.context);  // [n_sequences, vocab]

  for (const int n : rows) {
    BatchScalingPoint point = measure_point(model, *cache, sequences, solo, n, options);
    point.roofline =
        decode_roofline(config, n, options.context, bytes_per_value(options.weight_type), sizeof(float), result.ceilings);
    point.speedup = result.points.empty() ? 1.0 : point.tokens_per_s / result.points.front().tokens_per_s;
    result.points.push_back(std::move(point));
  }
  return result;
}

std::vector<ComputedRoofline> llama2_7b_on_h100(int context, const std::vector<int>& rows) {
  // H100 SXM5's datasheet: 3.35 TB/s of HBM3, 989.5 dense fp16 tensor-core
  // TFLOP/s (twice that with 2:4 sparsity, which a dense model cannot use).
  const NominalDevice h100{"H100 SXM (datasheet)", 3350.0, 990e3, "fp16", 2};
  const DeviceCeilings ceilings{h100.bandwidth_gb_per_s, "nominal", h100.compute_gflop_per_s, "nominal"};
  const llm::ModelConfig& llama = llm::find_preset("llama2-7b").config;
  std::vector<ComputedRoofline> out;
  for (const int n : rows)
    out.push_back({"Llama-2-7B", h100,
                   decode_roofline(llama, n, context, h100.bytes_per_value, h100.bytes_per_value, ceilings)});
  return out;
}

// --- Report -------------------------------------------------------------------

namespace {

const char* bound_name(const DecodeRoofline& roofline) { return roofline.compute_bound() ? "compute" : "memory"; }

llm::JsonObject roofline_json(const DecodeRoofline& roofline) {
  return {{"weight_bytes", roofline.weight_bytes},
          {"kv_bytes", roofline.kv_bytes},
          {"bytes", roofline.bytes()},
          {"flops", roofline.flops},
          {"intensity_flop_per_byte", roofline.intensity()},
          {"memory_ms", roofline.memory_ms},
          {"compute_ms", roofline.compute_ms},
          {"predicted_ms", roofline.predicted_ms()},
          {"predicted_ms_per_token", roofline.predicted_ms() / roofline.rows},
          {"bound", std::string(bound_name(roofline))}};
}

llm::JsonObject point_json(const BatchScaling& run, const BatchScalingPoint& point) {
  llm::JsonObject fields = {{"device", run.device},
                       {"source", std::string("measured")},
                       {"rows", static_cast<long long>(point.rows)},
                       {"context", static_cast<long long>(run.context)},
                       {"time_ms", point.forward.median_ms},
                       {"time_min_ms", point.forward.min_ms},
                       {"time_max_ms", point.forward.max_ms},
                       {"runs", static_cast<long long>(point.forward.runs)},
                       {"ms_per_token", point.ms_per_token},
                       {"tokens_per_s", point.tokens_per_s},
                       {"speedup", point.speedup}};
  for (auto& entry : roofline_json(point.roofline)) fields.push_back(std::move(entry));
  fields.emplace_back("weight_dtype", std::string(llm::dtype_name(run.weight_type)));
  fields.emplace_back("measured_over_predicted", point.forward.median_ms / point.roofline.predicted_ms());
  fields.emplace_back("bandwidth_gb_per_s", run.ceilings.bandwidth_gb_per_s);
  fields.emplace_back("bandwidth_measured_by", run.ceilings.bandwidth_measured_by);
  fields.emplace_back("compute_gflop_per_s", run.ceilings.compute_gflop_per_s);
  fields.emplace_back("compute_measured_by", run.ceilings.compute_measured_by);
  fields.emplace_back("prefill_gflop_per_s", run.prefill_gflop_per_s);
  fields.emplace_back("max_rel_err", point.logits.max_rel_err);
  fields.emplace_back("ok", point.logits.ok);
  return fields;
}

llm::JsonObject computed_json(const ComputedRoofline& row) {
  llm::JsonObject fields = {{"source", std::string("computed from the model's size, not measured")},
                       {"model", row.model},
                       {"dtype", row.device.dtype},
                       {"hardware", row.device.name},
                       {"bandwidth_gb_per_s", row.device.bandwidth_gb_per_s},
                       {"compute_gflop_per_s", row.device.compute_gflop_per_s},
                       {"ridge_flop_per_byte", row.device.compute_gflop_per_s / row.device.bandwidth_gb_per_s},
                       {"rows", static_cast<long long>(row.roofline.rows)},
                       {"context", static_cast<long long>(row.roofline.context)}};
  for (auto& entry : roofline_json(row.roofline)) fields.push_back(std::move(entry));
  fields.emplace_back("predicted_tokens_per_s", 1000.0 * row.roofline.rows / row.roofline.predicted_ms());
  return fields;
}

llm::ResultRow point_row(const BatchScaling& run, const BatchScalingPoint& point, const std::string& baseline) {
  const std::string variant = fmt::format("decode x{}", point.rows);
  llm::ResultRow row =
      llm::timed_result_row(run.device, point.rows, variant, point.forward, point.speedup, point.logits);
  row.throughput_key = "tokens_per_s";
  row.throughput = point.tokens_per_s;
  row.extra["kind"] = std::string("batch_scaling");
  row.extra["speedup_over"] = baseline;
  row.extra["rows"] = static_cast<long long>(point.rows);
  row.extra["context"] = static_cast<long long>(run.context);
  row.extra["ms_per_token"] = point.ms_per_token;
  row.extra["predicted_ms"] = point.roofline.predicted_ms();
  row.extra["bound"] = std::string(bound_name(point.roofline));
  llm::report_if_failed(run.device + " " + variant + " logits vs solo forwards", point.logits);
  return row;
}

}  // namespace

void add_batch_scaling_rows(llm::Results& results, const std::vector<BatchScaling>& runs) {
  if (runs.empty()) return;
  llm::JsonTable measured{"batch_scaling", {}};
  for (const BatchScaling& run : runs) {
    const std::string baseline = fmt::format("decode x{}", run.points.front().rows);
    for (const BatchScalingPoint& point : run.points) {
      results.add_row(point_row(run, point, baseline));
      measured.rows.push_back(point_json(run, point));
    }
  }
  results.set_config("scaling_context", static_cast<long long>(runs.front().context));
  results.add_table(std::move(measured));
  llm::JsonTable computed{"batch_roofline_computed", {}};
  for (const ComputedRoofline& row : llama2_7b_on_h100(runs.front().context))
    computed.rows.push_back(computed_json(row));
  results.add_table(std::move(computed));
}

namespace {

void print_run(const BatchScaling& run) {
  const DeviceCeilings& ceilings = run.ceilings;
  fmt::print(
      "{} ({} weights, fp32 K/V): bandwidth {:.1f} GB/s ({}); compute {:.1f} GFLOP/s ({}); ridge {:.1f} FLOP/byte; "
      "this model's prefill of {} rows: {:.1f} GFLOP/s\n",
      run.device, llm::dtype_name(run.weight_type), ceilings.bandwidth_gb_per_s, ceilings.bandwidth_measured_by, ceilings.compute_gflop_per_s,
      ceilings.compute_measured_by, ceilings.ridge_intensity(), run.context, run.prefill_gflop_per_s);
  fmt::print("{:<6} {:>5} {:>11} {:>11} {:>9} {:>7} {:>10} {:>9} {:>7} {:>11} {:>8} {:>9} {:>7}\n", "device", "rows",
             "forward", "per token", "tok/s", "vs x1", "bytes", "GFLOP", "FLOP/B", "predicted", "bound", "meas/pred",
             "logits");
  for (const BatchScalingPoint& point : run.points) {
    const DecodeRoofline& line = point.roofline;
    fmt::print("{:<6} {:>5} {:>11} {:>11} {:>9.0f} {:>6.2f}x {:>10} {:>9.4f} {:>7.2f} {:>11} {:>8} {:>8.2f}x {:>7}\n",
               run.device, point.rows, llm::format_ms(point.forward.median_ms), llm::format_ms(point.ms_per_token),
               point.tokens_per_s, point.speedup, llm::format_bytes(line.bytes()), line.flops / 1e9, line.intensity(),
               llm::format_ms(line.predicted_ms()), bound_name(line), point.forward.median_ms / line.predicted_ms(),
               point.logits.ok ? "same" : "DIFFER");
  }
  const double largest_bytes = run.points.back().roofline.bytes();
  if (run.last_level_cache_bytes > 0 && largest_bytes < static_cast<double>(run.last_level_cache_bytes))
    fmt::print("note: every forward's bytes (at most {}) fit in the last-level cache the OS reports ({}; one core may "
               "use a slice of it): repeated forwards may read them faster than the streaming bandwidth above.\n",
               llm::format_bytes(largest_bytes), llm::format_bytes(static_cast<double>(run.last_level_cache_bytes)));
}

void print_computed(int context) {
  const std::vector<ComputedRoofline> computed = llama2_7b_on_h100(context);
  const NominalDevice& hardware = computed.front().device;
  fmt::print(
      "\ncomputed from the model's size, NOT measured: {} in {} on an {}, {:.2f} TB/s and {:.0f} TFLOP/s "
      "(ridge {:.0f} FLOP/byte), context {}\n",
      computed.front().model, hardware.dtype, hardware.name, hardware.bandwidth_gb_per_s / 1e3,
      hardware.compute_gflop_per_s / 1e3, hardware.compute_gflop_per_s / hardware.bandwidth_gb_per_s, context);
  fmt::print("{:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>11} {:>11} {:>9}\n", "rows", "weights", "K/V", "TFLOP",
             "FLOP/B", "bound", "forward", "per token", "tok/s");
  for (const ComputedRoofline& row : computed) {
    const DecodeRoofline& line = row.roofline;
    fmt::print("{:>5} {:>10} {:>10} {:>10.3f} {:>8.1f} {:>8} {:>11} {:>11} {:>9.0f}\n", line.rows,
               llm::format_bytes(line.weight_bytes), llm::format_bytes(line.kv_bytes), line.flops / 1e12,
               line.intensity(), bound_name(line), llm::format_ms(line.predicted_ms()),
               llm::format_ms(line.predicted_ms() / line.rows), 1000.0 * line.rows / line.predicted_ms());
  }
  fmt::print("the weights are read once for the whole batch: until FLOP/byte reaches the ridge, more rows cost "
             "little more time. Each row's K/V is read for that row alone (about 1 FLOP per byte at any batch).\n");
}

}  // namespace

void print_batch_scaling(const std::vector<BatchScaling>& runs) {
  if (runs.empty()) return;
  fmt::print("\npart 1: one forward of n decode rows, each a different sequence with {} positions cached; median of "
             "{} forwards; predicted = max(bytes / bandwidth, FLOPs / compute) for the model's weight type, ceilings "
             "measured in this run\n",
             runs.front().context, runs.front().points.front().forward.runs);
  for (const BatchScaling& run : runs) print_run(run);
  fmt::print("vs x1 = tok/s / tok/s of the first row count, same device; logits: every row vs its sequence's solo "
             "1-row forward (fp32 logits tolerance; with half weights, as far as two ways of rounding the same values "
             "may part: compare.hpp's same_rounding_logits_tolerance).\n");
  print_computed(runs.front().context);
}

}  // namespace step07
