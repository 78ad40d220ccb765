#pragma once
// The memory replay: how much of a fixed KV budget holds real tokens, and how
// many sequences run at once, when a request trace is served with contiguous
// max-length reservations or with paged blocks. Bookkeeping only (no model,
// no K/V): lengths and reservations, iteration by iteration.
//
// The simplest serving loop that measures memory: every request arrives at
// time 0 and waits in a FCFS queue. One iteration = one forward:
//   1. every running sequence grows by one position;
//   2. waiting requests are admitted in order while the WHOLE request (prompt
//      + output, known from the trace) fits; an admitted sequence holds its
//      prompt plus the first generated token (its prefill made it);
//   3. the iteration is measured;  4. finished sequences leave.
// contiguous: budget_sequences slots of `context` positions, one per request.
// paged B: a step05::BlockManager of budget_positions / B blocks; admission
// promises a request the blocks of its final length, and it takes each block
// when it reaches it. No preemption is ever needed. Admission and preemption
// policy (a server does not know output lengths) is step 07's subject; these
// rows measure what paging does to memory (docs/05_paged_attention.md, 9.1).
#include <cstddef>
#include <string>
#include <vector>

#include "llm/config.hpp"
#include "step05_paged_attention/measure/request_trace.hpp"

namespace step05 {

// What the replay needs of a model: its context and the bytes of one
// position's K/V over all layers (to express the budget in bytes).
struct ModelDims {
  std::string name;
  int context = 0;
  std::size_t kv_bytes_per_token = 0;
};

// The rows of the replay table: `this_model` (fp32 K/V, as the course's
// caches store them, context = its seq_len), then Llama-2-7B (context 4096)
// and Llama-3-8B (context 8192) with fp16 K/V, their attention dims taken
// from step 03's well-known-model table.
std::vector<ModelDims> memory_replay_models(const std::string& this_model_name, const llm::ModelConfig& this_model);

struct MemoryReplayOptions {
  // The budget, in full-context sequences: budget_positions =
  // budget_sequences * context, the memory a contiguous server would need to
  // run budget_sequences requests at once.
  int budget_sequences = 8;
  std::vector<int> block_sizes = {8, 16, 32, 64};
  TraceOptions trace;  // its context is replaced by each model's
};

struct MemoryReplayRow {
  std::string model;
  int context = 0;
  std::string policy;              // "contiguous" | "paged"
  int block_size = 0;              // 0 for contiguous
  int n_blocks = 0;                // paged: budget_positions / block_size; contiguous: the slots (budget_sequences)
  long long budget_positions = 0;  // budget_sequences * context
  std::size_t kv_bytes_per_token = 0;
  std::size_t budget_bytes = 0;  // budget_positions * kv_bytes_per_token
  // Means over the iterations (each iteration weighs the same). Reserved
  // positions: running x context (contiguous), used blocks x block_size (paged).
  double kv_utilization = 0;           // real tokens / reserved positions
  double internal_fragmentation = 0;   // reserved positions holding no token / reserved: the unused rest of each
                                       // slot (contiguous), of each last block (paged); 1 - kv_utilization here
  double budget_utilization = 0;       // real tokens / budget_positions
  int peak_sequences = 0;              // most sequences running in one iteration
  double mean_sequences = 0;           // running sequences, mean over iterations
  long long iterations = 0;            // to finish the whole trace
  long long preemptions = 0;           // always 0: this replay never preempts (step 07's scheduler does)
  int requests = 0;                    // in the trace
  int requests_finished = 0;           // == requests when the replay ends
  double replay_ms = 0;                // wall time of this replay (bookkeeping only: milliseconds)
};

// Replays make_request_trace(options.trace with context = model.context)
// under contiguous reservation, then paged at each block size. Throws
// llm::InputError for budget_sequences < 1, a block size < 1, or a request
// that cannot fit the budget alone under a policy (it could never run: the
// replay says so instead of waiting forever).
std::vector<MemoryReplayRow> run_memory_replay(const ModelDims& model, const MemoryReplayOptions& options);
// The same replays of a trace the caller made (and may summarize).
std::vector<MemoryReplayRow> replay_policies(const std::vector<TraceRequest>& trace, const ModelDims& model,
                                             const MemoryReplayOptions& options);

// The replay of one trace under one policy (block_size 0: contiguous).
// run_memory_replay's building block, for tests and hand-made traces.
MemoryReplayRow replay_trace(const std::vector<TraceRequest>& trace, const ModelDims& model, int budget_sequences,
                             int block_size);

// The step's targets, checked on one model's rows: paged at block 16 keeps
// >= 90% of its reserved KV memory holding real tokens, and runs >= 2x the
// sequences of contiguous reservation (peak and mean).
struct MemoryReplayTargets {
  static constexpr int kBlockSize = 16;
  static constexpr double kMinUtilization = 0.90;
  static constexpr double kMinSequenceRatio = 2.0;
  double paged_utilization = 0;  // kv_utilization of paged at kBlockSize
  double peak_ratio = 0;         // peak sequences, paged / contiguous
  double mean_ratio = 0;         // mean sequences, paged / contiguous
  bool utilization_met = false;
  bool sequences_met = false;
  bool met() const { return utilization_met && sequences_met; }
};
// Throws llm::InputError when `rows` lack the contiguous row or paged at kBlockSize.
MemoryReplayTargets check_memory_replay_targets(const std::vector<MemoryReplayRow>& rows);

}  // namespace step05
