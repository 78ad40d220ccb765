// Step 07: continuous batching.
//
// One seeded request trace (skewed lengths, printed) is served by the same
// engine under four policies (policies.hpp): one request at a time, static
// batching, continuous batching, continuous batching with chunked prefill.
// Same model, same paged KV budget, same largest batch: only the scheduler's
// decisions differ. Every request's greedy tokens, under every policy, are
// checked against the same request run alone. Per device:
//   1. why batching pays: one forward of n decode rows, n = 1..64, beside its
//      roofline (the weights are read once for the whole batch);
//   2. the trace, all arriving at once, under every policy (throughput);
//   3. the trace arriving as a Poisson stream at a sweep of loads
//      (latency vs throughput, static vs continuous);
//   4. long prompts arriving while others decode, without and with chunked
//      prefill (the decoders' stalls);
//   5. the engine behind the HTTP server on loopback, loaded by the streaming
//      client with part 2's trace (what serving over HTTP costs);
//   6. the trace behind one long shared system prompt, with the engine's
//      prefix cache off and on (first-token latency, rows computed, hits);
//   7. n samples of one prompt (OpenAI's `n`, n = 1, 4, 8): forked from one
//      prefill, sharing the prompt's blocks, against n separate requests
//      (prefill rows, peak KV blocks, copies, wall time).
// Two more modes use the same engine: --serve PORT (an OpenAI-compatible
// server on localhost: completions, chat completions, models) and --load PORT
// (the trace against it).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/harness/progress.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/step_command_line.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step07_batching/measure/batch_scaling.hpp"
#include "step07_batching/measure/chunked_prefill.hpp"
#include "step07_batching/measure/loopback_serving.hpp"
#include "step07_batching/measure/parallel_sampling.hpp"
#include "step07_batching/measure/policy_comparison.hpp"
#include "step07_batching/measure/prefix_caching.hpp"
#include "step07_batching/measure/rate_sweep.hpp"
#include "step07_batching/measure/report.hpp"
#include "step07_batching/serve/server.hpp"
#include "step07_batching/measure/workload.hpp"

namespace {

// The sizes of each run when their flags are not given. The default run
// serves a shorter trace once per policy, at three loads (below, at and past
// what continuous batching sustains) and one chunk size: seconds. --full is
// what the chapter quotes: 200 requests, the median of 3 runs, five loads,
// four chunk sizes. (--quick: CI's seconds; its chunk size is the default's.)
struct RunSizeSettings {
  int requests;
  int repeats;
  std::vector<double> loads;
};
const RunSizeSettings kQuickRun{48, 1, {0.5, 1.0}};
const RunSizeSettings kDefaultRun{64, 1, {0.5, 1.0, 1.25}};
const RunSizeSettings kFullRun{200, 3, step07::RateSweepOptions{}.load_factors};
// Chunk sizes of part 4: the default and --quick run one (at least the
// largest batch: a chunk holds the decode rows too); --full the struct's list.
constexpr int kDefaultChunkTokens = 32;

struct Step07Options {
  llm::CommonOptions common;
  int requests = 0;             // --requests: the trace's length (0: by run size)
  step07::ServingLimits limits;  // --max-batch, --block-size, --chunk-tokens (and --kv-contexts)
  int kv_contexts = 6;          // --kv-contexts: the KV budget, in full contexts
  int repeats = 0;              // --repeats: runs per policy, the median kept (0: by run size)
  step07::RateSweepOptions sweep;          // --loads (into `loads` first: empty = by run size)
  std::vector<double> loads;
  std::vector<int> chunk_sizes;            // --chunk-sizes (empty: by run size)
  step07::ChunkedPrefillOptions chunking;  // --chunk-sizes, --long-prompt-every, --long-prompt-fraction, --chunk-load
  step07::BatchScalingOptions scaling;     // part 1: --scaling-rows, --scaling-context
  bool loopback = true;                    // part 5 (--no-loopback skips it)
  step07::PrefixCachingOptions prefix;     // part 6: --system-prompt-fraction, --prefix-load
  step07::ParallelSamplingOptions sampling;  // part 7: --samples, --sampling-prompt-tokens, --sampling-max-tokens
  bool prefix_cache = true;                // --serve: the engine's prefix cache (--no-prefix-cache: off)
  // The serving modes.
  int serve_port = -1;           // --serve PORT: run the server until Ctrl-C
  int load_port = -1;            // --load PORT: replay the trace against a running server
  double load_rate = 0.0;        // --load-rate: requests/s (0: all at once)
  double load_seconds = 60.0;    // --load-seconds: the load's wall-time bound
};

std::optional<int> parse_options(int argc, char** argv, Step07Options& options) {
  return llm::parse_step_command_line(
      "Step 07: continuous batching. One request trace served one at a time, in static batches, and with "
      "iteration-level (continuous) batching, with and without chunked prefill; outputs checked against solo runs.",
      argc, argv, options.common,
      [&options](CLI::App& app) {
        llm::in_range(app.add_option("--requests", options.requests,
                                     fmt::format("requests in the trace (default {}, --full {})", kDefaultRun.requests,
                                                 kFullRun.requests)),
                      1, 100000);
        llm::in_range(
            app.add_option("--max-batch", options.limits.max_sequences, "the largest batch (sequences at once)"), 1,
            1024)
            ->capture_default_str();
        llm::in_range(app.add_option("--block-size", options.limits.block_size, "positions per KV block"), 1, 4096)
            ->capture_default_str();
        llm::in_range(app.add_option("--kv-contexts", options.kv_contexts, "the KV budget, in full contexts"), 1, 4096)
            ->capture_default_str();
        llm::in_range(app.add_option("--chunk-tokens", options.limits.chunk_tokens,
                                     "chunked prefill: rows per forward, decode rows included (at least --max-batch)"),
                      1, 1 << 20)
            ->capture_default_str();
        llm::in_range(app.add_option("--repeats", options.repeats,
                                     fmt::format("runs per policy and per parallel sampling row, the median run is "
                                                 "reported (default {}, --full {})",
                                                 kDefaultRun.repeats, kFullRun.repeats)),
                      1, 100);
        llm::in_range(app.add_option("--loads", options.loads,
                                     fmt::format("rate sweep: arrival rates as fractions of continuous batching's "
                                                 "offline requests/s (default {}, --full {})",
                                                 fmt::join(kDefaultRun.loads, ","), fmt::join(kFullRun.loads, ",")))
                          ->delimiter(','),
                      0.001, 100.0);
        llm::in_range(app.add_option("--chunk-sizes", options.chunk_sizes,
                                     fmt::format("chunked prefill part: rows per forward to compare, each at least "
                                                 "--max-batch (default {}, --full {})",
                                                 kDefaultChunkTokens,
                                                 fmt::join(step07::ChunkedPrefillOptions{}.chunk_tokens, ",")))
                          ->delimiter(','),
                      1, 1 << 20);
        llm::in_range(app.add_option("--long-prompt-every", options.chunking.long_prompt_every,
                                     "chunked prefill part: every k-th request has a long prompt"),
                      1, 100000)
            ->capture_default_str();
        llm::in_range(app.add_option("--long-prompt-fraction", options.chunking.long_prompt_fraction,
                                     "chunked prefill part: the long prompt's length, as a fraction of the context"),
                      0.01, 0.99)
            ->capture_default_str();
        llm::in_range(app.add_option("--chunk-load", options.chunking.load_factor,
                                     "chunked prefill part: arrival rate, as a fraction of continuous batching's "
                                     "offline requests/s"),
                      0.001, 100.0)
            ->capture_default_str();
        step07::add_batch_scaling_flags(app, options.scaling);
        app.add_flag("!--no-loopback", options.loopback, "skip part 5 (the HTTP server on loopback)");
        llm::in_range(app.add_option("--system-prompt-fraction", options.prefix.system_prompt_fraction,
                                     "prefix caching part: the shared system prompt's length, as a fraction of the "
                                     "context"),
                      0.01, 0.99)
            ->capture_default_str();
        llm::in_range(app.add_option("--prefix-load", options.prefix.load_factor,
                                     "prefix caching part: arrival rate, as a fraction of continuous batching's "
                                     "offline requests/s"),
                      0.001, 100.0)
            ->capture_default_str();
        step07::add_parallel_sampling_flags(app, options.sampling);
        app.add_flag("!--no-prefix-cache", options.prefix_cache,
                     "--serve: requests do not share the cached blocks of a common prompt prefix");
        llm::in_range(app.add_option("--serve", options.serve_port,
                                     "serve the OpenAI-compatible API on 127.0.0.1:PORT until Ctrl-C (0: any free port)"),
                      0, 65535);
        llm::in_range(
            app.add_option("--load", options.load_port, "replay the trace against a server on 127.0.0.1:PORT"), 1,
            65535);
        llm::at_least(app.add_option("--load-rate", options.load_rate, "--load: arrivals per second (0: all at once)"),
                      0)
            ->capture_default_str();
        llm::greater_than(app.add_option("--load-seconds", options.load_seconds,
                                         "--load: stop sending and waiting after this long"),
                          0)
            ->capture_default_str();
      },
      [] { llm::print_variant_list(step07::policies(), 20); },
      {{{"--prompt", "--steps"}, "its requests' prompts and lengths come from its seeded trace"},
       {{"--temperature", "--top-p"},
        "every request decodes greedily, to be checked against the same request run alone"}});
}

// The run size's values for the flags not given. --quick: seconds on a slow
// CI core, part 1 shortened too.
void apply_run_size(Step07Options& options) {
  const RunSizeSettings& run = llm::by_run_size<const RunSizeSettings&>(options.common, kQuickRun, kDefaultRun,
                                                                         kFullRun);
  if (options.requests == 0) options.requests = run.requests;
  if (options.repeats == 0) options.repeats = run.repeats;
  options.sweep.load_factors = options.loads.empty() ? run.loads : options.loads;
  if (!options.chunk_sizes.empty())
    options.chunking.chunk_tokens = options.chunk_sizes;
  else if (!options.common.full)
    options.chunking.chunk_tokens = {std::max(kDefaultChunkTokens, options.limits.max_sequences)};
  options.sampling.repeats = options.repeats;
  if (options.common.quick) {
    step07::apply_quick(options.scaling);
    step07::apply_quick(options.sampling);
  }
}

// Prompts from the tokenizer when a model file came with one (a trained
// model continues text it has seen the like of), else seeded random ids.
step07::PromptSource prompt_source(const Step07Options& options, const llm::LoadedModel& loaded) {
  const bool from_file = !options.common.model_path.empty();
  return step07::PromptSource(from_file ? &loaded.tokenizer : nullptr, loaded.weights.config.vocab_size,
                              options.common.seed);
}

// The trace, all arriving at t = 0 (parts 3 and 4 give it arrival times).
std::vector<step07::Request> make_trace(const Step07Options& options, const llm::LoadedModel& loaded,
                                        const step07::PromptSource& prompts) {
  step07::WorkloadOptions workload;
  workload.lengths.n_requests = options.requests;
  workload.lengths.context = loaded.weights.config.seq_len;
  workload.lengths.seed = options.common.seed;
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
  results.set_config("system_prompt_fraction", options.prefix.system_prompt_fraction);
  results.set_config("prefix_load", options.prefix.load_factor);
  results.set_config("samples", fmt::format("{}", fmt::join(options.sampling.samples, ",")));
  results.set_config("sampling_prompt_tokens", static_cast<long long>(options.sampling.prompt_tokens));
  results.set_config("sampling_max_tokens", static_cast<long long>(options.sampling.max_tokens));
  results.set_config("clock", std::string("steady clock; idle gaps before an arrival skipped, never work"));
  results.set_config("speedup_baseline", std::string("output tokens/s of static batching on the same device"));
  results.set_config("quick", options.common.quick);
  results.set_config("full", options.common.full);
  results.add_note("speedup of decode xN rows = tokens/s / tokens/s of the fewest rows per forward (part 1's first), "
                   "same device");
  results.add_note("speedup of policy rows = output tokens/s / static batching's, same device and trace");
  results.add_note("speedup of prefill rows = p99 inter-token latency without chunks / with this row's chunks (their "
                   "time is that p99)");
  results.add_note("speedup of the HTTP row = its output tokens/s / the in-process continuous run's");
  results.add_note("speedup of prefix cache rows = p50 TTFT with the prefix cache off / with this row's setting (their "
                   "time is that p50)");
  results.add_note("speedup of parallel sampling rows = wall time of n independent requests / this row's, same device "
                   "and n (their time is the greedy run's wall time)");
  return results;
}

// Parts 1-7 on one device. Every run's tokens are checked against the
// requests run alone on the baseline model (contiguous cache).
struct DeviceParts {
  step07::BatchScaling scaling;
  std::vector<step07::PolicyRun> policies;
  std::vector<step07::RateSweepPoint> sweep;
  std::vector<step07::ChunkedPrefillRow> chunked;
  std::optional<step07::LoopbackRun> loopback;
  std::vector<step07::PrefixCachingRow> prefix;
  std::vector<step07::ParallelSamplingRow> sampling;
};

// The parts' scenarios, made once for every device.
struct Scenarios {
  std::vector<step07::Request> trace;         // parts 2, 3, 5
  std::vector<step07::Request> long_prompts;  // part 4 (arrival times given per device)
  std::vector<step07::Request> shared_system; // part 6 (arrival times given per device)
  step07::Request sampling_prompt;            // part 7: the prompt its n samples complete
};

// Progress lines per device: the solo runs, then each part.
int progress_parts(const Step07Options& options) { return 7 + (options.loopback ? 1 : 0); }

// The engine's model. On the CPU, step 05's paged attention reads the
// engine's block tables. On CUDA, the course's CUDA model (common/cuda): its
// decode and prefill kernels read any cache through its block table, so it
// runs the engine as it runs steps 01 and 04, with the same --dtype, --gemv,
// --max-gemv-rows, --no-gemv-prefetch, --no-gemv-pipelining, --no-gemv-wave-fit, --gemv-prefetch-next,
// --no-graphs, --no-fusions, --no-norm-folding, --merge-folding, --no-rope-folding and --no-pdl.
std::unique_ptr<llm::Model> make_engine_model(const std::string& device, const llm::ModelWeights& weights,
                                              const llm::CommonOptions& common) {
  if (device == "cuda") return llm::make_model_on(device, weights, llm::cuda_run_options(common));
  return step05::make_paged_model_on(device, weights);
}

// The weight type the roofline and the tolerances use: --dtype on CUDA.
llm::DType engine_weight_type(const std::string& device, const llm::CommonOptions& common) {
  return device == "cuda" ? llm::compare_dtype(llm::cuda_run_options(common).dtype) : llm::DType::F32;
}

DeviceParts run_device(const std::string& device, const Step07Options& options, const llm::LoadedModel& loaded,
                       const Scenarios& scenarios, const std::vector<int>& policy_ids, llm::RunProgress& progress) {
  // The reference (each request alone, through a contiguous cache) and the
  // engine's model run with the same precision.
  const auto baseline = llm::make_model_on(device, loaded.weights, llm::cuda_run_options(options.common));
  const auto model = make_engine_model(device, loaded.weights, options.common);
  step07::ServingLimits limits = options.limits;
  limits.weight_type = engine_weight_type(device, options.common);
  const auto& trace = scenarios.trace;
  progress.start(fmt::format("{}: the {} requests alone (the reference tokens)", device, trace.size()));
  const auto solo = step07::solo_outputs(*baseline, trace);
  DeviceParts parts;
  progress.start(fmt::format("{}: batch scaling, one forward of n decode rows", device));
  step07::BatchScalingOptions scaling = options.scaling;
  scaling.weight_type = limits.weight_type;
  parts.scaling = step07::measure_batch_scaling(device, *model, scaling);
  progress.start(fmt::format("{}: the trace under each policy", device));
  parts.policies = step07::compare_policies(device, *model, trace, solo, limits, policy_ids, options.repeats);
  // Loads are fractions of what continuous batching sustains offline, here.
  const step07::PolicyRun* continuous = step07::find_policy_run(parts.policies, step07::kContinuous);
  const step07::ServingMetrics offline =
      continuous != nullptr ? continuous->replay.metrics
                            : step07::replay(*model, trace,
                                             step07::engine_options_for(step07::policy(step07::kContinuous),
                                                                        limits, loaded.weights.config.seq_len))
                                  .metrics;
  progress.start(fmt::format("{}: rate sweep, Poisson arrivals at {} loads", device, options.sweep.load_factors.size()));
  parts.sweep = step07::sweep_rates(device, *model, trace, solo, limits, offline.requests_per_s, options.sweep);
  progress.start(fmt::format("{}: long prompts with and without chunked prefill", device));
  const auto long_prompts = step07::with_arrivals(
      scenarios.long_prompts, options.chunking.load_factor * offline.requests_per_s, options.chunking.seed);
  parts.chunked = step07::compare_chunk_sizes(device, *model, long_prompts,
                                              step07::solo_outputs(*baseline, long_prompts), limits,
                                              options.chunking);
  if (options.loopback) {
    progress.start(fmt::format("{}: the engine behind the HTTP server on loopback", device));
    parts.loopback = step07::serve_over_loopback(device, *model, loaded.name, trace, solo, limits,
                                                 offline.output_tokens_per_s);
  }
  progress.start(fmt::format("{}: a shared system prompt with the prefix cache off and on", device));
  const auto shared_system = step07::with_arrivals(
      scenarios.shared_system, options.prefix.load_factor * offline.requests_per_s, options.prefix.seed);
  parts.prefix = step07::compare_prefix_caching(device, *model, shared_system,
                                                step07::solo_outputs(*baseline, shared_system), limits,
                                                options.prefix);
  progress.start(fmt::format("{}: parallel sampling, n = {} forked and as separate requests", device,
                             fmt::join(options.sampling.samples, ", ")));
  const std::vector<int> sampling_solo = step07::solo_outputs(*baseline, {scenarios.sampling_prompt}).front();
  parts.sampling = step07::compare_parallel_sampling(device, *model, scenarios.sampling_prompt, sampling_solo,
                                                     limits, options.sampling);
  return parts;
}

// The checks that live outside the results rows: sweep points, chunk sizes, the served run.
bool other_checks_ok(const std::vector<DeviceParts>& devices) {
  for (const DeviceParts& parts : devices) {
    for (const auto& point : parts.sweep)
      if (!point.check.ok()) return false;
    for (const auto& row : parts.chunked)
      if (!row.check.ok()) return false;
    if (parts.loopback && (!parts.loopback->check.ok() || parts.loopback->load.failed > 0)) return false;
    for (const auto& row : parts.prefix)
      if (!row.check.ok()) return false;
  }
  return true;
}

void report(llm::Results& results, const step05::LengthSummary& lengths, int n_requests,
            const std::vector<DeviceParts>& devices, const step07::ChunkedPrefillOptions& chunking) {
  std::vector<step07::BatchScaling> scaling;
  std::vector<step07::PolicyRun> runs;
  std::vector<step07::RateSweepPoint> sweep;
  std::vector<step07::ChunkedPrefillRow> chunked;
  std::vector<step07::LoopbackRun> loopback;
  std::vector<step07::PrefixCachingRow> prefix;
  std::vector<step07::ParallelSamplingRow> sampling;
  for (const DeviceParts& parts : devices) {
    prefix.insert(prefix.end(), parts.prefix.begin(), parts.prefix.end());
    sampling.insert(sampling.end(), parts.sampling.begin(), parts.sampling.end());
    scaling.push_back(parts.scaling);
    runs.insert(runs.end(), parts.policies.begin(), parts.policies.end());
    sweep.insert(sweep.end(), parts.sweep.begin(), parts.sweep.end());
    chunked.insert(chunked.end(), parts.chunked.begin(), parts.chunked.end());
    if (parts.loopback) loopback.push_back(*parts.loopback);
  }
  step07::add_batch_scaling_rows(results, scaling);
  step07::add_trace_table(results, lengths, n_requests);
  step07::add_policy_rows(results, runs);
  step07::add_rate_sweep(results, sweep);
  step07::add_chunked_prefill(results, chunked);
  step07::add_loopback_rows(results, loopback);
  step07::add_prefix_caching(results, prefix);
  step07::add_parallel_sampling(results, sampling);
  fmt::print("{}\n", results.format_table());
  step07::print_batch_scaling(scaling);
  step07::print_trace(lengths);
  step07::print_policies(runs);
  step07::print_rate_sweep(sweep);
  step07::print_chunked_prefill(chunked, chunking);
  step07::print_loopback(loopback);
  step07::print_prefix_caching(prefix);
  step07::print_parallel_sampling(sampling);
}

// --serve PORT: continuous batching behind the OpenAI-compatible API until Ctrl-C.
int serve(const Step07Options& options, const llm::LoadedModel& loaded, const llm::DeviceSelection& devices) {
  const auto model = make_engine_model(devices.cuda ? "cuda" : "cpu", loaded.weights, options.common);
  step07::ServerOptions server_options;
  server_options.port = options.serve_port;
  server_options.engine =
      step07::engine_options_for(step07::policy(step07::kContinuous), options.limits, loaded.weights.config.seq_len);
  server_options.engine.prefix_caching = options.prefix_cache;
  const bool from_file = !options.common.model_path.empty();
  step07::CompletionServer server(*model, loaded.name, from_file ? &loaded.tokenizer : nullptr, server_options);
  step07::serve_until_signal(server);
  return 0;
}

// --load PORT: the trace against a running server (started with the same
// model and seed: prompts travel as token ids), timed by the client.
int load(const Step07Options& options, const std::vector<step07::Request>& trace) {
  const auto arriving = step07::with_arrivals(trace, options.load_rate, options.common.seed);
  step07::LoadOptions load_options;
  load_options.max_seconds = options.load_seconds;
  const step07::LoadResult result = step07::run_load("127.0.0.1", options.load_port, arriving, load_options);
  return step07::print_load(result, options.limits.max_sequences) ? 0 : 1;
}

int run_step07(int argc, char** argv) {
  Step07Options options;
  if (const auto exit_status = parse_options(argc, argv, options)) return *exit_status;
  apply_run_size(options);
  if (options.serve_port >= 0 && options.load_port >= 0)
    throw llm::InputError("--serve and --load are two modes: start the server with --serve PORT, then run the load "
                          "against it with --load PORT from a second process");
  const llm::DeviceSelection devices = llm::select_devices(options.common.device);
  const llm::LoadedModel loaded = llm::load_model(options.common);
  const int context = loaded.weights.config.seq_len;
  options.limits.kv_blocks = options.kv_contexts * step05::blocks_for_sequences(1, context, options.limits.block_size);
  options.scaling.seed = options.common.seed;
  const std::vector<int> policy_ids =
      llm::parse_variant_selection(options.common.variant, llm::variant_ids(step07::policies()));
  const step07::PromptSource prompts = prompt_source(options, loaded);
  const std::vector<step07::Request> trace = make_trace(options, loaded, prompts);
  if (options.serve_port >= 0) return serve(options, loaded, devices);
  if (options.load_port > 0) return load(options, trace);
  step07::check_parallel_sampling_options(options.sampling, options.limits.max_sequences, context);
  const Scenarios scenarios{trace, step07::with_long_prompts(trace, options.chunking, prompts, context),
                            step07::with_system_prompt(trace, options.prefix, prompts, context),
                            step07::parallel_sampling_request(options.sampling, prompts)};

  const std::vector<std::string> device_names = llm::selected_device_names(devices);
  llm::RunProgress progress("step07_batching", static_cast<int>(device_names.size()) * progress_parts(options));
  std::vector<DeviceParts> parts;
  for (const std::string& device : device_names)
    parts.push_back(run_device(device, options, loaded, scenarios, policy_ids, progress));

  llm::Results results = make_results(options, loaded, devices);
  report(results, lengths_of(trace, context), options.requests, parts, options.chunking);
  return llm::finish_run(results, options.common, devices, other_checks_ok(parts));
}

}  // namespace

int main(int argc, char** argv) { return llm::run_main(argc, argv, run_step07); }
