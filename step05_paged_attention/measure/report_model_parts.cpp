// Parts 3 and 4 of the step as results rows and printed tables (report.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "llm/harness/result_rows.hpp"
#include "step05_paged_attention/measure/report.hpp"

namespace step05 {

void add_prefix_sharing_rows(llm::Results& results, const PrefixSharingResult& sharing, int block_size) {
  const auto& off = sharing.without_sharing;
  const auto& on = sharing.with_sharing;
  for (const PrefixSharingRun* run : {&off, &on}) {
    llm::ResultRow row;
    row.device = sharing.device;
    row.id = run->sharing ? 1 : 0;
    row.variant = run->sharing ? "prefix sharing on (hit)" : "prefix sharing off";
    // TTFT of a request whose system prompt is cached (on) or not (off).
    const llm::TimingStats& ttft = run->sharing ? run->ttft_hit : run->ttft_miss;
    row.time_ms = ttft.median_ms;
    row.speedup = off.ttft_miss.median_ms / ttft.median_ms;
    row.ok = sharing.identical;
    row.throughput_key = "rows";  // prefill rows computed
    row.throughput = static_cast<double>(run->prefill_rows);
    row.extra["kind"] = std::string("prefix_sharing");
    row.extra["sharing"] = run->sharing;
    row.extra["block_size"] = static_cast<long long>(block_size);
    row.extra["requests"] = static_cast<long long>(run->tokens.size());
    row.extra["system_prompt_tokens"] = static_cast<long long>(sharing.system_prompt_tokens);
    row.extra["prompt_tokens"] = static_cast<long long>(sharing.prompt_tokens);
    row.extra["blocks_used"] = static_cast<long long>(run->blocks_used);
    row.extra["prefill_rows"] = run->prefill_rows;
    row.extra["cached_positions_per_hit"] = static_cast<long long>(run->cached_positions);
    row.extra["ttft_miss_ms"] = run->ttft_miss.median_ms;
    if (run->sharing) row.extra["ttft_hit_ms"] = run->ttft_hit.median_ms;
    row.extra["identical_tokens"] = sharing.identical;
    if (!sharing.identical)
      llm::report_failed_check(sharing.device + " " + row.variant, "generated tokens differ with and without sharing");
    results.add_row(std::move(row));
  }
}

void print_prefix_sharing(const std::vector<PrefixSharingResult>& sharing, int block_size) {
  if (sharing.empty()) return;
  const auto& first = sharing.front();
  fmt::print("\nprefix sharing: {} requests, a shared system prompt of {} tokens + {} own, blocks of {}\n",
             first.without_sharing.tokens.size(), first.system_prompt_tokens,
             first.prompt_tokens - first.system_prompt_tokens, block_size);
  fmt::print("{:<6} {:<8} {:>12} {:>14} {:>12} {:>12} {:>10} {:>10}\n", "device", "sharing", "blocks used",
             "prefill rows", "TTFT miss", "TTFT hit", "hit/miss", "tokens");
  for (const auto& r : sharing) {
    for (const PrefixSharingRun* run : {&r.without_sharing, &r.with_sharing}) {
      const bool hit = run->sharing && run->ttft_hit.runs > 0;
      fmt::print("{:<6} {:<8} {:>12} {:>14} {:>12} {:>12} {:>10} {:>10}\n", r.device, run->sharing ? "on" : "off",
                 run->blocks_used, run->prefill_rows, llm::format_ms(run->ttft_miss.median_ms),
                 hit ? llm::format_ms(run->ttft_hit.median_ms) : "-",
                 hit ? fmt::format("{:.2f}x", run->ttft_miss.median_ms / run->ttft_hit.median_ms) : "-",
                 r.identical ? "identical" : "DIFFER");
    }
  }
  fmt::print("hit/miss = TTFT miss / TTFT hit: how many times sooner a request whose system prompt is cached starts\n");
}

void add_generation_rows(llm::Results& results, const std::vector<GenerationCheck>& checks) {
  // Speedup: tokens per second against the contiguous run (variant 0) on the
  // same device (runs of two sequences generate twice the tokens).
  const auto tokens_per_s = [](const GenerationCheck& c) { return c.tokens_generated / (c.total_ms * 1e-3); };
  std::map<std::string, double> contiguous_tokens_per_s;
  for (const auto& c : checks)
    if (c.variant_id == 0) contiguous_tokens_per_s[c.device] = tokens_per_s(c);
  for (const auto& c : checks) {
    llm::ResultRow row;
    row.device = c.device;
    row.id = c.variant_id;
    row.variant =
        c.block_size == 0 ? c.variant_name : fmt::format("{} B={} {}", c.variant_name, c.block_size, c.scenario);
    row.time_ms = c.total_ms;
    row.speedup = contiguous_tokens_per_s.count(c.device) ? tokens_per_s(c) / contiguous_tokens_per_s[c.device] : 1.0;
    row.ok = c.identical;
    row.throughput_key = "tokens_per_s";
    row.throughput = tokens_per_s(c);
    row.extra["kind"] = std::string("generation");
    row.extra["variant_name"] = c.variant_name;
    row.extra["block_size"] = static_cast<long long>(c.block_size);
    row.extra["scenario"] = c.scenario;
    row.extra["tokens"] = static_cast<long long>(c.tokens.size());
    row.extra["tokens_generated"] = static_cast<long long>(c.tokens_generated);
    row.extra["identical_tokens"] = c.identical;
    row.extra["cached_positions"] = static_cast<long long>(c.cached_positions);
    row.extra["copy_on_write_blocks"] = c.copy_on_write;
    row.extra["blocks_used"] = static_cast<long long>(c.blocks_used);
    if (!c.identical)
      llm::report_failed_check(c.device + " " + row.variant, "greedy tokens differ from the contiguous cache's");
    results.add_row(std::move(row));
  }
}

void print_generation(const std::vector<GenerationCheck>& checks) {
  if (checks.empty()) return;
  fmt::print("\ngreedy generation through the paged cache vs step 01's contiguous cache ({} tokens):\n",
             checks.front().expected.size());
  fmt::print("{:<6} {:<16} {:>6} {:<14} {:>8} {:>8} {:>6} {:>12}\n", "device", "variant", "block", "scenario",
             "cached", "CoW", "blocks", "tokens");
  for (const auto& c : checks)
    fmt::print("{:<6} {:<16} {:>6} {:<14} {:>8} {:>8} {:>6} {:>12}\n", c.device, c.variant_name,
               c.block_size == 0 ? std::string("-") : fmt::format("{}", c.block_size), c.scenario,
               c.cached_positions, c.copy_on_write, c.blocks_used, c.identical ? "identical" : "DIFFER");
}

}  // namespace step05
