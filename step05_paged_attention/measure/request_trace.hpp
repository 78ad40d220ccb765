#pragma once
// A synthetic serving trace: requests with a prompt length and an output
// length, for bookkeeping replays (this step's memory replay, step 07's
// scheduler). Lengths only; no token ids.
//
// The distribution. Real chat traffic is wide and right-skewed: most requests
// are short, a few are very long. The PagedAttention paper's ShareGPT trace
// averages about 160 prompt and 340 output tokens with tails past 1,000, run
// against 2,048-token contexts, so a request ends, on average, at about a
// quarter of the context: a server that reserves the whole context for every
// request leaves about three quarters of that memory empty even at the end of
// each request's life, and more before. Both lengths are drawn here from
// log-normal distributions (the usual fit for such length data: a normal
// distribution of ln(length)), independently, with medians set as fractions
// of the context, so the trace keeps those proportions at any context:
//   prompt = clamp(round(context * prompt_median_fraction * exp(prompt_sigma * z1)), 1, context - 1)
//   output = clamp(round(context * output_median_fraction * exp(output_sigma * z2)), 1, context - prompt)
// with z1, z2 independent standard normals. With the defaults (medians 5%
// and 10% of the context, sigma 1: means about 8% and 15%) the mean request
// ends near a quarter of the context (summarize_lengths reports it per run;
// tests/step05_memory_replay_test.cpp keeps it within 20-35%).
#include <cstdint>
#include <vector>

namespace step05 {

struct TraceRequest {
  int id = 0;             // 0, 1, 2, ... in arrival order
  int prompt_length = 0;  // >= 1 positions
  int output_length = 0;  // >= 1 generated tokens (the first one comes out of the prefill)
  int total_length() const { return prompt_length + output_length; }
};

struct TraceOptions {
  int n_requests = 300;
  int context = 0;  // the model's context: every prompt + output <= context (>= 2; required)
  std::uint64_t seed = 42;
  // Log-normal lengths: a median (as a fraction of the context) and the
  // standard deviation of ln(length). For a median m and a sigma s the mean
  // is m exp(s^2 / 2) and the 99th percentile m exp(2.33 s): with s = 1, 1.65x
  // and 10x the median.
  double prompt_median_fraction = 0.05;
  double prompt_sigma = 1.0;
  double output_median_fraction = 0.10;
  double output_sigma = 1.0;
};

// The trace, reproducible from options.seed on every platform (its own
// splitmix64 stream and Box-Muller normals, not <random>'s distributions,
// whose algorithms the standard leaves to each library). Throws
// llm::InputError for n_requests < 1, context < 2, a median fraction outside
// (0, 1] or a negative sigma.
std::vector<TraceRequest> make_request_trace(const TraceOptions& options);

// Order statistics of one length: percentiles by linear interpolation
// between the closest ranks, as llm::TimingStats computes them.
struct LengthStats {
  double min = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
  double mean = 0;
};

struct LengthSummary {
  int requests = 0;
  int context = 0;
  LengthStats prompt;
  LengthStats output;
  LengthStats total;  // prompt + output: the positions a request holds when it ends
  // total.mean / context: what a request holds at its end, on average, of a
  // full-context reservation (1 minus this is wasted even then).
  double mean_total_fraction = 0;
};

// Throws llm::InputError for an empty trace or context < 1.
LengthSummary summarize_lengths(const std::vector<TraceRequest>& trace, int context);

}  // namespace step05
