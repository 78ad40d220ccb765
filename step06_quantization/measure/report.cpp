#include "step06_quantization/measure/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "step06_quantization/measure/weight_formats.hpp"

namespace step06 {

namespace {

// "% of bandwidth" of a row: its weight GB/s over the measured ceiling of its device.
double fraction_of_bandwidth(const std::string& device, double gb_per_s, double cpu_read_gbps,
                             double cuda_copy_gbps) {
  const double ceiling = device == "cpu" ? cpu_read_gbps : cuda_copy_gbps;
  return ceiling > 0 ? gb_per_s / ceiling : 0.0;
}

std::string percent_or_dash(double fraction) { return fraction > 0 ? fmt::format("{:.0f}%", 100 * fraction) : "-"; }

bool is_int4(const std::string& format) { return format.starts_with("int4") || format.starts_with("nf4"); }

}  // namespace

void add_kernel_rows(llm::Results& results, const KernelTable& table, double cuda_copy_gbps) {
  llm::JsonTable skipped{"skipped_cells", {}};
  for (const KernelCell& cell : table.cells) {
    if (!cell.skipped.empty()) {
      skipped.rows.push_back({{"device", cell.device}, {"model", cell.shape.model}, {"matrix", cell.shape.matrix},
                              {"format", cell.format}, {"why", cell.skipped}});
      continue;
    }
    llm::ResultRow row;
    row.device = cell.device;
    row.id = cell.variant_id;
    row.variant = fmt::format("{} {} {} x{}", cell.format, cell.shape.model, cell.shape.matrix, cell.rows);
    row.time_ms = cell.time_ms;
    row.speedup = cell.baseline_ms / cell.time_ms;
    row.max_rel_err = cell.check.max_rel_err;
    row.ok = cell.check.ok;
    row.throughput_key = "gb_per_s";
    row.throughput = cell.gb_per_s;
    row.extra["part"] = std::string("kernels");
    row.extra["format"] = cell.format;
    row.extra["model"] = cell.shape.model;
    row.extra["matrix"] = cell.shape.matrix;
    row.extra["out_features"] = static_cast<long long>(cell.shape.out_features);
    row.extra["in_features"] = static_cast<long long>(cell.shape.in_features);
    row.extra["rows"] = static_cast<long long>(cell.rows);
    row.extra["weight_bytes"] = cell.weight_bytes;
    row.extra["bytes_per_weight"] = cell.bytes_per_weight;
    row.extra["baseline_ms"] = cell.baseline_ms;
    row.extra["fraction_of_bandwidth"] =
        fraction_of_bandwidth(cell.device, cell.gb_per_s, table.cpu_read_gbps, cuda_copy_gbps);
    // Another kernel timed on the same x in the same run, beside the row's:
    // its time, speedup, GB/s, share of the bandwidth and check, under
    // `prefix`; the row is ok only if its check is too.
    const auto add_kernel_beside = [&](const std::string& prefix, double ms, const llm::CompareResult& check) {
      const double gb_per_s = cell.weight_bytes / (ms * 1e-3) / 1e9;
      row.extra[prefix + "_ms"] = ms;
      row.extra[prefix + "_speedup"] = cell.baseline_ms / ms;
      row.extra[prefix + "_gb_per_s"] = gb_per_s;
      row.extra[prefix + "_fraction_of_bandwidth"] =
          fraction_of_bandwidth(cell.device, gb_per_s, table.cpu_read_gbps, cuda_copy_gbps);
      row.extra[prefix + "_max_rel_err"] = check.max_rel_err;
      row.extra[prefix + "_ok"] = check.ok;
      row.ok = row.ok && check.ok;
    };
    // CUDA quantized cells: the row is the persistent kernel; beside it the
    // one-shot kernel it replaced and, for int4 at 1..4 rows, the decode GEMV.
    if (cell.one_shot_ms > 0) {
      row.extra["kernel"] = std::string("persistent");
      add_kernel_beside("one_shot", cell.one_shot_ms, cell.one_shot_check);
    }
    if (cell.int4_gemv_ms > 0) add_kernel_beside("int4_gemv", cell.int4_gemv_ms, cell.int4_gemv_check);
    results.add_row(row);
  }
  if (!skipped.rows.empty()) results.add_table(skipped);
}

void print_kernel_table(const KernelTable& table, double cuda_copy_gbps) {
  fmt::print("\n1. kernels: y = x W^T for a batch of rows, RTN-quantized random weights; speedup vs {}\n",
             "fp32 Eigen (cpu) / cuBLAS fp16 (cuda) at the same shape and rows");
  if (table.cpu_read_gbps > 0)
    fmt::print("   cpu: {} kernels, one thread; %bw = of the measured DRAM read bandwidth, {:.1f} GB/s (one thread)\n",
               table.cpu_simd, table.cpu_read_gbps);
  if (cuda_copy_gbps > 0)
    fmt::print("   cuda: measured device-to-device copy {:.0f} GB/s; L2 flushed\n", cuda_copy_gbps);
  // One line per (device, shape, format), the batches side by side.
  std::vector<int> batches;
  for (const KernelCell& cell : table.cells)
    if (cell.skipped.empty() && std::find(batches.begin(), batches.end(), cell.rows) == batches.end())
      batches.push_back(cell.rows);
  std::string header = fmt::format("{:<5} {:<10} {:<17} {:>12} {:<12} {:>6}", "dev", "model", "matrix", "[out, in]",
                                   "format", "B/w");
  for (int rows : batches)
    header += fmt::format(" | x{:<2} {:>9} {:>7} {:>5} {:>6}", rows, "time", "GB/s", "%bw", "speed");
  fmt::print("{}  ok\n", header);
  std::map<std::tuple<std::string, std::string, std::string, std::string>, std::vector<const KernelCell*>> lines;
  std::vector<std::tuple<std::string, std::string, std::string, std::string>> order;
  for (const KernelCell& cell : table.cells) {
    const auto key = std::tuple{cell.device, cell.shape.model, cell.shape.matrix, cell.format};
    if (!lines.contains(key)) order.push_back(key);
    lines[key].push_back(&cell);
  }
  for (const auto& key : order) {
    const std::vector<const KernelCell*>& cells = lines[key];
    const KernelCell& first = *cells.front();
    std::string line = fmt::format("{:<5} {:<10} {:<17} {:>12} {:<12}", first.device, first.shape.model,
                                   first.shape.matrix,
                                   fmt::format("[{}, {}]", first.shape.out_features, first.shape.in_features),
                                   first.format);
    if (!first.skipped.empty()) {
      fmt::print("{} skipped: {}\n", line, first.skipped);
      continue;
    }
    line += fmt::format(" {:>6.2f}", first.bytes_per_weight);
    // One batch's columns: time, GB/s of the weights, % of bandwidth, speedup over the baseline.
    const auto batch_columns = [&](const KernelCell& cell, double time_ms) {
      const double gb_per_s = cell.weight_bytes / (time_ms * 1e-3) / 1e9;
      const double fraction = fraction_of_bandwidth(cell.device, gb_per_s, table.cpu_read_gbps, cuda_copy_gbps);
      return fmt::format(" | {:>3} {:>9} {:>7.1f} {:>5} {:>5.2f}x", "", llm::format_ms(time_ms), gb_per_s,
                         percent_or_dash(fraction), cell.baseline_ms / time_ms);
    };
    bool all_ok = true;
    for (const KernelCell* cell : cells) {
      line += batch_columns(*cell, cell->time_ms);
      all_ok = all_ok && cell->check.ok;
    }
    fmt::print("{}  {}\n", line, all_ok ? "ok" : "FAIL");
    // Another kernel timed on the same x, on a line of its own under the
    // row's: each batch's columns where it ran ("-" where it did not).
    const auto print_kernel_beside = [&](const char* label, double KernelCell::*ms,
                                         llm::CompareResult KernelCell::*check) {
      std::string beside = fmt::format("{:<5} {:<10} {:<17} {:>12} {:<12} {:>6}", "", "", "", "", label, "");
      bool beside_ok = true;
      for (const KernelCell* cell : cells) {
        beside += cell->*ms > 0 ? batch_columns(*cell, cell->*ms)
                                : fmt::format(" | {:>3} {:>9} {:>7} {:>5} {:>6}", "", "-", "-", "-", "-");
        beside_ok = beside_ok && (cell->*ms == 0 || (cell->*check).ok);
      }
      fmt::print("{}  {}\n", beside, beside_ok ? "ok" : "FAIL");
    };
    // CUDA quantized formats: the line above is the persistent kernel; the
    // one-shot split-K kernel's times follow, then for int4 the decode
    // GEMV's (1..4 rows).
    if (first.one_shot_ms > 0) print_kernel_beside(" one-shot", &KernelCell::one_shot_ms, &KernelCell::one_shot_check);
    if (first.int4_gemv_ms > 0)
      print_kernel_beside(" int4 GEMV", &KernelCell::int4_gemv_ms, &KernelCell::int4_gemv_check);
  }
}

void add_model_rows(llm::Results& results, const std::vector<ModelRow>& rows, const std::string& part,
                    double cpu_read_gbps, double cuda_copy_gbps) {
  for (const ModelRow& model_row : rows) {
    llm::ResultRow row;
    row.device = model_row.device;
    row.id = model_row.variant.id();
    row.variant = fmt::format("{} ({})", model_row.variant.name(), model_row.model);
    row.ok = model_row.ok;
    row.extra["part"] = part;
    row.extra["model"] = model_row.model;
    row.extra["weights"] = model_row.variant.weights_name();
    row.extra["algorithm"] = algorithm_name(model_row.variant.algorithm);
    row.extra["kv"] = std::string(model_row.variant.int8_kv ? "int8" : "fp32");
    if (!model_row.skipped.empty()) {
      row.extra["skipped"] = model_row.skipped;
      results.add_row(row);
      continue;
    }
    row.time_ms = model_row.decode_ms_per_token;
    row.speedup = model_row.speedup;
    // Present only where the device has an fp16 row (a GPU), as the quality
    // keys only where quality was measured.
    if (model_row.speedup_vs_fp16 > 0) row.extra["speedup_vs_fp16"] = model_row.speedup_vs_fp16;
    row.max_rel_err = model_row.check.max_rel_err;
    row.throughput_key = "tokens_per_s";
    row.throughput = model_row.tokens_per_s;
    row.extra["weight_bytes_per_token"] = model_row.weight_bytes;
    row.extra["kv_bytes_per_position"] = model_row.kv_bytes_per_position;
    row.extra["weight_gb_per_s"] = model_row.gb_per_s;
    row.extra["fraction_of_bandwidth"] =
        fraction_of_bandwidth(model_row.device, model_row.gb_per_s, cpu_read_gbps, cuda_copy_gbps);
    row.extra["greedy_tokens_compared"] = static_cast<long long>(model_row.greedy_tokens_compared);
    row.extra["greedy_matching_prefix"] = static_cast<long long>(model_row.greedy_matching_prefix);
    if (model_row.agreement) {
      row.extra["mean_kl"] = model_row.agreement->mean_kl;
      row.extra["max_kl"] = model_row.agreement->max_kl;
      row.extra["top1_agreement"] = model_row.agreement->top1_agreement;
      row.extra["positions_compared"] = static_cast<long long>(model_row.agreement->positions);
      row.extra["perplexity"] = model_row.perplexity;
      row.extra["perplexity_fp32"] = model_row.perplexity_fp32;
    }
    results.add_row(row);
  }
}

void print_speed_table(const std::vector<ModelRow>& rows, double cpu_read_gbps, double cuda_copy_gbps) {
  fmt::print("\n2. decode speed: greedy decode through the unchanged model, time per token after the prefill; "
             "speedup vs fp32 weights and, on a GPU, vs fp16 weights (same device, model)\n");
  fmt::print("{:<5} {:<18} {:<24} {:>10} {:>10} {:>10} {:>8} {:>6} {:>8} {:>8} {:>8}  ok\n", "dev", "model",
             "weights", "bytes/tok", "ms/token", "tok/s", "GB/s", "%bw", "vs fp32", "vs fp16", "greedy=");
  for (const ModelRow& row : rows) {
    if (!row.skipped.empty()) {
      fmt::print("{:<5} {:<18} {:<24} skipped: {}\n", row.device, row.model, row.variant.name(), row.skipped);
      continue;
    }
    fmt::print("{:<5} {:<18} {:<24} {:>10} {:>10.4f} {:>10.1f} {:>8.1f} {:>6} {:>7.2f}x {:>8} {:>8}  {}\n",
               row.device, row.model, row.variant.name(), llm::format_bytes(row.weight_bytes),
               row.decode_ms_per_token, row.tokens_per_s, row.gb_per_s,
               percent_or_dash(fraction_of_bandwidth(row.device, row.gb_per_s, cpu_read_gbps, cuda_copy_gbps)),
               row.speedup, row.speedup_vs_fp16 > 0 ? fmt::format("{:.2f}x", row.speedup_vs_fp16) : "-",
               fmt::format("{}/{}", row.greedy_matching_prefix, row.greedy_tokens_compared), row.ok ? "ok" : "FAIL");
  }
  fmt::print("   vs fp16 : GPU rows only: the same weights in fp16, the baseline real GPU inference quantizes "
             "from (every CUDA row runs the same graphs and fusions: the JSON's cuda_* settings)\n");
  fmt::print("   greedy= : greedy tokens equal to fp32's before the first difference / tokens generated\n");
  fmt::print("   %bw over 100%: the weights were read from a cache, not DRAM (a model smaller than the last-level "
             "cache stays there from token to token)\n");
}

void print_quality_table(const std::vector<ModelRow>& rows, bool trained_weights) {
  fmt::print("\n3. quality vs the fp32 model on held-out sequences it sampled (teacher forced; cpu)\n");
  if (!trained_weights)
    fmt::print("   random weights: these columns say nothing about quantization quality; run with --model "
               "stories260K.bin --tokenizer tok512.bin\n");
  fmt::print("{:<26} {:>10} {:>11} {:>11} {:>8} {:>9} {:>9} {:>8}\n", "weights (+ kv)", "bytes/tok", "mean KL",
             "max KL", "top-1", "ppl", "ppl fp32", "greedy=");
  for (const ModelRow& row : rows) {
    if (row.device != "cpu") continue;
    if (!row.skipped.empty()) {
      fmt::print("{:<26} skipped: {}\n", row.variant.name(), row.skipped);
      continue;
    }
    if (!row.agreement) continue;
    fmt::print("{:<26} {:>10} {:>11.3e} {:>11.3e} {:>7.2f}% {:>9.3f} {:>9.3f} {:>8}\n", row.variant.name(),
               llm::format_bytes(row.weight_bytes), row.agreement->mean_kl, row.agreement->max_kl,
               100 * row.agreement->top1_agreement, row.perplexity, row.perplexity_fp32,
               fmt::format("{}/{}", row.greedy_matching_prefix, row.greedy_tokens_compared));
  }
}

namespace {

struct Target {
  std::string name;
  std::string status;  // "met", "missed", "not measured"
  std::string measured;
};

void add_target(std::vector<Target>& targets, std::string name, std::optional<bool> met, std::string measured) {
  targets.push_back({std::move(name), !met ? "not measured" : *met ? "met" : "missed", std::move(measured)});
}

// CPU, one thread, small preset: the faster int8 product (fp32 or int8
// activations) >= 2.5x, the best 4-bit format >= 4x fp32 tokens/s.
void cpu_decode_targets(const std::vector<ModelRow>* speed, std::vector<Target>& targets) {
  std::optional<ModelRow> int8_row, best_int4;
  if (speed != nullptr)
    for (const ModelRow& row : *speed) {
      if (row.device != "cpu" || !row.skipped.empty() || row.variant.int8_kv || !row.variant.weights) continue;
      const std::string format = row.variant.weights->name();
      if ((format == "int8" || format == "int8-a8") && (!int8_row || row.speedup > int8_row->speedup)) int8_row = row;
      if (is_int4(format) && (!best_int4 || row.speedup > best_int4->speedup)) best_int4 = row;
    }
  const auto describe_row = [](const ModelRow& row) {
    return fmt::format("{}: {:.2f}x ({:.0f} tok/s, {:.1f} GB/s of weights)", row.variant.name(), row.speedup,
                       row.tokens_per_s, row.gb_per_s);
  };
  add_target(targets, "cpu small preset decode: int8 >= 2.5x fp32 tokens/s",
             int8_row ? std::optional(int8_row->speedup >= 2.5) : std::nullopt,
             int8_row ? describe_row(*int8_row) : "int8 did not run on the small preset");
  add_target(targets, "cpu small preset decode: int4 >= 4x fp32 tokens/s",
             best_int4 ? std::optional(best_int4->speedup >= 4.0) : std::nullopt,
             best_int4 ? describe_row(*best_int4) : "no 4-bit format ran on the small preset");
}

// CUDA, Llama-2-7B's FFN matrices (the kernel table's llama2-7b shapes): at
// one row the best W4A16 format >= 3.3x cuBLAS fp16 and int8 (W8A16) >= 1.8x,
// and near-flat time from 1 to 16 rows (the best 4-bit format's 16 rows within
// 1.15x of its 1 row). Each is judged on the worse of the two matrices.
void cuda_kernel_targets(const KernelTable* kernels, std::vector<Target>& targets) {
  // (matrix, format) -> rows -> cell, for the CUDA cells on llama2-7b shapes.
  std::map<std::pair<std::string, std::string>, std::map<int, const KernelCell*>> cells;
  if (kernels != nullptr)
    for (const KernelCell& cell : kernels->cells)
      if (cell.device == "cuda" && cell.shape.model == "llama2-7b" && cell.skipped.empty())
        cells[{cell.shape.matrix, cell.format}][cell.rows] = &cell;
  // Per matrix: the fastest 4-bit format at one row (speedup, x16 / x1 time), and int8's speedup.
  std::map<std::string, std::pair<double, double>> best_int4;
  std::map<std::string, double> int8;
  for (const auto& [key, by_rows] : cells) {
    const auto& [matrix, format] = key;
    if (!by_rows.contains(1)) continue;
    const double speedup = by_rows.at(1)->baseline_ms / by_rows.at(1)->time_ms;
    if (format == "int8") int8[matrix] = speedup;
    if (!is_int4(format)) continue;
    const double flatness = by_rows.contains(16) ? by_rows.at(16)->time_ms / by_rows.at(1)->time_ms : 0.0;
    auto& best = best_int4[matrix];
    if (speedup > best.first) best = {speedup, flatness};
  }
  std::optional<double> worst_speedup_b1, worst_flatness, worst_int8;
  std::string detail, int8_detail;
  for (const auto& [matrix, best] : best_int4) {
    worst_speedup_b1 = std::min(worst_speedup_b1.value_or(1e30), best.first);
    if (best.second > 0) worst_flatness = std::max(worst_flatness.value_or(0.0), best.second);
    detail += fmt::format("{}{}: {:.2f}x, x16/x1 time {:.2f}", detail.empty() ? "" : "; ", matrix, best.first,
                          best.second);
  }
  for (const auto& [matrix, speedup] : int8) {
    worst_int8 = std::min(worst_int8.value_or(1e30), speedup);
    int8_detail += fmt::format("{}{}: {:.2f}x", int8_detail.empty() ? "" : "; ", matrix, speedup);
  }
  add_target(targets, "cuda llama2-7b FFN, 1 row: W4A16 >= 3.3x cuBLAS fp16",
             worst_speedup_b1 ? std::optional(*worst_speedup_b1 >= 3.3) : std::nullopt,
             worst_speedup_b1 ? detail : "no CUDA kernel rows on llama2-7b shapes (no GPU, or a run without --full)");
  add_target(targets, "cuda llama2-7b FFN: near-flat time from 1 to 16 rows (W4A16 x16 within 1.15x of x1)",
             worst_flatness ? std::optional(*worst_flatness <= 1.15) : std::nullopt,
             worst_flatness ? detail : "no CUDA kernel rows at 1 and 16 rows on llama2-7b shapes");
  add_target(targets, "cuda llama2-7b FFN, 1 row: W8A16 (int8) >= 1.8x cuBLAS fp16",
             worst_int8 ? std::optional(*worst_int8 >= 1.8) : std::nullopt,
             worst_int8 ? int8_detail : "no CUDA int8 kernel rows on llama2-7b shapes");
}

// CUDA, the loaded model (TinyLlama-1.1B's dims in the GPU check): the
// fastest int4 model decodes >= 2.5x the fp16 model's tokens/s, both with
// the run's graphs and fusions (int8 KV rows left out: the fp16 model's
// cache is fp32).
void cuda_decode_targets(const std::vector<ModelRow>* this_model, std::vector<Target>& targets) {
  std::optional<ModelRow> best_int4;
  if (this_model != nullptr)
    for (const ModelRow& row : *this_model)
      if (row.device == "cuda" && row.skipped.empty() && !row.variant.int8_kv && row.variant.weights &&
          is_int4(row.variant.weights->name()) && (!best_int4 || row.speedup_vs_fp16 > best_int4->speedup_vs_fp16))
        best_int4 = row;
  add_target(targets, "cuda decode of this model: W4A16 >= 2.5x the fp16 model's tokens/s",
             best_int4 ? std::optional(best_int4->speedup_vs_fp16 >= 2.5) : std::nullopt,
             best_int4 ? fmt::format("{}, {}: {:.2f}x ({:.3f} ms/token, {:.0f} GB/s of weights)", best_int4->model,
                                     best_int4->variant.name(), best_int4->speedup_vs_fp16,
                                     best_int4->decode_ms_per_token, best_int4->gb_per_s)
                       : "no CUDA int4 model row (no GPU, or no 4-bit format)");
}

// Trained model: GPTQ and AWQ each below RTN's KL at the same 4-bit format;
// int8 per channel top-1 >= 99%.
void quality_targets(const std::vector<ModelRow>* quality, bool trained, std::vector<Target>& targets) {
  std::map<std::string, std::map<std::string, double>> kl;  // format -> algorithm -> mean KL
  std::optional<double> int8_top1;
  if (quality != nullptr && trained)
    for (const ModelRow& row : *quality) {
      if (row.device != "cpu" || !row.agreement || row.variant.int8_kv || !row.variant.weights) continue;
      const std::string format = row.variant.weights->name();
      kl[format][algorithm_name(row.variant.algorithm)] = row.agreement->mean_kl;
      if (format == "int8" && row.variant.algorithm == QuantAlgorithm::Rtn) int8_top1 = row.agreement->top1_agreement;
    }
  for (const std::string algorithm : {"gptq", "awq"}) {
    std::optional<bool> all_below;
    std::string detail;
    for (const auto& [format, by_algorithm] : kl) {
      if (!is_int4(format) || !by_algorithm.contains("rtn") || !by_algorithm.contains(algorithm)) continue;
      const bool below = by_algorithm.at(algorithm) < by_algorithm.at("rtn");
      all_below = all_below.value_or(true) && below;
      detail += fmt::format("{}{}: {:.3e} vs rtn {:.3e}", detail.empty() ? "" : "; ", format,
                            by_algorithm.at(algorithm), by_algorithm.at("rtn"));
    }
    add_target(targets, fmt::format("trained model: {} mean KL below RTN's at every 4-bit format", algorithm),
               all_below, all_below ? detail : "needs a checkpoint (--model) and the 4-bit formats with rtn and " +
                                                   std::string(algorithm));
  }
  add_target(targets, "trained model: int8 per channel top-1 agreement >= 99%",
             int8_top1 ? std::optional(*int8_top1 >= 0.99) : std::nullopt,
             int8_top1 ? fmt::format("{:.2f}%", 100 * *int8_top1) : "needs a checkpoint (--model) and int8 rtn");
}

}  // namespace

void report_targets(llm::Results& results, const TargetInputs& inputs) {
  std::vector<Target> targets;
  cpu_decode_targets(inputs.small_speed, targets);
  cuda_kernel_targets(inputs.kernels, targets);
  cuda_decode_targets(inputs.quality, targets);
  quality_targets(inputs.quality, inputs.trained_weights, targets);
  llm::JsonTable table{"targets", {}};
  fmt::print("\ntargets (measured here; a miss is reported, not failed):\n");
  for (const Target& target : targets) {
    table.rows.push_back({{"target", target.name}, {"status", target.status}, {"measured", target.measured}});
    fmt::print("  [{:<12}] {}\n  {:<14} {}\n", target.status, target.name, "", target.measured);
  }
  results.add_table(table);
}

}  // namespace step06
