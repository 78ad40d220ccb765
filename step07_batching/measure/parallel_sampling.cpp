#include "step07_batching/measure/parallel_sampling.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"

namespace step07 {

void add_parallel_sampling_flags(CLI::App& app, ParallelSamplingOptions& options) {
  llm::in_range(app.add_option("--samples", options.samples,
                               "parallel sampling part: n, the completions of one prompt, e.g. 1,4,8 (each at most "
                               "--max-batch)")
                    ->delimiter(','),
                1, 1024)
      ->capture_default_str();
  llm::in_range(app.add_option("--sampling-prompt-tokens", options.prompt_tokens,
                               "parallel sampling part: the prompt's length in tokens"),
                1, 1 << 20)
      ->capture_default_str();
  llm::in_range(app.add_option("--sampling-max-tokens", options.max_tokens,
                               "parallel sampling part: tokens each sample generates at most"),
                1, 1 << 20)
      ->capture_default_str();
}

void apply_quick(ParallelSamplingOptions& options) {
  options.prompt_tokens = std::min(options.prompt_tokens, 60);  // ends inside a block of 16: the copies show
  options.max_tokens = std::min(options.max_tokens, 16);
}

void check_parallel_sampling_options(const ParallelSamplingOptions& options, int max_sequences, int context) {
  if (options.samples.empty()) throw llm::InputError("parallel sampling: --samples needs at least one n");
  for (const int n : options.samples)
    if (n < 1 || n > max_sequences)
      throw llm::InputError(fmt::format("parallel sampling: n = {} needs 1..{}, the largest batch (--max-batch): each "
                                        "sample runs in a cache slot of its own",
                                        n, max_sequences));
  if (options.prompt_tokens < 1 || options.max_tokens < 1)
    throw llm::InputError(fmt::format("parallel sampling: the prompt ({} tokens) and the tokens per sample ({}) must "
                                      "be at least 1",
                                      options.prompt_tokens, options.max_tokens));
  if (options.prompt_tokens + options.max_tokens - 1 > context)
    throw llm::InputError(fmt::format("parallel sampling: a {}-token prompt and {} tokens per sample need {} "
                                      "positions, more than the model's context of {} (--sampling-prompt-tokens, "
                                      "--sampling-max-tokens)",
                                      options.prompt_tokens, options.max_tokens,
                                      options.prompt_tokens + options.max_tokens - 1, context));
  if (options.repeats < 1)
    throw llm::InputError(fmt::format("parallel sampling: repeats must be at least 1 (got {})", options.repeats));
}

Request parallel_sampling_request(const ParallelSamplingOptions& options, const PromptSource& prompts) {
  Request request;
  request.prompt = prompts.prompt(options.prompt_tokens, options.seed);
  request.max_tokens = options.max_tokens;
  return request;
}

int predicted_peak_blocks(bool forked, int n, int prompt_tokens, int generated, int block_size) {
  const int positions = prompt_tokens + generated - 1;
  const int per_sample = (positions + block_size - 1) / block_size;
  if (!forked) return n * per_sample;
  const int shared = prompt_tokens / block_size;
  return shared + n * (per_sample - shared);
}

namespace {

// One run of a way's requests, all submitted at once, and what the part reports of it.
struct SamplingRun {
  std::vector<RequestRecord> records;  // [n] ordered by (id, sample)
  long long prefill_rows = 0;
  long long rows_computed = 0;
  int peak_blocks = 0;
  long long copy_on_write = 0;
  long long preemptions = 0;
  double wall_ms = 0.0;
  double prefill_ms = 0.0;  // the iterations that ran prefill rows
  double decode_ms = 0.0;   // the others
};

SamplingRun run_once(llm::Model& model, const std::vector<Request>& requests, const EngineOptions& options) {
  ServingClock clock;
  Engine engine(model, options, clock);  // the pool is allocated here, before the stopwatch starts
  SamplingRun run;
  // The peak is read in the token listener: it runs after a forward and
  // before any sample of that forward finishes, whereas the samples that
  // finish on the last forward give their blocks back before
  // IterationRecord::blocks_used is taken. (A read of the pool, which
  // changes nothing in the engine.)
  engine.set_token_listener([&](const TokenEvent&) {
    run.peak_blocks = std::max(run.peak_blocks, engine.cache().blocks().used_blocks());
  });
  const llm::Stopwatch stopwatch;
  for (const Request& request : requests) engine.submit(request);
  engine.run_until_idle();
  run.wall_ms = stopwatch.elapsed_ms();

  run.records = engine.take_finished();
  std::sort(run.records.begin(), run.records.end(), [](const RequestRecord& a, const RequestRecord& b) {
    return a.id != b.id ? a.id < b.id : a.sample < b.sample;
  });
  for (const IterationRecord& iteration : engine.iterations()) {
    run.prefill_rows += iteration.prefill_rows;
    run.rows_computed += iteration.prefill_rows + iteration.decode_rows;
    run.peak_blocks = std::max(run.peak_blocks, iteration.blocks_used);  // iterations that sampled no token
    (iteration.prefill_rows > 0 ? run.prefill_ms : run.decode_ms) += iteration.end_ms - iteration.start_ms;
  }
  run.copy_on_write = engine.cache().blocks().counters().copy_on_write;
  run.preemptions = engine.preemptions();
  return run;
}

// n completions of `request` with `sampling`: one request of n samples
// (forked), or n requests, ids 0..n-1, request j seeded seed + j as sample j
// of the forked one is (independent).
std::vector<Request> requests_for(const Request& request, int n, bool forked, const SamplingParams& sampling) {
  Request base = request;
  base.sampling = sampling;
  if (forked) {
    base.n = n;
    return {base};
  }
  std::vector<Request> requests;
  for (int j = 0; j < n; ++j) {
    Request copy = base;
    copy.id = j;
    copy.sampling.seed = sampling.seed + static_cast<std::uint64_t>(j);
    requests.push_back(std::move(copy));
  }
  return requests;
}

// Continuous batching under `limits`, the prefix cache off (the sharing
// measured is the fork's alone). The row budget holds n prompts, so the
// independent way's n prefills run in one forward: both ways then decode in
// lockstep and differ only in what the fork saves.
EngineOptions engine_options(const ServingLimits& limits, int context, int n, int prompt_tokens) {
  EngineOptions options = engine_options_for(policy(kContinuous), limits, context);
  options.prefix_caching = false;
  options.scheduler.token_budget = std::max(options.scheduler.token_budget, n * prompt_tokens);
  return options;
}

// The records numbered 0..n-1 as check_outputs reads them: a forked run's
// are request 0's samples 0..n-1, an independent run's requests 0..n-1 of
// one sample each, so id + sample is the index either way.
std::vector<RequestRecord> numbered_by_sample(std::vector<RequestRecord> records) {
  for (RequestRecord& record : records) record.id += record.sample;
  return records;
}

}  // namespace

std::vector<ParallelSamplingRow> compare_parallel_sampling(const std::string& device, llm::Model& model,
                                                           const Request& request, const std::vector<int>& solo,
                                                           const ServingLimits& limits,
                                                           const ParallelSamplingOptions& options) {
  const int context = model.config().seq_len;
  check_parallel_sampling_options(options, limits.max_sequences, context);
  const int prompt_tokens = static_cast<int>(request.prompt.size());
  const SamplingParams sampled{options.temperature, options.top_p, options.seed};

  // The sampled references: an n = 1 request seeded seed + j, alone, for
  // every j a row needs. These untimed runs also warm up (caches, the
  // allocator) before the timed ones.
  const int most_samples = *std::max_element(options.samples.begin(), options.samples.end());
  std::vector<std::vector<int>> alone;  // [most_samples] sample j's tokens
  for (int j = 0; j < most_samples; ++j) {
    SamplingParams seeded = sampled;
    seeded.seed += static_cast<std::uint64_t>(j);
    const SamplingRun run =
        run_once(model, requests_for(request, 1, true, seeded), engine_options(limits, context, 1, prompt_tokens));
    alone.push_back(run.records.front().generated);
  }

  std::vector<ParallelSamplingRow> rows;
  for (const int n : options.samples) {
    const EngineOptions engine = engine_options(limits, context, n, prompt_tokens);
    for (const bool forked : {true, false}) {
      ParallelSamplingRow row;
      row.device = device;
      row.n = n;
      row.forked = forked;
      row.prompt_tokens = prompt_tokens;
      row.generated = static_cast<int>(solo.size());
      row.block_size = limits.block_size;
      row.temperature = options.temperature;
      row.predicted_blocks = predicted_peak_blocks(forked, n, prompt_tokens, row.generated, limits.block_size);

      // Greedy, timed: every run schedules the same rows (the tokens are the
      // solo's every time), so the counters are every run's; the phase
      // times are the median run's.
      const std::vector<Request> greedy_requests = requests_for(request, n, forked, SamplingParams{});
      std::vector<SamplingRun> runs;  // [repeats]
      std::vector<double> wall_ms;    // [repeats]
      for (int i = 0; i < options.repeats; ++i) {
        runs.push_back(run_once(model, greedy_requests, engine));
        wall_ms.push_back(runs.back().wall_ms);
      }
      row.wall = llm::TimingStats::from_samples(wall_ms);
      std::sort(runs.begin(), runs.end(),
                [](const SamplingRun& a, const SamplingRun& b) { return a.wall_ms < b.wall_ms; });
      const SamplingRun& greedy = runs[runs.size() / 2];
      row.prefill_ms = greedy.prefill_ms;
      row.decode_ms = greedy.decode_ms;
      row.prefill_rows = greedy.prefill_rows;
      row.rows_computed = greedy.rows_computed;
      row.peak_blocks = greedy.peak_blocks;
      row.copy_on_write = greedy.copy_on_write;
      row.preemptions = greedy.preemptions;
      for (const RequestRecord& record : greedy.records)
        row.output_tokens += static_cast<long long>(record.generated.size());
      row.greedy = check_outputs(numbered_by_sample(greedy.records),
                                 std::vector<std::vector<int>>(static_cast<std::size_t>(n), solo));

      // Sampled, untimed: sample j (request j) against seed + j alone.
      const SamplingRun drawn = run_once(model, requests_for(request, n, forked, sampled), engine);
      row.sampled = check_outputs(numbered_by_sample(drawn.records),
                                  std::vector<std::vector<int>>(alone.begin(), alone.begin() + n));
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace step07
