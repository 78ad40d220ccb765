#pragma once
// CompletionServer: the continuous-batching engine behind an OpenAI-compatible
// HTTP API (completion_api.hpp), on loopback:
//   POST /v1/completions       a completion, whole or streamed as server-sent events
//   POST /v1/chat/completions  the same for a conversation (its chat template: chat_prompt)
//   GET  /v1/models            the model served
//   GET  /health               {"status": "ok"}
//   GET  /v1/stats             running, waiting, blocks_used, finished, cancelled, failed, preemptions
//
// Threads. The engine is single-threaded, so exactly one thread owns it:
//   HTTP handler threads (httplib's pool)  parse and check a request, post it
//       to the inbox, then wait on the request's own channel for its tokens
//       and write them out (one JSON answer, or chunks as they come);
//   the engine thread  takes the inbox (submissions, cancellations, stops),
//       calls Engine::submit / cancel / stop_sample / step, and its token
//       listener pushes every token into its request's channel; it sleeps
//       when nothing is to run;
//   the listening thread  httplib's accept loop.
// A request with n > 1 is one engine request whose samples fork after its
// prompt (Engine::fork_samples): its channel carries every sample's tokens,
// and the handler assembles them into n choices (ChoiceAssembler). A stop
// string is matched on the handler thread, which then posts a stop for
// that sample: the engine ends it and frees its blocks at its next
// iteration. A streaming client that goes away makes its handler post a
// cancellation (the next write fails: a token's, or a keep-alive comment's
// while the request waits), and the engine frees the request's KV blocks at
// its next iteration. A client of a whole answer that leaves is only noticed
// when the answer is written: its request runs to its end, which max_tokens
// bounds.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "llm/model.hpp"
#include "llm/tokenizer.hpp"
#include "step07_batching/serve/completion_api.hpp"
#include "step07_batching/engine.hpp"
#include "step07_batching/serving_clock.hpp"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace step07 {

struct ServerOptions {
  EngineOptions engine;
  // Loopback only: the server exists to measure serving, not to face a network.
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port (port() says which)
  // HTTP connections served at once. A streaming request holds one thread
  // from its arrival to its last token, so this bounds the requests in
  // flight; connections past it wait for a thread (and that wait is in their
  // latency, as a client sees it).
  int http_threads = 256;
  // A stream with no token for this long (its request is waiting for a slot)
  // sends a comment event: it keeps the client's read alive and tells the
  // server whether the client is still there.
  int keep_alive_ms = 1000;
};

// What GET /v1/stats reports: one snapshot the engine thread publishes after
// each of its iterations, so the numbers always belong together.
struct ServerStats {
  int running = 0;            // requests with a cache slot
  int waiting = 0;            // requests queued for one
  int blocks_used = 0;        // KV blocks held (0 when nothing runs)
  long long finished = 0;     // samples (a request has n) that ended with "stop" or "length"
  long long cancelled = 0;    // samples dropped before their end: the client left, an engine error, shutdown
  long long failed = 0;       // requests ended by an engine error (a 500 or an error event)
  long long preemptions = 0;  // times a running request's K/V were thrown away to make room
};

class CompletionServer {
 public:
  // `model` serves every request (from the engine thread, between start() and
  // stop()); `model_name` goes into every response; `tokenizer` (null, or an
  // empty vocabulary: prompts must be token ids and texts are empty) encodes
  // text prompts and decodes text pieces. Both must outlive the server.
  // Throws InputError for options the engine rejects.
  CompletionServer(llm::Model& model, std::string model_name, const llm::Tokenizer* tokenizer,
                   const ServerOptions& options);
  ~CompletionServer();  // stop()
  CompletionServer(const CompletionServer&) = delete;
  CompletionServer& operator=(const CompletionServer&) = delete;

  // Binds host:port, starts the engine and listening threads, and returns
  // once connections are being accepted. Throws InputError when the port
  // cannot be bound, or when called twice.
  void start();
  // Stops listening, fails what is still waiting or running (503: the server
  // is shutting down; the KV blocks are freed), answers every open request
  // and joins every thread. Safe to call again, or without start(). Call it
  // from one thread (the owner's), not from a handler.
  void stop();

  const std::string& host() const { return options_.host; }
  int port() const { return port_; }  // the bound port, once started
  ServerStats stats() const;
  const ServedModel& served_model() const { return served_; }

 private:
  class TokenChannel;  // one request's items, from the engine thread to its handler (server.cpp)
  class OpenStream;    // a streamed answer, from before its request reaches the engine to its last write

  // One sample to end early (a stop string matched in its text).
  struct StopRequest {
    int request_id = 0;
    int sample = 0;
  };
  // A checked request on its way to the engine.
  struct Submission {
    Request request;                        // with the id and arrival time the server gave it
    std::shared_ptr<TokenChannel> channel;  // shared with the handler that waits on it
  };
  // What the engine thread takes from the inbox at once.
  struct Inbox {
    std::vector<Submission> submissions;
    std::vector<int> cancellations;  // request ids whose client went away
    std::vector<StopRequest> stops;
    bool stopping = false;
  };
  // A request in the engine, as the engine thread tracks it.
  struct LiveRequest {
    std::shared_ptr<TokenChannel> channel;  // shared with the handler that waits on it
    int live_samples = 0;                   // n, less each sample that has ended
  };

  // HTTP handler threads.
  void add_routes();
  void handle_completion(Endpoint endpoint, const httplib::Request& http_request, httplib::Response& response);
  void post_submission(Request request, std::shared_ptr<TokenChannel> channel);
  void post_cancellation(int request_id);
  void post_stop(int request_id, int sample);
  void answer_when_finished(httplib::Response& response, const CompletionId& id, const CompletionRequest& request,
                            TokenChannel& channel);
  void answer_as_stream(httplib::Response& response, std::shared_ptr<OpenStream> stream);

  // The engine thread.
  void run_engine();
  Inbox wait_for_inbox();
  void admit(Submission& submission);
  void cancel(int request_id);
  void stop_sample(const StopRequest& stop);
  void step_engine();
  void deliver(const TokenEvent& event);  // the engine's token listener
  void end_live_requests(const ApiError& reason);
  void collect_finished();
  void publish_stats();

  ServedModel served_;
  ServerOptions options_;
  ServingClock clock_;              // the engine's time; the server never skips it
  std::unique_ptr<Engine> engine_;  // touched by the engine thread only, once started
  std::unique_ptr<httplib::Server> http_;
  int listening_socket_ = -1;       // the bound socket (its backlog is raised after bind)
  int port_ = 0;
  std::atomic<int> next_request_id_{0};  // ids are the server's: clients cannot collide
  // Streamed answers not yet fully written. httplib's chunked writer checks
  // for shutdown between writes and would cut a stream short of its last
  // event, so stop() waits for this to reach 0 before stopping httplib.
  std::atomic<int> open_streams_{0};
  std::thread engine_thread_;
  std::thread listening_thread_;
  bool started_ = false;  // start() and stop() run on the owner's thread: no lock
  bool stopped_ = false;

  // The inbox: handler threads post, the engine thread takes. No thread holds
  // this lock and a channel's at once, so the two can never deadlock.
  std::mutex inbox_mutex_;
  std::condition_variable inbox_ready_;  // the engine thread sleeps on it when it has nothing to run
  std::vector<Submission> submissions_;
  std::vector<int> cancellations_;
  std::vector<StopRequest> stops_;
  bool stopping_ = false;

  // The engine thread's own: every request in the engine, by id.
  std::unordered_map<int, LiveRequest> live_;
  long long finished_ = 0;   // stop/length records (one per sample) taken from the engine so far
  long long cancelled_ = 0;  // cancelled records taken so far
  long long failed_ = 0;     // requests ended by an engine error

  mutable std::mutex stats_mutex_;
  ServerStats stats_;  // the last snapshot (stats_mutex_)
};

// The CLI's serve mode: starts `server`, prints its address,
// blocks until SIGINT or SIGTERM, then stops it. The signal handler only
// writes a byte to a pipe that this thread reads, so it is safe whichever
// thread the signal lands on.
void serve_until_signal(CompletionServer& server);

}  // namespace step07
