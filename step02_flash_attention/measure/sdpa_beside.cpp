#include "step02_flash_attention/measure/sdpa_beside.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <tuple>

#include "llm/errors.hpp"
#include "llm/harness/json_field.hpp"
#include "llm/harness/program.hpp"

namespace step02 {
namespace {

// The rows the table and the targets read, per PyTorch dtype: this step's
// baseline FlashAttention-2, the ladder's rung with every scheduling change
// (tuned), and its last rung, which adds the instruction cuts; the targets
// judge the last rung.
struct RowPair {
  const char* dtype;     // the course's dtype name, as the rows' "dtype" says it
  const char* baseline;  // variant 4 / 5
  const char* tuned;     // variant 11 / 12
  const char* last;      // variant 15 / 16
};
constexpr RowPair kPairs[] = {
    {"fp16", "cuda_flash2_fp16", "cuda_flash2_tuned_fp16", "cuda_flash2_hoisted_copies_fp16"},
    {"bf16", "cuda_flash2_bf16", "cuda_flash2_tuned_bf16", "cuda_flash2_hoisted_copies_bf16"}};
// The rows of a dtype ("fp16" or "bf16": parse_sdpa_json admits no other).
const RowPair& pair_of(const std::string& dtype) {
  const RowPair* pair =
      std::find_if(std::begin(kPairs), std::end(kPairs), [&dtype](const RowPair& p) { return dtype == p.dtype; });
  if (pair == std::end(kPairs))
    throw llm::InputError(fmt::format("SDPA comparison: no rows of dtype \"{}\"", dtype));
  return *pair;
}
// The bar: the last rung at >= 80% of PyTorch from this length on
// (shorter sequences fill the GPU with fewer blocks; both sides' launch and
// tail effects dominate there).
constexpr double kTargetShareOfSdpa = 0.80;
constexpr int kTargetFromLength = 4096;

std::string course_dtype_name(const std::string& torch_name, const std::string& what) {
  if (torch_name == "float16") return "fp16";
  if (torch_name == "bfloat16") return "bf16";
  throw llm::InputError(fmt::format("{}: dtype \"{}\" is neither float16 nor bfloat16", what, torch_name));
}

std::string joined(const std::vector<int>& values) { return fmt::format("{}", fmt::join(values, ",")); }

// This run's TFLOP/s of `variant` on one prefill shape, from the results'
// rows (nullopt: the row did not run, e.g. this GPU lacks what it needs).
using ShapeKey = std::tuple<std::string, int, int, int, bool>;  // variant, heads, head_dim, length, causal
std::map<ShapeKey, double> prefill_tflops(const llm::Results& results) {
  const auto number = [](const llm::ResultRow& row, const char* key) -> std::optional<long long> {
    const auto found = row.extra.find(key);
    if (found == row.extra.end() || !std::holds_alternative<long long>(found->second)) return std::nullopt;
    return std::get<long long>(found->second);
  };
  std::map<ShapeKey, double> tflops;
  for (const llm::ResultRow& row : results.rows()) {
    const auto phase = row.extra.find("phase");
    const auto causal = row.extra.find("causal");
    if (row.device != "cuda" || !row.ok || phase == row.extra.end() ||
        phase->second != llm::JsonScalar(std::string("prefill")) || causal == row.extra.end())
      continue;
    const auto heads = number(row, "heads"), head_dim = number(row, "head_dim"), length = number(row, "seqlen_q");
    if (!heads || !head_dim || !length || !std::holds_alternative<bool>(causal->second)) continue;
    tflops[{row.variant, static_cast<int>(*heads), static_cast<int>(*head_dim), static_cast<int>(*length),
            std::get<bool>(causal->second)}] = row.throughput;
  }
  return tflops;
}

std::string share(std::optional<double> ours, double sdpa) {
  return ours ? fmt::format("{:7.1f} ({:3.0f}%)", *ours, 100.0 * *ours / sdpa) : std::string("      - (not run)");
}

}  // namespace

void check_sdpa_request(const std::string& script, bool cuda_selected) {
  if (!std::filesystem::is_regular_file(script) || !std::ifstream(script))
    throw llm::InputError(fmt::format("--compare-sdpa: cannot read the script '{}' (it is "
                                      "step02_flash_attention/measure/sdpa_compare.py in the repository)",
                                      script));
  if (!cuda_selected)
    throw llm::InputError("--compare-sdpa times PyTorch on the GPU beside this run's CUDA rows: select the GPU "
                          "(--device cuda or all, on a machine with one)");
}

SdpaRun parse_sdpa_json(const std::string& json_text, const std::string& command) {
  const std::string what = fmt::format("the JSON of '{}'", command);
  const nlohmann::json document = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded() || !document.is_object())
    throw llm::InputError(fmt::format("{} is not a JSON object; its end:\n{}", what, llm::last_lines(json_text, 10)));
  SdpaRun run;
  run.command = command;
  const auto info = llm::required_json_field<nlohmann::json>(document, "device_info", what);
  run.gpu_name = llm::required_json_field<std::string>(info, "gpu_name", what + ": its device_info");
  run.torch_version = llm::required_json_field<std::string>(info, "torch", what + ": its device_info");
  const auto rows = llm::required_json_field<nlohmann::json>(document, "rows", what);
  if (!rows.is_array() || rows.empty()) throw llm::InputError(fmt::format("{}: \"rows\" is no list of rows", what));
  for (const nlohmann::json& entry : rows) {
    const std::string row_what = fmt::format("{}, row {}", what, run.rows.size());
    SdpaRow row;
    row.dtype = course_dtype_name(llm::required_json_field<std::string>(entry, "dtype", row_what), row_what);
    row.heads = llm::required_json_field<int>(entry, "heads", row_what);
    row.head_dim = llm::required_json_field<int>(entry, "head_dim", row_what);
    row.seqlen = llm::required_json_field<int>(entry, "seqlen_q", row_what);
    row.causal = llm::required_json_field<bool>(entry, "causal", row_what);
    row.time_ms = llm::required_json_field<double>(entry, "time_ms", row_what);
    row.tflops = llm::required_json_field<double>(entry, "tflops", row_what);
    row.backend = llm::required_json_field<std::string>(entry, "backend", row_what);
    row.note = llm::required_json_field<std::string>(entry, "note", row_what);
    // Every percentage divides by PyTorch's speed: NaN or 0 would pass silently.
    if (!std::isfinite(row.time_ms) || row.time_ms <= 0 || !std::isfinite(row.tflops) || row.tflops <= 0)
      throw llm::InputError(fmt::format("{}: time {} ms, {} TFLOP/s", row_what, row.time_ms, row.tflops));
    run.rows.push_back(std::move(row));
  }
  return run;
}

SdpaRun run_sdpa_compare(const std::string& python, const std::string& script, const SdpaShapes& shapes) {
  std::vector<std::string> argv = {python,       script, "--heads", std::to_string(shapes.heads), "--head-dims",
                                   joined(shapes.head_dims), "--seq-lens", joined(shapes.seq_lens)};
  if (!shapes.causal) argv.push_back("--no-causal");
  argv.insert(argv.end(), {"--json", "-"});
  const std::string command = llm::command_line(argv);
  const llm::ProgramOutput output = llm::run_program(argv);
  if (!output.how_it_ended.empty())
    throw llm::InputError(fmt::format("'{}' failed ({}); the end of its stderr:\n{}", command, output.how_it_ended,
                                      llm::last_lines(output.err, 15)));
  return parse_sdpa_json(output.out, command);
}

void report_sdpa_comparison(llm::Results& results, const std::vector<SdpaRun>& runs) {
  if (runs.empty()) return;
  const auto ours = prefill_tflops(results);
  const auto find = [&ours](const char* variant, const SdpaRow& row) -> std::optional<double> {
    const auto found = ours.find({variant, row.heads, row.head_dim, row.seqlen, row.causal});
    return found == ours.end() ? std::nullopt : std::optional(found->second);
  };
  const SdpaRun& first = runs.front();
  fmt::print("\nbeside PyTorch SDPA (torch {}, {}), the same shapes, this run: TFLOP/s (% of PyTorch's)\n",
             first.torch_version, first.gpu_name);
  fmt::print("  {:<5} {:>5} {:>4} {:>6} {:>6} {:<16} {:>9}   {:<17} {:<17} {:<17}\n", "dtype", "heads", "d", "S",
             "mask", "torch backend", "torch", "flash2 (v4/v5)", "tuned (v11/v12)", "last (v15/v16)");
  llm::JsonTable table{"sdpa", {}};
  // Per (dtype, head_dim, mask): the last rung's lowest share at the target's lengths.
  std::map<std::tuple<std::string, int, bool>, std::pair<double, int>> lowest;  // -> (share, at length)
  std::map<std::tuple<std::string, int, bool>, bool> missing;  // a target length the last rung did not run at
  for (const SdpaRun& run : runs) {
    for (const SdpaRow& row : run.rows) {
      const RowPair& pair = pair_of(row.dtype);
      const auto baseline = find(pair.baseline, row), tuned = find(pair.tuned, row), last = find(pair.last, row);
      fmt::print("  {:<5} {:>5} {:>4} {:>6} {:>6} {:<16} {:>9.1f}   {:<17} {:<17} {:<17}{}\n", row.dtype, row.heads,
                 row.head_dim, row.seqlen, row.causal ? "causal" : "full", row.backend, row.tflops,
                 share(baseline, row.tflops), share(tuned, row.tflops), share(last, row.tflops),
                 row.note.empty() ? "" : "  " + row.note);
      llm::JsonObject line = {{"dtype", row.dtype},          {"heads", static_cast<long long>(row.heads)},
                              {"head_dim", static_cast<long long>(row.head_dim)},
                              {"seqlen", static_cast<long long>(row.seqlen)},
                              {"causal", row.causal},        {"torch_backend", row.backend},
                              {"torch_note", row.note},      {"torch_time_ms", row.time_ms},
                              {"torch_tflops", row.tflops},  {"torch_version", run.torch_version},
                              {"torch_gpu_name", run.gpu_name}};
      if (baseline) {
        line.emplace_back(std::string(pair.baseline) + "_tflops", *baseline);
        line.emplace_back("baseline_share_of_torch", *baseline / row.tflops);
      }
      if (tuned) {
        line.emplace_back(std::string(pair.tuned) + "_tflops", *tuned);
        line.emplace_back("tuned_share_of_torch", *tuned / row.tflops);
      }
      if (last) {
        line.emplace_back(std::string(pair.last) + "_tflops", *last);
        line.emplace_back("last_share_of_torch", *last / row.tflops);
      }
      table.rows.push_back(std::move(line));
      if (row.seqlen < kTargetFromLength) continue;
      const auto key = std::make_tuple(row.dtype, row.head_dim, row.causal);
      if (!last) {
        missing[key] = true;
        continue;
      }
      const double last_share = *last / row.tflops;
      const auto [it, inserted] = lowest.try_emplace(key, last_share, row.seqlen);
      if (!inserted && last_share < it->second.first) it->second = {last_share, row.seqlen};
    }
  }
  results.set_config("sdpa_torch", first.torch_version);
  results.add_table(std::move(table));

  // The targets: one per (dtype, head dim, mask) this run compared.
  llm::JsonTable targets{"targets", {}};
  fmt::print("\ntargets (measured here; a miss is reported, not failed):\n");
  std::map<std::tuple<std::string, int, bool>, bool> compared = missing;
  for (const auto& entry : lowest) compared[entry.first] = true;
  for (const auto& [key, unused] : compared) {
    const auto& [dtype, head_dim, causal] = key;
    const std::string name =
        fmt::format("{} >= {:.0f}% of PyTorch SDPA, d = {}, {}, S >= {}", pair_of(dtype).last,
                    100 * kTargetShareOfSdpa, head_dim, causal ? "causal" : "not causal", kTargetFromLength);
    const auto found = lowest.find(key);
    const bool all_ran = !missing.count(key);
    // Not measured when the last rung ran at none of the lengths; a miss
    // when it ran at some only, or fell short at one.
    const std::string status = found == lowest.end()                                          ? "not measured"
                               : all_ran && found->second.first >= kTargetShareOfSdpa ? "met"
                                                                                            : "missed";
    std::string measured = found == lowest.end() ? std::string("the last rung did not run at these lengths")
                                                 : fmt::format("lowest {:.0f}% (at S = {})", 100 * found->second.first,
                                                               found->second.second);
    if (found != lowest.end() && !all_ran) measured += "; the last rung did not run at some of these lengths";
    targets.rows.push_back({{"target", name}, {"status", status}, {"measured", measured}});
    fmt::print("  [{:<12}] {}\n  {:<14} {}\n", status, name, "", measured);
  }
  if (compared.empty())
    fmt::print("  (none: PyTorch timed no length of {} tokens or more)\n", kTargetFromLength);
  results.add_table(std::move(targets));
}

}  // namespace step02
