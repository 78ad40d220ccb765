#pragma once
// The latency table of a serving run, computed the same way for the
// in-process engine and for the load client over HTTP:
//   output tokens/s   every generated token / the run's duration
//   requests/s        finished requests / duration
//   TTFT              arrival -> first token (queueing + prefill), per request
//   TPOT              (last - first token) / (tokens - 1), per request
//   ITL               every gap between two consecutive tokens of a request:
//                     the stalls a reader of the stream sees
//   E2E               arrival -> last token
// Duration: first arrival to last finish. Percentiles by numpy's rule
// (llm::TimingStats).
#include <string>
#include <vector>

#include "step07_batching/engine.hpp"
#include "step07_batching/request.hpp"

namespace step07 {

struct Percentiles {
  double p50 = 0.0;
  double p90 = 0.0;
  double p99 = 0.0;
  double mean = 0.0;
  double max = 0.0;
};

struct ServingMetrics {
  int requests = 0;               // finished (not cancelled)
  long long output_tokens = 0;
  double duration_ms = 0.0;
  double output_tokens_per_s = 0.0;
  double requests_per_s = 0.0;
  Percentiles ttft_ms;
  Percentiles tpot_ms;            // over requests with 2+ tokens
  Percentiles itl_ms;
  Percentiles e2e_ms;
  long long preemptions = 0;
  // From the engine's iterations (0 where there are none, as for the load client):
  int iterations = 0;
  double mean_sequences = 0.0;    // requests per forward, averaged over iterations
  double mean_occupancy = 0.0;    // mean_sequences / max_sequences
  double mean_rows = 0.0;         // rows per forward
};

// Throws InputError when no request finished.
ServingMetrics summarize_serving(const std::vector<RequestRecord>& records,
                                 const std::vector<IterationRecord>& iterations, int max_sequences);

// One line per metric group, for a table cell ("p50 1.2 / p90 3.4 / p99 9.9 ms").
std::string format_percentiles(const Percentiles& p);

}  // namespace step07
