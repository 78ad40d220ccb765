#pragma once
// Running a trace through the engine, in process, and checking its outputs.
//
// replay(): a fresh engine on a fresh ServingClock. Requests are submitted
// when the clock reaches their arrival; when nothing is left to run, the
// clock jumps to the next arrival (serving_clock.hpp), so an hour of
// arrivals replays in the time its work takes, and every latency is the one
// a client would have seen.
//
// solo_outputs(): each request alone, greedy, through the model's own
// contiguous cache and step 05's one-sequence loop: the reference every
// policy's tokens must equal, token for token, where the model's rows are
// batch-invariant (the CPU). On CUDA a row's logits move by rounding-level
// amounts with the rows that share its forward, and a greedy token may then
// take the other side of a near-tie: check_replay says when that is all that
// happened.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "llm/harness/compare.hpp"
#include "llm/model.hpp"
#include "step07_batching/engine.hpp"
#include "step07_batching/request.hpp"
#include "step07_batching/measure/serving_metrics.hpp"

namespace step07 {

struct ReplayResult {
  std::vector<RequestRecord> records;        // [requests] ordered by id
  std::vector<IterationRecord> iterations;   // [forwards] in order
  ServingMetrics metrics;
  int max_sequences = 0;
  int kv_blocks = 0;                         // the pool the engine ran with
  int peak_blocks_used = 0;
  step05::BlockManagerCounters blocks;       // the pool's counters at the end (prefix-cache hits among them)
  // Given the solo tokens (replay's `watch`): each request whose tokens part
  // from them, by id: the first differing token's index and the logits row
  // [vocab] the run drew it from.
  struct Parting {
    int token = 0;
    std::vector<float> logits;
  };
  std::map<int, Parting> partings;
};

// `requests` in arrival order; `watch`, when given, the solo tokens
// (solo_outputs) whose partings to keep. Throws what the engine throws
// (InputError for a request that can never run, DeviceError).
ReplayResult replay(llm::Model& model, const std::vector<Request>& requests, const EngineOptions& options,
                    const std::vector<std::vector<int>>* watch = nullptr);

// Whether a row's logits are the same bits whatever other rows share its
// forward. The CPU model runs each row through the same loops; on CUDA,
// cuBLAS picks its GEMM kernel by the row count, and more rows than
// --max-gemv-rows (1 by default, up to 16) take the half model's products
// from its GEMV to cuBLAS.
bool batch_invariant(const llm::Model& model);

// [requests] the greedy tokens of each request run alone (max_tokens of them,
// fewer when it generates the end token).
std::vector<std::vector<int>> solo_outputs(llm::Model& model, const std::vector<Request>& requests);

// How a run's tokens compare with the solo ones.
struct OutputCheck {
  int expected = 0;              // requests in the trace
  int requests = 0;              // of those, finished
  int identical = 0;             // finished with exactly their solo tokens
  // Finished with other tokens, each difference explained by the logits, on
  // a device whose products depend on the batch's rows (check_replay's
  // greedy check, part 7's sampled one); always 0 for check_outputs.
  int explained = 0;
  std::string first_difference;  // "" when all are identical or explained, else which request and where
  std::string first_explained;   // the first explained difference, for the report
  bool ok() const { return identical + explained == expected && requests == expected && first_difference.empty(); }
};
OutputCheck check_outputs(const std::vector<RequestRecord>& records, const std::vector<std::vector<int>>& solo);

// Why a request's tokens part from its reference at token t: explained or
// not, and the reason (appended to "token t is A alone, B here").
struct PartingVerdict {
  bool explained = false;
  std::string why;
};
// `check` (check_outputs of `records` against `reference`, indexed by
// record id) with every request that parts from its reference judged by
// `judge`(record, t), t the first differing token, which both runs have (one
// that ended before the other is not explained). `first_difference` and
// `first_explained` read "request ID: token t is A alone, B here" + why.
// The greedy check (explain_partings) and part 7's sampled one share it.
OutputCheck judge_partings(OutputCheck check, const std::vector<RequestRecord>& records,
                           const std::vector<std::vector<int>>& reference,
                           const std::function<PartingVerdict(const RequestRecord&, int)>& judge);

// check_outputs for a run replayed with `watch` = &solo. On a batch-invariant
// model, exactly that. Otherwise a request whose tokens part from its solo
// tokens at token t passes as explained when the run's logits row there and
// the solo run's (recomputed alone on `model`, feeding the solo tokens before
// t) agree within `tolerance` (compare.hpp's same_rounding_logits_tolerance
// of the weights' type), each row's greedy token being its own: two
// computations of one row that close can only choose differently at a
// near-tie. Every token before t is equal; after t the two runs have
// different histories and are not compared. A row past the tolerance, a
// parting the run did not keep, or a run that ended early fails.
OutputCheck check_replay(llm::Model& model, const std::vector<Request>& requests, const ReplayResult& run,
                         const std::vector<std::vector<int>>& solo, llm::Tolerance tolerance);
// check_replay's second half, whatever the device (the tests drive it on the
// CPU): `check` (check_outputs of run.records) with every parting judged.
OutputCheck explain_partings(OutputCheck check, llm::Model& model, const std::vector<Request>& requests,
                             const ReplayResult& run, const std::vector<std::vector<int>>& solo,
                             llm::Tolerance tolerance);

// check_outputs for tokens that came without their logits rows (part 5's
// client over HTTP sees tokens only). On a batch-invariant model, exactly
// that. Otherwise a request that parts from its solo tokens at token t
// passes as explained when the solo row there (recomputed alone) makes the
// two tokens a near-tie that a row within `tolerance` of it could swap:
// alone[solo token] - alone[run's token] <= 2 (abs_tol + rel_tol x the
// larger |logit|). Weaker than check_replay's verdict: the batched row
// itself is not seen, so this is what rounding must satisfy, not proof that
// rounding is all that happened.
OutputCheck check_tokens_only(llm::Model& model, const std::vector<Request>& requests,
                              const std::vector<RequestRecord>& records, const std::vector<std::vector<int>>& solo,
                              llm::Tolerance tolerance);
// check_tokens_only's second half, whatever the device (the tests drive it
// on the CPU).
OutputCheck explain_partings_by_near_ties(OutputCheck check, llm::Model& model, const std::vector<Request>& requests,
                                          const std::vector<RequestRecord>& records,
                                          const std::vector<std::vector<int>>& solo, llm::Tolerance tolerance);

}  // namespace step07
