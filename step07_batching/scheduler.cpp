#include "step07_batching/scheduler.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "llm/errors.hpp"

namespace step07 {

int Schedule::total_rows() const {
  int total = 0;
  for (const ScheduledRows& entry : rows) total += entry.n_rows;
  return total;
}

int Schedule::decode_rows() const {
  int decode = 0;
  for (const ScheduledRows& entry : rows)
    if (entry.n_rows == 1 && entry.samples_token()) ++decode;
  return decode;
}

int Schedule::prefill_rows() const { return total_rows() - decode_rows(); }

Scheduler::Scheduler(SchedulerOptions options, int block_size) : options_(options), block_size_(block_size) {
  if (options_.max_sequences < 1)
    throw llm::InputError(fmt::format("max_sequences must be at least 1 (got {})", options_.max_sequences));
  if (options_.token_budget < options_.max_sequences)
    throw llm::InputError(fmt::format("the token budget ({}) must hold a row for each of the {} sequences",
                                      options_.token_budget, options_.max_sequences));
  if (block_size_ < 1) throw llm::InputError(fmt::format("block size must be at least 1 (got {})", block_size_));
}

namespace {

// Preempts the newest running request (vLLM's choice: the one that has
// waited least and holds the least progress; its blocks are freed and it is
// recomputed from its tokens when it is admitted again). Returns its blocks.
int preempt_newest(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running, Schedule& plan,
                   const Scheduler& scheduler) {
  RequestState* victim = running.back();
  running.pop_back();
  const int freed = scheduler.blocks_for(victim->computed);
  victim->computed = 0;
  waiting.push_front(victim);  // first in line: it arrived before everything still waiting
  plan.preempted.push_back(victim);
  return freed;
}

}  // namespace

Schedule Scheduler::schedule(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running,
                             int free_blocks) const {
  Schedule plan;
  int budget = options_.token_budget;

  // 1. Running requests, oldest first: a decode row each, or the next chunk
  // of a prompt that chunked prefill left unfinished.
  for (std::size_t i = 0; i < running.size() && budget > 0;) {
    RequestState* request = running[i];
    const int rows = std::min(request->pending_rows(), budget);
    const int needed = blocks_for(request->computed + rows) - blocks_for(request->computed);
    // Out of blocks: take them from the newest request, which may be this one.
    while (needed > free_blocks && running.back() != request)
      free_blocks += preempt_newest(waiting, running, plan, *this);
    if (needed > free_blocks) {
      free_blocks += preempt_newest(waiting, running, plan, *this);  // this one: nothing newer is left
      break;
    }
    free_blocks -= needed;
    budget -= rows;
    plan.blocks_needed += needed;
    plan.rows.push_back({request, request->computed, rows});
    ++i;
  }

  // 2. Admission, in arrival order. Static batching admits only into an
  // empty batch; continuous batching whenever a slot and the budget allow.
  const bool may_admit = options_.admission == Admission::EveryIteration || running.empty();
  while (may_admit && !waiting.empty() && static_cast<int>(running.size()) < options_.max_sequences &&
         budget > 0) {
    RequestState* request = waiting.front();
    int rows = request->pending_rows();
    if (rows > budget) {
      if (!options_.chunked_prefill) break;  // the whole prompt runs at once, or it waits
      rows = budget;
    }
    const int needed = blocks_for(rows);  // a waiting request holds no blocks
    if (needed > free_blocks) break;       // first come, first served: nobody overtakes it
    waiting.pop_front();
    running.push_back(request);
    free_blocks -= needed;
    budget -= rows;
    plan.blocks_needed += needed;
    plan.admitted.push_back(request);
    plan.rows.push_back({request, 0, rows});
  }
  return plan;
}

}  // namespace step07
