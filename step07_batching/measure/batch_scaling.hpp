#pragma once
// Part 1 of the step: why decode batches almost for free (chapter 07,
// section 2). One forward of n decode rows, each the next token of a
// different sequence with `context` positions already in a paged cache, for
// n = 1, 2, 4, ... At batch 1 a decode step reads every weight to do two
// FLOPs with it; n rows read the weights ONCE and do 2n FLOPs with each, so
// until the arithmetic catches up with the memory traffic, n rows cost about
// what one row costs. What does not batch: each row's K/V, read for that row
// alone (about 1 FLOP per byte at any n).
//
// Beside each measurement, its roofline:
//   bytes      = weights once (step 01's decode_bytes_per_token at context 0)
//                + n x K/V of the positions each row attends
//   FLOPs      = 2 x parameters x n + attention's 4 x positions x dim x layers x n
//   predicted  = max(bytes / bandwidth, FLOPs / compute rate)
// with the ceilings measured in the same run (DeviceCeilings), and Llama-2-7B
// in fp16 on an H100, computed from its datasheet (nothing run). Every
// batched row's logits are checked against its sequence's solo forward.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llm/config.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/timer.hpp"
#include "llm/model.hpp"

namespace CLI {
class App;
}

namespace step07 {

struct BatchScalingOptions {
  std::vector<int> rows = {1, 2, 4, 8, 16, 32, 64};  // decode rows (sequences) per forward
  int context = 128;   // positions already cached in every sequence (context + 1 <= the model's seq_len)
  int warmup = 2;      // untimed forwards before each row count's timed ones
  int repeats = 7;     // timed forwards per row count (the median is reported)
  int block_size = 16;  // positions per KV block of the paged cache
  // The CPU's bandwidth probe reads a buffer of twice the last-level cache,
  // at most this (see measure_cpu_read_bandwidth_gbps in the .cpp).
  std::size_t max_read_buffer_bytes = std::size_t{256} << 20;
  std::uint64_t seed = 42;  // the sequences' tokens
  // The model's weight type (the CUDA model's --dtype): the roofline's bytes
  // per weight, and the tolerance of a row against its solo forward
  // (same_rounding_logits_tolerance). The K/V cache stays fp32.
  llm::DType weight_type = llm::DType::F32;
};

// --scaling-rows LIST and --scaling-context N (main.cpp's command line).
void add_batch_scaling_flags(CLI::App& app, BatchScalingOptions& options);
// --quick: a fraction of a second on one core (at most 16 rows, context 32, 3 runs, a 64 MiB read).
void apply_quick(BatchScalingOptions& options);

// The two ceilings of a device's roofline, as measured in this run.
struct DeviceCeilings {
  double bandwidth_gb_per_s = 0.0;  // bytes per second / 1e9
  std::string bandwidth_measured_by;
  double compute_gflop_per_s = 0.0;  // FLOPs per second / 1e9
  std::string compute_measured_by;
  // FLOP/byte above which a forward is compute-bound.
  double ridge_intensity() const { return compute_gflop_per_s / bandwidth_gb_per_s; }
};

// The roofline model of one decode forward: n rows, each at `context`
// cached positions (so it attends context + 1, its own included).
struct DecodeRoofline {
  int rows = 0;
  int context = 0;
  double weight_bytes = 0.0;  // every weight once, whatever n
  double kv_bytes = 0.0;      // n x (context + 1) positions of K and V
  double flops = 0.0;
  double memory_ms = 0.0;     // bytes / bandwidth
  double compute_ms = 0.0;    // FLOPs / compute rate
  double bytes() const { return weight_bytes + kv_bytes; }
  double intensity() const { return flops / bytes(); }
  double predicted_ms() const { return memory_ms > compute_ms ? memory_ms : compute_ms; }
  bool compute_bound() const { return compute_ms > memory_ms; }
};
DecodeRoofline decode_roofline(const llm::ModelConfig& config, int rows, int context,
                               std::size_t weight_bytes_per_value, std::size_t kv_bytes_per_value,
                               const DeviceCeilings& ceilings);

// One row count, measured.
struct BatchScalingPoint {
  int rows = 0;
  llm::TimingStats forward;  // one forward of `rows` decode rows (ms)
  double ms_per_token = 0.0;  // forward median / rows
  double tokens_per_s = 0.0;
  double speedup = 1.0;       // tokens/s over the smallest row count's (n = 1 by default)
  DecodeRoofline roofline;    // the model's prediction, its weight type, with the measured ceilings
  llm::CompareResult logits;  // every row's logits vs its sequence's solo 1-row forward
};

struct BatchScaling {
  std::string device;
  llm::DType weight_type = llm::DType::F32;
  llm::ModelConfig config;
  int context = 0;
  DeviceCeilings ceilings;
  std::size_t last_level_cache_bytes = 0;  // the CPU's (0 on CUDA or when unknown)
  double prefill_gflop_per_s = 0.0;        // this model's prefill of `context` rows (the GPU's compute ceiling)
  std::vector<BatchScalingPoint> points;   // ascending rows
};

// Measures every row count of `options` on `model` (any device: the model's
// forward returns host logits, so it has finished when it returns and a
// wall clock times it honestly on the GPU too). Throws InputError for bad
// options (no rows, context + 1 beyond the model's seq_len), DeviceError.
BatchScaling measure_batch_scaling(const std::string& device, llm::Model& model, const BatchScalingOptions& options);

// Computed, not measured: a model's decode roofline on a device given by its
// datasheet numbers.
struct NominalDevice {
  std::string name;
  double bandwidth_gb_per_s;
  double compute_gflop_per_s;
  std::string dtype;
  std::size_t bytes_per_value;
};
struct ComputedRoofline {
  std::string model;
  NominalDevice device;
  DecodeRoofline roofline;
};
// Llama-2-7B in fp16 on an H100 SXM (3.35 TB/s, 990 dense fp16 TFLOP/s) at
// n = 1, 8, 64 rows of `context` positions.
std::vector<ComputedRoofline> llama2_7b_on_h100(int context, const std::vector<int>& rows = {1, 8, 64});

// Rows of kind "batch_scaling" (variant "decode xN", id N, time = one
// forward, throughput = tokens/s, speedup over n = 1, ok = logits finite and
// equal to the solo forwards'), the JSON table "batch_scaling" (one object
// per device and row count, measurement and roofline side by side) and the
// table "batch_roofline_computed" (Llama-2-7B on an H100, labelled computed).
void add_batch_scaling_rows(llm::Results& results, const std::vector<BatchScaling>& runs);
void print_batch_scaling(const std::vector<BatchScaling>& runs);

}  // namespace step07
