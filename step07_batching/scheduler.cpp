#include "step07_batching/scheduler.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "llm/errors.hpp"
#include "llm/exercise.hpp"

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

Scheduler::Scheduler(SchedulerOptions options) : options_(options) {
  if (options_.max_sequences < 1)
    throw llm::InputError(fmt::format("max_sequences must be at least 1 (got {})", options_.max_sequences));
  if (options_.token_budget < options_.max_sequences)
    throw llm::InputError(fmt::format("the token budget ({}) must hold a row for each of the {} sequences",
                                      options_.token_budget, options_.max_sequences));
}

// The newest running request: vLLM's choice, the one that has waited least
// and holds the least progress. Its blocks go back to the ledger (a block
// another request shares stays with it; a cached one stays in the prefix
// cache), and it is recomputed from its tokens when it is admitted again.
void Scheduler::preempt_newest(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running,
                               KvLedger& ledger, Schedule& plan) {
  // BEGIN EXERCISE ex07.1
  RequestState* victim = running.back();
  running.pop_back();
  ledger.release(victim->slot);
  victim->slot = -1;
  victim->computed = 0;        // its K/V are gone: every token is recomputed when it is admitted again
  waiting.push_front(victim);  // first in line: it arrived before everything still waiting
  plan.preempted.push_back(victim);
  // END EXERCISE ex07.1
}

int Scheduler::slots_taken(const std::vector<RequestState*>& running) {
  int taken = 0;
  for (const RequestState* request : running) taken += request->slots_needed();
  return taken;
}

// The caller knows a slot is free (slots_taken counts the slots in use).
int Scheduler::free_slot(const std::vector<RequestState*>& running, int max_sequences) {
  std::vector<bool> held(static_cast<std::size_t>(max_sequences), false);  // [max_sequences]
  for (const RequestState* request : running) held[static_cast<std::size_t>(request->slot)] = true;
  return static_cast<int>(std::find(held.begin(), held.end(), false) - held.begin());
}

Schedule Scheduler::schedule(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running,
                             KvLedger& ledger) const {
  Schedule plan;
  int budget = options_.token_budget;
  schedule_running(waiting, running, ledger, plan, budget);
  // Static batching admits only into an empty batch; continuous batching
  // whenever a slot and the budget allow, but not in an iteration that had
  // to preempt (vLLM's rule): memory is short, and the request just
  // preempted, now first in line, would come straight back in to be
  // preempted again.
  if (plan.preempted.empty() && (options_.admission == Admission::EveryIteration || running.empty()))
    admit_waiting(waiting, running, ledger, plan, budget);
  return plan;
}

// Running requests, oldest first: a decode row each, or the next chunk of a
// prompt that chunked prefill left unfinished. A chunk's blocks were
// reserved when its prompt was admitted, so only a decode row may need a new
// block; when the pool has none, the newest request (which may be this one)
// gives its blocks back.
void Scheduler::schedule_running(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running,
                                 KvLedger& ledger, Schedule& plan, int& budget) const {
  for (std::size_t i = 0; i < running.size() && budget > 0;) {
    RequestState* request = running[i];
    const int rows = std::min(request->pending_rows(), budget);
    const int end = request->computed + rows;
    // BEGIN EXERCISE ex07.1
    // Out of blocks: newer requests give theirs back, newest first, until
    // this one's rows fit; if it is itself the newest, it goes (and with it
    // the iteration's running rows end: nothing newer is left to schedule).
    while (!ledger.blocks().can_reserve(request->slot, request->computed, end) && running.back() != request)
      preempt_newest(waiting, running, ledger, plan);
    if (!ledger.blocks().can_reserve(request->slot, request->computed, end)) {
      preempt_newest(waiting, running, ledger, plan);  // this one: nothing newer is left
      break;
    }
    // END EXERCISE ex07.1
    ledger.reserve(request->slot, request->computed, end);
    budget -= rows;
    plan.rows.push_back({request, request->computed, rows});
    ++i;
  }
}

// Admission, in arrival order: first come, first served, so nobody
// overtakes a front request that does not fit. A request takes its cached
// prefix, then blocks for its whole sequence at once: a long prompt is never
// left half-computed for want of blocks that decode rows took in the
// meantime (which would preempt it and throw the chunks away, again and
// again: thrashing).
void Scheduler::admit_waiting(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running,
                              KvLedger& ledger, Schedule& plan, int& budget) const {
  // BEGIN EXERCISE ex07.2
  while (!waiting.empty() && budget > 0) {
    RequestState* request = waiting.front();  // holds no blocks: computed == 0
    // A slot for it, and one for each sample it forks once its prompt is computed (n > 1).
    if (slots_taken(running) + request->slots_needed() > options_.max_sequences) break;
    const std::span<const int> tokens = request->tokens;
    const int cached = ledger.cached_prefix(tokens);
    int rows = request->pending_rows() - cached;
    if (rows > budget) {
      if (!options_.chunked_prefill) break;  // the whole prompt runs at once, or it waits
      rows = budget;
    }
    const int end = static_cast<int>(tokens.size());
    if (ledger.blocks().blocks_needed_to_admit(tokens, cached, end) > ledger.blocks().available_blocks()) break;
    waiting.pop_front();
    request->slot = free_slot(running, options_.max_sequences);
    running.push_back(request);
    request->computed = ledger.share_cached_prefix(request->slot, tokens);
    ledger.reserve(request->slot, request->computed, end);
    budget -= rows;
    plan.admitted.push_back(request);
    plan.rows.push_back({request, request->computed, rows});
  }
  // END EXERCISE ex07.2
}

}  // namespace step07
