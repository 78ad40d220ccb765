// Step 07: continuous batching.
//
// One seeded request trace (skewed lengths, printed) is served by the same
// engine under four policies (policies.hpp): one request at a time, static
// batching, continuous batching, continuous batching with chunked prefill.
// Same model, same paged KV budget, same largest batch: only the scheduler's
// decisions differ. Every request's greedy tokens, under every policy, are
// checked against the same request run alone.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/step_command_line.hpp"
#include "step05_paged_attention/paged_generation.hpp"
#include "step07_batching/batch_scaling.hpp"
#include "step07_batching/policy_comparison.hpp"
#include "step07_batching/report.hpp"
#include "step07_batching/workload.hpp"

namespace {

struct Step07Options {
  llm::CommonOptions common;
  int requests = 300;           // --requests: the trace's length
  step07::ServingLimits limits;  // --max-batch, --block-size, --chunk-tokens (and --kv-contexts)
  int kv_contexts = 6;          // --kv-contexts: the KV budget, in full contexts
  int repeats = 3;              // --repeats: runs per policy (the median kept)
  step07::BatchScalingOptions scaling;  // part 1: --scaling-rows, --scaling-context
};

std::optional<int> parse_options(int argc, char** argv, Step07Options& options) {
  return llm::parse_step_command_line(
      "Step 07: continuous batching. One request trace served one at a time, in static batches, and with "
      "iteration-level (continuous) batching, with and without chunked prefill; outputs checked against solo runs.",
      argc, argv, options.common, [&options](CLI::App& app) {
        app.add_option("--requests", options.requests, "requests in the trace")
            ->check(CLI::Range(1, 100000))->capture_default_str();
        app.add_option("--max-batch", options.limits.max_sequences, "the largest batch (sequences at once)")
            ->check(CLI::Range(1, 1024))->capture_default_str();
        app.add_option("--block-size", options.limits.block_size, "positions per KV block")
            ->check(CLI::Range(1, 4096))->capture_default_str();
        app.add_option("--kv-contexts", options.kv_contexts, "the KV budget, in full contexts")
            ->check(CLI::Range(1, 4096))->capture_default_str();
        app.add_option("--chunk-tokens", options.limits.chunk_tokens,
                       "chunked prefill: rows per forward, decode rows included (at least --max-batch)")
            ->check(CLI::Range(1, 1 << 20))->capture_default_str();
        app.add_option("--repeats", options.repeats, "runs per policy (the median run is reported)")
            ->check(CLI::Range(1, 100))->capture_default_str();
        step07::add_batch_scaling_flags(app, options.scaling);
      },
      [] { llm::print_variant_list(step07::policies(), 20); });
}

// --quick: seconds on a slow CI core.
void apply_quick(Step07Options& options) {
  if (!options.common.quick) return;
  options.requests = std::min(options.requests, 48);
  options.repeats = 1;
  step07::apply_quick(options.scaling);
}

// The trace, with prompts from the tokenizer when a model file came with one.
std::vector<step07::Request> make_trace(const Step07Options& options, const llm::LoadedModel& loaded) {
  step07::WorkloadOptions workload;
  workload.lengths.n_requests = options.requests;
  workload.lengths.context = loaded.weights.config.seq_len;
  workload.lengths.seed = options.common.seed;
  const bool from_file = !options.common.model_path.empty();
  const step07::PromptSource prompts(from_file ? &loaded.tokenizer : nullptr, loaded.weights.config.vocab_size,
                                     options.common.seed);
  return step07::make_workload(workload, prompts);
}

step05::LengthSummary lengths_of(const std::vector<step07::Request>& requests, int context) {
  std::vector<step05::TraceRequest> lengths;
  for (const step07::Request& request : requests)
    lengths.push_back({request.id, static_cast<int>(request.prompt.size()), request.max_tokens});
  return step05::summarize_lengths(lengths, context);
}

llm::Results make_results(const Step07Options& options, const llm::LoadedModel& loaded,
                          const llm::DeviceSelection& devices) {
  llm::Results results("step07_batching", "continuous batching: the batch re-forms at every iteration");
  results.set_device_info(llm::device_info_for(devices));
  results.set_config("model", loaded.name);
  results.set_config("model_config", loaded.weights.config.describe());
  results.set_config("requests", static_cast<long long>(options.requests));
  results.set_config("max_batch", static_cast<long long>(options.limits.max_sequences));
  results.set_config("block_size", static_cast<long long>(options.limits.block_size));
  results.set_config("kv_blocks", static_cast<long long>(options.limits.kv_blocks));
  results.set_config("kv_contexts", static_cast<long long>(options.kv_contexts));
  results.set_config("chunk_tokens", static_cast<long long>(options.limits.chunk_tokens));
  results.set_config("repeats", static_cast<long long>(options.repeats));
  results.set_config("clock", std::string("steady clock; idle gaps before an arrival skipped, never work"));
  results.set_config("speedup_baseline", std::string("output tokens/s of static batching on the same device"));
  results.set_config("quick", options.common.quick);
  return results;
}

int run_step07(int argc, char** argv) {
  Step07Options options;
  if (const auto exit_status = parse_options(argc, argv, options)) return *exit_status;
  apply_quick(options);
  const llm::DeviceSelection devices = llm::select_devices(options.common.device);
  const llm::LoadedModel loaded = llm::load_model(options.common);
  const int context = loaded.weights.config.seq_len;
  options.limits.kv_blocks = options.kv_contexts * step05::blocks_for_sequences(1, context, options.limits.block_size);
  const std::vector<int> policy_ids =
      llm::parse_variant_selection(options.common.variant, llm::variant_ids(step07::policies()));
  const std::vector<step07::Request> requests = make_trace(options, loaded);

  options.scaling.seed = options.common.seed;
  std::vector<step07::BatchScaling> scaling;
  std::vector<step07::PolicyRun> runs;
  for (const std::string& device : llm::selected_device_names(devices)) {
    const auto baseline = llm::make_model_on(device, loaded.weights);  // contiguous cache: the solo reference
    const auto model = step05::make_paged_model_on(device, loaded.weights);
    scaling.push_back(step07::measure_batch_scaling(device, *model, options.scaling));  // part 1
    const auto solo = step07::solo_outputs(*baseline, requests);
    const auto device_runs = step07::compare_policies(device, *model, requests, solo, options.limits, policy_ids,
                                                      options.repeats);
    runs.insert(runs.end(), device_runs.begin(), device_runs.end());
  }

  llm::Results results = make_results(options, loaded, devices);
  const step05::LengthSummary lengths = lengths_of(requests, context);
  step07::add_batch_scaling_rows(results, scaling);
  step07::add_trace_table(results, lengths, options.requests);
  step07::add_policy_rows(results, runs);
  fmt::print("{}\n", results.format_table());
  step07::print_batch_scaling(scaling);
  step07::print_trace(lengths);
  step07::print_policies(runs);
  return llm::finish_run(results, options.common, devices);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_main(argc, argv, run_step07); }
