// Step 07's scheduler against step 05's block manager (the one ledger),
// with no model and no K/V. A simulated engine loop replays long seeded
// random traces (prompt lengths 1..context-1, prompts that share system
// prompts, random max_tokens, bursty arrivals, early end tokens,
// cancellations of waiting and running requests) under every policy's
// options (static, one at a time, continuous, chunked with small budgets),
// block sizes 1, 7 and 16, KV pools down to exactly one full context, with
// automatic prefix caching on and off. After every schedule it checks the
// block manager's invariants and the scheduler's promises: the budget, the
// slots, every scheduled row's blocks held and private, a prompt's whole
// sequence reserved from its admission, no running request losing a block,
// preemption only when needed and of the newest, first come first served,
// admission that stops only for a reason, static admission, whole prompts
// without chunking, the oldest request always progressing. At the end of
// each trace every request has finished exactly once and no block is used.
// Negative controls show the checks catch a ledger that skips reservations
// or leaks blocks; focused tests pin one preemption by hand and the
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
#include "step05_paged_attention/block_manager.hpp"
#include "step07_batching/policies.hpp"
#include "step07_batching/request.hpp"
#include "step07_batching/scheduler.hpp"

namespace step07 {
namespace {

constexpr int kVocab = 8;       // prompt ids in [1, kVocab); the sampler needs a size
constexpr int kOtherToken = 5;  // what the simulated model "generates" when it does not stop

// The test's own block arithmetic.
int blocks_covering(int positions, int block_size) { return (positions + block_size - 1) / block_size; }

// Uniform in [lo, hi], and a coin of probability p, from one seeded stream.
int uniform_int(llm::SplitMix64& random, int lo, int hi) {
  return lo + static_cast<int>(random.next() % static_cast<std::uint64_t>(hi - lo + 1));
}
bool chance(llm::SplitMix64& random, double p) { return random.uniform() < p; }

// A fault the negative controls plant in the ledger.
enum class LedgerFault {
  None,
  SkipReserve,    // reserve() does nothing: rows run without their blocks
  LeakOnRelease,  // release() keeps the first block
};

// A KvLedger over a bare block manager: the engine's, without K/V rows to
// copy (a copy-on-write copy is a block taken, which is all the scheduler sees).
class BlockManagerLedger final : public KvLedger {
 public:
  BlockManagerLedger(int n_blocks, int block_size, int slots, int context, bool prefix_caching,
                     LedgerFault fault = LedgerFault::None)
      : blocks_(n_blocks, block_size, slots, blocks_covering(context, block_size)),
        prefix_caching_(prefix_caching),
        fault_(fault) {}
  const step05::BlockManager& blocks() const override { return blocks_; }
  step05::BlockManager& blocks() { return blocks_; }
  int cached_prefix(std::span<const int> tokens) const override {
    return prefix_caching_ ? blocks_.cached_prefix_length(tokens.first(tokens.size() - 1)) : 0;
  }
  int share_cached_prefix(int slot, std::span<const int> tokens) override {
    return prefix_caching_ ? blocks_.share_cached_prefix(slot, tokens, static_cast<int>(tokens.size()) - 1) : 0;
  }
  void reserve(int slot, int first_write, int end) override {
    if (fault_ != LedgerFault::SkipReserve) blocks_.reserve(slot, first_write, end);
  }
  void release(int slot) override {
    const bool leak = fault_ == LedgerFault::LeakOnRelease && blocks_.blocks_held(slot) > 0;
    blocks_.truncate(slot, leak ? 1 : 0);
  }

 private:
  step05::BlockManager blocks_;
  bool prefix_caching_;
  LedgerFault fault_;
};

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
  bool prefix_caching = false;
  std::vector<SimulatedRequest> requests;  // arrival order, ids 0..n-1

  std::string describe() const {
    return fmt::format("{}: max_sequences {}, budget {}, block {}, context {}, pool {} blocks, prefix caching {}, "
                       "{} requests",
                       policy, options.max_sequences, options.token_budget, block_size, context, n_blocks,
                       prefix_caching ? "on" : "off", requests.size());
  }
};

// A prompt of `length` ids, BOS first: often the start of one of a few
// shared system prompts (so prefixes hit), then random ids.
std::vector<int> random_prompt(llm::SplitMix64& random, int length, const std::vector<std::vector<int>>& systems) {
  std::vector<int> prompt;
  if (chance(random, 0.6)) {
    const auto& system = systems[random.next() % systems.size()];
    prompt.assign(system.begin(), system.begin() + std::min<std::ptrdiff_t>(length, std::ssize(system)));
  } else {
    prompt.push_back(llm::Tokenizer::kBos);
  }
  while (static_cast<int>(prompt.size()) < length) prompt.push_back(uniform_int(random, 1, kVocab - 1));
  return prompt;
}

// Draws trace number `index`: the policy in turn, the rest from the seed.
TraceShape random_trace(int index, std::uint64_t seed) {
  llm::SplitMix64 random(llm::splitmix64_mix(seed + static_cast<std::uint64_t>(index)));
  const auto& table = policies();
  const auto& policy = table[static_cast<std::size_t>(index) % table.size()];
  TraceShape shape;
  shape.policy = policy.name;
  shape.context = std::vector<int>{16, 40, 96, 130}[random.next() % 4];
  shape.prefix_caching = (index / table.size()) % 2 == 1;  // each policy with and without
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

  std::vector<std::vector<int>> systems(3);  // [3] system prompts of context - 1 ids
  for (auto& system : systems) {
    system = {llm::Tokenizer::kBos};
    while (static_cast<int>(system.size()) < shape.context - 1) system.push_back(uniform_int(random, 1, kVocab - 1));
  }
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
    simulated.request.prompt = random_prompt(random, prompt_length, systems);
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
  long long preemptions_in_one_context_pools = 0;
  long long preemptions_with_prefix_caching = 0;
  long long split_prompt_rows = 0;  // rows that stop short of the sequence's end (chunks)
  long long prefix_hit_blocks = 0;  // blocks admitted requests shared from the prefix cache
  long long evictions = 0;          // cached blocks reclaimed for an allocation
  long long cancelled_waiting = 0;
  long long cancelled_running = 0;
  long long stopped = 0;     // finished on the end token before max_tokens
  long long idle_jumps = 0;  // the engine drained before the next arrival
};

// What a running request held before a schedule: its blocks, in order.
using Tables = std::vector<std::vector<std::int32_t>>;  // [requests] the block table of each (empty: none)

// The engine's loop without a model: submit, cancel, schedule, "forward"
// (computed positions advance, full blocks are published, a token comes out
// of every row that reaches a sequence's end), finish. Every schedule is
// checked against the block manager and the scheduler's promises.
class SimulatedEngine {
 public:
  SimulatedEngine(const TraceShape& shape, Exercised& exercised, LedgerFault fault = LedgerFault::None)
      : shape_(shape),
        scheduler_(shape.options),
        ledger_(shape.n_blocks, shape.block_size, shape.options.max_sequences, shape.context, shape.prefix_caching,
                fault),
        exercised_(exercised),
        computed_(shape.requests.size(), 0),
        finishes_(shape.requests.size(), 0) {
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
      ASSERT_NO_FATAL_FAILURE(cancel_due());
      if (waiting_.empty() && running_.empty()) {
        if (next_arrival_ < shape_.requests.size()) {
          iteration_ = shape_.requests[next_arrival_].arrival;  // idle: skip to the next arrival
          ++exercised_.idle_jumps;
        }
        continue;
      }
      ASSERT_NO_FATAL_FAILURE(check_queues());
      ASSERT_NO_FATAL_FAILURE(schedule_and_check()) << "at iteration " << iteration_;
      ++iteration_;
    }
    // Every request finished exactly once, and every block came back.
    for (std::size_t id = 0; id < finishes_.size(); ++id) ASSERT_EQ(finishes_[id], 1) << "request " << id;
    ASSERT_NO_THROW(blocks().check_invariants());
    ASSERT_EQ(blocks().used_blocks(), 0) << "blocks leaked";
    exercised_.prefix_hit_blocks += blocks().counters().prefix_hit_blocks;
    exercised_.evictions += blocks().counters().evictions;
  }

 private:
  const step05::BlockManager& blocks() const { return ledger_.blocks(); }
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
      } else {
        ASSERT_NE(std::find(running_.begin(), running_.end(), request), running_.end()) << "request " << id;
        ++exercised_.cancelled_running;
      }
      finish(request);
    }
  }

  void finish(RequestState* request) {
    const auto running = std::find(running_.begin(), running_.end(), request);
    if (running != running_.end()) {
      running_.erase(running);
      ledger_.release(request->slot);
      request->slot = -1;
    }
    ++finishes_[static_cast<std::size_t>(id_of(request))];
  }

  // Between schedules: the block manager is consistent; the running
  // requests hold distinct slots, what they computed and, while a prompt is
  // being prefilled, blocks for their whole sequence; the waiting ones hold
  // nothing and have computed nothing.
  void check_queues() const {
    ASSERT_NO_THROW(blocks().check_invariants());
    std::vector<bool> slot_taken(static_cast<std::size_t>(shape_.options.max_sequences), false);
    for (const RequestState* request : running_) {
      const auto id = static_cast<std::size_t>(id_of(request));
      ASSERT_GE(request->slot, 0) << "request " << id;
      ASSERT_LT(request->slot, shape_.options.max_sequences) << "request " << id;
      ASSERT_FALSE(slot_taken[static_cast<std::size_t>(request->slot)]) << "two requests in slot " << request->slot;
      slot_taken[static_cast<std::size_t>(request->slot)] = true;
      ASSERT_EQ(request->computed, computed_[id]) << "request " << id;
      const int sequence = request->decoding() ? request->computed : static_cast<int>(request->tokens.size());
      ASSERT_GE(blocks().blocks_held(request->slot), blocks_covering(sequence, shape_.block_size))
          << "request " << id << " lost blocks promised to it";
    }
    for (const RequestState* request : waiting_) {
      const auto id = static_cast<std::size_t>(id_of(request));
      ASSERT_EQ(request->computed, 0) << "waiting request " << id;
      ASSERT_EQ(request->slot, -1) << "waiting request " << id;
    }
  }

  // Would the running requests' rows fit the pool with nobody preempted?
  // (Each one's reservation is its own: no two running sequences share a
  // block that either writes.)
  bool rows_fit_without_preemption(const std::vector<RequestState*>& running) const {
    int budget = shape_.options.token_budget;
    int needed = 0;
    for (const RequestState* request : running) {
      if (budget == 0) break;
      const int rows = std::min(request->pending_rows(), budget);
      budget -= rows;
      needed += blocks().blocks_needed_to_reserve(request->slot, request->computed, request->computed + rows);
    }
    return needed <= blocks().available_blocks();
  }

  void schedule_and_check() {
    const std::vector<RequestState*> waiting_before(waiting_.begin(), waiting_.end());
    const std::vector<RequestState*> running_before = running_;
    const bool fits = rows_fit_without_preemption(running_before);
    Tables tables_before(shape_.requests.size());
    for (const RequestState* request : running_before) {
      const auto table = blocks().block_table(request->slot);
      tables_before[static_cast<std::size_t>(id_of(request))].assign(table.begin(), table.end());
    }
    const Schedule plan = scheduler_.schedule(waiting_, running_, ledger_);
    ++exercised_.schedules;
    if (fits) ASSERT_TRUE(plan.preempted.empty()) << "preempted although the running requests' rows fit the pool";
    ASSERT_NO_FATAL_FAILURE(check_queues_after(waiting_before, running_before, plan));
    ASSERT_NO_FATAL_FAILURE(check_rows(running_before, tables_before, plan));
    ASSERT_NO_FATAL_FAILURE(check_admission_stopped_for_a_reason(running_before.size() - plan.preempted.size(), plan));
    forward(plan);
  }

  // Who moved: the newest running requests preempted (newest first, to the
  // front of the queue, nothing computed, no slot); a prefix of that queue
  // admitted in order; static batching admits only into an empty batch.
  void check_queues_after(const std::vector<RequestState*>& waiting_before,
                          const std::vector<RequestState*>& running_before, const Schedule& plan) {
    const SchedulerOptions& options = scheduler_.options();
    const std::size_t n_preempted = plan.preempted.size();
    ASSERT_LE(n_preempted, running_before.size());
    for (std::size_t k = 0; k < n_preempted; ++k)
      ASSERT_EQ(plan.preempted[k], running_before[running_before.size() - 1 - k])
          << "preemption " << k << " is not the newest running request";
    const std::vector<RequestState*> kept(running_before.begin(),
                                          running_before.end() - static_cast<std::ptrdiff_t>(n_preempted));
    for (RequestState* victim : plan.preempted) {
      ASSERT_EQ(victim->computed, 0) << "preempted request " << id_of(victim) << " keeps computed positions";
      computed_[static_cast<std::size_t>(id_of(victim))] = 0;
    }
    // The oldest request progresses: it is never preempted (a pool of one
    // full context holds it alone).
    if (!running_before.empty())
      ASSERT_EQ(std::find(plan.preempted.begin(), plan.preempted.end(), running_before.front()), plan.preempted.end())
          << "the oldest running request was preempted";
    if (!plan.preempted.empty()) ASSERT_TRUE(plan.admitted.empty()) << "admitted in an iteration that preempted";

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
    if (options.admission == Admission::WhenBatchEmpty && !plan.admitted.empty())
      ASSERT_TRUE(kept.empty()) << "static admission admitted beside " << kept.size() << " running requests";
    for (RequestState* victim : plan.preempted) ASSERT_EQ(victim->slot, -1) << "preempted request keeps its slot";
    ASSERT_NO_THROW(blocks().check_invariants());
  }

  // The rows: kept running requests first (oldest first, as many rows as the
  // budget left allows), then the admitted ones from their cached prefix.
  // Each row's blocks are held and private; a kept request keeps every block
  // it held (a copy-on-write copy replaces only a block its rows write).
  void check_rows(const std::vector<RequestState*>& running_before, const Tables& tables_before,
                  const Schedule& plan) {
    const SchedulerOptions& options = scheduler_.options();
    const int block_size = shape_.block_size;
    ASSERT_FALSE(plan.rows.empty()) << "no rows with work queued";  // progress
    if (!running_before.empty()) ASSERT_EQ(plan.rows.front().request, running_before.front()) << "the oldest waits";
    const std::size_t running_rows = plan.rows.size() - plan.admitted.size();
    int budget = options.token_budget;
    for (std::size_t i = 0; i < plan.rows.size(); ++i) {
      const ScheduledRows& row = plan.rows[i];
      const bool admitted = i >= running_rows;
      RequestState* request = admitted ? plan.admitted[i - running_rows] : running_before[i];
      ASSERT_EQ(row.request, request) << "row " << i;
      const auto id = static_cast<std::size_t>(id_of(request));
      if (admitted) {
        ASSERT_EQ(row.first_position % block_size, 0) << "a cached prefix of whole blocks";
        ASSERT_LT(row.first_position, static_cast<int>(request->tokens.size())) << "the last token is computed";
        if (!shape_.prefix_caching) ASSERT_EQ(row.first_position, 0);
        computed_[id] = row.first_position;
      }
      ASSERT_EQ(row.first_position, computed_[id]) << "row " << i << " does not start at its first uncomputed position";
      const int pending = static_cast<int>(request->tokens.size()) - computed_[id];
      if (admitted && pending > budget)
        ASSERT_TRUE(options.chunked_prefill) << "a prompt of " << pending << " rows split without chunked prefill";
      ASSERT_EQ(row.n_rows, std::min(pending, budget)) << "row " << i << ": " << pending << " pending, budget " << budget;
      budget -= row.n_rows;
      const auto table = blocks().block_table(request->slot);
      ASSERT_GE(static_cast<int>(table.size()), blocks_covering(row.first_position + row.n_rows, block_size))
          << "row " << i << " has no block for its last position";
      if (admitted)  // its whole sequence reserved at admission: a chunked prompt never waits for blocks
        ASSERT_GE(static_cast<int>(table.size()), blocks_covering(static_cast<int>(request->tokens.size()), block_size));
      for (int logical = row.first_position / block_size; logical * block_size < row.first_position + row.n_rows;
           ++logical) {
        ASSERT_EQ(blocks().ref_count(table[static_cast<std::size_t>(logical)]), 1) << "a written block is shared";
        ASSERT_FALSE(blocks().is_cached(table[static_cast<std::size_t>(logical)])) << "a written block is cached";
      }
      if (!admitted) {
        const auto& before = tables_before[id];
        ASSERT_GE(table.size(), before.size()) << "request " << id << " lost blocks";
        for (int logical = 0; logical < row.first_position / block_size; ++logical)
          ASSERT_EQ(table[static_cast<std::size_t>(logical)], before[static_cast<std::size_t>(logical)])
              << "request " << id << " lost block " << logical;
      }
      if (!row.samples_token()) ++exercised_.split_prompt_rows;
      if (!options.chunked_prefill) ASSERT_TRUE(row.samples_token()) << "without chunked prefill, row " << i << " stops short";
    }
    ASSERT_GE(budget, 0) << "the token budget is exceeded";
    if (running_rows < running_before.size() - plan.preempted.size())
      ASSERT_EQ(budget, 0) << "a running request left out with budget left";
    std::vector<const RequestState*> in_batch;
    for (const ScheduledRows& row : plan.rows) in_batch.push_back(row.request);
    std::sort(in_batch.begin(), in_batch.end());
    ASSERT_EQ(std::adjacent_find(in_batch.begin(), in_batch.end()), in_batch.end()) << "a request appears twice";
    budget_left_ = budget;
  }

  // Admission stops only for a reason: an iteration that preempted, no slot,
  // no budget, static with a batch running, the front's rows do not fit the
  // budget (without chunking), or its blocks do not fit the pool.
  void check_admission_stopped_for_a_reason(std::size_t kept, const Schedule& plan) const {
    const SchedulerOptions& options = scheduler_.options();
    const bool may_admit = options.admission == Admission::EveryIteration || kept == 0;
    if (!may_admit || !plan.preempted.empty() || waiting_.empty() ||
        static_cast<int>(running_.size()) >= options.max_sequences || budget_left_ == 0)
      return;
    const RequestState* front = waiting_.front();
    const int cached = ledger_.cached_prefix(front->tokens);
    const int size = static_cast<int>(front->tokens.size());
    const bool rows_fit = size - cached <= budget_left_ || options.chunked_prefill;
    const bool blocks_fit = blocks().blocks_needed_to_admit(front->tokens, cached, size) <= blocks().available_blocks();
    ASSERT_FALSE(rows_fit && blocks_fit) << "request " << id_of(front) << " (" << size << " tokens, " << cached
                                         << " cached) fits but was not admitted";
  }

  // The forward, simulated: computed positions advance, the blocks they
  // filled enter the prefix cache, and every row that reaches its
  // sequence's end yields a token.
  void forward(const Schedule& plan) {
    exercised_.preemptions += static_cast<long long>(plan.preempted.size());
    if (shape_.n_blocks == blocks_covering(shape_.context, shape_.block_size))
      exercised_.preemptions_in_one_context_pools += static_cast<long long>(plan.preempted.size());
    if (shape_.prefix_caching)
      exercised_.preemptions_with_prefix_caching += static_cast<long long>(plan.preempted.size());
    for (const ScheduledRows& row : plan.rows) {
      RequestState& request = *row.request;
      const auto id = static_cast<std::size_t>(id_of(&request));
      const bool samples = row.samples_token();
      request.computed += row.n_rows;
      computed_[id] = request.computed;
      if (shape_.prefix_caching)
        ledger_.blocks().publish_full_blocks(request.slot,
                                             std::span<const int>(request.tokens).first(request.computed));
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
  Scheduler scheduler_;
  BlockManagerLedger ledger_;
  Exercised& exercised_;
  std::vector<std::unique_ptr<RequestState>> states_;  // [requests] by id
  std::deque<RequestState*> waiting_;
  std::vector<RequestState*> running_;
  std::vector<int> cancellations_;  // ids with a cancel_at, in cancel_at order
  std::size_t next_cancellation_ = 0;
  std::size_t next_arrival_ = 0;
  int iteration_ = 0;
  std::vector<int> computed_;  // [requests] positions with K/V, by the test's count
  std::vector<int> finishes_;  // [requests] times each finished (or was cancelled)
  int budget_left_ = 0;        // rows the last schedule left unused
};

// A few hundred thousand schedules over seeded traces, the policies in turn,
// with and without prefix caching: every check above after every schedule,
// and the end of every trace clean.
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
  EXPECT_GT(exercised.preemptions_with_prefix_caching, 400);
  EXPECT_GT(exercised.split_prompt_rows, 2'000);
  EXPECT_GT(exercised.prefix_hit_blocks, 1'000);
  EXPECT_GT(exercised.evictions, 100);
  EXPECT_GT(exercised.cancelled_waiting, 100);
  EXPECT_GT(exercised.cancelled_running, 100);
  EXPECT_GT(exercised.stopped, 1'000);
  EXPECT_GT(exercised.idle_jumps, 100);
  std::cout << "[ info     ] " << exercised.schedules << " schedules, " << exercised.preemptions << " preemptions ("
            << exercised.preemptions_in_one_context_pools << " in pools of one context, "
            << exercised.preemptions_with_prefix_caching << " with prefix caching), " << exercised.split_prompt_rows
            << " chunks, " << exercised.prefix_hit_blocks << " prefix-hit blocks, " << exercised.evictions
            << " evictions, " << exercised.cancelled_waiting << " + " << exercised.cancelled_running
            << " cancellations, " << exercised.stopped << " stops, " << exercised.idle_jumps << " idle gaps\n";
}

// Negative controls: the checks above catch a ledger that skips
// reservations (rows without blocks) and one that leaks a block on every
// release (so they are not vacuous). The messages of the checks that failed
// over a few traces.
std::vector<std::string> failures_with_fault(LedgerFault fault) {
  ::testing::TestPartResultArray failures;
  {
    const ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    Exercised exercised;
    for (int index = 0; index < 40 && failures.size() == 0; ++index) {
      TraceShape shape = random_trace(index, 20240707);
      shape.prefix_caching = false;
      SimulatedEngine(shape, exercised, fault).run();
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

TEST(Step07SchedulerProperty, ChecksCatchAFaultyLedger) {
  const auto skipped = failures_with_fault(LedgerFault::SkipReserve);
  EXPECT_TRUE(any_says(skipped, "has no block for its last position") || any_says(skipped, "lost blocks promised"))
      << skipped.size() << " failures";
  const auto leaked = failures_with_fault(LedgerFault::LeakOnRelease);
  EXPECT_TRUE(any_says(leaked, "blocks leaked") || any_says(leaked, "preempted although") ||
              any_says(leaked, "fits but was not admitted"))
      << leaked.size() << " failures";
}

// One preemption by hand: two requests decoding at a block boundary, one
// block left in the pool. The older one gets it; the newer one is
// preempted, gives its block back, waits at the front of the queue with
// nothing computed, and nothing is admitted in that iteration. With four
// blocks to spare (the control) nobody is preempted and the queued prompt
// joins with blocks for all of it.
TEST(Step07Scheduler, OutOfBlocksPreemptsTheNewest) {
  constexpr int kBlockSize = 4;
  constexpr int kContext = 8;
  const Scheduler scheduler({Admission::EveryIteration, 4, 64, false});
  // Three requests of 5 tokens; the first two have 4 computed (one full
  // block each), so their next row opens a second block.
  std::vector<std::unique_ptr<RequestState>> states;
  std::deque<RequestState*> waiting;
  std::vector<RequestState*> running;
  const auto reset = [&](BlockManagerLedger& ledger) {
    states.clear();
    for (int id = 0; id < 3; ++id) {
      Request request;
      request.id = id;
      request.prompt = {llm::Tokenizer::kBos, 5, 5, 5, 5};
      states.push_back(std::make_unique<RequestState>(request, kVocab));
    }
    for (int id = 0; id < 2; ++id) {
      states[id]->computed = kBlockSize;
      states[id]->slot = id;
      ledger.reserve(id, 0, kBlockSize);
    }
    running = {states[0].get(), states[1].get()};
    waiting = {states[2].get()};
  };

  BlockManagerLedger tight(/*n_blocks=*/3, kBlockSize, 4, kContext, false);
  reset(tight);
  const Schedule plan = scheduler.schedule(waiting, running, tight);
  ASSERT_EQ(plan.rows.size(), 1u);
  EXPECT_EQ(plan.rows[0].request, states[0].get());
  EXPECT_EQ(plan.rows[0].first_position, kBlockSize);
  EXPECT_EQ(plan.rows[0].n_rows, 1);
  EXPECT_EQ(plan.preempted, std::vector<RequestState*>{states[1].get()});
  EXPECT_TRUE(plan.admitted.empty());
  EXPECT_EQ(states[1]->computed, 0);
  EXPECT_EQ(states[1]->slot, -1);
  EXPECT_EQ(tight.blocks().blocks_held(0), 2);
  EXPECT_EQ(tight.blocks().blocks_held(1), 0);
  EXPECT_EQ(tight.blocks().available_blocks(), 1);
  EXPECT_EQ(running, std::vector<RequestState*>{states[0].get()});
  EXPECT_EQ(waiting, (std::deque<RequestState*>{states[1].get(), states[2].get()}));
  tight.blocks().check_invariants();

  BlockManagerLedger roomy(/*n_blocks=*/6, kBlockSize, 4, kContext, false);
  reset(roomy);
  const Schedule joined = scheduler.schedule(waiting, running, roomy);
  EXPECT_TRUE(joined.preempted.empty());
  EXPECT_EQ(joined.admitted, std::vector<RequestState*>{states[2].get()});
  EXPECT_EQ(joined.rows.size(), 3u);
  EXPECT_EQ(states[2]->slot, 2);  // the lowest slot nobody holds
  // A second block for each decode row, two for the 5-token prompt: the pool is spent.
  EXPECT_EQ(roomy.blocks().available_blocks(), 0);
  EXPECT_TRUE(waiting.empty());
  roomy.blocks().check_invariants();
}

// Requests of `length` tokens (BOS, then 5s), ids 0.., none computed.
std::vector<std::unique_ptr<RequestState>> requests_of_lengths(const std::vector<int>& lengths) {
  std::vector<std::unique_ptr<RequestState>> states;
  for (const int length : lengths) {
    Request request;
    request.id = static_cast<int>(states.size());
    request.prompt.assign(static_cast<std::size_t>(length), 5);
    request.prompt[0] = llm::Tokenizer::kBos;
    states.push_back(std::make_unique<RequestState>(request, kVocab));
  }
  return states;
}

// Preemption alone (nothing is admitted in an iteration that preempts):
// three requests decoding at a block boundary, each holding its one full
// block. With no block free, the oldest gets the block of the newest
// (preempted first), and the middle one, newest by then, preempts itself;
// both wait at the front of the queue in arrival order, holding nothing.
// With one block free, the oldest takes it and the middle one the newest's.
TEST(Step07Scheduler, OutOfBlocksPreemptsNewestFirstUntilTheRowsFit) {
  constexpr int kBlockSize = 4;
  constexpr int kContext = 8;
  const Scheduler scheduler({Admission::EveryIteration, 4, 64, false});
  for (const int free_blocks : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << free_blocks << " free blocks");
    BlockManagerLedger ledger(/*n_blocks=*/3 + free_blocks, kBlockSize, 4, kContext, false);
    auto states = requests_of_lengths({5, 5, 5, 3});  // 0, 1, 2 run with 4 computed; 3 waits
    std::vector<RequestState*> running;
    for (int id = 0; id < 3; ++id) {
      states[id]->computed = kBlockSize;
      states[id]->slot = id;
      ledger.reserve(id, 0, kBlockSize);
      running.push_back(states[id].get());
    }
    std::deque<RequestState*> waiting = {states[3].get()};
    ASSERT_EQ(ledger.blocks().available_blocks(), free_blocks);

    const Schedule plan = scheduler.schedule(waiting, running, ledger);
    EXPECT_TRUE(plan.admitted.empty());
    const int kept = free_blocks == 0 ? 1 : 2;  // requests 0 (and 1) keep running
    ASSERT_EQ(plan.rows.size(), static_cast<std::size_t>(kept));
    for (int id = 0; id < kept; ++id) {
      EXPECT_EQ(plan.rows[id].request, states[id].get());
      EXPECT_EQ(plan.rows[id].first_position, kBlockSize);
      EXPECT_EQ(plan.rows[id].n_rows, 1);
      EXPECT_EQ(ledger.blocks().blocks_held(id), 2) << "request " << id;
      EXPECT_EQ(running[static_cast<std::size_t>(id)], states[id].get());
    }
    EXPECT_EQ(running.size(), static_cast<std::size_t>(kept));
    std::vector<RequestState*> preempted = {states[2].get()};  // the newest first
    if (free_blocks == 0) preempted.push_back(states[1].get());
    EXPECT_EQ(plan.preempted, preempted);
    std::deque<RequestState*> expected_waiting(preempted.rbegin(), preempted.rend());  // arrival order
    expected_waiting.push_back(states[3].get());
    EXPECT_EQ(waiting, expected_waiting);
    for (RequestState* victim : preempted) {
      SCOPED_TRACE("preempted request " + std::to_string(victim->request.id));
      EXPECT_EQ(victim->computed, 0);  // recomputed from its tokens when admitted again
      EXPECT_EQ(victim->slot, -1);
      EXPECT_EQ(victim->tokens.size(), 5u);
      EXPECT_EQ(ledger.blocks().blocks_held(victim->request.id), 0);
    }
    EXPECT_EQ(ledger.blocks().available_blocks(), free_blocks == 0 ? 1 : 0);
    ledger.blocks().check_invariants();
  }
}

// Admission by hand, in arrival order, until the budget, the slots or the
// pool say stop. With chunked prefill the budget left cuts a prompt into a
// chunk, but its blocks are reserved for the whole prompt at once; without
// it a prompt that does not fit the budget waits, and nobody behind it
// overtakes it. A prompt whose blocks the pool cannot hold waits too.
TEST(Step07Scheduler, AdmitsInArrivalOrderWithChunksAndWholePromptBlocks) {
  constexpr int kBlockSize = 4;
  constexpr int kContext = 16;
  {
    SCOPED_TRACE("chunked prefill, budget 8");
    const Scheduler scheduler({Admission::EveryIteration, 4, 8, true});
    BlockManagerLedger ledger(/*n_blocks=*/8, kBlockSize, 4, kContext, false);
    auto states = requests_of_lengths({3, 10, 2});
    std::deque<RequestState*> waiting = {states[0].get(), states[1].get(), states[2].get()};
    std::vector<RequestState*> running;
    const Schedule first = scheduler.schedule(waiting, running, ledger);
    // 3 rows of request 0, then a chunk of 5 of request 1's 10: the budget is spent.
    ASSERT_EQ(first.rows.size(), 2u);
    EXPECT_EQ(first.rows[0].request, states[0].get());
    EXPECT_EQ(first.rows[0].first_position, 0);
    EXPECT_EQ(first.rows[0].n_rows, 3);
    EXPECT_TRUE(first.rows[0].samples_token());
    EXPECT_EQ(first.rows[1].request, states[1].get());
    EXPECT_EQ(first.rows[1].first_position, 0);
    EXPECT_EQ(first.rows[1].n_rows, 5);
    EXPECT_FALSE(first.rows[1].samples_token());
    EXPECT_EQ(first.admitted, (std::vector<RequestState*>{states[0].get(), states[1].get()}));
    EXPECT_TRUE(first.preempted.empty());
    EXPECT_EQ(running, first.admitted);
    EXPECT_EQ(waiting, std::deque<RequestState*>{states[2].get()});
    EXPECT_EQ(states[0]->slot, 0);
    EXPECT_EQ(states[1]->slot, 1);
    EXPECT_EQ(ledger.blocks().blocks_held(0), 1);
    EXPECT_EQ(ledger.blocks().blocks_held(1), 3) << "the whole 10-token prompt's blocks, not the chunk's";
    EXPECT_EQ(ledger.blocks().available_blocks(), 4);

    // The forward, by hand: request 0 samples a token, request 1's chunk is in the cache.
    states[0]->computed = 3;
    states[0]->tokens.push_back(7);
    states[1]->computed = 5;
    const Schedule second = scheduler.schedule(waiting, running, ledger);
    // Request 0's decode row, the rest of request 1's prompt, then request 2 in the 2 rows left.
    ASSERT_EQ(second.rows.size(), 3u);
    EXPECT_EQ(second.rows[0].request, states[0].get());
    EXPECT_EQ(second.rows[0].first_position, 3);
    EXPECT_EQ(second.rows[0].n_rows, 1);
    EXPECT_EQ(second.rows[1].request, states[1].get());
    EXPECT_EQ(second.rows[1].first_position, 5);
    EXPECT_EQ(second.rows[1].n_rows, 5);
    EXPECT_EQ(second.rows[2].request, states[2].get());
    EXPECT_EQ(second.rows[2].first_position, 0);
    EXPECT_EQ(second.rows[2].n_rows, 2);
    EXPECT_EQ(second.admitted, std::vector<RequestState*>{states[2].get()});
    EXPECT_EQ(states[2]->slot, 2);
    EXPECT_TRUE(waiting.empty());
    EXPECT_EQ(second.total_rows(), 8);
    ledger.blocks().check_invariants();
  }
  {
    SCOPED_TRACE("no chunking, budget 8: the 10-token prompt waits, and the one behind it too");
    const Scheduler scheduler({Admission::EveryIteration, 4, 8, false});
    BlockManagerLedger ledger(/*n_blocks=*/8, kBlockSize, 4, kContext, false);
    auto states = requests_of_lengths({3, 10, 2});
    std::deque<RequestState*> waiting = {states[0].get(), states[1].get(), states[2].get()};
    std::vector<RequestState*> running;
    const Schedule plan = scheduler.schedule(waiting, running, ledger);
    ASSERT_EQ(plan.rows.size(), 1u);
    EXPECT_EQ(plan.rows[0].n_rows, 3);
    EXPECT_EQ(plan.admitted, std::vector<RequestState*>{states[0].get()});
    EXPECT_EQ(waiting, (std::deque<RequestState*>{states[1].get(), states[2].get()}));
    EXPECT_EQ(states[1]->slot, -1);
  }
  {
    SCOPED_TRACE("a pool of one context: the second prompt's blocks do not fit");
    const Scheduler scheduler({Admission::EveryIteration, 4, 64, true});
    BlockManagerLedger ledger(/*n_blocks=*/4, kBlockSize, 4, kContext, false);
    auto states = requests_of_lengths({9, 6, 1});  // 3 blocks, 2 blocks, 1 block
    std::deque<RequestState*> waiting = {states[0].get(), states[1].get(), states[2].get()};
    std::vector<RequestState*> running;
    const Schedule plan = scheduler.schedule(waiting, running, ledger);
    EXPECT_EQ(plan.admitted, std::vector<RequestState*>{states[0].get()});
    ASSERT_EQ(plan.rows.size(), 1u);
    EXPECT_EQ(plan.rows[0].n_rows, 9);
    EXPECT_EQ(waiting, (std::deque<RequestState*>{states[1].get(), states[2].get()}));
    EXPECT_EQ(ledger.blocks().available_blocks(), 1);
  }
  {
    SCOPED_TRACE("two slots: the third request waits for one");
    const Scheduler scheduler({Admission::EveryIteration, 2, 64, true});
    BlockManagerLedger ledger(/*n_blocks=*/8, kBlockSize, 2, kContext, false);
    auto states = requests_of_lengths({2, 2, 2});
    std::deque<RequestState*> waiting = {states[0].get(), states[1].get(), states[2].get()};
    std::vector<RequestState*> running;
    const Schedule plan = scheduler.schedule(waiting, running, ledger);
    EXPECT_EQ(plan.admitted, (std::vector<RequestState*>{states[0].get(), states[1].get()}));
    EXPECT_EQ(waiting, std::deque<RequestState*>{states[2].get()});
  }
  {
    SCOPED_TRACE("four slots, a request of n = 3 samples: it needs three of them");
    const Scheduler scheduler({Admission::EveryIteration, 4, 64, true});
    BlockManagerLedger ledger(/*n_blocks=*/8, kBlockSize, 4, kContext, false);
    auto states = requests_of_lengths({2, 2, 2});
    states[1]->forks_pending = 2;  // n = 3: it forks two samples once its prompt is computed
    std::deque<RequestState*> waiting = {states[0].get(), states[1].get(), states[2].get()};
    std::vector<RequestState*> running;
    const Schedule plan = scheduler.schedule(waiting, running, ledger);
    // 1 + 3 slots: the third request finds none, though only two requests run.
    EXPECT_EQ(plan.admitted, (std::vector<RequestState*>{states[0].get(), states[1].get()}));
    EXPECT_EQ(Scheduler::slots_taken(running), 4);
    EXPECT_EQ(waiting, std::deque<RequestState*>{states[2].get()});
    // With a running request of n = 3 in two of three slots, an n = 2 request waits at the front.
    BlockManagerLedger small_ledger(/*n_blocks=*/8, kBlockSize, 3, kContext, false);
    const Scheduler three_slots({Admission::EveryIteration, 3, 64, true});
    auto more = requests_of_lengths({2, 2, 2});
    more[0]->forks_pending = 1;
    more[1]->forks_pending = 1;
    std::deque<RequestState*> queue = {more[0].get(), more[1].get(), more[2].get()};
    std::vector<RequestState*> none_running;
    const Schedule admitted_one = three_slots.schedule(queue, none_running, small_ledger);
    EXPECT_EQ(admitted_one.admitted, std::vector<RequestState*>{more[0].get()})
        << "a request overtook one that needs two slots";
    EXPECT_EQ(queue.front(), more[1].get());
  }
}

// Bad options are InputErrors; the smallest valid ones are accepted.
TEST(Step07Scheduler, ConstructorRejectsBadOptions) {
  EXPECT_THROW(Scheduler({Admission::EveryIteration, 0, 512, false}), llm::InputError);  // no slot
  EXPECT_THROW(Scheduler({Admission::EveryIteration, -1, 512, false}), llm::InputError);
  EXPECT_THROW(Scheduler({Admission::EveryIteration, 4, 3, true}), llm::InputError);  // budget < a row each
  EXPECT_THROW(Scheduler({Admission::WhenBatchEmpty, 4, 3, false}), llm::InputError);
  EXPECT_NO_THROW(Scheduler({Admission::EveryIteration, 1, 1, true}));
  EXPECT_NO_THROW(Scheduler({Admission::WhenBatchEmpty, 4, 4, false}));
}

}  // namespace
}  // namespace step07
