// Step 05 (PagedAttention), CPU: the request trace (reproducible, within the
// context, skewed as documented) and the memory replay (every request
// finishes under every policy, utilizations are fractions, the contiguous
// value matches a hand computation, block 1 wastes nothing, a request waits
// until the whole of it fits and nothing is preempted, an impossible budget
// is an InputError).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "llm/config.hpp"
#include "llm/errors.hpp"
#include "step05_paged_attention/measure/memory_replay.hpp"
#include "step05_paged_attention/measure/request_trace.hpp"
#include "test_support.hpp"

namespace step05 {
namespace {

TraceOptions trace_at(int context, std::uint64_t seed = 42) {
  TraceOptions options;
  options.context = context;
  options.seed = seed;
  return options;
}

bool same_trace(const std::vector<TraceRequest>& a, const std::vector<TraceRequest>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].id != b[i].id || a[i].prompt_length != b[i].prompt_length || a[i].output_length != b[i].output_length)
      return false;
  return true;
}

TEST(RequestTrace, IsReproducibleFromItsSeedAndRespectsTheContext) {
  for (const int context : {2, 16, 512, 4096, 131072}) {
    const auto trace = make_request_trace(trace_at(context));
    ASSERT_EQ(trace.size(), 300u);
    EXPECT_TRUE(same_trace(trace, make_request_trace(trace_at(context)))) << "context " << context;
    EXPECT_FALSE(context > 16 && same_trace(trace, make_request_trace(trace_at(context, 43)))) << "context " << context;
    for (std::size_t i = 0; i < trace.size(); ++i) {
      EXPECT_EQ(trace[i].id, static_cast<int>(i));
      EXPECT_GE(trace[i].prompt_length, 1);
      EXPECT_GE(trace[i].output_length, 1);
      EXPECT_LE(trace[i].total_length(), context);
    }
  }
}

TEST(RequestTrace, IsWideAndSkewedAsDocumented) {
  // The documented shape at a Llama context: requests end at 20-35% of the
  // context on average (a max-length reservation wastes most of its memory),
  // with a long right tail (mean above median, p99 several times the median).
  for (const std::uint64_t seed : {42u, 7u, 1234u}) {
    const LengthSummary summary = summarize_lengths(make_request_trace(trace_at(4096, seed)), 4096);
    EXPECT_EQ(summary.requests, 300);
    EXPECT_GE(summary.mean_total_fraction, 0.20) << "seed " << seed;
    EXPECT_LE(summary.mean_total_fraction, 0.35) << "seed " << seed;
    for (const LengthStats* stats : {&summary.prompt, &summary.output, &summary.total}) {
      EXPECT_LE(stats->min, stats->p50);
      EXPECT_LE(stats->p50, stats->p90);
      EXPECT_LE(stats->p90, stats->p99);
      EXPECT_LE(stats->p99, stats->max);
      EXPECT_GT(stats->mean, stats->p50);
      EXPECT_GT(stats->p99, 4 * stats->p50);
    }
  }
}

TEST(RequestTrace, SummaryOfAHandMadeTrace) {
  const std::vector<TraceRequest> trace = {{0, 1, 2}, {1, 3, 4}, {2, 5, 6}};
  const LengthSummary summary = summarize_lengths(trace, 20);
  EXPECT_DOUBLE_EQ(summary.prompt.min, 1);
  EXPECT_DOUBLE_EQ(summary.prompt.p50, 3);
  EXPECT_DOUBLE_EQ(summary.prompt.max, 5);
  EXPECT_DOUBLE_EQ(summary.output.mean, 4);
  EXPECT_DOUBLE_EQ(summary.total.p90, 7.0 + 0.8 * 4.0);  // totals 3, 7, 11: rank 1.8 (type 7)
  EXPECT_DOUBLE_EQ(summary.mean_total_fraction, 7.0 / 20.0);
}

TEST(RequestTrace, BadOptionsAreInputErrors) {
  TraceOptions options = trace_at(1);
  EXPECT_THROW(make_request_trace(options), llm::InputError);  // no room for prompt + output
  options = trace_at(512);
  options.n_requests = 0;
  EXPECT_THROW(make_request_trace(options), llm::InputError);
  options = trace_at(512);
  options.prompt_median_fraction = 0;
  EXPECT_THROW(make_request_trace(options), llm::InputError);
  options = trace_at(512);
  options.output_sigma = -1;
  EXPECT_THROW(make_request_trace(options), llm::InputError);
  EXPECT_THROW(summarize_lengths({}, 512), llm::InputError);
}

// ---------------------------------------------------------------------------
// The replay.

ModelDims dims(int context) { return {"test", context, 1000}; }

TEST(MemoryReplay, EveryPolicyFinishesEveryRequestWithFractionsInRange) {
  const auto models = memory_replay_models("tiny", llm::find_preset("tiny").config);
  for (const ModelDims& model : models) {
    const auto rows = run_memory_replay(model, MemoryReplayOptions{});
    ASSERT_EQ(rows.size(), 5u);  // contiguous, then blocks 8, 16, 32, 64
    EXPECT_EQ(rows[0].policy, "contiguous");
    EXPECT_EQ(rows[0].block_size, 0);
    for (const MemoryReplayRow& row : rows) {
      const std::string what = model.name + " " + row.policy + " " + std::to_string(row.block_size);
      EXPECT_EQ(row.requests, 300) << what;
      EXPECT_EQ(row.requests_finished, row.requests) << what;
      for (const double fraction : {row.kv_utilization, row.internal_fragmentation, row.budget_utilization}) {
        EXPECT_FALSE(std::isnan(fraction)) << what;
        EXPECT_GE(fraction, 0.0) << what;
        EXPECT_LE(fraction, 1.0) << what;
      }
      // Nothing is shared in the replay: every reserved position is a token or waste.
      EXPECT_NEAR(row.kv_utilization + row.internal_fragmentation, 1.0, 1e-12) << what;
      EXPECT_GE(row.peak_sequences, row.mean_sequences) << what;
      EXPECT_GT(row.iterations, 0) << what;
      EXPECT_EQ(row.context, model.context) << what;
      EXPECT_EQ(row.budget_positions, 8LL * model.context) << what;
      EXPECT_EQ(row.budget_bytes, static_cast<std::size_t>(row.budget_positions) * model.kv_bytes_per_token) << what;
      EXPECT_EQ(row.preemptions, 0) << what;  // admission promises the whole request
      if (row.policy == "contiguous") EXPECT_LE(row.peak_sequences, 8) << what;
    }
  }
}

TEST(MemoryReplay, TheModelsAreThisOneAndTwoLlamas) {
  const llm::ModelConfig tiny = llm::find_preset("tiny").config;
  const auto models = memory_replay_models("tiny", tiny);
  ASSERT_EQ(models.size(), 3u);
  EXPECT_EQ(models[0].name, "tiny");
  EXPECT_EQ(models[0].context, tiny.seq_len);
  EXPECT_EQ(models[0].kv_bytes_per_token, tiny.kv_bytes_per_token(4));
  EXPECT_EQ(models[1].name, "Llama-2-7B");
  EXPECT_EQ(models[1].context, 4096);
  EXPECT_EQ(models[1].kv_bytes_per_token, 2u * 32 * 32 * 128 * 2);  // K and V, 32 layers, 32 KV heads, fp16
  EXPECT_EQ(models[2].name, "Llama-3-8B");
  EXPECT_EQ(models[2].context, 8192);
  EXPECT_EQ(models[2].kv_bytes_per_token, 2u * 32 * 8 * 128 * 2);  // 8 KV heads
}

// Context 10, two slots (20 positions). A (prompt 2, output 3), B (4, 1),
// C (1, 2), by iteration (lengths after growth and admission):
//   1: A and B admitted: A 3, B 5 -> 8 of 20 reserved; B is done
//   2: A grows to 4, C admitted at 2 -> 6 of 20
//   3: A 5, C 3 -> 8 of 20; both done
const std::vector<TraceRequest> kHandTrace = {{0, 2, 3}, {1, 4, 1}, {2, 1, 2}};

TEST(MemoryReplay, ContiguousUtilizationIsTheHandComputedValue) {
  const MemoryReplayRow row = replay_trace(kHandTrace, dims(10), 2, 0);
  EXPECT_EQ(row.iterations, 3);
  EXPECT_DOUBLE_EQ(row.kv_utilization, (8.0 / 20 + 6.0 / 20 + 8.0 / 20) / 3);
  EXPECT_DOUBLE_EQ(row.internal_fragmentation, (12.0 / 20 + 14.0 / 20 + 12.0 / 20) / 3);
  EXPECT_DOUBLE_EQ(row.budget_utilization, row.kv_utilization);  // both slots reserved throughout
  EXPECT_EQ(row.peak_sequences, 2);
  EXPECT_DOUBLE_EQ(row.mean_sequences, 2.0);
  EXPECT_EQ(row.requests_finished, 3);
  EXPECT_EQ(row.n_blocks, 2);
}

TEST(MemoryReplay, PagedOnTheHandTrace) {
  // Blocks of 1: all three fit at once. 1: A 3, B 5, C 2 (B done);
  // 2: A 4, C 3 (C done); 3: A 5 (done). Every reserved position is a token.
  const MemoryReplayRow row = replay_trace(kHandTrace, dims(10), 2, 1);
  EXPECT_EQ(row.iterations, 3);
  EXPECT_EQ(row.peak_sequences, 3);
  EXPECT_DOUBLE_EQ(row.mean_sequences, 2.0);
  EXPECT_DOUBLE_EQ(row.kv_utilization, 1.0);
  EXPECT_DOUBLE_EQ(row.budget_utilization, (10.0 / 20 + 7.0 / 20 + 5.0 / 20) / 3);
  // Blocks of 4: A holds 1 block (3 positions), B 2 (5), C 1 (2): 10 of 16.
  const MemoryReplayRow blocks_of_4 = replay_trace(kHandTrace, dims(10), 2, 4);
  EXPECT_EQ(blocks_of_4.n_blocks, 5);
  EXPECT_EQ(blocks_of_4.peak_sequences, 3);
  // 2: A 4 (1 block), C 3 (1 block): 7 of 8; 3: A 5 (2 blocks): 5 of 8.
  EXPECT_DOUBLE_EQ(blocks_of_4.kv_utilization, (10.0 / 16 + 7.0 / 8 + 5.0 / 8) / 3);
}

TEST(MemoryReplay, PagedAtBlockOneHasNoInternalFragmentation) {
  MemoryReplayOptions options;
  options.block_sizes = {1};
  for (const int context : {512, 4096}) {
    const auto rows = run_memory_replay(dims(context), options);
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[1].internal_fragmentation, 0.0) << "context " << context;
    EXPECT_EQ(rows[1].kv_utilization, 1.0) << "context " << context;
    EXPECT_EQ(rows[1].requests_finished, 300);
  }
}

TEST(MemoryReplay, ARequestWaitsUntilTheWholeOfItFits) {
  // Context 8, one sequence of budget (4 blocks of 2). Each request ends at
  // 8 positions, all 4 blocks: the second waits until the first has left
  // (iterations 1-7: the first grows from 2 to 8 positions; 8-14: the
  // second), though the first holds fewer than 4 blocks for most of its run.
  const std::vector<TraceRequest> trace = {{0, 1, 7}, {1, 1, 7}};
  const MemoryReplayRow row = replay_trace(trace, dims(8), 1, 2);
  EXPECT_EQ(row.requests_finished, 2);
  EXPECT_EQ(row.peak_sequences, 1);
  EXPECT_EQ(row.iterations, 14);
  EXPECT_EQ(row.preemptions, 0);
  EXPECT_DOUBLE_EQ(row.mean_sequences, 1.0);
  // Shorter requests share the pool: ends at 4 + 4 positions fit 4 blocks.
  const MemoryReplayRow two_short = replay_trace({{0, 1, 3}, {1, 1, 3}}, dims(8), 1, 2);
  EXPECT_EQ(two_short.peak_sequences, 2);
  EXPECT_EQ(two_short.iterations, 3);
}

TEST(MemoryReplay, ABudgetTooSmallForARequestIsAnInputError) {
  // 100 positions of budget in blocks of 64: one block, and a request of 90
  // positions needs two. It could never run; the replay says so.
  const std::vector<TraceRequest> trace = {{0, 10, 10}, {1, 40, 50}};
  try {
    replay_trace(trace, dims(100), 1, 64);
    FAIL() << "expected InputError";
  } catch (const llm::InputError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(llm::testing::HasSubstr(message, "request 1 needs 90 positions, 2 blocks of 64"));
    EXPECT_TRUE(llm::testing::HasSubstr(message, "holds only 1 blocks"));
  }
  EXPECT_THROW(replay_trace(trace, dims(80), 1, 0), llm::InputError);   // longer than the context
  EXPECT_THROW(replay_trace(trace, dims(100), 0, 0), llm::InputError);  // no budget
  EXPECT_THROW(replay_trace(trace, dims(100), 1, -4), llm::InputError);  // a negative block size
  MemoryReplayOptions options;
  options.block_sizes = {16, 0};
  EXPECT_THROW(run_memory_replay(dims(512), options), llm::InputError);
}

TEST(MemoryReplay, TheTraceFollowsEachModelsContext) {
  MemoryReplayOptions options;
  options.trace.context = 7;  // replaced by the model's
  options.block_sizes = {16};
  const auto rows = run_memory_replay(dims(2048), options);
  EXPECT_EQ(rows[0].requests_finished, 300);
  // The contiguous slots are 2048 positions: the mean request's share of its
  // slot is the trace's documented 20-35% (a little more while it waits to end).
  EXPECT_GT(rows[0].kv_utilization, 0.2);
  EXPECT_LT(rows[0].kv_utilization, 0.4);
}

TEST(MemoryReplay, TargetsAreReadFromTheRows) {
  MemoryReplayRow contiguous, paged_8, paged_16;
  contiguous.policy = "contiguous";
  contiguous.peak_sequences = 8;
  contiguous.mean_sequences = 7.5;
  paged_8.policy = paged_16.policy = "paged";
  paged_8.block_size = 8;
  paged_16.block_size = 16;
  paged_16.kv_utilization = 0.95;
  paged_16.peak_sequences = 40;
  paged_16.mean_sequences = 15.0;
  MemoryReplayTargets targets = check_memory_replay_targets({contiguous, paged_8, paged_16});
  EXPECT_DOUBLE_EQ(targets.paged_utilization, 0.95);
  EXPECT_DOUBLE_EQ(targets.peak_ratio, 5.0);
  EXPECT_DOUBLE_EQ(targets.mean_ratio, 2.0);
  EXPECT_TRUE(targets.met());
  paged_16.mean_sequences = 14.9;
  EXPECT_FALSE(check_memory_replay_targets({contiguous, paged_16}).sequences_met);
  EXPECT_THROW(check_memory_replay_targets({contiguous, paged_8}), llm::InputError);
}

}  // namespace
}  // namespace step05
