#pragma once
// Scheduler: the decision at the start of every iteration. Which running
// requests run (decode rows, and prefill chunks in flight), which waiting
// requests join, and who is preempted when KV blocks run out. It moves
// RequestState pointers between the engine's two queues and reserves their
// blocks through the one ledger (KvLedger: step 05's block manager); it
// never touches the model, so it is tested alone against a block manager.
//
// The loop (vLLM's, in miniature; chapter 07, section 3):
//   budget = token_budget
//   for r in running, oldest first:            # decode rows (and chunks in flight) first
//       rows = min(r.pending_rows, budget)
//       while the ledger cannot reserve r's rows:   # out of KV memory
//           preempt the newest running request      # release its blocks, recompute it later
//       reserve them; budget -= rows
//   if nobody was preempted, and continuous or (static and nothing runs):  # admission
//     for w in waiting, in arrival order, while slots and budget remain:
//       share w's cached prefix (prefix caching); rows = what is left
//       stop at the first whose rows do not fit the budget (chunked prefill:
//         at most the budget left) or whose whole prompt does not fit the pool
//       admit w: reserve its whole prompt now (its chunks never wait for blocks)
#include <deque>
#include <span>
#include <vector>

#include "step05_paged_attention/block_manager.hpp"
#include "step07_batching/request.hpp"

namespace step07 {

enum class Admission {
  EveryIteration,  // continuous batching: a free slot is filled at the next iteration
  WhenBatchEmpty,  // static batching: a new batch forms only when the last one has finished
};

// The KV blocks as the scheduler sees them: step 05's block manager, the one
// ledger. The scheduler asks it (can these rows be reserved?) and reserves
// through it, so no count of blocks is kept anywhere else. The engine's
// ledger is its paged cache (which also copies the rows of copy-on-write
// blocks); the scheduler's tests use a bare block manager.
class KvLedger {
 public:
  virtual ~KvLedger() = default;
  virtual const step05::BlockManager& blocks() const = 0;
  // Positions of the cached prefix of `tokens` a request admitted now would
  // share (whole blocks, never the last token); 0 with prefix caching off.
  virtual int cached_prefix(std::span<const int> tokens) const = 0;
  // `slot` (holding nothing) shares that prefix; returns its positions.
  virtual int share_cached_prefix(int slot, std::span<const int> tokens) = 0;
  // blocks().reserve(slot, first_write, end), copy-on-write copies made. The
  // caller has checked blocks().can_reserve.
  virtual void reserve(int slot, int first_write, int end) = 0;
  virtual void release(int slot) = 0;  // every block `slot` holds goes back
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
  std::vector<RequestState*> admitted;     // moved waiting -> running (given a slot and their blocks)
  std::vector<RequestState*> preempted;    // moved running -> front of waiting (their slot and blocks released)
  int total_rows() const;
  int decode_rows() const;                 // scheduled requests with one row that samples
  int prefill_rows() const;                // every other row
};

class Scheduler {
 public:
  // Throws InputError for bad options.
  explicit Scheduler(SchedulerOptions options);

  const SchedulerOptions& options() const { return options_; }

  // The lowest cache slot in 0..max_sequences-1 no running request holds
  // (the engine's forks take theirs this way too).
  static int free_slot(const std::vector<RequestState*>& running, int max_sequences);
  // Slots the running requests hold or will hold: theirs, and one for each
  // sample they have yet to fork (RequestState::slots_needed).
  static int slots_taken(const std::vector<RequestState*>& running);

  // One iteration's decision; every block it takes or gives back goes
  // through `ledger`, whose slots 0..max_sequences-1 the running requests
  // hold. After it, each scheduled row's blocks are reserved (and private
  // where it writes). A preempted request has released its slot and blocks,
  // has computed = 0 and waits at the front of `waiting` (it keeps its
  // tokens: recomputing them restores its K/V). An admitted request holds a
  // slot, its cached prefix (computed = its positions) and blocks for its
  // whole sequence.
  Schedule schedule(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running, KvLedger& ledger) const;

 private:
  // Step 1 of the loop: the running requests' rows; preempts when the pool is short.
  void schedule_running(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running, KvLedger& ledger,
                        Schedule& plan, int& budget) const;
  // Step 2: admission in arrival order while it fits.
  void admit_waiting(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running, KvLedger& ledger,
                     Schedule& plan, int& budget) const;
  // Step 1's way out of blocks: the newest running request is preempted
  // (what that leaves behind: schedule() above).
  static void preempt_newest(std::deque<RequestState*>& waiting, std::vector<RequestState*>& running,
                             KvLedger& ledger, Schedule& plan);
  SchedulerOptions options_;
};

}  // namespace step07
