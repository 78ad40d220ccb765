// Step 07's scheduler alone, with no model and no cache. A simulated engine
// loop replays long seeded random traces (prompt lengths 1..context-1, random
// max_tokens, bursty arrivals, early end tokens, cancellations of waiting and
// running requests) under every policy's options (static, one at a time,
// continuous, chunked with small budgets), block sizes 1, 7 and 16, and KV
// pools down to exactly one full context. The test keeps its own model of the
// state (the blocks and computed positions of each request, the blocks
// promised to prompts prefilled in chunks, the free pool) and checks every
// schedule against it: the budget, the slots, the block arithmetic, promises
// within the pool, who is preempted (only when needed) and where they go,
// first come first served, admission that stops only for a reason, static
// admission, whole prompts without chunking, progress. At the end of each
// trace every request has finished exactly once and the pool is whole.
// Negative controls show the checks catch a scheduler told the wrong number
// of free blocks; focused tests pin one preemption by hand and the
// constructor's errors.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "llm/errors.hpp"
#include "llm/splitmix64.hpp"
#include "llm/tokenizer.hpp"
#include "step07_batching/policies.hpp"
#include "step07_batching/request.hpp"
#include "step07_batching/scheduler.hpp"

namespace step07 {
namespace {

constexpr int kVocab = 8;       // the scheduler never reads token values; the sampler needs a size
constexpr int kOtherToken = 5;  // what the simulated model "generates" when it does not stop

// The test's own block arithmetic (not the scheduler's blocks_for).
int blocks_covering(int positions, int block_size) { return (positions + block_size - 1) / block_size; }

// Uniform in [lo, hi], and a coin of probability p, from one seeded stream.
int uniform_int(llm::SplitMix64& random, int lo, int hi) {
  return lo + static_cast<int>(random.next() % static_cast<std::uint64_t>(hi - lo + 1));
}
bool chance(llm::SplitMix64& random, double p) { return random.uniform() < p; }

// One client of a trace: what it asks, when, and what happens to it.
struct SimulatedRequest {
  Request request;     // id, prompt, max_tokens
  int arrival = 0;     // the iteration at which it is submitted
  int stop_at = -1;    // index of the generated token that is the end token (-1: none)
  int cancel_at = -1;  // the iteration at which the client goes away, if still live (-1: never)
};

// One trace's scheduler, pool and requests.
struct TraceShape {
  std::string policy;
  SchedulerOptions options;
  int block_size = 16;
  int context = 64;
  int n_blocks = 0;
  std::vector<SimulatedRequest> requests;  // arrival order, ids 0..n-1

  std::string describe() const {
    return fmt::format("{}: max_sequences {}, budget {}, block {}, context {}, pool {} blocks, {} requests", policy,
                       options.max_sequences, options.token_budget, block_size, context, n_blocks, requests.size());
  }
};

// Draws trace number `index`: the policy in turn, the rest from the seed.
TraceShape random_trace(int index, std::uint64_t seed) {
  llm::SplitMix64 random(llm::splitmix64_mix(seed + static_cast<std::uint64_t>(index)));
  const auto& table = policies();
  const auto& policy = table[static_cast<std::size_t>(index) % table.size()];
  TraceShape shape;
  shape.policy = policy.name;
  shape.context = std::vector<int>{16, 40, 96, 130}[random.next() % 4];
  ServingLimits limits;
  limits.block_size = std::vector<int>{1, 7, 16}[random.next() % 3];
  limits.max_sequences = uniform_int(random, 1, 12);
  limits.chunk_tokens = limits.max_sequences + uniform_int(random, 0, 20);  // down to a row per sequence
  const int full_context = blocks_covering(shape.context, limits.block_size);
  // A third of the traces get exactly one full context: the tightest pool the engine accepts.
  limits.kv_blocks = chance(random, 0.35) ? full_context : uniform_int(random, full_context, full_context * 4);
  const EngineOptions options = engine_options_for(policy.fn, limits, shape.context);
  shape.options = options.scheduler;
  shape.block_size = options.block_size;
  shape.n_blocks = options.n_blocks;

  const int n_requests = uniform_int(random, 60, 160);
  int arrival = 0;
  for (int id = 0; id < n_requests; ++id) {
    SimulatedRequest simulated;
    // Prompts: mostly short, some anywhere up to context - 1, some long.
    const int shape_draw = uniform_int(random, 0, 9);
    const int longest = shape.context - 1;
    const int prompt_length = shape_draw < 5   ? uniform_int(random, 1, std::max(1, longest / 8))
                              : shape_draw < 8 ? uniform_int(random, 1, longest)
                                               : uniform_int(random, longest / 2 + 1, longest);
    // Outputs: prompt + max_tokens - 1 <= context, mostly short.
    const int most = shape.context - prompt_length + 1;
    simulated.request.id = id;
    simulated.request.prompt.assign(static_cast<std::size_t>(prompt_length), kOtherToken);
    simulated.request.prompt.front() = llm::Tokenizer::kBos;
    simulated.request.max_tokens =
        chance(random, 0.7) ? uniform_int(random, 1, std::max(1, most / 4)) : uniform_int(random, 1, most);
    // Bursts (several in one iteration) and gaps, sometimes long enough to drain the engine.
    arrival += chance(random, 0.5)    ? 0
               : chance(random, 0.95) ? uniform_int(random, 1, 6)
                                      : uniform_int(random, 50, 400);
    simulated.arrival = arrival;
    if (chance(random, 0.2)) simulated.stop_at = uniform_int(random, 0, simulated.request.max_tokens - 1);
    if (chance(random, 0.08)) simulated.cancel_at = arrival + uniform_int(random, 0, 60);
    shape.requests.push_back(std::move(simulated));
  }
  return shape;
}

// What the suite exercised (so it cannot pass vacuously).
struct Exercised {
  long long schedules = 0;
  long long preemptions = 0;
  // Preempted and admitted again by the same schedule, from position 0
  // (counted, not an error).
  long long readmitted = 0;
  long long preemptions_in_one_context_pools = 0;
  long long split_prompt_rows = 0;  // rows that stop short of the sequence's end (chunks)
  long long cancelled_waiting = 0;
  long long cancelled_running = 0;
  long long stopped = 0;     // finished on the end token before max_tokens
  long long idle_jumps = 0;  // the engine drained before the next arrival
};

// The engine's loop without a model: submit, cancel, schedule, "forward"
// (computed positions advance, a token comes out of every row that reaches a
// sequence's end), finish. Every schedule is checked against the test's model.
class SimulatedEngine {
 public:
  // blocks_misreported: told to the scheduler on top of the free blocks
  // (0; the negative controls lie, to show the checks catch it).
  SimulatedEngine(const TraceShape& shape, Exercised& exercised, int blocks_misreported = 0)
      : shape_(shape),
        blocks_misreported_(blocks_misreported),
        scheduler_(shape.options, shape.block_size),
        exercised_(exercised),
        held_(shape.requests.size(), 0),
        computed_(shape.requests.size(), 0),
        finishes_(shape.requests.size(), 0),
        free_blocks_(shape.n_blocks) {
    for (const SimulatedRequest& simulated : shape.requests)
      states_.push_back(std::make_unique<RequestState>(simulated.request, kVocab));
    for (const SimulatedRequest& simulated : shape.requests)
      if (simulated.cancel_at >= 0) cancellations_.push_back(simulated.request.id);
    std::stable_sort(cancellations_.begin(), cancellations_.end(), [&](int a, int b) {
      return shape_.requests[static_cast<std::size_t>(a)].cancel_at <
             shape_.requests[static_cast<std::size_t>(b)].cancel_at;
    });
  }

  // Runs the trace to the end; stops at the first failed check.
  void run() {
    constexpr long long kIterationLimit = 2'000'000;  // far past any trace's work: a livelock
    while (next_arrival_ < shape_.requests.size() || !waiting_.empty() || !running_.empty()) {
      ASSERT_LT(iteration_, kIterationLimit) << "no end in sight: the scheduler livelocks";
      submit_due();
      cancel_due();
      if (waiting_.empty() && running_.empty()) {
        if (next_arrival_ < shape_.requests.size()) {
          iteration_ = shape_.requests[next_arrival_].arrival;  // idle: skip to the next arrival
          ++exercised_.idle_jumps;
        }
        continue;
      }
      ASSERT_NO_FATAL_FAILURE(check_model_agrees());
      ASSERT_NO_FATAL_FAILURE(schedule_and_check()) << "at iteration " << iteration_;
      ++iteration_;
    }
    // Every request finished exactly once, and every block came back.
    for (std::size_t id = 0; id < finishes_.size(); ++id) ASSERT_EQ(finishes_[id], 1) << "request " << id;
    for (std::size_t id = 0; id < held_.size(); ++id) ASSERT_EQ(held_[id], 0) << "request " << id;
    ASSERT_EQ(free_blocks_, shape_.n_blocks) << "blocks leaked";
  }

 private:
  int id_of(const RequestState* request) const { return request->request.id; }
  const SimulatedRequest& simulated(const RequestState* request) const {
    return shape_.requests[static_cast<std::size_t>(id_of(request))];
  }

  void submit_due() {
    while (next_arrival_ < shape_.requests.size() && shape_.requests[next_arrival_].arrival <= iteration_)
      waiting_.push_back(states_[next_arrival_++].get());
  }

  // The engine's cancel: out of whichever queue holds it, its blocks back.
  void cancel_due() {
    while (next_cancellation_ < cancellations_.size()) {
      const int id = cancellations_[next_cancellation_];
      if (shape_.requests[static_cast<std::size_t>(id)].cancel_at > iteration_) break;
      ++next_cancellation_;
      RequestState* request = states_[static_cast<std::size_t>(id)].get();
      if (finishes_[static_cast<std::size_t>(id)] > 0) continue;  // already done
      const auto queued = std::find(waiting_.begin(), waiting_.end(), request);
      if (queued != waiting_.end()) {
        waiting_.erase(queued);
        ++exercised_.cancelled_waiting;
        finish(request);
      } else {
        ASSERT_NE(std::find(running_.begin(), running_.end(), request), running_.end()) << "request " << id;
        ++exercised_.cancelled_running;
        finish(request);
      }
    }
  }

  void finish(RequestState* request) {
    const auto running = std::find(running_.begin(), running_.end(), request);
    if (running != running_.end()) running_.erase(running);
    const auto id = static_cast<std::size_t>(id_of(request));
    free_blocks_ += held_[id];
    held_[id] = 0;
    ++finishes_[id];
  }

  // Blocks a running request holds or was promised: a prompt being
  // prefilled in chunks was admitted with room for all of it, so it counts
  // its whole sequence; a decoding one (one row left) what it holds.
  int committed(const RequestState* request) const {
    const int computed = computed_[static_cast<std::size_t>(id_of(request))];
    const int tokens = static_cast<int>(request->tokens.size());
    return blocks_covering(tokens - computed == 1 ? computed : tokens, shape_.block_size);
  }
  int committed_to(const std::vector<RequestState*>& requests) const {
    int total = 0;
    for (const RequestState* request : requests) total += committed(request);
    return total;
  }

  // The scheduler moves only `computed` (to 0 on a preemption): it must agree
  // with the test's own count, and nothing waiting holds blocks. The test's
  // books balance: free + held == the pool; what the running requests hold
  // and were promised never exceeds the pool.
  void check_model_agrees() const {
    int held = 0;
    for (const int blocks : held_) held += blocks;
    ASSERT_EQ(free_blocks_ + held, shape_.n_blocks);
    ASSERT_LE(committed_to(running_), shape_.n_blocks) << "the promises overbook the pool";
    for (const RequestState* request : running_)
      ASSERT_EQ(request->computed, computed_[static_cast<std::size_t>(id_of(request))]) << "request " << id_of(request);
    for (const RequestState* request : waiting_) {
      const auto id = static_cast<std::size_t>(id_of(request));
      ASSERT_EQ(request->computed, 0) << "waiting request " << id;
      ASSERT_EQ(computed_[id], 0) << "waiting request " << id;
      ASSERT_EQ(held_[id], 0) << "waiting request " << id;
    }
  }

  void schedule_and_check() {
    const std::vector<RequestState*> waiting_before(waiting_.begin(), waiting_.end());
    const std::vector<RequestState*> running_before = running_;
    const int free_before = free_blocks_;
    const Schedule plan = scheduler_.schedule(waiting_, running_, std::max(0, free_before + blocks_misreported_));
    ++exercised_.schedules;
    ASSERT_NO_FATAL_FAILURE(check_schedule(waiting_before, running_before, free_before, plan));
    forward(plan);
  }

  void check_schedule(const std::vector<RequestState*>& waiting_before,
                      const std::vector<RequestState*>& running_before, int free_before, const Schedule& plan) {
    const SchedulerOptions& options = scheduler_.options();
    const int block_size = shape_.block_size;

    // Preemption only when the running requests' rows do not fit otherwise:
    // a chunk takes the blocks promised to it, a decode row its new block
    // from the blocks nobody holds or was promised (computed_ is still the
    // state before the schedule here).
    const int unpromised_before = shape_.n_blocks - committed_to(running_before);
    int unpreempted_budget = options.token_budget;
    int unpreempted_blocks = 0;
    for (const RequestState* request : running_before) {
      if (unpreempted_budget == 0) break;
      const int computed = computed_[static_cast<std::size_t>(id_of(request))];
      const int pending = static_cast<int>(request->tokens.size()) - computed;
      const int rows = std::min(pending, unpreempted_budget);
      unpreempted_budget -= rows;
      if (pending == 1)
        unpreempted_blocks += blocks_covering(computed + 1, block_size) - blocks_covering(computed, block_size);
    }
    if (unpreempted_blocks <= unpromised_before)
      ASSERT_TRUE(plan.preempted.empty())
          << "preempted although the decode rows fit in " << unpromised_before << " blocks neither held nor promised";

    // Progress: with work queued, the batch is never empty.
    ASSERT_FALSE(plan.rows.empty()) << "no rows with " << waiting_before.size() << " waiting and "
                                    << running_before.size() << " running, " << free_before << " blocks free";

    // Preemption takes the newest running requests, newest first.
    const std::size_t n_preempted = plan.preempted.size();
    ASSERT_LE(n_preempted, running_before.size());
    for (std::size_t k = 0; k < n_preempted; ++k)
      ASSERT_EQ(plan.preempted[k], running_before[running_before.size() - 1 - k])
          << "preemption " << k << " is not the newest running request";
    const std::vector<RequestState*> kept(running_before.begin(),
                                          running_before.end() - static_cast<std::ptrdiff_t>(n_preempted));
    // What the kept ones hold or were promised before their rows.
    const int committed_kept = committed_to(kept);
    int freed = 0;
    for (RequestState* victim : plan.preempted) {
      const auto id = static_cast<std::size_t>(id_of(victim));
      ASSERT_EQ(victim->computed, 0) << "preempted request " << id << " keeps computed positions";
      freed += held_[id];
      held_[id] = 0;
      computed_[id] = 0;
    }

    // First come, first served: the queue admission reads is the old one
    // with the preempted pushed in front (oldest first); admission takes a
    // prefix of it and what is left waits, in order. So a preempted request
    // not admitted again waits at the very front.
    std::deque<RequestState*> queue(waiting_before.begin(), waiting_before.end());
    for (RequestState* victim : plan.preempted) queue.push_front(victim);
    ASSERT_LE(plan.admitted.size(), queue.size());
    for (std::size_t k = 0; k < plan.admitted.size(); ++k)
      ASSERT_EQ(plan.admitted[k], queue[k]) << "admission " << k << " overtook the front of the queue";
    const std::vector<RequestState*> left(queue.begin() + static_cast<std::ptrdiff_t>(plan.admitted.size()),
                                          queue.end());
    ASSERT_EQ(std::vector<RequestState*>(waiting_.begin(), waiting_.end()), left) << "the waiting queue after";
    std::vector<RequestState*> expected_running = kept;
    expected_running.insert(expected_running.end(), plan.admitted.begin(), plan.admitted.end());
    ASSERT_EQ(running_, expected_running) << "running after: the kept ones in order, then the admitted";
    ASSERT_LE(static_cast<int>(running_.size()), options.max_sequences);
    for (RequestState* victim : plan.preempted)
      if (std::find(plan.admitted.begin(), plan.admitted.end(), victim) != plan.admitted.end()) ++exercised_.readmitted;

    // Static batching forms a batch only when the last one has finished.
    if (options.admission == Admission::WhenBatchEmpty && !plan.admitted.empty())
      ASSERT_TRUE(kept.empty()) << "static admission admitted beside " << kept.size() << " running requests";

    // Rows: kept running requests first (oldest first, as many rows as the
    // budget left allows), then the admitted ones from position 0.
    ASSERT_LE(plan.admitted.size(), plan.rows.size());
    const std::size_t running_rows = plan.rows.size() - plan.admitted.size();
    ASSERT_LE(running_rows, kept.size());
    int budget = options.token_budget;
    int blocks_needed = 0;
    int unpromised = shape_.n_blocks - committed_kept;  // what admission may promise, after the decode rows
    for (std::size_t i = 0; i < plan.rows.size(); ++i) {
      const ScheduledRows& row = plan.rows[i];
      const bool admitted = i >= running_rows;
      RequestState* request = admitted ? plan.admitted[i - running_rows] : kept[i];
      ASSERT_EQ(row.request, request) << "row " << i;
      const auto id = static_cast<std::size_t>(id_of(request));
      ASSERT_EQ(row.first_position, computed_[id]) << "row " << i << " does not start at its first uncomputed position";
      const int pending = static_cast<int>(request->tokens.size()) - computed_[id];
      ASSERT_GE(pending, 1);
      ASSERT_GE(row.n_rows, 1) << "row " << i;
      if (admitted && pending > budget)
        ASSERT_TRUE(options.chunked_prefill) << "a prompt of " << pending << " rows split without chunked prefill";
      ASSERT_EQ(row.n_rows, std::min(pending, budget))
          << "row " << i << ": " << pending << " pending, budget " << budget;
      budget -= row.n_rows;
      blocks_needed += blocks_covering(row.first_position + row.n_rows, block_size) - held_[id];
      if (admitted)
        unpromised -= blocks_covering(pending, block_size);  // its whole sequence: the chunk's blocks and the rest
      else if (pending == 1)
        unpromised -= blocks_covering(row.first_position + 1, block_size) - held_[id];  // a decode row's new block
      if (!row.samples_token()) ++exercised_.split_prompt_rows;
      if (!options.chunked_prefill)
        ASSERT_TRUE(row.samples_token()) << "without chunked prefill, row " << i << " stops short";
    }
    ASSERT_GE(budget, 0) << "the token budget is exceeded";
    ASSERT_LE(plan.total_rows(), options.token_budget);
    // A running request is left out only when the budget is spent.
    if (running_rows < kept.size())
      ASSERT_EQ(budget, 0) << "running request " << id_of(kept[running_rows]) << " left out with budget left";
    // Each request at most once.
    std::vector<const RequestState*> in_batch;
    for (const ScheduledRows& row : plan.rows) in_batch.push_back(row.request);
    std::sort(in_batch.begin(), in_batch.end());
    ASSERT_EQ(std::adjacent_find(in_batch.begin(), in_batch.end()), in_batch.end()) << "a request appears twice";

    // Blocks: the scheduler's count is the test's, and fits what was free
    // plus what the preempted gave back.
    ASSERT_EQ(plan.blocks_needed, blocks_needed);
    ASSERT_LE(blocks_needed, free_before + freed) << "the schedule takes more blocks than are free";
    ASSERT_GE(unpromised, 0) << "the schedule promises more blocks than the pool has";

    // Admission stops only for a reason: no slot, no budget, static with a
    // batch running, the front's rows do not fit the budget (without
    // chunking), or its whole sequence does not fit the blocks neither held
    // nor promised. After a preemption either way is right (vLLM admits
    // nothing then; this scheduler may).
    const int free_left = free_before + freed - blocks_needed;
    const bool may_admit = options.admission == Admission::EveryIteration || kept.empty();
    if (may_admit && n_preempted == 0 && !waiting_.empty() &&
        static_cast<int>(running_.size()) < options.max_sequences && budget > 0) {
      const RequestState* front = waiting_.front();
      const int pending = static_cast<int>(front->tokens.size());
      const bool rows_fit = pending <= budget || options.chunked_prefill;
      ASSERT_FALSE(rows_fit && blocks_covering(pending, block_size) <= unpromised)
          << "request " << id_of(front) << " (" << pending << " rows) fits " << budget << " rows and " << unpromised
          << " blocks but was not admitted";
    }
    exercised_.preemptions += static_cast<long long>(n_preempted);
    if (shape_.n_blocks == blocks_covering(shape_.context, block_size))
      exercised_.preemptions_in_one_context_pools += static_cast<long long>(n_preempted);
    free_blocks_ = free_left;
  }

  // The forward, simulated: computed positions advance and take their
  // blocks; every row that reaches its sequence's end yields a token.
  void forward(const Schedule& plan) {
    for (const ScheduledRows& row : plan.rows) {
      RequestState& request = *row.request;
      const auto id = static_cast<std::size_t>(id_of(&request));
      const bool samples = row.samples_token();
      request.computed += row.n_rows;
      computed_[id] = row.first_position + row.n_rows;
      held_[id] = blocks_covering(computed_[id], shape_.block_size);
      if (!samples) continue;
      const SimulatedRequest& client = simulated(&request);
      const bool stop = request.generated() == client.stop_at;
      request.tokens.push_back(stop ? llm::Tokenizer::kBos : kOtherToken);
      if (stop) {
        ++exercised_.stopped;
        finish(&request);
      } else if (request.generated() == client.request.max_tokens) {
        finish(&request);
      }
    }
  }

  const TraceShape& shape_;
  int blocks_misreported_;
  Scheduler scheduler_;
  Exercised& exercised_;
  std::vector<std::unique_ptr<RequestState>> states_;  // [requests] by id
  std::deque<RequestState*> waiting_;
  std::vector<RequestState*> running_;
  std::vector<int> cancellations_;  // ids with a cancel_at, in cancel_at order
  std::size_t next_cancellation_ = 0;
  std::size_t next_arrival_ = 0;
  int iteration_ = 0;
  // The test's model.
  std::vector<int> held_;      // [requests] blocks each holds
  std::vector<int> computed_;  // [requests] positions with K/V
  std::vector<int> finishes_;  // [requests] times each finished (or was cancelled)
  int free_blocks_;
};

// A few hundred thousand schedules over seeded traces, the policies in turn:
// every check above after every schedule, and the end of every trace clean.
TEST(Step07SchedulerProperty, RandomTracesKeepEveryInvariant) {
  constexpr int kTraces = 400;
  constexpr std::uint64_t kSeed = 20240707;
  Exercised exercised;
  for (int index = 0; index < kTraces; ++index) {
    const TraceShape shape = random_trace(index, kSeed);
    SimulatedEngine engine(shape, exercised);
    engine.run();
    if (HasFatalFailure()) FAIL() << "trace " << index << " (" << shape.describe() << ")";
  }
  // The traces reached what the checks are about (the suite cannot pass vacuously).
  EXPECT_GT(exercised.schedules, 200'000);
  EXPECT_GT(exercised.preemptions, 1'000);
  EXPECT_GT(exercised.preemptions_in_one_context_pools, 400);
  EXPECT_GT(exercised.split_prompt_rows, 2'000);
  EXPECT_GT(exercised.cancelled_waiting, 100);
  EXPECT_GT(exercised.cancelled_running, 100);
  EXPECT_GT(exercised.stopped, 1'000);
  EXPECT_GT(exercised.idle_jumps, 100);
  std::cout << "[ info     ] " << exercised.schedules << " schedules, " << exercised.preemptions << " preemptions ("
            << exercised.preemptions_in_one_context_pools << " in pools of one context, " << exercised.readmitted
            << " admitted again at once), " << exercised.split_prompt_rows << " chunks, " << exercised.cancelled_waiting
            << " + " << exercised.cancelled_running << " cancellations, " << exercised.stopped << " stops, "
            << exercised.idle_jumps << " idle gaps\n";
}

// Negative controls: a scheduler told one block more than is free overdraws
// the pool, one told one block less preempts or holds back a request that
// fits; the checks above catch both (so they are not vacuous).
// The messages of the checks that failed over a few traces.
std::vector<std::string> failures_with_misreported_blocks(int blocks_misreported) {
  ::testing::TestPartResultArray failures;
  {
    const ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    Exercised exercised;
    for (int index = 0; index < 40 && failures.size() == 0; ++index) {
      const TraceShape shape = random_trace(index, 20240707);
      SimulatedEngine(shape, exercised, blocks_misreported).run();
    }
  }
  std::vector<std::string> messages;
  for (int i = 0; i < failures.size(); ++i) messages.emplace_back(failures.GetTestPartResult(i).message());
  return messages;
}

bool any_says(const std::vector<std::string>& messages, const std::string& words) {
  return std::any_of(messages.begin(), messages.end(),
                     [&](const std::string& message) { return message.find(words) != std::string::npos; });
}

TEST(Step07SchedulerProperty, ChecksCatchMisreportedFreeBlocks) {
  const auto overdraw = failures_with_misreported_blocks(+1);
  EXPECT_TRUE(any_says(overdraw, "more blocks than are free") || any_says(overdraw, "overbook") ||
              any_says(overdraw, "promises more blocks"))
      << overdraw.size() << " failures";
  const auto underuse = failures_with_misreported_blocks(-1);
  EXPECT_TRUE(any_says(underuse, "preempted although") || any_says(underuse, "was not admitted"))
      << underuse.size() << " failures";
}

// One preemption by hand: two requests decoding at a block boundary, one
// free block. The older one gets it; the newer one is preempted, waits at
// the front of the queue with nothing computed, and is not admitted again
// (its recompute needs two blocks). With four free blocks (the control)
// nobody is preempted and the queued prompt joins.
TEST(Step07Scheduler, OutOfBlocksPreemptsTheNewest) {
  constexpr int kBlockSize = 4;
  const Scheduler scheduler({Admission::EveryIteration, 4, 64, false}, kBlockSize);
  // Three requests of 5 tokens; the first two have 4 computed (one full
  // block each), so their next row opens a second block.
  std::vector<std::unique_ptr<RequestState>> states;
  std::deque<RequestState*> waiting;
  std::vector<RequestState*> running;
  const auto reset = [&] {
    states.clear();
    for (int id = 0; id < 3; ++id) {
      Request request;
      request.id = id;
      request.prompt = {llm::Tokenizer::kBos, 5, 5, 5, 5};
      states.push_back(std::make_unique<RequestState>(request, kVocab));
    }
    states[0]->computed = states[1]->computed = kBlockSize;
    running = {states[0].get(), states[1].get()};
    waiting = {states[2].get()};
  };

  reset();
  const Schedule plan = scheduler.schedule(waiting, running, /*free_blocks=*/1);
  ASSERT_EQ(plan.rows.size(), 1u);
  EXPECT_EQ(plan.rows[0].request, states[0].get());
  EXPECT_EQ(plan.rows[0].first_position, kBlockSize);
  EXPECT_EQ(plan.rows[0].n_rows, 1);
  EXPECT_EQ(plan.blocks_needed, 1);
  EXPECT_EQ(plan.preempted, std::vector<RequestState*>{states[1].get()});
  EXPECT_TRUE(plan.admitted.empty());
  EXPECT_EQ(states[1]->computed, 0);
  EXPECT_EQ(running, std::vector<RequestState*>{states[0].get()});
  EXPECT_EQ(waiting, (std::deque<RequestState*>{states[1].get(), states[2].get()}));

  reset();
  const Schedule roomy = scheduler.schedule(waiting, running, /*free_blocks=*/4);
  EXPECT_TRUE(roomy.preempted.empty());
  EXPECT_EQ(roomy.admitted, std::vector<RequestState*>{states[2].get()});
  EXPECT_EQ(roomy.rows.size(), 3u);
  EXPECT_EQ(roomy.blocks_needed, 4);  // a second block for each decode row, two for the 5-token prompt
  EXPECT_TRUE(waiting.empty());
}

// Bad options are InputErrors; the smallest valid ones are accepted.
TEST(Step07Scheduler, ConstructorRejectsBadOptions) {
  EXPECT_THROW(Scheduler({Admission::EveryIteration, 0, 512, false}, 16), llm::InputError);  // no slot
  EXPECT_THROW(Scheduler({Admission::EveryIteration, -1, 512, false}, 16), llm::InputError);
  EXPECT_THROW(Scheduler({Admission::EveryIteration, 4, 3, true}, 16), llm::InputError);  // budget < a row each
  EXPECT_THROW(Scheduler({Admission::WhenBatchEmpty, 4, 3, false}, 16), llm::InputError);
  EXPECT_THROW(Scheduler({Admission::EveryIteration, 4, 64, false}, 0), llm::InputError);  // block size 0
  EXPECT_THROW(Scheduler({Admission::EveryIteration, 4, 64, false}, -7), llm::InputError);
  EXPECT_NO_THROW(Scheduler({Admission::EveryIteration, 1, 1, true}, 1));
  EXPECT_NO_THROW(Scheduler({Admission::WhenBatchEmpty, 4, 4, false}, 1));
}

}  // namespace
}  // namespace step07
