#include "step07_batching/engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "llm/errors.hpp"
#include "llm/exercise.hpp"
#include "llm/tokenizer.hpp"

namespace step07 {

namespace {

// The KV budget in blocks: the option, or a full context for every slot.
step05::PagedKvCacheOptions cache_options(const llm::ModelConfig& config, const EngineOptions& options) {
  step05::PagedKvCacheOptions cache;
  cache.num_sequences = options.scheduler.max_sequences;
  cache.block_size = options.block_size;
  if (options.block_size < 1)
    throw llm::InputError(fmt::format("block size must be at least 1 (got {})", options.block_size));
  if (options.n_blocks < 0)
    throw llm::InputError(fmt::format("the KV pool's blocks must be >= 0 (0: a full context per slot; got {})",
                                      options.n_blocks));
  const int full_context = step05::blocks_for_sequences(1, config.seq_len, options.block_size);
  cache.n_blocks = options.n_blocks > 0 ? options.n_blocks : full_context * options.scheduler.max_sequences;
  // Any request fits the context, so a pool of one full context can always
  // run the oldest request alone: the scheduler can never deadlock.
  if (cache.n_blocks < full_context)
    throw llm::InputError(fmt::format("a KV pool of {} blocks of {} cannot hold one full context ({} blocks)",
                                      cache.n_blocks, options.block_size, full_context));
  return cache;
}

}  // namespace

int PagedCacheLedger::cached_prefix(std::span<const int> tokens) const {
  if (!prefix_caching_ || tokens.empty()) return 0;
  // Never the last token: its logits are what the request needs next.
  return cache_.blocks().cached_prefix_length(tokens.first(tokens.size() - 1));
}

int PagedCacheLedger::share_cached_prefix(int slot, std::span<const int> tokens) {
  return prefix_caching_ ? cache_.share_cached_prefix(slot, tokens) : 0;
}

Engine::Engine(llm::Model& model, const EngineOptions& options, const ServingClock& clock)
    : model_(model),
      clock_(clock),
      scheduler_(options.scheduler),
      cache_(step05::make_paged_kv_cache(model.device_name(), model.config(), cache_options(model.config(), options))),
      ledger_(*cache_, options.prefix_caching) {}

void Engine::submit(Request request) {
  const llm::ModelConfig& config = model_.config();
  const int prompt_length = static_cast<int>(request.prompt.size());
  if (request.max_tokens < 1)
    throw llm::InputError(fmt::format("request {}: max_tokens must be at least 1 (got {})", request.id,
                                      request.max_tokens));
  // The last token is never fed back, so a request holds prompt + max_tokens - 1 positions at most
  // (compared in 64 bits: max_tokens may be anything a client sent).
  const long long positions = static_cast<long long>(prompt_length) + request.max_tokens - 1;
  if (positions > config.seq_len)
    throw llm::InputError(fmt::format("request {}: a prompt of {} tokens + max_tokens {} needs {} positions; the "
                                      "context is {}",
                                      request.id, prompt_length, request.max_tokens, positions, config.seq_len));
  llm::validate_generation(config, request.prompt, static_cast<int>(positions));
  for (const int token : request.prompt)
    if (token < 0 || token >= config.vocab_size)
      throw llm::InputError(fmt::format("request {}: token id {} is outside the vocabulary [0, {})", request.id,
                                        token, config.vocab_size));
  if (!(request.sampling.temperature >= 0.0f))
    throw llm::InputError(fmt::format("request {}: temperature must be >= 0", request.id));
  const int max_sequences = scheduler_.options().max_sequences;
  if (request.n < 1 || request.n > max_sequences)
    throw llm::InputError(fmt::format("request {}: n must be from 1 to {} (each sample runs in a cache slot of its "
                                      "own; got {})",
                                      request.id, max_sequences, request.n));
  if (request.top_logprobs < -1)
    throw llm::InputError(fmt::format("request {}: top_logprobs must be -1 (none) or at least 0 (got {})", request.id,
                                      request.top_logprobs));
  for (const auto& live : live_)
    if (live->request.id == request.id)
      throw llm::InputError(fmt::format("request id {} is already being served", request.id));
  const int n = request.n;
  live_.push_back(std::make_unique<RequestState>(std::move(request), config.vocab_size));
  live_.back()->forks_pending = n - 1;  // forked off when its prompt is computed (fork_samples)
  waiting_.push_back(live_.back().get());
}

bool Engine::cancel(int request_id) {
  std::vector<RequestState*> samples;  // every live sample of the request (finish() edits live_)
  for (const auto& live : live_)
    if (live->request.id == request_id) samples.push_back(live.get());
  for (RequestState* sample : samples) end_early(*sample, FinishReason::Cancelled);
  return !samples.empty();
}

bool Engine::stop_sample(int request_id, int sample) {
  const auto found = std::find_if(live_.begin(), live_.end(), [&](const auto& live) {
    return live->request.id == request_id && live->sample == sample;
  });
  if (found == live_.end()) return false;
  end_early(**found, FinishReason::Stop);
  return true;
}

// A waiting request (never admitted, or preempted: its tokens kept, its K/V
// dropped) leaves the queue first; finish() releases a running one's slot.
void Engine::end_early(RequestState& request, FinishReason reason) {
  const auto queued = std::find(waiting_.begin(), waiting_.end(), &request);
  if (queued != waiting_.end()) waiting_.erase(queued);
  finish(request, reason);
}

int Engine::step() {
  if (!has_work()) return 0;
  IterationRecord iteration;
  iteration.start_ms = clock_.now_ms();

  // The rows' blocks are reserved by the schedule itself: the forward's own
  // reserve finds them held. With work queued and a pool of at least one
  // full context, the oldest request always fits, so the batch is never empty.
  Schedule schedule = scheduler_.schedule(waiting_, running_, ledger_);
  record_schedule(schedule);

  // Counted before sampling: sampling grows each sequence's tokens, and a
  // request that finishes is gone (its RequestState freed) by the end of it.
  iteration.sequences = static_cast<int>(schedule.rows.size());
  iteration.decode_rows = schedule.decode_rows();
  iteration.prefill_rows = schedule.prefill_rows();

  const llm::TokenBatch batch = build_batch(schedule);
  std::span<const float> logits = model_.forward(batch, *cache_);  // one row per scheduled request
  // Before sampling: a request may finish (and free its blocks) on its first token.
  logits = fork_samples(schedule, logits);  // forks join the schedule, a row of logits each
  sample_and_finish(schedule, logits);

  iteration.end_ms = clock_.now_ms();
  iteration.waiting = static_cast<int>(waiting_.size());
  iteration.preempted = static_cast<int>(schedule.preempted.size());
  iteration.blocks_used = cache_->blocks().used_blocks();
  iterations_.push_back(iteration);
  return batch.size();
}

void Engine::run_until_idle() {
  while (has_work()) step();
}

// The scheduler has released the preempted requests' slots and blocks and
// given the admitted ones theirs; the engine keeps the records.
void Engine::record_schedule(const Schedule& schedule) {
  for (RequestState* request : schedule.preempted) {
    ++request->record.preemptions;
    ++preemptions_;
  }
  const double now = clock_.now_ms();
  for (RequestState* request : schedule.admitted)
    if (request->record.first_scheduled_ms < 0) request->record.first_scheduled_ms = now;
}

// Parallel sampling (Request::n). A request whose rows just reached the end
// of its prompt forks its n - 1 other samples now, while its K/V hold
// exactly the prompt: each sample takes a free slot and shares the prompt's
// blocks (step 05's fork: no K/V copied), so n samples cost one prefill.
// Each fork joins this iteration's sampling as a row of the schedule with no
// rows to run (n_rows 0, at the end of the prompt), whose logits are a copy
// of its parent's: it draws its first token from the very distribution the
// parent draws from, with its own sampler, exactly as a request of n = 1
// with its seed would. Its first write (that token's K/V, next iteration)
// goes into the prompt's last block if the prompt ends inside one: shared,
// so the write copies it first (copy-on-write). The scheduler counted the
// forks' slots when it admitted the request (RequestState::slots_needed), so
// the slots are free. Returns the logits the sampling reads: the forward's,
// with a row appended per fork.
std::span<const float> Engine::fork_samples(Schedule& schedule, std::span<const float> logits) {
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  const std::size_t forward_rows = schedule.rows.size();
  fork_logits_.clear();
  bool forked = false;
  for (std::size_t i = 0; i < forward_rows; ++i) {
    const ScheduledRows entry = schedule.rows[i];  // a copy: rows may grow below
    RequestState& parent = *entry.request;
    if (parent.forks_pending == 0 || !entry.samples_token()) continue;
    if (!std::exchange(forked, true)) fork_logits_.assign(logits.begin(), logits.end());
    const int prompt_length = static_cast<int>(parent.tokens.size());  // nothing generated before the fork
    for (int sample = 1; sample <= parent.forks_pending; ++sample) {
      auto fork = std::make_unique<RequestState>(parent.request, model_.config().vocab_size, sample);
      fork->slot = Scheduler::free_slot(running_, scheduler_.options().max_sequences);
      cache_->adopt_prefix(fork->slot, parent.slot, prompt_length);
      fork->computed = prompt_length;
      fork->record.first_scheduled_ms = parent.record.first_scheduled_ms;
      schedule.rows.push_back({fork.get(), prompt_length, 0});
      const auto parent_row = logits.subspan(i * vocab, vocab);
      fork_logits_.insert(fork_logits_.end(), parent_row.begin(), parent_row.end());
      running_.push_back(fork.get());
      live_.push_back(std::move(fork));
    }
    parent.forks_pending = 0;
  }
  return forked ? std::span<const float>(fork_logits_) : logits;
}

// rows: tokens[first .. first + n) of each scheduled request, at positions
// first .. first + n - 1 of its slot. Each request's rows are contiguous, so
// the forward returns one logits row per request, in this order.
llm::TokenBatch Engine::build_batch(const Schedule& schedule) const {
  llm::TokenBatch batch;
  for (const ScheduledRows& entry : schedule.rows)
    for (int position = entry.first_position; position < entry.first_position + entry.n_rows; ++position)
      batch.add(entry.request->tokens[static_cast<std::size_t>(position)], position, entry.request->slot);
  return batch;
}

// Logits row i belongs to schedule.rows[i]. Every scheduled request's K/V
// now cover its rows; the ones whose rows reached their last token sample the
// next one, and a request that ends leaves at once (finish frees its slot and
// blocks for the next iteration's admissions). No request outlives the
// context: submit() accepted only prompt + max_tokens - 1 <= seq_len, so
// max_tokens comes first.
void Engine::sample_and_finish(const Schedule& schedule, std::span<const float> logits) {
  // BEGIN EXERCISE ex07.3
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  const double now = clock_.now_ms();
  for (std::size_t i = 0; i < schedule.rows.size(); ++i) {
    const ScheduledRows& entry = schedule.rows[i];
    RequestState& request = *entry.request;
    const bool samples = entry.samples_token();  // before computed moves: the rows reached the last token
    request.computed += entry.n_rows;
    if (ledger_.prefix_caching()) publish_filled_blocks(request, entry.first_position);
    if (!samples) continue;  // a prompt chunk short of the end, or a recompute: its logits are not needed
    const std::span<const float> row = logits.subspan(i * vocab, vocab);
    const int token = request.sampler.sample(row);
    request.tokens.push_back(token);
    request.record.generated.push_back(token);
    request.record.token_ms.push_back(now);
    FinishReason reason = FinishReason::None;
    if (token == llm::Tokenizer::kBos) reason = FinishReason::Stop;
    else if (request.generated() == request.request.max_tokens) reason = FinishReason::Length;
    if (listener_) listener_(token_event(request, token, row, reason, now));
    if (reason != FinishReason::None) finish(request, reason);
  }
  // END EXERCISE ex07.3
}

TokenEvent Engine::token_event(const RequestState& request, int token, std::span<const float> logits,
                               FinishReason finish, double now) const {
  TokenEvent event;
  event.request_id = request.request.id;
  event.sample = request.sample;
  event.token = token;
  event.index = request.generated() - 1;
  event.finish = finish;
  event.time_ms = now;
  event.logits = logits;
  if (request.request.top_logprobs >= 0)
    event.logprobs = token_logprobs(logits, request.request.sampling.temperature, token, request.request.top_logprobs);
  return event;
}

// Only when the rows filled a block: publishing walks the sequence's whole
// hash chain. A block already cached (shared, or published before) stays.
void Engine::publish_filled_blocks(const RequestState& request, int first_position) {
  const int block_size = cache_->block_size();
  if (request.computed / block_size > first_position / block_size) cache_->publish(request.slot, request.tokens);
}

// The request leaves: its slot and blocks go back, its record joins finished_.
void Engine::finish(RequestState& request, FinishReason reason) {
  if (request.slot >= 0) {
    ledger_.release(request.slot);
    request.slot = -1;
    running_.erase(std::find(running_.begin(), running_.end(), &request));
  }
  request.record.finish = reason;
  request.record.finish_ms = clock_.now_ms();
  finished_.push_back(std::move(request.record));
  const auto owner = std::find_if(live_.begin(), live_.end(), [&](const auto& live) { return live.get() == &request; });
  live_.erase(owner);
}

std::vector<RequestRecord> Engine::take_finished() { return std::exchange(finished_, {}); }

}  // namespace step07
