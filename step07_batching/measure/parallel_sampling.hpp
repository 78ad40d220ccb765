#pragma once
// Part 7 of the step: parallel sampling (OpenAI's `n`). n completions of one
// prompt, served two ways by continuous batching on the same engine:
//   forked:       one Request with n samples (what the server does for `n`):
//                 the prompt is prefilled once, then the sequence forks into
//                 n samples that share its KV blocks (step 05's fork) and
//                 draw their first tokens from its last row of logits; the
//                 prompt's partial last block is copied on the samples' writes
//   independent:  n Requests with the same prompt (what a server without
//                 forking runs): n prefills, n sets of blocks
// The prefix cache is off in both, so the sharing measured is the fork's
// alone. Per n: prefill rows, rows run, the peak of KV blocks held beside
// its prediction, copy-on-write copies, wall time (greedy, the median of
// `repeats` runs) and tokens/s. Checked: greedy, every sample's tokens equal
// the prompt's solo tokens; sampled, sample j (request j) equals an n = 1
// request seeded seed + j run alone (the engine's promise, request.hpp),
// bit for bit where the forward is batch-invariant (the CPU), up to a
// difference the logits explain elsewhere (check_sampled_outputs).
#include <cstdint>
#include <string>
#include <vector>

#include "llm/harness/compare.hpp"
#include "llm/harness/timer.hpp"
#include "llm/model.hpp"
#include "step07_batching/measure/replay.hpp"
#include "step07_batching/measure/workload.hpp"
#include "step07_batching/policies.hpp"

namespace CLI {
class App;
}

namespace step07 {

struct ParallelSamplingOptions {
  std::vector<int> samples = {1, 4, 8};  // n, each served both ways (each at most the largest batch)
  int prompt_tokens = 200;  // the prompt, BOS first: a window of the trace's prompt text (random ids without one)
  int max_tokens = 64;      // tokens each sample generates at most
  int repeats = 1;          // timed greedy runs per row, the median reported (main.cpp: --repeats)
  // The sampled check: temperature, nucleus and the seed s (sample j draws from s + j).
  float temperature = 0.8f;
  float top_p = 0.9f;
  // Also picks the prompt's window of the text: with stories260K and the
  // default --seed, 45's window is one that greedy decoding continues for all
  // 64 tokens (44's ends its story after 11), so the part times the decode.
  std::uint64_t seed = 45;
};

// --samples LIST, --sampling-prompt-tokens N, --sampling-max-tokens N (main.cpp's command line).
void add_parallel_sampling_flags(CLI::App& app, ParallelSamplingOptions& options);
// --quick: a 60-token prompt (ending inside a block of 16) and 16 tokens per sample.
void apply_quick(ParallelSamplingOptions& options);
// InputError for options no run can serve: no n, an n outside 1..max_sequences
// (a sample runs in a slot of its own), a prompt and its tokens past the
// context, repeats < 1. main.cpp calls it before any part runs.
void check_parallel_sampling_options(const ParallelSamplingOptions& options, int max_sequences, int context);

// The part's prompt as a greedy n = 1 request (id 0, at t = 0) of
// options.max_tokens tokens: the one solo_outputs runs for the reference.
Request parallel_sampling_request(const ParallelSamplingOptions& options, const PromptSource& prompts);

// The KV blocks n samples hold at their peak, every sample at its last
// forward (P + G - 1 positions: the prompt, then each generated token fed
// back but the last), B positions per block:
//   independent: n x ceil((P + G - 1) / B)
//   forked:      S + n x (ceil((P + G - 1) / B) - S), S = floor(P / B)
// S: the prompt's full blocks, shared to the end. A partial last block
// (P % B != 0) is shared too until the samples' first tokens are written
// into it: each write copies it while another sample still holds it, so
// n - 1 copies, and the last writer keeps the original (none when the
// prompt fills its blocks: the first writes open new ones). The samples run
// in lockstep (every fork draws its first token in its parent's iteration),
// so all n reach their last forward together.
int predicted_peak_blocks(bool forked, int n, int prompt_tokens, int generated, int block_size);

struct ParallelSamplingRow {
  std::string device;
  int n = 1;
  bool forked = false;
  int prompt_tokens = 0;
  int generated = 0;            // tokens per sample (the solo's: greedy samples generate the same)
  int block_size = 0;
  long long prefill_rows = 0;   // IterationRecord::prefill_rows, summed
  long long rows_computed = 0;  // every row of every forward
  int peak_blocks = 0;          // the pool's most blocks held at once
  int predicted_blocks = 0;     // predicted_peak_blocks
  long long copy_on_write = 0;  // the block manager's copies of a shared block
  long long preemptions = 0;    // a KV budget too small for the n samples (the peak is then the pool's)
  long long output_tokens = 0;  // of one greedy run, every sample's
  llm::TimingStats wall;        // the greedy runs, from the first submit to the last token
  // The median run's forwards, split: those that ran prefill rows, and the
  // rest (decode).
  double prefill_ms = 0.0;
  double decode_ms = 0.0;
  OutputCheck greedy;           // every sample vs the solo tokens (a forked run's sample j as request j)
  OutputCheck sampled;          // sample j vs an n = 1 request seeded seed + j, alone
  float temperature = 0.0f;     // the sampled check's
  double tokens_per_s() const { return wall.median_ms > 0 ? output_tokens / (wall.median_ms / 1000.0) : 0.0; }
  bool ok() const { return greedy.ok() && sampled.ok(); }
};

// Every sampled token's logits row, per sample numbered id + sample (a
// forked run's sample j, an independent run's request j):
// [sample][token * vocab + v].
using LogitsBySample = std::vector<std::vector<float>>;

// The sampled check: records[j] (numbered by sample) against `alone`[j], the
// tokens of an n = 1 request seeded seed + j run alone. `exact` (a
// batch-invariant device, the CPU): every sample's tokens equal, as
// check_outputs. Otherwise a sample may part from its alone run at one
// token, and that passes when the logits explain it: the two rows there
// (`logits`, `alone_logits`) agree within same_rounding_logits_tolerance of
// the model's weight type (fp32's: 1e-4), and the
// sampler seeded seed + j, replayed over the alone run's earlier rows (one
// coin per token), draws the alone token from the alone row and this run's
// token from this run's row. The seed, the coin and every earlier token are
// then the same, and rounding-level differences in the logits moved the
// nucleus (the order of near-equal probabilities, or a boundary) under the
// coin; after it the two sequences go their own ways. A wrong seed, a wrong
// row, logits past the tolerance or a sample that ended early fail.
OutputCheck check_sampled_outputs(const std::vector<RequestRecord>& records, const std::vector<std::vector<int>>& alone,
                                  const LogitsBySample& logits, const LogitsBySample& alone_logits,
                                  const SamplingParams& sampling, int vocab_size, bool exact,
                                  llm::DType weight_type = llm::DType::F32);

// For every n of options.samples, forked then independent, on `model`;
// `request` from parallel_sampling_request and `solo` its solo tokens.
// Throws InputError for bad options (check_parallel_sampling_options).
std::vector<ParallelSamplingRow> compare_parallel_sampling(const std::string& device, llm::Model& model,
                                                           const Request& request, const std::vector<int>& solo,
                                                           const ServingLimits& limits,
                                                           const ParallelSamplingOptions& options);

}  // namespace step07
