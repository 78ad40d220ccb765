#pragma once
// The step's variant table: four ways to serve one trace with the same model,
// the same KV budget and the same largest batch. Only the scheduler's
// options differ (scheduler.hpp), so the table isolates the policy.
//   0 one_at_a_time       one request, start to finish, then the next (a batch of 1)
//   1 static              batches of max_sequences in arrival order; each
//                         runs until its longest member ends
//   2 continuous          the batch re-forms at every iteration: finished
//                         requests leave, waiting ones join; prompts run whole
//   3 continuous_chunked  the same, with prompts prefilled in chunks beside
//                         the decode rows, under a budget of rows per forward
#include <vector>

#include "llm/harness/compare.hpp"
#include "llm/harness/variant.hpp"
#include "step07_batching/engine.hpp"

namespace step07 {

struct ServingPolicy {
  Admission admission = Admission::EveryIteration;
  bool one_sequence = false;     // max_sequences = 1 whatever the limits say
  bool chunked_prefill = false;
};

const std::vector<llm::Variant<ServingPolicy>>& policies();

// The table's ids, for the parts that pick a policy by its role.
inline constexpr int kOneAtATime = 0;
inline constexpr int kStatic = 1;
inline constexpr int kContinuous = 2;
inline constexpr int kContinuousChunked = 3;
// The policy of table id `id` (InputError for an id not in the table).
const ServingPolicy& policy(int id);

// What every policy shares in one comparison.
struct ServingLimits {
  int max_sequences = 16;  // the largest batch (and the cache's slots)
  int block_size = 16;     // positions per KV block
  int kv_blocks = 0;       // the KV budget in blocks (0: a full context per slot)
  // Chunked prefill: rows per forward, decode rows included. Small, because
  // on a CPU a forward's time grows with its rows (part 1): the smaller the
  // chunk, the shorter the decoders' stall. A GPU, whose forward costs about
  // the same up to hundreds of rows, takes far larger chunks (part 4 sweeps it).
  int chunk_tokens = 32;
  // The model's weight type (the CUDA model's --dtype): how far a row's
  // logits may move between a forward alone and in a batch where the model
  // is not batch-invariant (same_rounding_logits_tolerance; check_replay,
  // part 7's sampled check).
  llm::DType weight_type = llm::DType::F32;
};

// The engine options of `policy` under `limits` for a model of `context`
// positions. Without chunked prefill the row budget holds the longest prompt
// beside a decode row for every other slot, so a prompt never waits on it.
EngineOptions engine_options_for(const ServingPolicy& policy, const ServingLimits& limits, int context);

}  // namespace step07
