// Step 05: PagedAttention.
//
// Four parts, one results table (+ JSON with --json), each with its own table:
//   1. Memory: a seeded request trace replayed through a fixed KV budget, for
//      this model's dims and Llama-2-7B's and Llama-3-8B's: contiguous
//      max-length reservation vs paged blocks of 8/16/32/64. Bookkeeping only.
//   2. Kernel overhead: decode attention over the same K/V laid out
//      contiguously and in shuffled blocks of 16, contexts 1k and 4k, batch 1
//      and 4 (--full: blocks of 8/16/32, contexts 1k-32k, batch 1 and 16), on
//      the CPU and (when present) on CUDA.
//   3. Prefix sharing: N requests with a shared system prompt, with and
//      without the prefix cache: blocks, prefill rows, time to first token.
//   4. The model: greedy generation through the paged cache (block sizes 1,
//      7, 16, 64; a shared prefix; a fork) against step 01's contiguous cache.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <span>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/harness/progress.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/step_command_line.hpp"
#include "step05_paged_attention/measure/kernel_overhead.hpp"
#include "step05_paged_attention/measure/memory_replay.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step05_paged_attention/measure/prefix_sharing.hpp"
#include "step05_paged_attention/measure/report.hpp"

namespace {

// Part 2's sizes when their flags are not given, per run size. The default
// run keeps every CPU cell's K/V (the contiguous copy and a paged pool: 256
// MiB at 4k x 4) and the cache flush under 1 GB; --full is what the chapter
// quotes (up to 1 GiB of K/V per layout, four layouts at once).
constexpr const char* kQuickContexts = "1024,4096";
constexpr const char* kDefaultContexts = "1024,4096";
constexpr const char* kFullContexts = "1024,2048,4096,8192,16384,32768";
constexpr const char* kQuickBatches = "1,4";
constexpr const char* kDefaultBatches = "1,4";
constexpr const char* kFullBatches = "1,16";
constexpr const char* kQuickBlockSizes = "16";
constexpr const char* kDefaultBlockSizes = "16";
constexpr const char* kFullBlockSizes = "8,16,32";

struct Step05Options {
  llm::CommonOptions common;
  // 1. Memory.
  int requests = 300;            // --requests: the trace's length
  int budget_sequences = 8;      // --budget-sequences: the KV budget, in max-length sequences
  // 2. Kernel overhead (an empty list: by run size, above).
  std::string contexts;              // --contexts
  std::string batches;               // --batches
  std::string overhead_block_sizes;  // --overhead-block-sizes
  int query_heads = 32;          // --query-heads (Llama-3-8B's attention)
  int kv_heads = 8;              // --kv-heads
  int head_dim = 128;            // --head-dim
  int repeats = 5;               // --repeats: timed runs per cell (median reported)
  bool no_flush = false;         // --no-flush: warm CPU caches between timed runs
  double max_host_gib = 1.0;     // --max-host-gib: skip CPU cells whose K/V need more
  // 3. Prefix sharing.
  step05::PrefixSharingOptions sharing;  // --shared-requests, --system-tokens, --sharing-block-size
  // 4. The model.
  std::string block_sizes = "1,7,16,64";  // --block-sizes
};

std::optional<int> parse_options(int argc, char** argv, Step05Options& options) {
  return llm::parse_step_command_line(
      "Step 05: PagedAttention. KV memory in blocks allocated on demand: memory a trace wastes, the kernel's "
      "table-lookup overhead, prefix sharing, and exact generation through the paged cache.",
      argc, argv, options.common,
      [&options](CLI::App& app) {
        llm::in_range(app.add_option("--requests", options.requests, "requests in the memory part's trace"), 1,
                      100000)
            ->capture_default_str();
        llm::in_range(app.add_option("--budget-sequences", options.budget_sequences,
                                     "the memory part's KV budget, in max-length sequences"),
                      1, 4096)
            ->capture_default_str();
        app.add_option("--contexts", options.contexts,
                       fmt::format("kernel-overhead context lengths (default {}; --full {})", kDefaultContexts,
                                   kFullContexts));
        app.add_option("--batches", options.batches,
                       fmt::format("kernel-overhead batch sizes (default {}; --full {})", kDefaultBatches,
                                   kFullBatches));
        app.add_option("--overhead-block-sizes", options.overhead_block_sizes,
                       fmt::format("kernel-overhead block sizes (default {}; --full {})", kDefaultBlockSizes,
                                   kFullBlockSizes));
        llm::in_range(app.add_option("--query-heads", options.query_heads, "query heads of the timed attention"), 1,
                      256)
            ->capture_default_str();
        llm::in_range(app.add_option("--kv-heads", options.kv_heads,
                                     "KV heads of the timed attention (divides --query-heads)"),
                      1, 256)
            ->capture_default_str();
        llm::in_range(app.add_option("--head-dim", options.head_dim, "head size of the timed attention"), 1, 256)
            ->capture_default_str();
        llm::in_range(app.add_option("--repeats", options.repeats, "timed runs per cell (median reported)"), 1, 1000)
            ->capture_default_str();
        app.add_flag("--no-flush", options.no_flush, "do not evict the CPU caches between timed runs");
        llm::greater_than(app.add_option("--max-host-gib", options.max_host_gib,
                                         "skip CPU kernel cells whose K/V need more host memory"),
                          0)
            ->capture_default_str();
        llm::in_range(app.add_option("--shared-requests", options.sharing.n_requests, "prefix sharing: requests"), 2,
                      1024)
            ->capture_default_str();
        llm::in_range(app.add_option("--system-tokens", options.sharing.system_prompt_tokens,
                                     "prefix sharing: tokens of the shared system prompt (BOS included)"),
                      2, 1 << 20)
            ->capture_default_str();
        llm::in_range(app.add_option("--sharing-block-size", options.sharing.block_size, "prefix sharing: block size"),
                      1, 4096)
            ->capture_default_str();
        app.add_option("--block-sizes", options.block_sizes, "the model part's block sizes")->capture_default_str();
      },
      [] { llm::print_variant_list(step05::variants(), 16); },
      {{{"--temperature", "--top-p"},
        "its generation is greedy: the paged cache must give the contiguous cache's tokens exactly"},
       {{"--dtype", "--gemv", "--max-gemv-rows", "--no-graphs", "--no-fusions", "--no-norm-folding",
         "--merge-folding", "--no-rope-folding", "--no-pdl", "--no-gemv-prefetch",
         "--no-gemv-pipelining", "--no-gemv-wave-fit", "--gemv-prefetch-next"},
        "its paged CUDA model is fp32 and launches its paged kernels per forward (steps 01 and 04 take them)"}});
}

// The run size's part 2 sizes for the flags not given. --quick: seconds on a
// slow CI core. The memory part is bookkeeping and runs whole; the kernels
// get two short contexts and one timed run on warm caches.
void apply_run_size(Step05Options& options) {
  const llm::CommonOptions& run = options.common;
  if (options.contexts.empty())
    options.contexts = llm::by_run_size<std::string>(run, kQuickContexts, kDefaultContexts, kFullContexts);
  if (options.batches.empty())
    options.batches = llm::by_run_size<std::string>(run, kQuickBatches, kDefaultBatches, kFullBatches);
  if (options.overhead_block_sizes.empty())
    options.overhead_block_sizes =
        llm::by_run_size<std::string>(run, kQuickBlockSizes, kDefaultBlockSizes, kFullBlockSizes);
  if (!options.common.quick) return;
  options.repeats = 1;
  options.no_flush = true;
  options.sharing.n_requests = 4;
  options.sharing.system_prompt_tokens = std::min(options.sharing.system_prompt_tokens, 64);
  options.sharing.repeats = 1;
  options.common.steps = std::min(options.common.steps, 64);
}

// Parts 2 and 4's settings from the flags, checked before any work.
struct Plan {
  step05::KernelOverheadOptions overhead;
  step05::GenerationCheckOptions generation;
};
Plan plan_from(const Step05Options& options, const llm::DeviceSelection& devices) {
  Plan plan;
  plan.overhead.n_heads = options.query_heads;
  plan.overhead.n_kv_heads = options.kv_heads;
  plan.overhead.head_dim = options.head_dim;
  plan.overhead.contexts = llm::parse_positive_int_list(options.contexts, "--contexts");
  plan.overhead.batches = llm::parse_positive_int_list(options.batches, "--batches");
  plan.overhead.block_sizes = llm::parse_positive_int_list(options.overhead_block_sizes, "--overhead-block-sizes");
  plan.overhead.repeats = options.repeats;
  plan.overhead.flush_caches = !options.no_flush;
  plan.overhead.flush_limit_bytes = options.common.full ? llm::kFullRunFlushLimit : llm::kDefaultRunFlushLimit;
  plan.overhead.max_host_gib = options.max_host_gib;
  plan.overhead.seed = options.common.seed;
  plan.overhead.cpu = devices.cpu;
  plan.overhead.cuda = devices.cuda;
  if (options.query_heads % options.kv_heads != 0)
    throw llm::InputError(fmt::format("--kv-heads {} does not divide --query-heads {}", options.kv_heads,
                                      options.query_heads));
  plan.generation.block_sizes = llm::parse_positive_int_list(options.block_sizes, "--block-sizes");
  plan.generation.variant_ids =
      llm::parse_variant_selection(options.common.variant, llm::variant_ids(step05::variants()));
  return plan;
}

// 1. The trace replayed for this model's dims and two real models'.
std::vector<step05::ModelMemoryReplay> replay_for_models(const Step05Options& options,
                                                         const llm::LoadedModel& loaded) {
  step05::MemoryReplayOptions replay;
  replay.budget_sequences = options.budget_sequences;
  replay.trace.n_requests = options.requests;
  replay.trace.seed = options.common.seed;
  std::vector<step05::ModelMemoryReplay> replays;
  for (const step05::ModelDims& model : step05::memory_replay_models(loaded.name, loaded.weights.config)) {
    step05::TraceOptions trace = replay.trace;
    trace.context = model.context;
    const std::vector<step05::TraceRequest> requests = step05::make_request_trace(trace);
    replays.push_back(
        {step05::replay_policies(requests, model, replay), step05::summarize_lengths(requests, model.context)});
  }
  return replays;
}

llm::Results make_results(const Step05Options& options, const llm::LoadedModel& loaded,
                          const llm::DeviceSelection& devices, const Plan& plan) {
  llm::Results results("step05_paged_attention", "PagedAttention: KV memory in blocks allocated on demand");
  results.set_device_info(llm::device_info_for(devices));
  results.set_config("model", loaded.name);
  results.set_config("model_config", loaded.weights.config.describe());
  results.set_config("trace_requests", static_cast<long long>(options.requests));
  results.set_config("budget_sequences", static_cast<long long>(options.budget_sequences));
  results.set_config("attention_query_heads", static_cast<long long>(plan.overhead.n_heads));
  results.set_config("attention_kv_heads", static_cast<long long>(plan.overhead.n_kv_heads));
  results.set_config("attention_head_dim", static_cast<long long>(plan.overhead.head_dim));
  results.set_config("overhead_contexts", options.contexts);
  results.set_config("overhead_batches", options.batches);
  results.set_config("overhead_block_sizes", options.overhead_block_sizes);
  results.set_config("repeats", static_cast<long long>(options.repeats));
  results.set_config("cpu_caches_flushed", plan.overhead.flush_caches);
  results.set_config("sharing_requests", static_cast<long long>(options.sharing.n_requests));
  results.set_config("sharing_block_size", static_cast<long long>(options.sharing.block_size));
  results.set_config("generation_block_sizes", options.block_sizes);
  results.set_config("speedup_baseline",
                     std::string("memory: mean sequences of contiguous reservation; kernels: the contiguous layout, "
                                 "same device, context and batch; prefix sharing: TTFT without sharing; model: the "
                                 "contiguous cache on the same device"));
  results.set_config("quick", options.common.quick);
  results.set_config("full", options.common.full);
  results.add_note("speedup of memory rows = mean concurrent sequences / contiguous reservation's, same model and "
                   "budget");
  results.add_note("speedup of decode rows = time of the contiguous layout / this row's time, same device, context "
                   "and batch");
  results.add_note("speedup of prefix sharing rows = TTFT without sharing / this row's TTFT, same device");
  results.add_note("speedup of generation rows = tokens/s / the contiguous cache's tokens/s, same device");
  return results;
}

// 3. Prefix sharing and 4. the model, on every selected device: the
// baseline model (contiguous cache, reference kernels) and the paged one.
struct ModelParts {
  std::vector<step05::PrefixSharingResult> sharing;  // [devices]
  std::vector<step05::GenerationCheck> generation;   // [devices x checks]
};
ModelParts run_model_parts(const Step05Options& options, const llm::LoadedModel& loaded,
                           const llm::DeviceSelection& devices, std::span<const int> prompt, int positions,
                           const Plan& plan, llm::RunProgress& progress) {
  ModelParts parts;
  for (const std::string& device : llm::selected_device_names(devices)) {
    const auto baseline = llm::make_model_on(device, loaded.weights);
    const auto paged = step05::make_paged_model_on(device, loaded.weights);
    const auto prompts = step05::make_shared_prefix_prompts(*baseline, prompt, options.sharing);
    progress.start(fmt::format("{}: requests sharing a system prompt, without and with the prefix cache", device));
    parts.sharing.push_back(step05::run_prefix_sharing(device, *paged, prompts, options.sharing));
    progress.start(fmt::format("{}: greedy generation through the paged cache, checked token for token", device));
    const auto checks = step05::check_paged_generation(device, *baseline, *paged, prompt, positions, plan.generation);
    parts.generation.insert(parts.generation.end(), checks.begin(), checks.end());
  }
  return parts;
}

// Every part's rows into `results`, the main table, then each part's own table.
void report(llm::Results& results, const Step05Options& options, const llm::DeviceSelection& devices,
            const std::vector<step05::ModelMemoryReplay>& memory, const step05::KernelOverheadResult& overhead,
            const ModelParts& parts) {
  // CUDA kernel rows say what fraction of the GPU's measured copy bandwidth they reach.
  const double copy_gbps = devices.cuda ? llm::cuda::measure_copy_bandwidth_gbps() : 0.0;
  if (copy_gbps > 0) results.set_config("cuda_copy_gbps", copy_gbps);
  step05::add_memory_rows(results, memory);
  step05::add_overhead_rows(results, overhead, copy_gbps);
  for (const auto& sharing : parts.sharing)
    step05::add_prefix_sharing_rows(results, sharing, options.sharing.block_size);
  step05::add_generation_rows(results, parts.generation);
  fmt::print("{}\n", results.format_table());
  step05::print_memory(memory, options.budget_sequences);
  step05::print_overhead(overhead);
  step05::print_prefix_sharing(parts.sharing, options.sharing.block_size);
  step05::print_generation(parts.generation);
}

int run_step05(int argc, char** argv) {
  Step05Options options;
  if (const auto exit_status = parse_options(argc, argv, options)) return *exit_status;
  apply_run_size(options);
  const llm::DeviceSelection devices = llm::select_devices(options.common.device);
  const llm::LoadedModel loaded = llm::load_model(options.common);
  const std::vector<int> prompt = llm::encode_prompt(loaded, options.common);
  const int positions = llm::generation_positions(options.common, loaded.weights.config, prompt.size());
  const Plan plan = plan_from(options, devices);  // every flag checked before any work

  // 1. Memory: the trace through a fixed budget. 2. The kernels' overhead.
  const auto device_count = static_cast<int>(llm::selected_device_names(devices).size());
  llm::RunProgress progress("step05_paged_attention", 2 + 2 * device_count);
  progress.start("the request trace through a KV budget, contiguous and paged");
  const std::vector<step05::ModelMemoryReplay> memory = replay_for_models(options, loaded);
  progress.start("paged against contiguous decode attention on the same K/V");
  const step05::KernelOverheadResult overhead = step05::run_kernel_overhead(plan.overhead);
  // 3. Prefix sharing and 4. exact generation through the paged cache.
  const ModelParts parts = run_model_parts(options, loaded, devices, prompt, positions, plan, progress);

  llm::Results results = make_results(options, loaded, devices, plan);
  report(results, options, devices, memory, overhead, parts);
  return llm::finish_run(results, options.common, devices);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_main(argc, argv, run_step05); }
