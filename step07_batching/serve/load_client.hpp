#pragma once
// The load client: a workload (workload.hpp) sent to a CompletionServer over
// HTTP, each request at its arrival time, timed on the client's side. What
// the in-process replay measures inside the engine, this measures as a user
// would: every token is stamped when its server-sent event arrives, so the
// same latency table (summarize_serving) now includes HTTP, JSON and the
// server's threads.
//
// One thread per request (it sleeps until its arrival, then sends and reads
// the stream), so requests are as concurrent as their arrivals make them: the
// workload's size bounds the threads, and callers keep it to a few hundred.
#include <string>
#include <vector>

#include "step07_batching/request.hpp"

namespace step07 {

struct LoadOptions {
  int max_requests = 0;       // send the workload's first max_requests (0: all of it)
  // The load's wall-time bound: requests arriving later are not sent; those
  // still running then are cut off (the server cancels them) and counted.
  double max_seconds = 60.0;
  // true: streamed, a time per token. false: one answer per request, so
  // every token of it gets the answer's time (TTFT = end-to-end latency).
  bool stream = true;
};

struct LoadResult {
  // Requests that finished ("stop" or "length"), ordered by id, timed on the
  // client's clock (0 = the load's start): summarize_serving(records, {}, max_sequences).
  // first_scheduled_ms is -1 and preemptions 0: the server does not say.
  std::vector<RequestRecord> records;
  int sent = 0;                // requests sent
  int not_sent = 0;            // arriving after max_seconds
  int unfinished = 0;          // sent, still running at max_seconds
  int failed = 0;              // an HTTP error, an error event or a broken connection
  std::string first_failure;   // what went wrong first ("" when nothing failed)
};

// `workload` in arrival order (arrival_ms from the load's start; ids are the
// workload's, the server assigns its own). Throws InputError for
// max_seconds <= 0 or a negative max_requests.
LoadResult run_load(const std::string& host, int port, const std::vector<Request>& workload,
                    const LoadOptions& options);

}  // namespace step07
