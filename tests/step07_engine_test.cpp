// Step 07's engine on the CPU.
//   Outputs: greedy tokens under every serving policy equal each request's
//     solo tokens: under preemption and chunked prefill, with Poisson
//     arrivals, with blocks of 1 and 7 positions, on the tiny preset and on
//     stories260K with the tokenizer's prompts. Sampled tokens (temperature
//     > 0, a seed per request) do not depend on the batch either.
//   Runs the test drives itself (requests joining mid-run, a pool of one
//     full context), one per policy: no block leaks, every request finishes
//     once, records and finish reasons are right, the token listener sees
//     every token, the iteration records count decode and prefill rows.
//   Errors: each bad request or option is an InputError that changes
//     nothing; cancel frees a waiting or running request's blocks.
//   Prefix caching: greedy tokens identical with the cache on and off under
//     every policy (shared system prompts, preemption, chunked prefill); the
//     hit counters of a hand-made pair of requests; cancelling and preempting
//     requests that share blocks keeps the block manager consistent and
//     leaks nothing.
//   Parallel sampling (n > 1): one prefill for n samples, which share the
//     prompt's blocks and copy only the last one; sample j draws what an
//     n = 1 request with seed + j draws; greedy samples equal the solo
//     tokens, under preemption too; cancel ends every sample, stop_sample
//     one; n outside the slots is refused; log-probabilities of the sampled
//     distribution, on their own and through the listener.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/config.hpp"
#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/sampler.hpp"
#include "llm/tokenizer.hpp"
#include "llm/weights.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step07_batching/engine.hpp"
#include "step07_batching/policies.hpp"
#include "step07_batching/measure/prefix_caching.hpp"
#include "step07_batching/measure/replay.hpp"
#include "step07_batching/serving_clock.hpp"
#include "step07_batching/measure/workload.hpp"
#include "step07_serving_checks.hpp"
#include "test_support.hpp"

namespace step07 {
namespace {

using testing::expect_every_policy_exact;
using testing::small_workload;
using testing::tight_limits;

constexpr int kEndToken = llm::Tokenizer::kBos;  // the engine stops on BOS, as run.c

llm::ModelWeights tiny_weights() { return llm::random_weights(llm::find_preset("tiny").config, 7); }

// The tiny preset's random weights never generate the end token on the
// trace; scaling its embedding row (the shared classifier's row) by 3 makes
// it the argmax now and then, so about a third of the requests stop early.
llm::ModelWeights tiny_weights_that_stop() {
  llm::ModelWeights weights = tiny_weights();
  const auto dim = static_cast<std::size_t>(weights.config.dim);
  for (std::size_t i = 0; i < dim; ++i) weights.token_embedding[kEndToken * dim + i] *= 3.0f;
  return weights;
}

// The policy of that name in the table (a renamed policy fails here, loudly).
const ServingPolicy& policy_named(const std::string& name) {
  for (const auto& policy : policies())
    if (policy.name == name) return policy.fn;
  throw std::logic_error("no serving policy named " + name);
}

// Every request's record, by id (finishing order is the engine's business).
std::vector<RequestRecord> by_id(std::vector<RequestRecord> records) {
  std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return records;
}

// ---------------------------------------------------------------------------
// Outputs equal the solo outputs.

TEST(Step07Engine, EveryPolicyMatchesSoloOnTinyPreset) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const auto requests = small_workload(weights.config, 40, 3);
  expect_every_policy_exact(*model, requests, solo_outputs(*model, requests), tight_limits(weights.config), true);
}

// Requests arrive as a Poisson process (on the serving clock) and join the
// batch while others run: the outputs do not change.
TEST(Step07Engine, EveryPolicyMatchesSoloWithPoissonArrivals) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const auto requests = with_arrivals(small_workload(weights.config, 30, 5), 400.0, 5);
  ASSERT_GT(requests.back().arrival_ms, 0.0);
  expect_every_policy_exact(*model, requests, solo_outputs(*model, requests), tight_limits(weights.config), false);
}

// Blocks of one position (a table lookup per key: the slowest, so half the
// trace, outputs capped at 128 tokens) and of 7 (a block boundary inside
// every tile of 16 keys). Under the sanitizers, where this was the tier's
// longest test, the blocks of 7 take half the trace; the blocks of one keep
// their 12 requests (half of those never ran out of KV blocks), so every
// check, preemption included, stays.
TEST(Step07Engine, EveryPolicyMatchesSoloWithBlocksOf1And7) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const int n_requests = llm::testing::kSanitizerBuild ? 12 : 24;
  std::vector<Request> requests = small_workload(weights.config, n_requests, 11);
  expect_every_policy_exact(*model, requests, solo_outputs(*model, requests), tight_limits(weights.config, 7), true);
  requests.resize(12);
  for (Request& request : requests) request.max_tokens = std::min(request.max_tokens, 128);
  expect_every_policy_exact(*model, requests, solo_outputs(*model, requests), tight_limits(weights.config, 1), true);
}

// The real model, with prompts cut from the tokenizer's encoding of text.
TEST(Step07Engine, EveryPolicyMatchesSoloOnStories260K) {
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  LLM_REQUIRE_MODEL_FILE(tokenizer_path, "tok512.bin");
  const llm::ModelWeights weights = llm::load_checkpoint(model_path);
  const llm::Tokenizer tokenizer = llm::Tokenizer::load(tokenizer_path, weights.config.vocab_size);
  auto model = step05::make_paged_model_on("cpu", weights);
  const auto requests = small_workload(weights.config, 30, 17, &tokenizer);
  expect_every_policy_exact(*model, requests, solo_outputs(*model, requests), tight_limits(weights.config), true);
}

// Sampling: each request owns its sampler stream, so a seeded request
// samples the same tokens alone (one at a time) as in a busy batch that
// preempts it and recomputes it. The control: other seeds sample otherwise.
TEST(Step07Engine, SampledTokensDoNotDependOnTheBatch) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  std::vector<Request> requests = small_workload(weights.config, 24, 23);
  for (Request& request : requests) request.sampling = {0.9f, 0.9f, 1000u + static_cast<std::uint64_t>(request.id)};
  const ServingLimits limits = tight_limits(weights.config);
  const auto tokens_of = [](const ReplayResult& run) {
    std::vector<std::vector<int>> tokens;
    for (const RequestRecord& record : run.records) tokens.push_back(record.generated);
    return tokens;
  };
  const int context = weights.config.seq_len;
  const auto alone =
      tokens_of(replay(*model, requests, engine_options_for(policy_named("one_at_a_time"), limits, context)));
  long long preemptions = 0;
  for (const char* busy : {"continuous", "continuous_chunked"}) {
    const ReplayResult run = replay(*model, requests, engine_options_for(policy_named(busy), limits, context));
    EXPECT_EQ(tokens_of(run), alone) << busy;
    preemptions += run.metrics.preemptions;
  }
  EXPECT_GT(preemptions, 0) << "nothing was preempted: recompute under sampling went untested";

  // Not greedy, and the seed matters.
  EXPECT_NE(alone, solo_outputs(*model, requests)) << "temperature 0.9 sampled the greedy tokens";
  for (Request& request : requests) request.sampling.seed += 7;
  EXPECT_NE(tokens_of(replay(*model, requests, engine_options_for(policy_named("continuous"), limits, context))), alone)
      << "other seeds sampled the same tokens";
}

// ---------------------------------------------------------------------------
// Runs the test drives itself: requests submitted a few per iteration (so
// they join a running batch), the token listener recording every event.

struct DrivenRun {
  std::vector<RequestRecord> records;  // by id
  std::vector<TokenEvent> events;      // in the order the listener saw them
  std::vector<IterationRecord> iterations;
  long long preemptions = 0;
  long long rows = 0;   // step()'s return values, summed
  int blocks_used = 0;  // after the last step
  int pool_blocks = 0;
  int running = 0;  // after the last step
  int waiting = 0;
};

DrivenRun drive(llm::Model& model, const std::vector<Request>& requests, const EngineOptions& options,
                std::size_t per_step) {
  ServingClock clock;
  Engine engine(model, options, clock);
  DrivenRun run;
  engine.set_token_listener([&](const TokenEvent& event) { run.events.push_back(event); });
  std::size_t next = 0;
  while (next < requests.size() || engine.has_work()) {
    for (std::size_t k = 0; k < per_step && next < requests.size(); ++k) {
      Request request = requests[next++];
      request.arrival_ms = clock.now_ms();
      engine.submit(std::move(request));
    }
    run.rows += engine.step();
  }
  run.records = by_id(engine.take_finished());
  run.iterations = engine.iterations();
  run.preemptions = engine.preemptions();
  run.blocks_used = engine.cache().blocks().used_blocks();
  run.pool_blocks = engine.cache().blocks().n_blocks();
  run.running = engine.running();
  run.waiting = engine.waiting();
  return run;
}

// Joining mid-run changes no output.
void expect_outputs_match_solo(const DrivenRun& run, const std::vector<std::vector<int>>& solo) {
  const OutputCheck check = check_outputs(run.records, solo);
  EXPECT_TRUE(check.ok()) << check.first_difference;
}

// Every block comes back: none held at the end, and never more than the pool.
void expect_no_block_leak(const DrivenRun& run) {
  EXPECT_EQ(run.blocks_used, 0) << "blocks held after the last request finished";
  EXPECT_EQ(run.running, 0);
  EXPECT_EQ(run.waiting, 0);
  int peak = 0;
  for (const IterationRecord& iteration : run.iterations) peak = std::max(peak, iteration.blocks_used);
  EXPECT_LE(peak, run.pool_blocks);
  EXPECT_GT(peak, 0);
}

// The occupancy timeline adds up: each iteration's decode and prefill rows
// are the rows it ran, and every token comes out of a decode row except the
// first of each request and the first after each recompute (a prompt's last
// chunk of one row counts as a decode row, so those bound it from below).
void expect_iterations_consistent(const DrivenRun& run) {
  long long decode = 0;
  long long prefill = 0;
  for (const IterationRecord& iteration : run.iterations) {
    EXPECT_GE(iteration.decode_rows, 0);
    EXPECT_LE(iteration.decode_rows, iteration.sequences);
    decode += iteration.decode_rows;
    prefill += iteration.prefill_rows;
  }
  EXPECT_EQ(decode + prefill, run.rows);
  long long tokens = 0;
  for (const RequestRecord& record : run.records) tokens += static_cast<long long>(record.generated.size());
  const auto requests = static_cast<long long>(run.records.size());
  EXPECT_LE(decode, tokens);
  EXPECT_GE(decode, tokens - requests - run.preemptions)
      << "decode rows counted as prefill rows (" << decode << " decode, " << prefill << " prefill rows for " << tokens
      << " tokens)";
}

// Each request finishes exactly once, with a consistent record: a time per
// token, never decreasing; TTFT >= 0; Stop exactly when the last token is
// the end token (and no earlier token is), Length exactly when max_tokens
// came out without it; the preemptions add up to the engine's.
void expect_records_consistent(const DrivenRun& run, const std::vector<Request>& requests) {
  ASSERT_EQ(run.records.size(), requests.size()) << "a request finished twice or never";
  int stops = 0;
  int lengths = 0;
  long long preemptions = 0;
  for (std::size_t i = 0; i < run.records.size(); ++i) {
    const RequestRecord& record = run.records[i];
    const Request& request = requests[i];
    ASSERT_EQ(record.id, request.id) << "the finished ids are not each submitted id once";
    SCOPED_TRACE("request " + std::to_string(record.id));
    EXPECT_EQ(record.prompt_length, static_cast<int>(request.prompt.size()));
    ASSERT_FALSE(record.generated.empty());
    ASSERT_EQ(record.token_ms.size(), record.generated.size());
    EXPECT_TRUE(std::is_sorted(record.token_ms.begin(), record.token_ms.end()));
    EXPECT_GE(record.ttft_ms(), 0.0);
    EXPECT_GE(record.first_scheduled_ms, record.arrival_ms);
    EXPECT_LE(record.first_scheduled_ms, record.token_ms.front());
    EXPECT_GE(record.finish_ms, record.token_ms.back());
    EXPECT_GE(record.tpot_ms(), 0.0);
    EXPECT_LE(static_cast<int>(record.generated.size()), request.max_tokens);
    const bool ended = record.generated.back() == kEndToken;
    EXPECT_EQ(std::count(record.generated.begin(), record.generated.end(), kEndToken), ended ? 1 : 0)
        << "tokens came after the end token";
    if (ended) {
      EXPECT_EQ(record.finish, FinishReason::Stop);
      ++stops;
    } else {
      EXPECT_EQ(record.finish, FinishReason::Length);
      EXPECT_EQ(static_cast<int>(record.generated.size()), request.max_tokens);
      ++lengths;
    }
    preemptions += record.preemptions;
  }
  EXPECT_EQ(preemptions, run.preemptions);
  EXPECT_GT(stops, 0) << "no request generated the end token: Stop went untested";
  EXPECT_GT(lengths, 0);
}

// The listener sees each record's tokens, in order, indexed from 0, with
// the record's times, and the finish reason on the last token only.
void expect_listener_saw_every_token(const DrivenRun& run) {
  std::map<int, std::vector<TokenEvent>> streams;  // request id -> its events, in order
  for (const TokenEvent& event : run.events) streams[event.request_id].push_back(event);
  ASSERT_EQ(streams.size(), run.records.size());
  for (const RequestRecord& record : run.records) {
    const std::vector<TokenEvent>& stream = streams[record.id];
    ASSERT_EQ(stream.size(), record.generated.size()) << "request " << record.id;
    for (std::size_t i = 0; i < stream.size(); ++i) {
      EXPECT_EQ(stream[i].token, record.generated[i]) << "request " << record.id << " token " << i;
      EXPECT_EQ(stream[i].index, static_cast<int>(i)) << "request " << record.id;
      EXPECT_EQ(stream[i].time_ms, record.token_ms[i]) << "request " << record.id;
      const FinishReason expected = i + 1 == stream.size() ? record.finish : FinishReason::None;
      EXPECT_EQ(stream[i].finish, expected) << "request " << record.id << " token " << i;
    }
  }
}

// One driven run per policy: weights whose end token comes up now and then
// (so both finish reasons occur), 32 requests submitted 3 per iteration, a
// pool of one full context for 8 slots (every policy but one at a time
// preempts). The run's books balance: outputs, blocks, records, stream,
// iterations.
class Step07EngineRun : public ::testing::TestWithParam<int> {};

TEST_P(Step07EngineRun, KeepsItsBooks) {
  const auto& policy = policies()[static_cast<std::size_t>(GetParam())];
  const llm::ModelWeights weights = tiny_weights_that_stop();
  auto model = step05::make_paged_model_on("cpu", weights);
  const auto requests = small_workload(weights.config, 32, 29);
  const auto options = engine_options_for(policy.fn, tight_limits(weights.config), weights.config.seq_len);
  const DrivenRun run = drive(*model, requests, options, 3);
  if (options.scheduler.max_sequences > 1) EXPECT_GT(run.preemptions, 0) << "the pool never ran out";
  {
    SCOPED_TRACE("outputs equal the solo outputs");
    expect_outputs_match_solo(run, solo_outputs(*model, requests));
  }
  {
    SCOPED_TRACE("no block leaks");
    expect_no_block_leak(run);
  }
  {
    SCOPED_TRACE("records");
    expect_records_consistent(run, requests);
  }
  {
    SCOPED_TRACE("token listener");
    expect_listener_saw_every_token(run);
  }
  {
    SCOPED_TRACE("iteration records");
    expect_iterations_consistent(run);
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, Step07EngineRun, ::testing::Range(0, static_cast<int>(policies().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return policies()[static_cast<std::size_t>(info.param)].name;
                         });

// ---------------------------------------------------------------------------
// Errors and cancellation.

// A request of `length` prompt tokens (BOS, then ids 3..) and `max_tokens`.
Request request_of(int id, int length, int max_tokens) {
  Request request;
  request.id = id;
  request.prompt.push_back(llm::Tokenizer::kBos);
  for (int i = 1; i < length; ++i) request.prompt.push_back(3 + (id * 31 + i * 7) % 200);
  request.max_tokens = max_tokens;
  return request;
}

EngineOptions continuous_options(const llm::ModelConfig& config, int max_sequences) {
  ServingLimits limits;
  limits.max_sequences = max_sequences;
  return engine_options_for(policy_named("continuous"), limits, config.seq_len);
}

// Each bad request is an InputError that leaves the engine as it was: the
// queues hold the same requests, which then finish with their solo tokens.
// The controls: requests that end exactly at the context (a long output, and
// a prompt of the whole context) are accepted and served, and a finished
// request's id may be used again.
TEST(Step07Engine, BadRequestsAreInputErrorsThatChangeNothing) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const int context = weights.config.seq_len;
  const int vocab = weights.config.vocab_size;
  ServingClock clock;
  Engine engine(*model, continuous_options(weights.config, 1), clock);
  const std::vector<Request> good = {request_of(0, 12, 20), request_of(1, 9, 15), request_of(2, 10, context - 10 + 1),
                                     request_of(3, context, 1)};
  // 0 runs (the one slot); 1, 2 and 3 wait.
  engine.submit(good[0]);
  engine.step();
  for (std::size_t i = 1; i < good.size(); ++i) engine.submit(good[i]);
  ASSERT_EQ(engine.running(), 1);
  ASSERT_EQ(engine.waiting(), 3);

  std::vector<std::pair<std::string, Request>> bad;
  bad.emplace_back("empty prompt", request_of(10, 1, 5));
  bad.back().second.prompt.clear();
  bad.emplace_back("negative token id", request_of(11, 6, 5));
  bad.back().second.prompt[3] = -1;
  bad.emplace_back("token id == vocab", request_of(12, 6, 5));
  bad.back().second.prompt[5] = vocab;
  bad.emplace_back("max_tokens 0", request_of(13, 6, 0));
  bad.emplace_back("max_tokens < 0", request_of(14, 6, -4));
  bad.emplace_back("one position past the context", request_of(15, 10, context - 10 + 2));
  bad.emplace_back("max_tokens INT_MAX", request_of(19, 10, std::numeric_limits<int>::max()));
  bad.emplace_back("prompt longer than the context", request_of(16, context + 1, 1));
  bad.emplace_back("running id", request_of(0, 5, 5));
  bad.emplace_back("waiting id", request_of(2, 5, 5));
  bad.emplace_back("negative temperature", request_of(17, 6, 5));
  bad.back().second.sampling.temperature = -0.5f;
  bad.emplace_back("NaN temperature", request_of(18, 6, 5));
  bad.back().second.sampling.temperature = std::nanf("");
  for (const auto& [what, request] : bad) {
    EXPECT_THROW(engine.submit(request), llm::InputError) << what;
    EXPECT_EQ(engine.running(), 1) << what;
    EXPECT_EQ(engine.waiting(), 3) << what;
    EXPECT_TRUE(engine.finished().empty()) << what;
  }
  EXPECT_FALSE(engine.cancel(99)) << "cancel of an id never submitted";
  EXPECT_EQ(engine.waiting(), 3);

  engine.run_until_idle();
  const auto records = by_id(engine.take_finished());
  const OutputCheck check = check_outputs(records, solo_outputs(*model, good));
  EXPECT_TRUE(check.ok()) << check.first_difference;
  EXPECT_EQ(engine.cache().blocks().used_blocks(), 0);
  EXPECT_FALSE(engine.cancel(0)) << "cancel of a finished request";

  engine.submit(good[0]);  // id 0 is free again
  engine.run_until_idle();
  ASSERT_EQ(engine.finished().size(), 1u);
  EXPECT_EQ(engine.finished()[0].generated, records[0].generated);
}

// The KV pool must hold one full context (the oldest request can always run
// alone); bad scheduler options are InputErrors too. The control: exactly
// one full context is accepted.
TEST(Step07Engine, ConstructorRejectsBadOptions) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const ServingClock clock;
  for (const int block_size : {1, 7, 16}) {
    EngineOptions options = continuous_options(weights.config, 4);
    options.block_size = block_size;
    const int full_context = (weights.config.seq_len + block_size - 1) / block_size;
    options.n_blocks = full_context - 1;
    EXPECT_THROW(Engine(*model, options, clock), llm::InputError) << "block size " << block_size;
    options.n_blocks = full_context;
    EXPECT_NO_THROW(Engine(*model, options, clock)) << "block size " << block_size;
  }
  EngineOptions no_slots = continuous_options(weights.config, 4);
  no_slots.scheduler.max_sequences = 0;
  EXPECT_THROW(Engine(*model, no_slots, clock), llm::InputError);
  EngineOptions no_block_size = continuous_options(weights.config, 4);
  no_block_size.block_size = 0;
  EXPECT_THROW(Engine(*model, no_block_size, clock), llm::InputError);
}

// The occupancy timeline by hand: a prompt of 5 tokens and 4 tokens out is
// one iteration of 5 prefill rows, then 3 of one decode row each.
TEST(Step07Engine, IterationRecordsCountDecodeAndPrefillRows) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  ServingClock clock;
  Engine engine(*model, continuous_options(weights.config, 2), clock);
  engine.submit(request_of(0, 5, 4));
  engine.run_until_idle();
  ASSERT_EQ(engine.finished().size(), 1u);
  ASSERT_EQ(engine.finished()[0].generated.size(), 4u);
  const auto& iterations = engine.iterations();
  ASSERT_EQ(iterations.size(), 4u);
  for (std::size_t i = 0; i < iterations.size(); ++i) {
    SCOPED_TRACE("iteration " + std::to_string(i));
    EXPECT_EQ(iterations[i].sequences, 1);
    EXPECT_EQ(iterations[i].decode_rows, i == 0 ? 0 : 1);
    EXPECT_EQ(iterations[i].prefill_rows, i == 0 ? 5 : 0);
    EXPECT_EQ(iterations[i].waiting, 0);
    EXPECT_EQ(iterations[i].preempted, 0);
    EXPECT_EQ(iterations[i].blocks_used, i + 1 == iterations.size() ? 0 : 1);  // the last one finished it
  }
}

// Cancel mid-run, one waiting request and one running: true once (false
// after), the running one's blocks go back at once, both records finish as
// Cancelled (the running one with the tokens it had), nothing is held at
// the end, and the others still finish with their solo tokens.
TEST(Step07Engine, CancelFreesEveryBlock) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  std::vector<Request> requests;
  for (int id = 0; id < 8; ++id) requests.push_back(request_of(id, 20 + 5 * id, 40));
  const auto solo = solo_outputs(*model, requests);
  ServingClock clock;
  Engine engine(*model, continuous_options(weights.config, 3), clock);
  std::map<int, int> tokens_seen;  // request id -> tokens the listener saw
  engine.set_token_listener([&](const TokenEvent& event) { ++tokens_seen[event.request_id]; });
  for (const Request& request : requests) engine.submit(request);
  for (int i = 0; i < 5; ++i) engine.step();
  ASSERT_EQ(engine.running(), 3);  // 0, 1, 2 (40 tokens each: none done)
  ASSERT_EQ(engine.waiting(), 5);
  ASSERT_EQ(tokens_seen[1], 5);
  ASSERT_EQ(tokens_seen.count(6), 0u);

  const int used_before = engine.cache().blocks().used_blocks();
  EXPECT_TRUE(engine.cancel(1));  // running: positions 0..28 of 16-position blocks
  EXPECT_EQ(engine.cache().blocks().used_blocks(), used_before - 2);
  EXPECT_EQ(engine.running(), 2);
  EXPECT_TRUE(engine.cancel(6));  // waiting
  EXPECT_EQ(engine.waiting(), 4);
  EXPECT_FALSE(engine.cancel(1));
  EXPECT_FALSE(engine.cancel(6));

  engine.run_until_idle();
  EXPECT_EQ(engine.cache().blocks().used_blocks(), 0);
  const auto records = by_id(engine.take_finished());
  ASSERT_EQ(records.size(), requests.size());
  for (const RequestRecord& record : records) {
    SCOPED_TRACE("request " + std::to_string(record.id));
    const auto& expected = solo[static_cast<std::size_t>(record.id)];
    if (record.id == 1) {
      EXPECT_EQ(record.finish, FinishReason::Cancelled);
      EXPECT_EQ(record.generated, std::vector<int>(expected.begin(), expected.begin() + 5));
    } else if (record.id == 6) {
      EXPECT_EQ(record.finish, FinishReason::Cancelled);
      EXPECT_TRUE(record.generated.empty());
    } else {
      EXPECT_EQ(record.finish, FinishReason::Length);
      EXPECT_EQ(record.generated, expected);
    }
  }
}

// ---------------------------------------------------------------------------
// Prefix caching.

// The trace behind a shared system prompt of half the context.
std::vector<Request> shared_system_workload(const llm::ModelConfig& config, int n_requests, std::uint64_t seed) {
  const PromptSource prompts(nullptr, config.vocab_size, seed);
  return with_system_prompt(small_workload(config, n_requests, seed), PrefixCachingOptions{}, prompts, config.seq_len);
}

// Every policy, the cache off then on, in a pool of one full context: the
// same tokens as alone; with the cache on, blocks are hit and requests are
// preempted (so a recompute meets its own published blocks).
TEST(Step07EnginePrefixCaching, TokensAreIdenticalWithTheCacheOnAndOff) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const int n_requests = llm::testing::kSanitizerBuild ? 12 : 24;  // half under the sanitizers
  const auto requests = with_arrivals(shared_system_workload(weights.config, n_requests, 21), 300.0, 21);
  const auto solo = solo_outputs(*model, requests);
  long long hits = 0, preemptions = 0;
  for (const auto& policy : policies()) {
    for (const bool prefix_caching : {false, true}) {
      EngineOptions options = engine_options_for(policy.fn, tight_limits(weights.config), weights.config.seq_len);
      options.prefix_caching = prefix_caching;
      const ReplayResult run = replay(*model, requests, options);
      const OutputCheck check = check_outputs(run.records, solo);
      EXPECT_TRUE(check.ok()) << policy.name << ", prefix caching " << prefix_caching << ": "
                              << check.first_difference;
      if (!prefix_caching) {
        EXPECT_EQ(run.blocks.prefix_hit_blocks, 0) << policy.name;
        continue;
      }
      hits += run.blocks.prefix_hit_blocks;
      preemptions += run.metrics.preemptions;
      EXPECT_GT(run.blocks.prefix_hit_blocks, 0) << policy.name << ": the shared system prompt never hit";
    }
  }
  EXPECT_GT(preemptions, 0) << "the KV budget never ran out with the cache on: preemption went untested";
  std::cout << "[ info     ] " << hits << " blocks hit, " << preemptions << " preemptions with the cache on\n";
}

// Two requests with the same first 32 tokens (two blocks of 16), one after
// the other: the second shares both blocks and computes only its last 8
// rows; the counters say so, and both finish with their solo tokens.
TEST(Step07EnginePrefixCaching, ASecondRequestSharesTheFirstOnesBlocks) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  Request first = request_of(0, 40, 6);
  Request second = request_of(1, 40, 6);
  std::copy(first.prompt.begin(), first.prompt.begin() + 32, second.prompt.begin());
  const auto solo = solo_outputs(*model, {first, second});
  ServingClock clock;
  EngineOptions options = continuous_options(weights.config, 4);
  options.prefix_caching = true;
  Engine engine(*model, options, clock);
  engine.submit(first);
  engine.run_until_idle();
  const step05::BlockManager& blocks = engine.cache().blocks();
  EXPECT_EQ(blocks.counters().prefix_hit_blocks, 0);
  EXPECT_EQ(blocks.evictable_blocks(), 2) << "the first request's two full blocks stay cached";
  engine.submit(second);
  engine.step();
  EXPECT_EQ(engine.iterations().back().prefill_rows, 8) << "only the rows past the shared 32 run";
  engine.run_until_idle();
  EXPECT_EQ(blocks.counters().prefix_queries, 2);
  EXPECT_EQ(blocks.counters().prefix_queried_blocks, 4);  // 39 positions each may share: 2 blocks
  EXPECT_EQ(blocks.counters().prefix_hit_blocks, 2);
  EXPECT_EQ(blocks.used_blocks(), 0);
  blocks.check_invariants();
  const auto records = by_id(engine.take_finished());
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].generated, solo[0]);
  EXPECT_EQ(records[1].generated, solo[1]);
}

// Requests sharing a system prompt in a pool of one full context: the
// engine is stepped by hand, a running request that shares blocks is
// cancelled mid-run and others are preempted; the block manager's
// invariants hold after every step, and every block comes back.
TEST(Step07EnginePrefixCaching, CancelAndPreemptionOfSharedBlocksLeakNothing) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const auto requests = shared_system_workload(weights.config, 16, 33);
  const auto solo = solo_outputs(*model, requests);
  ServingClock clock;
  EngineOptions options =
      engine_options_for(policy_named("continuous_chunked"), tight_limits(weights.config), weights.config.seq_len);
  options.prefix_caching = true;
  Engine engine(*model, options, clock);
  for (const Request& request : requests) engine.submit(request);
  const step05::BlockManager& blocks = engine.cache().blocks();
  int cancelled = -1;
  while (engine.has_work()) {
    engine.step();
    ASSERT_NO_THROW(blocks.check_invariants());
    // Once a request runs on shared blocks, the newest running one goes.
    if (cancelled < 0 && blocks.counters().prefix_hit_blocks > 0 && engine.running() >= 2) {
      for (int id = static_cast<int>(requests.size()) - 1; id >= 0 && cancelled < 0; --id) {
        const bool finished = std::any_of(engine.finished().begin(), engine.finished().end(),
                                          [&](const RequestRecord& record) { return record.id == id; });
        if (!finished && engine.cancel(id)) cancelled = id;
      }
      ASSERT_NO_THROW(blocks.check_invariants());
    }
  }
  EXPECT_GE(cancelled, 0) << "no request was cancelled while sharing blocks";
  EXPECT_GT(engine.preemptions(), 0) << "nothing was preempted: the pool never ran short";
  EXPECT_EQ(blocks.used_blocks(), 0) << "blocks leaked";
  const auto records = by_id(engine.take_finished());
  ASSERT_EQ(records.size(), requests.size());
  for (const RequestRecord& record : records)
    if (record.id != cancelled) EXPECT_EQ(record.generated, solo[static_cast<std::size_t>(record.id)]) << record.id;
}

// ---------------------------------------------------------------------------
// Parallel sampling: n samples of one prompt.

// One request alone in an engine of 8 slots (prefix caching off: sharing
// comes from the fork alone); every sample's record in sample order.
struct SampledRun {
  std::vector<RequestRecord> records;  // [n] by sample
  std::vector<TokenEvent> events;
  long long prefill_rows = 0;          // every iteration's, summed
  long long forward_rows = 0;          // step()'s return values, summed
  int peak_blocks = 0;
  long long copy_on_write = 0;         // the block manager's copies
  int blocks_used_after = -1;
};

SampledRun run_alone(llm::Model& model, const Request& request, int n_blocks = 0) {
  ServingClock clock;
  EngineOptions options;
  options.scheduler.max_sequences = 8;
  options.n_blocks = n_blocks;
  Engine engine(model, options, clock);
  SampledRun run;
  engine.set_token_listener([&](const TokenEvent& event) { run.events.push_back(event); });
  engine.submit(request);
  while (engine.has_work()) run.forward_rows += engine.step();
  run.records = engine.take_finished();
  std::sort(run.records.begin(), run.records.end(), [](const auto& a, const auto& b) { return a.sample < b.sample; });
  for (const IterationRecord& iteration : engine.iterations()) {
    run.prefill_rows += iteration.prefill_rows;
    run.peak_blocks = std::max(run.peak_blocks, iteration.blocks_used);
  }
  run.copy_on_write = engine.cache().blocks().counters().copy_on_write;
  run.blocks_used_after = engine.cache().blocks().used_blocks();
  engine.cache().blocks().check_invariants();
  return run;
}

Request sampled_request(const llm::ModelConfig& config, int prompt_length, int max_tokens, int n, std::uint64_t seed) {
  Request request = small_workload(config, 1, 41).front();
  request.prompt.resize(static_cast<std::size_t>(prompt_length), 5);  // a prompt of exactly prompt_length
  request.max_tokens = max_tokens;
  request.n = n;
  request.sampling = {0.9f, 0.9f, seed};
  return request;
}

// A prompt of 40 positions in blocks of 16: two full blocks and one with 8
// positions. Four samples share all three; each sample's first write (its
// first token's K/V, at position 40) copies the partial block, three copies
// in all (the last holder writes in place), and each grows its own blocks
// past it. One prefill: the prompt's 40 rows run once, and no other row
// but the samples' decode rows.
TEST(Step07EngineParallelSampling, NSamplesCostOnePrefillAndShareThePromptsBlocks) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const int prompt = 40;
  const int max_tokens = 20;  // 59 positions: 4 blocks for one sample
  const SampledRun one = run_alone(*model, sampled_request(weights.config, prompt, max_tokens, 1, 100));
  const SampledRun four = run_alone(*model, sampled_request(weights.config, prompt, max_tokens, 4, 100));

  ASSERT_EQ(four.records.size(), 4u);
  for (int sample = 0; sample < 4; ++sample) {
    EXPECT_EQ(four.records[static_cast<std::size_t>(sample)].sample, sample);
    EXPECT_EQ(four.records[static_cast<std::size_t>(sample)].generated.size(), static_cast<std::size_t>(max_tokens));
  }
  EXPECT_EQ(one.prefill_rows, prompt);
  EXPECT_EQ(four.prefill_rows, prompt) << "the prompt was prefilled more than once";
  EXPECT_EQ(four.forward_rows, prompt + 4 * (max_tokens - 1)) << "a sample ran a row beyond its decode rows";
  EXPECT_EQ(one.peak_blocks, 4);
  // Shared: blocks 0 and 1. Each sample's own: its copy of block 2 (one
  // sample keeps the original) and block 3.
  EXPECT_EQ(four.peak_blocks, 2 + 4 * 2);
  EXPECT_EQ(four.copy_on_write, 3);
  EXPECT_EQ(one.copy_on_write, 0);
  EXPECT_EQ(four.blocks_used_after, 0);
  EXPECT_EQ(one.blocks_used_after, 0);
}

// Sample j is seeded seed + j: it draws what an n = 1 request with that seed
// draws (its first token from a copy of the same logits row, the rest from
// the same K/V), and a second run draws the same again. The control: the
// samples differ.
TEST(Step07EngineParallelSampling, SampleJDrawsWhatSeedPlusJDrawsAlone) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const int n = 4;
  const SampledRun together = run_alone(*model, sampled_request(weights.config, 33, 24, n, 500));
  const SampledRun again = run_alone(*model, sampled_request(weights.config, 33, 24, n, 500));
  ASSERT_EQ(together.records.size(), static_cast<std::size_t>(n));
  std::vector<std::vector<int>> samples;
  for (int sample = 0; sample < n; ++sample) {
    const RequestRecord& record = together.records[static_cast<std::size_t>(sample)];
    const SampledRun alone = run_alone(*model, sampled_request(weights.config, 33, 24, 1, 500 + sample));
    EXPECT_EQ(record.generated, alone.records.front().generated) << "sample " << sample;
    EXPECT_EQ(record.generated, again.records[static_cast<std::size_t>(sample)].generated) << "sample " << sample;
    samples.push_back(record.generated);
  }
  std::sort(samples.begin(), samples.end());
  EXPECT_NE(samples.front(), samples.back()) << "every sample drew the same tokens";
}

// Greedy samples are n copies of the solo tokens, also when a pool of one
// full context makes the samples preempt one another and recompute.
TEST(Step07EngineParallelSampling, GreedySamplesEqualTheSoloTokensUnderPreemption) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  Request request = sampled_request(weights.config, 60, 300, 6, 0);
  request.sampling = {};  // greedy
  const std::vector<int> solo = solo_outputs(*model, {request}).front();
  const int one_context = weights.config.seq_len / 16;
  ServingClock clock;
  EngineOptions options;
  options.scheduler.max_sequences = 8;
  options.n_blocks = one_context;
  Engine engine(*model, options, clock);
  engine.submit(request);
  engine.run_until_idle();
  const std::vector<RequestRecord> records = engine.take_finished();
  ASSERT_EQ(records.size(), 6u);
  for (const RequestRecord& record : records) EXPECT_EQ(record.generated, solo) << "sample " << record.sample;
  EXPECT_GT(engine.preemptions(), 0) << "six samples of 360 positions fit one context: preemption went untested";
  EXPECT_EQ(engine.cache().blocks().used_blocks(), 0);
  engine.cache().blocks().check_invariants();
}

// The listener hears every sample's tokens, each sample indexed from 0.
TEST(Step07EngineParallelSampling, TheListenerHearsEverySample) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  const SampledRun run = run_alone(*model, sampled_request(weights.config, 20, 12, 3, 9));
  std::map<int, std::vector<TokenEvent>> by_sample;  // sample -> its events, in order
  for (const TokenEvent& event : run.events) by_sample[event.sample].push_back(event);
  ASSERT_EQ(by_sample.size(), 3u);
  for (const RequestRecord& record : run.records) {
    const std::vector<TokenEvent>& events = by_sample[record.sample];
    ASSERT_EQ(events.size(), record.generated.size()) << "sample " << record.sample;
    for (std::size_t i = 0; i < events.size(); ++i) {
      EXPECT_EQ(events[i].token, record.generated[i]);
      EXPECT_EQ(events[i].index, static_cast<int>(i));
      EXPECT_EQ(events[i].finish, i + 1 == events.size() ? record.finish : FinishReason::None);
      EXPECT_FALSE(events[i].logprobs) << "log-probabilities nobody asked for";
    }
  }
}

// cancel() ends every sample (forked or still pending); stop_sample() one.
TEST(Step07EngineParallelSampling, CancelEndsEverySampleAndStopSampleOne) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  ServingClock clock;
  EngineOptions options;
  options.scheduler.max_sequences = 4;  // request 0's three samples leave one slot: request 1 (n = 3) waits
  Engine engine(*model, options, clock);

  engine.submit(sampled_request(weights.config, 30, 50, 3, 1));  // id 0 (small_workload's first)
  Request pending = sampled_request(weights.config, 30, 50, 3, 1);
  pending.id = 1;
  engine.step();  // request 0's prompt, and its forks
  engine.submit(pending);
  engine.step();
  engine.step();
  EXPECT_TRUE(engine.stop_sample(0, 2));
  EXPECT_FALSE(engine.stop_sample(0, 2)) << "a sample stopped twice";
  EXPECT_FALSE(engine.stop_sample(0, 7));
  EXPECT_TRUE(engine.cancel(0));
  EXPECT_TRUE(engine.cancel(1));
  EXPECT_FALSE(engine.has_work());
  EXPECT_EQ(engine.cache().blocks().used_blocks(), 0);
  engine.cache().blocks().check_invariants();

  std::map<std::pair<int, int>, FinishReason> finish;  // (id, sample) -> how it ended
  for (const RequestRecord& record : engine.take_finished()) finish[{record.id, record.sample}] = record.finish;
  EXPECT_EQ(finish.at({0, 2}), FinishReason::Stop);
  EXPECT_EQ(finish.at({0, 0}), FinishReason::Cancelled);
  EXPECT_EQ(finish.at({0, 1}), FinishReason::Cancelled);
  EXPECT_EQ(finish.size(), 4u) << "request 1 forked while it waited, or a sample finished twice";
  EXPECT_EQ(finish.at({1, 0}), FinishReason::Cancelled);
}

TEST(Step07EngineParallelSampling, NOutsideTheSlotsIsRefused) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  ServingClock clock;
  EngineOptions options;
  options.scheduler.max_sequences = 4;
  Engine engine(*model, options, clock);
  for (const int n : {0, -1, 5}) {
    const Request request = sampled_request(weights.config, 10, 5, n, 1);
    try {
      engine.submit(request);
      ADD_FAILURE() << "n = " << n << " was taken";
    } catch (const llm::InputError& error) {
      EXPECT_TRUE(llm::testing::HasSubstr(error.what(), "n must be from 1 to 4"));
    }
  }
  EXPECT_FALSE(engine.has_work());
}

// The log-probabilities of the distribution a token was drawn from.
TEST(Step07EngineParallelSampling, TokenLogprobsAreTheSampledDistributions) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  const auto log_normalizer = [&](float temperature) {
    double sum = 0.0;
    for (const float logit : logits) sum += std::exp(logit / temperature);
    return static_cast<float>(std::log(sum));
  };
  const TokenLogprobs greedy = token_logprobs(logits, 0.0f, 2, 3);  // greedy: the raw logits
  EXPECT_NEAR(greedy.logprob, 2.0f - log_normalizer(1.0f), 1e-5f);
  ASSERT_EQ(greedy.top.size(), 3u);
  EXPECT_EQ(greedy.top[0].first, 1) << "a tie goes to the first id";
  EXPECT_EQ(greedy.top[1].first, 3);
  EXPECT_EQ(greedy.top[2].first, 2);
  EXPECT_NEAR(greedy.top[0].second, 3.0f - log_normalizer(1.0f), 1e-5f);
  const TokenLogprobs hot = token_logprobs(logits, 0.5f, 0, 0);
  EXPECT_NEAR(hot.logprob, 2.0f - log_normalizer(0.5f), 1e-5f);
  EXPECT_TRUE(hot.top.empty());
  EXPECT_EQ(token_logprobs(logits, 1.0f, 0, 10).top.size(), logits.size()) << "k past the vocabulary";
  // Large logits: no overflow, and the probabilities sum to 1.
  const std::vector<float> large = {1000.0f, 999.0f, -1000.0f};
  const TokenLogprobs all = token_logprobs(large, 1.0f, 0, 3);
  double total = 0.0;
  for (const auto& [token, logprob] : all.top) {
    EXPECT_TRUE(std::isfinite(logprob)) << "token " << token;
    total += std::exp(static_cast<double>(logprob));
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
}

// Through the engine, greedy: the sampled token is the most likely one.
TEST(Step07EngineParallelSampling, TheListenerCarriesLogprobsWhenAsked) {
  const llm::ModelWeights weights = tiny_weights();
  auto model = step05::make_paged_model_on("cpu", weights);
  Request request = sampled_request(weights.config, 20, 10, 2, 3);
  request.sampling = {};
  request.top_logprobs = 3;
  const SampledRun run = run_alone(*model, request);
  ASSERT_EQ(run.events.size(), 20u);
  for (const TokenEvent& event : run.events) {
    ASSERT_TRUE(event.logprobs) << "sample " << event.sample << " token " << event.index;
    ASSERT_EQ(event.logprobs->top.size(), 3u);
    EXPECT_EQ(event.logprobs->top[0].first, event.token);
    EXPECT_FLOAT_EQ(event.logprobs->logprob, event.logprobs->top[0].second);
    EXPECT_LE(event.logprobs->logprob, 0.0f);
    EXPECT_GE(event.logprobs->top[0].second, event.logprobs->top[1].second);
  }
}

// The run the parting tests forge a difference into: 3 requests of the tiny
// preset replayed with continuous batching on the CPU (watching for
// partings), and each request's solo tokens. (The tests take its members as
// named references, not a structured binding: clang before 16 lets no lambda
// capture a binding.)
struct ReplayedTrace {
  llm::ModelWeights weights = tiny_weights();
  std::unique_ptr<llm::Model> model = step05::make_paged_model_on("cpu", weights);
  std::vector<Request> requests;
  std::vector<std::vector<int>> solo;
  ReplayResult run;
  explicit ReplayedTrace(std::uint64_t workload_seed)
      : requests(small_workload(weights.config, 3, workload_seed)), solo(solo_outputs(*model, requests)) {
    run = replay(*model, requests,
                 engine_options_for(policy_named("continuous"), tight_limits(weights.config), weights.config.seq_len),
                 &solo);
  }
};

// The logits row a request's token 1 is drawn from when it runs alone: its
// prompt, then its solo token 0 fed back.
std::vector<float> solo_row_of_second_token(llm::Model& model, const Request& request, const std::vector<int>& solo) {
  const auto cache = model.make_cache(1, model.config().seq_len);
  model.forward(llm::TokenBatch::prefill(request.prompt, 0, 0), *cache);
  const std::span<const float> next =
      model.forward(llm::TokenBatch::single(solo[0], static_cast<int>(request.prompt.size()), 0), *cache);
  return {next.begin(), next.end()};
}

// check_replay's judgment of a greedy run that parts from its solo run
// (explain_partings; on the CPU, where rows are batch-invariant, it is only
// reached directly): request 0's token 1 is forged to the solo row's
// runner-up, drawn from a kept row that is the solo row with the runner-up
// raised just past the top. Explained under a tolerance that covers that
// change; not under one that does not, not when the run kept no row, and not
// when the kept row's greedy token is not the forged one.
TEST(Step07Engine, AGreedyPartingIsExplainedOnlyByRowsWithinTheTolerance) {
  const ReplayedTrace trace(11);
  const std::unique_ptr<llm::Model>& model = trace.model;
  const std::vector<Request>& requests = trace.requests;
  const std::vector<std::vector<int>>& solo = trace.solo;
  const ReplayResult& run = trace.run;
  ASSERT_GE(solo[0].size(), 3u);
  EXPECT_TRUE(run.partings.empty()) << "a batch-invariant run parts from no solo run";
  const OutputCheck clean = check_replay(*model, requests, run, solo, llm::model_logits_tolerance(llm::DType::F32));
  EXPECT_TRUE(clean.ok()) << clean.first_difference;
  EXPECT_EQ(clean.explained, 0);

  const std::vector<float> row = solo_row_of_second_token(*model, requests[0], solo[0]);
  const int top = llm::argmax(row);
  ASSERT_EQ(top, solo[0][1]);
  std::vector<float> without_top = row;
  without_top[static_cast<std::size_t>(top)] = -std::numeric_limits<float>::infinity();
  const int runner_up = llm::argmax(without_top);
  const float gap = row[static_cast<std::size_t>(top)] - row[static_cast<std::size_t>(runner_up)];

  ReplayResult forged = run;
  forged.records[0].generated = {solo[0][0], runner_up};
  std::vector<float> kept = row;
  kept[static_cast<std::size_t>(runner_up)] += gap * 1.001f;  // just past the top
  forged.partings[0] = {1, kept};
  const auto judged = [&](const ReplayResult& judged_run, llm::Tolerance tolerance) {
    return explain_partings(check_outputs(judged_run.records, solo), *model, requests, judged_run, solo, tolerance);
  };
  const llm::Tolerance covers{2.0 * gap, 0.0}, misses{0.5 * gap, 0.0};

  const OutputCheck near_tie = judged(forged, covers);
  EXPECT_TRUE(near_tie.ok()) << near_tie.first_difference;
  EXPECT_EQ(near_tie.explained, 1);
  EXPECT_TRUE(llm::testing::HasSubstr(near_tie.first_explained, "request 0: token 1"));

  const OutputCheck too_far = judged(forged, misses);
  EXPECT_FALSE(too_far.ok());
  EXPECT_TRUE(llm::testing::HasSubstr(too_far.first_difference, "past the tolerance"));

  ReplayResult unkept = forged;
  unkept.partings.clear();
  EXPECT_TRUE(llm::testing::HasSubstr(judged(unkept, covers).first_difference, "kept no logits row"));

  ReplayResult not_drawn = forged;
  not_drawn.partings[0].logits = row;  // its greedy token is `top`, not the forged one
  EXPECT_TRUE(llm::testing::HasSubstr(judged(not_drawn, covers).first_difference, "not the token drawn from it"));
}

// check_tokens_only's judgment (part 5's, over HTTP, where no logits row
// comes back): request 0's token 1 forged to the solo row's runner-up is
// explained when the solo row's gap between the two tokens is within twice
// the tolerance, and not when it is past it; a token outside the
// vocabulary, or the third-best token under a tolerance that only covers
// the runner-up, is not explained. On the CPU the check itself is exact.
TEST(Step07Engine, ATokensOnlyPartingIsExplainedOnlyAtANearTie) {
  const ReplayedTrace trace(12);
  const std::unique_ptr<llm::Model>& model = trace.model;
  const std::vector<Request>& requests = trace.requests;
  const std::vector<std::vector<int>>& solo = trace.solo;
  const ReplayResult& run = trace.run;
  ASSERT_GE(solo[0].size(), 3u);

  // The solo row of request 0's token 1, and its tokens by logit.
  const std::vector<float> next = solo_row_of_second_token(*model, requests[0], solo[0]);
  std::vector<int> by_logit(next.size());
  for (std::size_t i = 0; i < by_logit.size(); ++i) by_logit[i] = static_cast<int>(i);
  std::sort(by_logit.begin(), by_logit.end(), [&next](int a, int b) {
    return next[static_cast<std::size_t>(a)] > next[static_cast<std::size_t>(b)];
  });
  ASSERT_EQ(by_logit[0], solo[0][1]);
  const int runner_up = by_logit[1], third = by_logit[2];
  const float gap = next[static_cast<std::size_t>(by_logit[0])] - next[static_cast<std::size_t>(runner_up)];
  const float third_gap = next[static_cast<std::size_t>(by_logit[0])] - next[static_cast<std::size_t>(third)];
  ASSERT_GT(third_gap, gap);

  std::vector<RequestRecord> records = run.records;
  const auto judged = [&](int token, llm::Tolerance tolerance) {
    records[0].generated = {solo[0][0], token};
    return explain_partings_by_near_ties(check_outputs(records, solo), *model, requests, records, solo, tolerance);
  };
  // A tolerance t lets rows swap tokens up to 2 t apart.
  const llm::Tolerance covers{0.51 * gap, 0.0}, misses{0.49 * gap, 0.0};

  const OutputCheck near_tie = judged(runner_up, covers);
  EXPECT_TRUE(near_tie.ok()) << near_tie.first_difference;
  EXPECT_EQ(near_tie.explained, 1);
  EXPECT_TRUE(llm::testing::HasSubstr(near_tie.first_explained, "request 0: token 1"));
  EXPECT_TRUE(llm::testing::HasSubstr(near_tie.first_explained, "near-tie"));

  const OutputCheck too_far = judged(runner_up, misses);
  EXPECT_FALSE(too_far.ok());
  EXPECT_TRUE(llm::testing::HasSubstr(too_far.first_difference, "more than a row within the tolerance can swap"));

  if (third_gap > 2.0f * 0.51f * gap) {
    EXPECT_FALSE(judged(third, covers).ok()) << "the third-best token, past what the tolerance can swap";
  }
  EXPECT_TRUE(llm::testing::HasSubstr(judged(trace.weights.config.vocab_size, covers).first_difference,
                                      "not in the vocabulary"));

  // The whole check on the CPU: exact, and this run is identical.
  const OutputCheck clean = check_tokens_only(*model, requests, run.records, solo, covers);
  EXPECT_TRUE(clean.ok()) << clean.first_difference;
  EXPECT_EQ(clean.explained, 0);
}

}  // namespace
}  // namespace step07
