#pragma once
// Scheduler: the decision at the start of every iteration. Which running
// requests run (decode rows, and prefill chunks in flight), which waiting
// requests join, and who is preempted when KV blocks run out. It moves
// RequestState pointers between the engine's two queues and does the block
// arithmetic; it never touches the model or the cache (the engine applies the
// plan), so it is tested on its own over long random traces.
//
// The loop (vLLM's, in miniature):
//   budget = token_budget
//   for r in running, oldest first:            # decode rows (and chunks in flight) first
//       rows = min(r.pending_rows, budget)
//       while r's new blocks > free blocks:     # out of KV memory
//           preempt the newest running request  # free its blocks, recompute it later
//       take rows, blocks; budget -= rows
//   if nobody was preempted, and continuous or (static and nothing runs):  # admission
//     for w in waiting, in arrival order, while slots and budget remain:
//       rows = w.pending_rows (chunked prefill: at most the budget left)
//       stop at the first that does not fit the budget, or whose whole
//         prompt does not fit the free blocks
//       admit w: take rows; its chunk's blocks now, the rest promised
#include <deque>
#include <vector>

#include "step07_batching/request.hpp"

namespace step07 {

enum class Admission {
  EveryIteration,  // continuous batching: a free slot is filled at the next iteration
  WhenBatchEmpty,  // static batching: a new batch forms only when the last one has finished
};

struct SchedulerOptions {
  Admission admission = Admission::EveryIteration;
  int max_sequences = 16;  // requests running at once (the cache's slots)
  // Rows one forward may run. Without chunked prefill a prompt runs whole in
  // the iteration that admits it, so the budget must hold the longest prompt
  // plus a row for each other sequence: make_scheduler_options sets that.
  int token_budget = 512;
  // On: a prompt longer than the budget left runs in chunks over several
  // iterations, beside the other sequences' decode rows.
  bool chunked_prefill = false;
};

// Rows tokens[first_position .. first_position + n_rows) of one request.
struct ScheduledRows {
  RequestState* request = nullptr;
  int first_position = 0;  // request->computed when scheduled
  int n_rows = 0;
  // The rows reach the sequence's last token: their last row's logits give a new token.
  bool samples_token() const {
    return first_position + n_rows == static_cast<int>(request->tokens.size());
  }
};

struct Schedule {
  std::vector<ScheduledRows> rows;         // the batch, in order (running ones first, then admitted)
  std::vector<RequestState*> admitted;     // moved waiting -> running (need a slot)
  std::vector<RequestState*> preempted;    // moved running -> front of waiting (free their slot and blocks)
  int blocks_needed = 0;                   // new blocks the batch's rows take
  int total_rows() const;
  int decode_rows() const;                 // scheduled requests with one row that samples
  int prefill_rows() const;                // every other row
};

class Scheduler {
 public:
  // block_size: positions per KV block (the cache's); throws InputError for bad options.
  Scheduler(SchedulerOptions options, int block_size);

  const SchedulerOptions& options() const { return options_; }
  int blocks_for(int positions) const { return (positions + block_size_ - 1) / block_size_; }
  // Blocks a running request whose prompt is being prefilled in chunks will
  // still take to reach its last token (0 once it decodes): promised to it
  // when it was admitted, so the scheduler never counts them as free.
  int blocks_promised(const RequestState& request) const {
    return request.decoding() ? 0
                              : blocks_for(static_cast<int>(request.tokens.size())) - blocks_for(request.computed);
  }

  // One iteration's decision. `free_blocks`: blocks the cache can hand out
  // now. A preempted request gets computed = 0 and goes to the front of
  // `waiting` (it keeps its tokens: recomputing them restores its K/V).
  Schedule schedule(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running, int free_blocks) const;

 private:
  SchedulerOptions options_;
  int block_size_;
};

}  // namespace step07
