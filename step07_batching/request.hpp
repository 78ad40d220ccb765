#pragma once
// Request: what a client asks for, and what the engine keeps about it from
// arrival to finish. The engine (engine.hpp) owns one RequestState per live
// request; the scheduler (scheduler.hpp) moves them between its queues.
//
// One rule covers prefill, decode, chunked prefill and recompute after a
// preemption. A sequence holds `tokens` (the prompt, then every token
// generated so far); positions 0..computed-1 have their K/V in the cache.
// The rows still to run are tokens[computed..]: the whole prompt for a new
// request, the rest of it after a chunk, one row (the last token) while
// decoding, and the prompt plus everything generated after a preemption threw
// the K/V away. Only the row of the last token yields a next token.
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "llm/sampler.hpp"

namespace step07 {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax)
  float top_p = 0.9f;        // nucleus sampling's mass (used when temperature > 0)
  std::uint64_t seed = 0;    // the request's own sampler stream (sample j draws from seed + j)
};

struct Request {
  int id = 0;
  std::vector<int> prompt;   // [prompt_length] token ids, BOS first
  int max_tokens = 1;        // tokens to generate at most (the first comes out of the prefill)
  SamplingParams sampling;
  double arrival_ms = 0.0;   // when the request reaches the server, on the serving clock
  // Parallel sampling (OpenAI's `n`): n completions of one prompt. The prompt
  // is prefilled once; then the sequence forks into n samples that share the
  // prompt's KV blocks (step 05's fork; a shared block is copied on its first
  // write). Sample j draws from its own sampler, seeded seed + j: sample 0 is
  // the completion an n = 1 request with the same seed gets.
  int n = 1;
  // Log-probabilities of each sampled token (OpenAI's `logprobs`): -1 none;
  // k >= 0 the sampled token's and the k most likely tokens' (TokenLogprobs).
  int top_logprobs = -1;
};

// One sampled token's log-probabilities under the distribution it was drawn
// from: log softmax(logits / temperature), with the raw logits (temperature
// 1) for greedy decoding, which has no distribution of its own. Computed from
// the logits row already on the host, only for requests that ask.
struct TokenLogprobs {
  float logprob = 0.0f;                     // of the sampled token
  std::vector<std::pair<int, float>> top;   // [k] (token, logprob), most likely first
};
// `logits` [vocab_size] of one row; `token` the sampled one; k >= 0.
TokenLogprobs token_logprobs(std::span<const float> logits, float temperature, int token, int k);

enum class FinishReason {
  None,       // still running
  Stop,       // generated the end token (BOS, as llama2.c's run.c stops)
  Length,     // generated max_tokens
  Cancelled,  // the client went away (server) before the end
};
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "cancelled", "none"

// What is known about a request once it has finished: its tokens and the
// times the latency table is made of (milliseconds on the serving clock).
struct RequestRecord {
  int id = 0;
  int sample = 0;                // which of the request's n samples (0 for n = 1)
  int prompt_length = 0;
  std::vector<int> generated;    // [n] the tokens, in order (the end token included)
  std::vector<double> token_ms;  // [n] when each token came out of a forward
  FinishReason finish = FinishReason::None;
  double arrival_ms = 0.0;
  double first_scheduled_ms = -1.0;  // start of the first iteration that ran any of its rows
  double finish_ms = 0.0;            // when its last token came out (or it was cancelled)
  int preemptions = 0;               // times its K/V were thrown away to make room

  // Time to first token: arrival to the first token (queueing + prefill).
  double ttft_ms() const;
  // Time per output token: (last - first token) / (n - 1); 0 for one token.
  double tpot_ms() const;
};

// A request in the engine: the request, its sequence, its cache slot and
// sampler. A request with n > 1 is one RequestState until its prompt is
// computed (sample 0, with n - 1 forks pending), then n of them, one per
// sample, each with its own slot, tokens and sampler.
struct RequestState {
  // Sample `sample` of `r`: its sampler is seeded r.sampling.seed + sample.
  RequestState(Request r, int vocab_size, int sample = 0);

  Request request;
  int sample = 0;            // 0..n-1
  int forks_pending = 0;     // samples still to fork off this one when its prompt is computed (n - 1, then 0)
  std::vector<int> tokens;   // [prompt_length + generated] what the sequence holds or is about to
  int computed = 0;          // positions 0..computed-1 have K/V in the cache (0 again after a preemption)
  int slot = -1;             // the cache slot while running; -1 while waiting
  llm::Sampler sampler;      // its own stream: a preemption does not change what it samples
  RequestRecord record;

  int generated() const { return static_cast<int>(tokens.size() - request.prompt.size()); }
  // Rows to run before the next token can be sampled: tokens[computed..].
  int pending_rows() const { return static_cast<int>(tokens.size()) - computed; }
  bool decoding() const { return pending_rows() == 1; }
  // Cache slots it needs: its own, and one for each sample it will fork.
  int slots_needed() const { return 1 + forks_pending; }
};

}  // namespace step07
