// Parts 1 and 2 of the step as results rows and printed tables (report.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "llm/harness/result_rows.hpp"
#include "step05_paged_attention/measure/report.hpp"

namespace step05 {
namespace {

std::string context_label(int context) {
  return context % 1024 == 0 ? fmt::format("{}k", context / 1024) : fmt::format("{}", context);
}

std::string policy_label(const MemoryReplayRow& row) {
  return row.block_size == 0 ? row.policy : fmt::format("{} B={}", row.policy, row.block_size);
}

// The contiguous row of the same model (every speedup of part 1 is "times
// the sequences contiguous reservation runs").
const MemoryReplayRow& contiguous_row_of(const std::vector<MemoryReplayRow>& rows, const MemoryReplayRow& row) {
  for (const auto& other : rows)
    if (other.model == row.model && other.block_size == 0) return other;
  return row;
}

// The contiguous cell of the same device, context and batch.
const KernelOverheadCell& contiguous_cell_of(const KernelOverheadResult& result, const KernelOverheadCell& cell) {
  for (const auto& other : result.cells)
    if (other.device == cell.device && other.context == cell.context && other.batch == cell.batch &&
        other.block_size == 0)
      return other;
  return cell;
}

}  // namespace

void add_memory_rows(llm::Results& results, const std::vector<ModelMemoryReplay>& replays) {
  for (const ModelMemoryReplay& replay : replays) {
    for (std::size_t i = 0; i < replay.rows.size(); ++i) {
      const MemoryReplayRow& r = replay.rows[i];
      const MemoryReplayRow& contiguous = contiguous_row_of(replay.rows, r);
      llm::ResultRow row;
      row.device = "cpu";  // bookkeeping: it runs on the host whatever the cache's device
      row.id = r.block_size;
      row.variant = fmt::format("memory {} {}", r.model, policy_label(r));
      row.time_ms = r.replay_ms;
      // How many times the sequences contiguous reservation runs at once.
      row.speedup = r.mean_sequences / contiguous.mean_sequences;
      // The replay must finish every request, with every fraction a number in [0, 1].
      row.ok = r.requests_finished == r.requests && std::isfinite(r.kv_utilization) && r.kv_utilization >= 0 &&
               r.kv_utilization <= 1;
      row.throughput_key = "seqs";  // mean concurrent sequences
      row.throughput = r.mean_sequences;
      row.extra["kind"] = std::string("memory");
      row.extra["model"] = r.model;
      row.extra["context"] = static_cast<long long>(r.context);
      row.extra["policy"] = r.policy;
      row.extra["block_size"] = static_cast<long long>(r.block_size);
      row.extra["n_blocks"] = static_cast<long long>(r.n_blocks);
      row.extra["budget_positions"] = r.budget_positions;
      row.extra["budget_bytes"] = static_cast<long long>(r.budget_bytes);
      row.extra["kv_bytes_per_token"] = static_cast<long long>(r.kv_bytes_per_token);
      row.extra["kv_utilization"] = r.kv_utilization;
      row.extra["internal_fragmentation"] = r.internal_fragmentation;
      row.extra["budget_utilization"] = r.budget_utilization;
      row.extra["peak_sequences"] = static_cast<long long>(r.peak_sequences);
      row.extra["mean_sequences"] = r.mean_sequences;
      row.extra["peak_sequences_vs_contiguous"] =
          static_cast<double>(r.peak_sequences) / static_cast<double>(contiguous.peak_sequences);
      row.extra["iterations"] = r.iterations;
      row.extra["preemptions"] = r.preemptions;
      row.extra["requests"] = static_cast<long long>(r.requests);
      row.extra["requests_finished"] = static_cast<long long>(r.requests_finished);
      if (!row.ok) llm::report_failed_check(row.variant, "the replay did not finish every request with sane fractions");
      results.add_row(std::move(row));
    }
    const MemoryReplayTargets targets = check_memory_replay_targets(replay.rows);
    results.add_table({fmt::format("memory_targets_{}", replay.rows.front().model),
                       {{{"model", replay.rows.front().model},
                         {"block_size", static_cast<long long>(MemoryReplayTargets::kBlockSize)},
                         {"paged_kv_utilization", targets.paged_utilization},
                         {"min_kv_utilization", MemoryReplayTargets::kMinUtilization},
                         {"peak_sequences_ratio", targets.peak_ratio},
                         {"mean_sequences_ratio", targets.mean_ratio},
                         {"min_sequences_ratio", MemoryReplayTargets::kMinSequenceRatio},
                         {"utilization_met", targets.utilization_met},
                         {"sequences_met", targets.sequences_met}}}});
  }
}

void print_memory(const std::vector<ModelMemoryReplay>& replays, int budget_sequences) {
  for (const ModelMemoryReplay& replay : replays) {
    const LengthSummary& s = replay.lengths;
    const MemoryReplayRow& first = replay.rows.front();
    fmt::print("\nmemory: {} ({} context, {} per token of KV), a budget of {} full-context sequences = {}\n",
               first.model, first.context, llm::format_bytes(static_cast<double>(first.kv_bytes_per_token)),
               budget_sequences, llm::format_bytes(static_cast<double>(first.budget_bytes)));
    fmt::print("  trace: {} requests, log-normal lengths     {:>6} {:>6} {:>6} {:>6} {:>6} {:>7}\n", s.requests,
               "min", "p50", "p90", "p99", "max", "mean");
    for (const auto& [name, stats] : {std::pair{"prompt", &s.prompt}, {"output", &s.output}, {"total", &s.total}})
      fmt::print("  {:<41}{:>6.0f} {:>6.0f} {:>6.0f} {:>6.0f} {:>6.0f} {:>7.1f}\n", name, stats->min, stats->p50,
                 stats->p90, stats->p99, stats->max, stats->mean);
    fmt::print("  a request ends at {:.1f}% of the context on average\n", 100.0 * s.mean_total_fraction);
    fmt::print("  {:<15} {:>9} {:>13} {:>10} {:>10} {:>10} {:>11} {:>10}\n", "policy", "KV util",
               "last-blk waste", "budget", "peak seqs", "mean seqs", "vs contig.", "iterations");
    for (const auto& r : replay.rows) {
      const MemoryReplayRow& contiguous = contiguous_row_of(replay.rows, r);
      fmt::print("  {:<15} {:>8.1f}% {:>12.1f}% {:>9.1f}% {:>10} {:>10.1f} {:>10.2f}x {:>10}\n", policy_label(r),
                 100.0 * r.kv_utilization, 100.0 * r.internal_fragmentation, 100.0 * r.budget_utilization,
                 r.peak_sequences, r.mean_sequences, r.mean_sequences / contiguous.mean_sequences, r.iterations);
    }
    fmt::print("  admission: first come first served, while the whole request fits; no preemption (step 07's subject)\n");
    fmt::print("  vs contig. = mean seqs / contiguous reservation's mean seqs, same model and budget\n");
    const MemoryReplayTargets t = check_memory_replay_targets(replay.rows);
    fmt::print("  target, paged B={}: >= {:.0f}% of reserved KV holding tokens: {:.1f}% ({}); >= {:.0f}x the "
               "sequences of contiguous: peak {:.2f}x, mean {:.2f}x ({})\n",
               MemoryReplayTargets::kBlockSize, 100.0 * MemoryReplayTargets::kMinUtilization,
               100.0 * t.paged_utilization, t.utilization_met ? "met" : "NOT met",
               MemoryReplayTargets::kMinSequenceRatio,
               t.peak_ratio, t.mean_ratio, t.sequences_met ? "met" : "NOT met");
  }
}

void add_overhead_rows(llm::Results& results, const KernelOverheadResult& overhead, double copy_gbps) {
  for (const KernelOverheadCell& cell : overhead.cells) {
    const KernelOverheadCell& contiguous = contiguous_cell_of(overhead, cell);
    const std::string layout = cell.block_size == 0 ? "contiguous" : fmt::format("paged B={}", cell.block_size);
    llm::ResultRow row = llm::timed_result_row(
        cell.device, cell.block_size,
        fmt::format("decode @{} x{} {}", context_label(cell.context), cell.batch, layout), cell.timing,
        contiguous.timing.median_ms / cell.timing.median_ms, cell.error);
    row.throughput_key = "gbps";
    row.throughput = cell.gb_per_s;
    row.extra["kind"] = std::string("kernel_overhead");
    row.extra["context"] = static_cast<long long>(cell.context);
    row.extra["batch"] = static_cast<long long>(cell.batch);
    row.extra["block_size"] = static_cast<long long>(cell.block_size);
    row.extra["layout"] = layout;
    row.extra["kv_bytes_read"] = static_cast<long long>(cell.kv_bytes_read);
    row.extra["overhead_percent"] = cell.overhead_percent;
    row.extra["runs"] = static_cast<long long>(cell.timing.runs);
    if (cell.device == "cuda" && copy_gbps > 0) row.extra["fraction_of_copy_bandwidth"] = cell.gb_per_s / copy_gbps;
    llm::report_if_failed(cell.device + " " + row.variant, cell.error);
    results.add_row(std::move(row));
  }
}

void print_overhead(const KernelOverheadResult& overhead) {
  // One pivot per (device, batch): layouts down, contexts across.
  std::vector<std::pair<std::string, int>> groups;
  std::vector<int> contexts;
  for (const auto& cell : overhead.cells) {
    if (std::find(groups.begin(), groups.end(), std::pair{cell.device, cell.batch}) == groups.end())
      groups.emplace_back(cell.device, cell.batch);
    if (std::find(contexts.begin(), contexts.end(), cell.context) == contexts.end()) contexts.push_back(cell.context);
  }
  std::sort(contexts.begin(), contexts.end());
  for (const auto& [device, batch] : groups) {
    fmt::print("\ndecode attention on {}, batch {}: median time (overhead vs contiguous), GB/s of K/V read\n", device,
               batch);
    fmt::print("{:<12}", "layout");
    for (const int context : contexts) fmt::print(" {:>25}", context_label(context));
    fmt::print("\n");
    std::map<int, std::map<int, const KernelOverheadCell*>> by_layout;  // block size -> context -> cell
    for (const auto& cell : overhead.cells)
      if (cell.device == device && cell.batch == batch) by_layout[cell.block_size][cell.context] = &cell;
    for (const auto& [block_size, cells] : by_layout) {
      fmt::print("{:<12}", block_size == 0 ? std::string("contiguous") : fmt::format("paged B={}", block_size));
      for (const int context : contexts) {
        const auto it = cells.find(context);
        if (it == cells.end()) {
          fmt::print(" {:>25}", "-");
          continue;
        }
        const KernelOverheadCell& c = *it->second;
        fmt::print(" {:>25}", block_size == 0 ? fmt::format("{} {:.0f}", llm::format_ms(c.timing.median_ms), c.gb_per_s)
                                              : fmt::format("{} ({:+.1f}%) {:.0f}", llm::format_ms(c.timing.median_ms),
                                                            c.overhead_percent, c.gb_per_s));
      }
      fmt::print("\n");
    }
  }
  for (const auto& reason : overhead.skipped) fmt::print("skipped: {}\n", reason);
}

}  // namespace step05
