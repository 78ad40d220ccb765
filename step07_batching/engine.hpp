#pragma once
// Engine: iteration-level (continuous) batching over step 05's paged cache.
// Each step():
//   1. the scheduler picks the rows of this iteration (decode rows, prefill
//      chunks), admits waiting requests and preempts when blocks run out,
//      reserving through the cache's block manager (the one ledger);
//   2. one TokenBatch, one forward pass of the unchanged model (CPU or CUDA);
//   3. with prefix caching, every block the forward filled enters step 05's
//      prefix cache, for later requests with the same prefix to share;
//   4. a request whose prompt is now computed forks its other samples (n > 1:
//      they share its blocks and draw from its logits: fork_samples);
//   5. a token is sampled for every sequence whose rows reached its end;
//      finished requests leave and give back their slot and blocks.
// Static batching and one-request-at-a-time are the same engine with other
// SchedulerOptions (policies.hpp), so the comparison changes nothing else.
//
// Single-threaded: whoever owns the engine calls submit/step/cancel (the
// server's engine thread; the offline replay).
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "llm/model.hpp"
#include "step05_paged_attention/paged_kv_cache.hpp"
#include "step07_batching/request.hpp"
#include "step07_batching/scheduler.hpp"
#include "step07_batching/serving_clock.hpp"

namespace step07 {

struct EngineOptions {
  SchedulerOptions scheduler;
  int block_size = 16;  // positions per KV block
  // Blocks in the KV pool: the KV budget. 0: enough for every slot to hold a
  // full context (no preemption ever). Must hold one full context at least.
  int n_blocks = 0;
  // Automatic prefix caching (step 05's hash chain): an admitted request
  // shares the cached blocks of its prompt's longest cached prefix and
  // computes only the rest. Off by default: a hit changes which rows a
  // forward runs (a request recomputed after a preemption takes back its own
  // blocks), and the policy comparison isolates the scheduler. The server
  // turns it on; part 6 measures it.
  bool prefix_caching = false;
};

// The engine's KvLedger: its paged cache (the block manager, and the
// copy-on-write row copies of what is reserved).
class PagedCacheLedger final : public KvLedger {
 public:
  PagedCacheLedger(step05::PagedKvCache& cache, bool prefix_caching) : cache_(cache), prefix_caching_(prefix_caching) {}
  const step05::BlockManager& blocks() const override { return cache_.blocks(); }
  int cached_prefix(std::span<const int> tokens) const override;
  int share_cached_prefix(int slot, std::span<const int> tokens) override;
  void reserve(int slot, int first_write, int end) override { cache_.reserve(slot, first_write, end); }
  void release(int slot) override { cache_.truncate(slot, 0); }
  bool prefix_caching() const { return prefix_caching_; }

 private:
  step05::PagedKvCache& cache_;
  bool prefix_caching_;
};

// One token leaving a forward: what a streaming server sends.
struct TokenEvent {
  int request_id = 0;
  int sample = 0;                             // which of the request's n samples
  int token = 0;
  int index = 0;                              // 0 for the first token of the sample
  FinishReason finish = FinishReason::None;   // not None on the sample's last token
  double time_ms = 0.0;
  std::optional<TokenLogprobs> logprobs;      // when the request asked (top_logprobs >= 0)
  // [vocab] the logits row the token was drawn from, on the host: valid only
  // inside the listener call (it views the forward's output). Part 7 keeps
  // copies to explain a sampled token that differs from its solo run's.
  std::span<const float> logits;
};

// One iteration, for the occupancy timeline.
struct IterationRecord {
  double start_ms = 0.0;
  double end_ms = 0.0;
  int sequences = 0;     // requests with rows in the batch
  int decode_rows = 0;   // of which one row that samples a token
  int prefill_rows = 0;  // every other row (prompt chunks, recomputes)
  int waiting = 0;       // requests left waiting after the schedule
  int preempted = 0;     // requests preempted by this schedule
  int blocks_used = 0;   // KV blocks held after the forward (a chunked prompt's whole sequence included)
};

class Engine {
 public:
  // Makes a paged cache of options.scheduler.max_sequences slots on the
  // model's device. Throws InputError for bad options (a pool smaller than
  // one full context), DeviceError when the device cannot hold the pool.
  Engine(llm::Model& model, const EngineOptions& options, const ServingClock& clock);

  // Queues a request (FCFS). Throws InputError, changing nothing, for an
  // empty prompt, a token id out of range, max_tokens < 1, prompt +
  // max_tokens - 1 positions beyond the context, a duplicate live id, bad
  // sampling parameters, or n outside 1..max_sequences (each sample runs in
  // a slot of its own).
  void submit(Request request);
  // Drops a waiting or running request, every one of its samples, and frees
  // their blocks; their records finish as Cancelled. False when no live
  // request has that id.
  bool cancel(int request_id);
  // Ends one sample early with FinishReason::Stop (the server matched a stop
  // string in its text) and frees its blocks. False when that sample is not
  // live (it has finished already).
  bool stop_sample(int request_id, int sample);

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  // One iteration (above). Returns the rows it ran (0 when there was no work).
  int step();
  // Steps until every submitted request has finished.
  void run_until_idle();

  // Called for every token as it leaves a forward (streaming), inside
  // step(): it must not call back into the engine (cancel a request between
  // steps, as the server does).
  void set_token_listener(std::function<void(const TokenEvent&)> listener) { listener_ = std::move(listener); }

  // Finished (and cancelled) requests, in finishing order; take_finished() moves them out.
  const std::vector<RequestRecord>& finished() const { return finished_; }
  std::vector<RequestRecord> take_finished();
  const std::vector<IterationRecord>& iterations() const { return iterations_; }

  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  long long preemptions() const { return preemptions_; }
  const step05::PagedKvCache& cache() const { return *cache_; }
  const Scheduler& scheduler() const { return scheduler_; }
  const llm::Model& model() const { return model_; }

 private:
  void record_schedule(const Schedule& schedule);       // preemption counts, first-scheduled times
  llm::TokenBatch build_batch(const Schedule& schedule) const;
  // A request whose prompt this forward completed forks its pending samples.
  std::span<const float> fork_samples(Schedule& schedule, std::span<const float> logits);
  void sample_and_finish(const Schedule& schedule, std::span<const float> logits);
  // What the listener hears about `token`, sampled from `logits` [vocab].
  TokenEvent token_event(const RequestState& request, int token, std::span<const float> logits, FinishReason finish,
                         double now) const;
  void finish(RequestState& request, FinishReason reason);  // frees its slot and blocks, records it
  void end_early(RequestState& request, FinishReason reason);  // cancel / stop_sample: waiting or running
  // Prefix caching: the blocks rows first_position.. of `request` filled enter the prefix cache.
  void publish_filled_blocks(const RequestState& request, int first_position);

  llm::Model& model_;
  const ServingClock& clock_;
  Scheduler scheduler_;
  std::unique_ptr<step05::PagedKvCache> cache_;
  PagedCacheLedger ledger_;
  std::vector<std::unique_ptr<RequestState>> live_;  // every submitted, unfinished request
  std::deque<RequestState*> waiting_;                // arrival order (preempted ones go back to the front)
  std::vector<RequestState*> running_;               // admission order: the oldest first
  std::vector<RequestRecord> finished_;
  std::vector<IterationRecord> iterations_;
  std::function<void(const TokenEvent&)> listener_;
  // [forward rows + forks, vocab] in an iteration that forks: the forward's
  // logits, then a copy of each fork's parent's row (fork_samples).
  std::vector<float> fork_logits_;
  long long preemptions_ = 0;
};

}  // namespace step07
