#include "step07_batching/measure/parallel_sampling.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <utility>

#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/compare.hpp"
#include "llm/sampler.hpp"

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

// `logits`: when given, every token's logits row is kept, per sample
// numbered id + sample (the sampled check on a device that is not
// batch-invariant reads them).
SamplingRun run_once(llm::Model& model, const std::vector<Request>& requests, const EngineOptions& options,
                     LogitsBySample* logits = nullptr) {
  ServingClock clock;
  Engine engine(model, options, clock);  // the pool is allocated here, before the stopwatch starts
  SamplingRun run;
  // The peak is read in the token listener: it runs after a forward and
  // before any sample of that forward finishes, whereas the samples that
  // finish on the last forward give their blocks back before
  // IterationRecord::blocks_used is taken. (A read of the pool, which
  // changes nothing in the engine.)
  engine.set_token_listener([&](const TokenEvent& event) {
    run.peak_blocks = std::max(run.peak_blocks, engine.cache().blocks().used_blocks());
    if (logits == nullptr) return;
    const auto sample = static_cast<std::size_t>(event.request_id + event.sample);
    if (logits->size() <= sample) logits->resize(sample + 1);
    (*logits)[sample].insert((*logits)[sample].end(), event.logits.begin(), event.logits.end());
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

// Sample j's sampling parameters: its own stream, seed + j.
SamplingParams seeded(SamplingParams sampling, int sample) {
  sampling.seed += static_cast<std::uint64_t>(sample);
  return sampling;
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
    copy.sampling = seeded(sampling, j);
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

// check_sampled_outputs' verdict on a sample whose tokens `got` part from its
// alone run's `want` at token t (`got_logits`, `want_logits` their rows).
PartingVerdict judge_sampled_parting(const std::vector<int>& got, const std::vector<int>& want, std::size_t t,
                                     const std::vector<float>& got_logits, const std::vector<float>& want_logits,
                                     const SamplingParams& sampling, int vocab_size, llm::DType weight_type) {
  const auto vocab = static_cast<std::size_t>(vocab_size);
  if (got_logits.size() < (t + 1) * vocab || want_logits.size() < (t + 1) * vocab)
    return {false, " (no logits were kept for that token)"};
  const std::span<const float> got_row(got_logits.data() + t * vocab, vocab);
  const std::span<const float> want_row(want_logits.data() + t * vocab, vocab);
  const llm::CompareResult close = llm::compare(got_row, want_row, llm::same_rounding_logits_tolerance(weight_type));
  const char* type = llm::dtype_name(weight_type);
  if (!close.ok)
    return {false, fmt::format(": the two logits rows there are past the {} tolerance: {}", type, close.summary())};
  // The sampler takes one coin per token: replayed over the alone run's
  // earlier rows, it holds the coin both runs drew token t with.
  llm::Sampler replay(vocab_size, sampling.temperature, sampling.top_p, sampling.seed);
  for (std::size_t s = 0; s < t; ++s)
    if (replay.sample(std::span<const float>(want_logits.data() + s * vocab, vocab)) != want[s])
      return {false, fmt::format(": the sampler seeded {} does not replay the alone run's token {}", sampling.seed, s)};
  llm::Sampler replay_here = replay;  // the same state: the same coin
  const int alone_draw = replay.sample(want_row);
  const int here_draw = replay_here.sample(got_row);
  if (alone_draw != want[t] || here_draw != got[t])
    return {false, fmt::format(": the sampler seeded {} draws {} from the alone row and {} from this run's row",
                               sampling.seed, alone_draw, here_draw)};
  return {true, fmt::format(": the logits there agree within the {} tolerance (max_rel {:.2e}), and the same coin "
                            "draws each token from its own row",
                            type, close.max_rel_err)};
}

}  // namespace

OutputCheck check_sampled_outputs(const std::vector<RequestRecord>& records, const std::vector<std::vector<int>>& alone,
                                  const LogitsBySample& logits, const LogitsBySample& alone_logits,
                                  const SamplingParams& sampling, int vocab_size, bool exact,
                                  llm::DType weight_type) {
  const OutputCheck check = check_outputs(records, alone);
  if (exact) return check;
  static const std::vector<float> none;
  return judge_partings(check, records, alone, [&](const RequestRecord& record, int t) {
    const auto sample = static_cast<std::size_t>(record.id);
    return judge_sampled_parting(record.generated, alone.at(sample), static_cast<std::size_t>(t),
                                 sample < logits.size() ? logits[sample] : none,
                                 sample < alone_logits.size() ? alone_logits[sample] : none,
                                 seeded(sampling, record.id), vocab_size, weight_type);
  });
}

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
  // Where the device is not batch-invariant, every token's logits row too.
  const bool exact = batch_invariant(model);
  const int most_samples = *std::max_element(options.samples.begin(), options.samples.end());
  std::vector<std::vector<int>> alone;  // [most_samples] sample j's tokens
  LogitsBySample alone_logits;          // [most_samples][token * vocab + v], when !exact
  for (int j = 0; j < most_samples; ++j) {
    LogitsBySample logits;
    const SamplingRun run = run_once(model, requests_for(request, 1, true, seeded(sampled, j)),
                                     engine_options(limits, context, 1, prompt_tokens), exact ? nullptr : &logits);
    alone.push_back(run.records.front().generated);
    alone_logits.push_back(exact ? std::vector<float>{} : std::move(logits.at(0)));
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
      LogitsBySample drawn_logits;
      const SamplingRun drawn =
          run_once(model, requests_for(request, n, forked, sampled), engine, exact ? nullptr : &drawn_logits);
      row.sampled = check_sampled_outputs(numbered_by_sample(drawn.records),
                                          std::vector<std::vector<int>>(alone.begin(), alone.begin() + n),
                                          drawn_logits, alone_logits, sampled, model.config().vocab_size, exact,
                                          limits.weight_type);
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace step07
