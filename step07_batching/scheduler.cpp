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
  const int freed = scheduler.blocks_for(victim->computed) + scheduler.blocks_promised(*victim);
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
  // Blocks promised to prompts being prefilled in chunks are not free: each
  // was admitted only with room for its whole prompt, so a long prompt is
  // never left half-computed for want of blocks that decode rows took in
  // the meantime (which would preempt it and throw the chunks away, again
  // and again: thrashing).
  for (const RequestState* request : running) free_blocks -= blocks_promised(*request);

  // 1. Running requests, oldest first: a decode row each, or the next chunk
  // of a prompt that chunked prefill left unfinished.
  for (std::size_t i = 0; i < running.size() && budget > 0;) {
    RequestState* request = running[i];
    const int rows = std::min(request->pending_rows(), budget);
    const int needed = blocks_for(request->computed + rows) - blocks_for(request->computed);
    // A decode row takes a new block from the free ones; a chunk takes blocks
    // promised to it at admission.
    const int from_free = request->decoding() ? needed : 0;
    // Out of blocks: take them from the newest request, which may be this one.
    while (from_free > free_blocks && running.back() != request)
      free_blocks += preempt_newest(waiting, running, plan, *this);
    if (from_free > free_blocks) {
      free_blocks += preempt_newest(waiting, running, plan, *this);  // this one: nothing newer is left
      break;
    }
    free_blocks -= from_free;
    budget -= rows;
    plan.blocks_needed += needed;
    plan.rows.push_back({request, request->computed, rows});
    ++i;
  }

  // 2. Admission, in arrival order. Static batching admits only into an
  // empty batch; continuous batching whenever a slot and the budget allow,
  // but not in an iteration that had to preempt (vLLM's rule): memory is
  // short, and the request just preempted, now first in line, would come
  // straight back in to be preempted again.
  const bool may_admit =
      plan.preempted.empty() && (options_.admission == Admission::EveryIteration || running.empty());
  while (may_admit && !waiting.empty() && static_cast<int>(running.size()) < options_.max_sequences &&
         budget > 0) {
    RequestState* request = waiting.front();
    int rows = request->pending_rows();
    if (rows > budget) {
      if (!options_.chunked_prefill) break;  // the whole prompt runs at once, or it waits
      rows = budget;
    }
    // Room for all of it (a waiting request holds no blocks): the chunk's
    // blocks now, the rest promised (above).
    const int whole = blocks_for(request->pending_rows());
    if (whole > free_blocks) break;  // first come, first served: nobody overtakes it
    waiting.pop_front();
    running.push_back(request);
    free_blocks -= whole;
    budget -= rows;
    plan.blocks_needed += blocks_for(rows);
    plan.admitted.push_back(request);
    plan.rows.push_back({request, 0, rows});
  }
  return plan;
}

}  // namespace step07
