#include "step05_paged_attention/measure/memory_replay.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <stdexcept>

#include "llm/errors.hpp"
#include "llm/harness/timer.hpp"
#include "llm/harness/well_known_models.hpp"
#include "step05_paged_attention/block_manager.hpp"

namespace step05 {
namespace {

// A request that is running: what it holds and how far it has come.
struct RunningSequence {
  int request = 0;       // index into the trace
  int slot = 0;          // contiguous: its slot; paged: its block-manager sequence id
  int length = 0;        // positions holding K/V
  int final_length = 0;  // prompt + output: where it ends
};

// Where a policy keeps sequences: admission, growth, release, and what it
// reserves. The replay loop is the same for both.
class Reservations {
 public:
  virtual ~Reservations() = default;
  // A slot for a sequence that holds `length` positions now and will end at
  // `final_length`, or -1 when the whole of it does not fit now.
  virtual int admit(int length, int final_length) = 0;
  // Room for position `length` (the sequence grows to length + 1). Never
  // fails: admission promised the final length.
  virtual void grow(const RunningSequence& sequence) = 0;
  virtual void release(const RunningSequence& sequence) = 0;
  virtual long long reserved_positions() const = 0;
};

class ContiguousReservations final : public Reservations {
 public:
  ContiguousReservations(int slots, int context) : context_(context) {
    for (int slot = slots - 1; slot >= 0; --slot) free_slots_.push_back(slot);
  }
  int admit(int, int) override {  // every request fits a slot (checked before the replay)
    if (free_slots_.empty()) return -1;
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    ++running_;
    return slot;
  }
  void grow(const RunningSequence&) override {}  // the slot already spans the context
  void release(const RunningSequence& sequence) override {
    free_slots_.push_back(sequence.slot);
    --running_;
  }
  long long reserved_positions() const override { return static_cast<long long>(running_) * context_; }

 private:
  int context_;
  int running_ = 0;
  std::vector<int> free_slots_;  // a stack of unused slot ids
};

class PagedReservations final : public Reservations {
 public:
  // One block-manager sequence id per running sequence: never more than
  // n_blocks run (each holds a block), nor more than the trace's requests.
  PagedReservations(int n_blocks, int block_size, int context, int n_requests)
      : manager_(n_blocks, block_size, std::min(n_blocks, n_requests), (context + block_size - 1) / block_size) {
    for (int id = manager_.max_sequences() - 1; id >= 0; --id) free_ids_.push_back(id);
  }
  int admit(int length, int final_length) override {
    const int promise = manager_.blocks_for(final_length);
    if (free_ids_.empty() || promised_blocks_ + promise > manager_.n_blocks()) return -1;
    const int id = free_ids_.back();
    free_ids_.pop_back();
    promised_blocks_ += promise;
    manager_.reserve(id, 0, length);  // the blocks written now; the rest as the sequence grows
    return id;
  }
  void grow(const RunningSequence& sequence) override {
    // A new block only at a block boundary; the promise leaves one free.
    if (manager_.blocks_for(sequence.length + 1) > manager_.blocks_held(sequence.slot))
      manager_.reserve(sequence.slot, sequence.length, sequence.length + 1);
  }
  void release(const RunningSequence& sequence) override {
    manager_.free_sequence(sequence.slot);
    promised_blocks_ -= manager_.blocks_for(sequence.final_length);
    free_ids_.push_back(sequence.slot);
  }
  long long reserved_positions() const override {
    return static_cast<long long>(manager_.used_blocks()) * manager_.block_size();
  }

 private:
  BlockManager manager_;
  int promised_blocks_ = 0;    // the final lengths of the running sequences, in blocks (<= n_blocks)
  std::vector<int> free_ids_;  // a stack of unused block-manager sequence ids
};

// Llama contexts (config.json's max_position_embeddings); the attention dims
// come from step 03's table.
struct PublishedContext {
  const char* name;
  int context;
};
constexpr PublishedContext kReplayedModels[] = {{"Llama-2-7B", 4096}, {"Llama-3-8B", 8192}};

}  // namespace

std::vector<ModelDims> memory_replay_models(const std::string& this_model_name, const llm::ModelConfig& this_model) {
  std::vector<ModelDims> models = {{this_model_name, this_model.seq_len, this_model.kv_bytes_per_token(sizeof(float))}};
  for (const PublishedContext& published : kReplayedModels) {
    const auto& table = llm::well_known_models();
    const auto found =
        std::find_if(table.begin(), table.end(), [&](const auto& m) { return m.name == published.name; });
    if (found == table.end()) throw std::logic_error(fmt::format("{} is missing from step 03's table", published.name));
    models.push_back({published.name, published.context, llm::attention_config(*found).kv_bytes_per_token(2)});
  }
  return models;
}

namespace {

// Throws llm::InputError for a budget, block size or context out of range,
// and for a request that could never run: longer than the context, or (paged)
// needing more blocks than the whole budget.
void check_replay(const std::vector<TraceRequest>& trace, const ModelDims& model, int budget_sequences,
                  int block_size) {
  if (budget_sequences < 1 || block_size < 0 || model.context < 1)
    throw llm::InputError(
        fmt::format("memory replay: budget of {} sequences, block size {}, context {}: needs >= 1 sequence, a block "
                    "size >= 1 (0: contiguous) and a context >= 1",
                    budget_sequences, block_size, model.context));
  const long long budget_positions = static_cast<long long>(budget_sequences) * model.context;
  if (block_size > 0 && budget_positions / block_size > (1 << 30))
    throw llm::InputError(
        fmt::format("memory replay: {} positions in blocks of {} is too many blocks", budget_positions, block_size));
  const long long n_blocks = block_size > 0 ? budget_positions / block_size : 0;
  for (const TraceRequest& request : trace) {
    const long long total = request.total_length();
    if (request.prompt_length < 1 || request.output_length < 1 || total > model.context)
      throw llm::InputError(
          fmt::format("memory replay: request {} ({} prompt + {} output positions) does not fit "
                      "the context of {} ({})",
                      request.id, request.prompt_length, request.output_length, model.context, model.name));
    if (block_size > 0 && (total + block_size - 1) / block_size > n_blocks)
      throw llm::InputError(fmt::format(
          "memory replay: request {} needs {} positions, {} blocks of {}, but the budget of {} positions holds only {} "
          "blocks: raise the budget or lower the block size",
          request.id, total, (total + block_size - 1) / block_size, block_size, budget_positions, n_blocks));
  }
}

// The row's description: everything but what the replay measures.
MemoryReplayRow describe_replay(const std::vector<TraceRequest>& trace, const ModelDims& model, int budget_sequences,
                                int block_size) {
  MemoryReplayRow row;
  row.model = model.name;
  row.context = model.context;
  row.policy = block_size > 0 ? "paged" : "contiguous";
  row.block_size = block_size;
  row.budget_positions = static_cast<long long>(budget_sequences) * model.context;
  row.n_blocks = block_size > 0 ? static_cast<int>(row.budget_positions / block_size) : budget_sequences;
  row.kv_bytes_per_token = model.kv_bytes_per_token;
  row.budget_bytes = static_cast<std::size_t>(row.budget_positions) * model.kv_bytes_per_token;
  row.requests = static_cast<int>(trace.size());
  return row;
}

// Sums over the iterations, turned into the row's means at the end.
struct ReplaySums {
  double utilization = 0, fragmentation = 0, budget = 0, sequences = 0;
  long long measured_iterations = 0;  // iterations with something reserved (all, in practice)

  void add(const std::vector<RunningSequence>& running, long long reserved, long long budget_positions) {
    long long tokens = 0;
    for (const RunningSequence& sequence : running) tokens += sequence.length;
    if (reserved > 0) {
      utilization += static_cast<double>(tokens) / static_cast<double>(reserved);
      fragmentation += static_cast<double>(reserved - tokens) / static_cast<double>(reserved);
      ++measured_iterations;
    }
    budget += static_cast<double>(tokens) / static_cast<double>(budget_positions);
    sequences += static_cast<double>(running.size());
  }
  void write_means(MemoryReplayRow& row) const {
    if (measured_iterations > 0) {
      row.kv_utilization = utilization / static_cast<double>(measured_iterations);
      row.internal_fragmentation = fragmentation / static_cast<double>(measured_iterations);
    }
    if (row.iterations > 0) {
      row.budget_utilization = budget / static_cast<double>(row.iterations);
      row.mean_sequences = sequences / static_cast<double>(row.iterations);
    }
  }
};

}  // namespace

MemoryReplayRow replay_trace(const std::vector<TraceRequest>& trace, const ModelDims& model, int budget_sequences,
                             int block_size) {
  const llm::Stopwatch watch;
  check_replay(trace, model, budget_sequences, block_size);
  MemoryReplayRow row = describe_replay(trace, model, budget_sequences, block_size);
  std::unique_ptr<Reservations> reservations;
  if (block_size > 0)
    reservations = std::make_unique<PagedReservations>(row.n_blocks, block_size, model.context,
                                                       static_cast<int>(std::max<std::size_t>(trace.size(), 1)));
  else
    reservations = std::make_unique<ContiguousReservations>(budget_sequences, model.context);

  std::deque<int> waiting;  // requests not yet admitted, in arrival order
  for (std::size_t i = 0; i < trace.size(); ++i) waiting.push_back(static_cast<int>(i));
  std::vector<RunningSequence> running;  // in admission order
  ReplaySums sums;
  while (!waiting.empty() || !running.empty()) {
    ++row.iterations;
    // 1. Decode: every running sequence grows by one position.
    for (RunningSequence& sequence : running) {
      reservations->grow(sequence);
      ++sequence.length;
    }
    // 2. Admission, first come first served (the front only: no overtaking).
    // The prefill holds the prompt and produces the first output token.
    while (!waiting.empty()) {
      const TraceRequest& request = trace[static_cast<std::size_t>(waiting.front())];
      const int length = request.prompt_length + 1;
      const int slot = reservations->admit(length, request.total_length());
      if (slot < 0) break;
      running.push_back({waiting.front(), slot, length, request.total_length()});
      waiting.pop_front();
    }
    if (running.empty())  // cannot happen when every request fits alone (checked above)
      throw std::logic_error(fmt::format("memory replay: nothing runs at iteration {}", row.iterations));
    // 3. Measure.
    sums.add(running, reservations->reserved_positions(), row.budget_positions);
    row.peak_sequences = std::max(row.peak_sequences, static_cast<int>(running.size()));
    // 4. Finished sequences leave (length p + n: all n output tokens generated).
    std::erase_if(running, [&](const RunningSequence& sequence) {
      if (sequence.length < sequence.final_length) return false;
      reservations->release(sequence);
      ++row.requests_finished;
      return true;
    });
  }
  sums.write_means(row);
  row.replay_ms = watch.elapsed_ms();
  return row;
}

std::vector<MemoryReplayRow> run_memory_replay(const ModelDims& model, const MemoryReplayOptions& options) {
  TraceOptions trace_options = options.trace;
  trace_options.context = model.context;  // the same seed, this model's context
  return replay_policies(make_request_trace(trace_options), model, options);
}

std::vector<MemoryReplayRow> replay_policies(const std::vector<TraceRequest>& trace, const ModelDims& model,
                                             const MemoryReplayOptions& options) {
  for (const int block_size : options.block_sizes)
    if (block_size < 1)
      throw llm::InputError(fmt::format("memory replay: block size {} (block sizes must be >= 1)", block_size));
  std::vector<MemoryReplayRow> rows;
  rows.push_back(replay_trace(trace, model, options.budget_sequences, 0));
  for (const int block_size : options.block_sizes)
    rows.push_back(replay_trace(trace, model, options.budget_sequences, block_size));
  return rows;
}

MemoryReplayTargets check_memory_replay_targets(const std::vector<MemoryReplayRow>& rows) {
  const MemoryReplayRow* contiguous = nullptr;
  const MemoryReplayRow* paged = nullptr;
  for (const MemoryReplayRow& row : rows) {
    if (row.policy == "contiguous") contiguous = &row;
    if (row.policy == "paged" && row.block_size == MemoryReplayTargets::kBlockSize) paged = &row;
  }
  if (!contiguous || !paged)
    throw llm::InputError(fmt::format("memory replay targets need the contiguous row and paged at block {}",
                                      MemoryReplayTargets::kBlockSize));
  MemoryReplayTargets targets;
  targets.paged_utilization = paged->kv_utilization;
  targets.peak_ratio = static_cast<double>(paged->peak_sequences) / contiguous->peak_sequences;
  targets.mean_ratio = paged->mean_sequences / contiguous->mean_sequences;
  targets.utilization_met = targets.paged_utilization >= MemoryReplayTargets::kMinUtilization;
  targets.sequences_met = targets.peak_ratio >= MemoryReplayTargets::kMinSequenceRatio &&
                          targets.mean_ratio >= MemoryReplayTargets::kMinSequenceRatio;
  return targets;
}

}  // namespace step05
