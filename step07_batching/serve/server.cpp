#include "step07_batching/serve/server.hpp"

#include <fmt/format.h>
#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <utility>

#include "llm/errors.hpp"
#include "step07_batching/serve/choice_assembler.hpp"

namespace step07 {
namespace {

constexpr const char* kJsonType = "application/json";
constexpr const char* kEventStreamType = "text/event-stream";
// A prompt of token ids for a 32k-token context is under 250 KB of JSON; a
// body past this is refused (413) before it is read whole.
constexpr std::size_t kMaxBodyBytes = 1 << 20;

// One thing the engine thread tells a request's handler.
struct ChannelItem {
  enum class Kind {
    Accepted,  // Engine::submit took the request: the answer will be a 200
    Token,     // a generated token of one sample (its last one has finish != None)
    Failed,    // the request ended without finishing: `failure` says why
  };
  Kind kind = Kind::Accepted;
  TokenEvent token;  // Kind::Token: the engine's event
  ApiError failure;  // Kind::Failed

  static ChannelItem accepted() { return {Kind::Accepted, {}, {}}; }
  static ChannelItem generated(const TokenEvent& event) { return {Kind::Token, event, {}}; }
  static ChannelItem failed(ApiError failure) { return {Kind::Failed, {}, std::move(failure)}; }
};

// An error that no request field caused: a route, the server, the engine.
ApiError error_of(int status, std::string message) { return {status, std::move(message), {}, {}}; }

const ApiError kShuttingDown = error_of(503, "the server is shutting down");

std::int64_t unix_time_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void answer_error(httplib::Response& response, const ApiError& error) {
  response.status = error.status;
  response.set_content(error_json(error), kJsonType);
}

// The routes, for the 404 and 405 messages.
bool known_path(const std::string& path) {
  return path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/models" || path == "/health" ||
         path == "/v1/stats";
}
bool is_post_path(const std::string& path) { return path == "/v1/completions" || path == "/v1/chat/completions"; }

// httplib's own refusals (no route, an unreadable request, a body too large)
// arrive here with an empty body; answers the handlers wrote are left alone.
httplib::Server::HandlerResponse answer_refusal(const httplib::Request& request, httplib::Response& response) {
  if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
  if (response.status == 404 && known_path(request.path)) {
    // The path exists for another method: 405, as HTTP asks, with the method that works.
    response.status = 405;
    response.set_header("Allow", is_post_path(request.path) ? "POST" : "GET");
    answer_error(response, error_of(405, fmt::format("{} {} is not allowed here (use {})", request.method, request.path,
                                                 response.get_header_value("Allow"))));
  } else if (response.status == 404) {
    answer_error(response, error_of(404, fmt::format("no route {} {} (this server has POST /v1/completions, POST "
                                             "/v1/chat/completions, GET /v1/models, GET /health and GET /v1/stats)",
                                                 request.method, request.path)));
  } else if (response.status == 413) {
    answer_error(response, error_of(413, fmt::format("the body is over {} bytes, more than any prompt that fits the context",
                                                 kMaxBodyBytes)));
  } else {
    answer_error(response,
                 error_of(response.status, fmt::format("the request was refused (HTTP {})", response.status)));
  }
  return httplib::Server::HandlerResponse::Handled;
}

// A handler must never let an exception reach httplib (it would answer a
// bare 500); should one escape all the same, the client gets a JSON 500.
void answer_exception(const httplib::Request&, httplib::Response& response, std::exception_ptr exception) {
  std::string what = "unknown exception";
  try {
    if (exception) std::rethrow_exception(exception);
  } catch (const std::exception& error) {
    what = error.what();
  } catch (...) {
  }
  answer_error(response, error_of(500, "internal error: " + what));
}

}  // namespace

// One request's items, in order, from the engine thread (push) to the
// handler thread that answers the request (pop).
class CompletionServer::TokenChannel {
 public:
  void push(ChannelItem item) {
    {
      std::lock_guard lock(mutex_);
      items_.push_back(std::move(item));
    }
    ready_.notify_one();
  }
  // Blocks until an item comes. The engine thread always answers: every
  // request ends with a last token or a Failed item, shutdown included.
  ChannelItem pop() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return !items_.empty(); });
    return take_front();
  }
  // Every item queued, once at least one has come; empty when none came
  // within `timeout`. All at once: a stream that fell behind the engine
  // catches up in one write instead of one write (and one wake-up of the
  // client) per token.
  std::vector<ChannelItem> pop_all_for(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    std::vector<ChannelItem> items;
    if (!ready_.wait_for(lock, timeout, [&] { return !items_.empty(); })) return items;
    items.assign(std::make_move_iterator(items_.begin()), std::make_move_iterator(items_.end()));
    items_.clear();
    return items;
  }

 private:
  ChannelItem take_front() {
    ChannelItem item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<ChannelItem> items_;  // pushed, not yet popped (mutex_)
};

// What a streamed answer needs between the content provider's calls (httplib
// copies the provider, so it lives behind a shared pointer). It counts as an
// open stream for as long as it exists: from before its request is posted
// until httplib has released the response, or the handler has answered an
// error instead, whichever way that happens.
class CompletionServer::OpenStream {
 public:
  OpenStream(std::atomic<int>& open_streams, const CompletionId& id, const CompletionRequest& request,
             std::shared_ptr<TokenChannel> channel, const ServedModel& model)
      : open_streams_(open_streams),
        id_(id),
        with_logprobs_(request.top_logprobs >= 0),
        include_usage_(request.include_usage),
        channel_(std::move(channel)),
        choices_(model, request) {
    ++open_streams_;
  }
  // Runs on an httplib thread (the handler's, or the one releasing the
  // response), which stop() joins: the counter outlives this.
  ~OpenStream() {
    if (--open_streams_ == 0) open_streams_.notify_all();
  }
  OpenStream(const OpenStream&) = delete;
  OpenStream& operator=(const OpenStream&) = delete;

  const CompletionId& id() const { return id_; }
  TokenChannel& channel() { return *channel_; }
  // The events an item becomes: a chunk of its choice (none for a token of
  // a choice that has ended), or an error event; after the last choice's
  // last chunk, the usage chunk when asked, and the end of the stream.
  std::string events_for(const ChannelItem& item, CompletionServer& server) {
    std::string events;
    if (item.kind == ChannelItem::Kind::Failed) {
      ended_ = true;
      return error_event(item.failure) + std::string(kDoneEvent);
    }
    const TokenEvent& token = item.token;
    const auto added = choices_.add(token.sample, token.token, token.finish, token.logprobs);
    if (!added) return events;
    if (added->stop_string_matched) server.post_stop(id_.request_id, token.sample);
    events = chunk_event(server.served_, id_, added->delta, with_logprobs_, include_usage_);
    if (choices_.all_ended()) {
      if (include_usage_) events += usage_event(server.served_, id_, choices_.usage());
      events += kDoneEvent;
      ended_ = true;
    }
    return events;
  }
  bool ended() const { return ended_; }  // the last event has been made

 private:
  std::atomic<int>& open_streams_;
  CompletionId id_;
  bool with_logprobs_;
  bool include_usage_;
  std::shared_ptr<TokenChannel> channel_;  // shared with the engine thread
  ChoiceAssembler choices_;
  bool ended_ = false;
};

CompletionServer::CompletionServer(llm::Model& model, std::string model_name, const llm::Tokenizer* tokenizer,
                                   const ServerOptions& options)
    : served_(make_served_model(model.config(), std::move(model_name), tokenizer,
                                options.engine.scheduler.max_sequences, unix_time_s())),
      options_(options),
      engine_(std::make_unique<Engine>(model, options.engine, clock_)),
      http_(std::make_unique<httplib::Server>()) {
  engine_->set_token_listener([this](const TokenEvent& event) { deliver(event); });
  add_routes();
}

CompletionServer::~CompletionServer() { stop(); }

// ---- HTTP handler threads ----

void CompletionServer::add_routes() {
  http_->Post("/v1/completions", [this](const httplib::Request& request, httplib::Response& response) {
    handle_completion(Endpoint::Completions, request, response);
  });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& request, httplib::Response& response) {
    handle_completion(Endpoint::ChatCompletions, request, response);
  });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(models_json(served_), kJsonType);
  });
  http_->Get("/health", [](const httplib::Request&, httplib::Response& response) {
    response.set_content(R"({"status":"ok"})", kJsonType);
  });
  http_->Get("/v1/stats", [this](const httplib::Request&, httplib::Response& response) {
    const ServerStats now = stats();
    const nlohmann::json json = {{"running", now.running},         {"waiting", now.waiting},
                                 {"blocks_used", now.blocks_used}, {"finished", now.finished},
                                 {"cancelled", now.cancelled},     {"failed", now.failed},
                                 {"preemptions", now.preemptions}};
    response.set_content(json.dump(), kJsonType);
  });
  http_->set_error_handler(httplib::Server::HandlerWithResponse(answer_refusal));
  http_->set_exception_handler(answer_exception);
  http_->set_payload_max_length(kMaxBodyBytes);
  const auto threads = static_cast<std::size_t>(std::max(1, options_.http_threads));
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // The default options (SO_REUSEADDR), and the bound socket remembered for start().
  http_->set_socket_options([this](socket_t socket) {
    httplib::default_socket_options(socket);
    listening_socket_ = socket;
  });
}

void CompletionServer::handle_completion(Endpoint endpoint, const httplib::Request& http_request,
                                         httplib::Response& response) {
  ParsedCompletion parsed = endpoint == Endpoint::Completions ? parse_completion_request(http_request.body, served_)
                                                              : parse_chat_request(http_request.body, served_);
  if (const auto* error = std::get_if<ApiError>(&parsed)) return answer_error(response, *error);
  const CompletionRequest& completion = std::get<CompletionRequest>(parsed);
  const CompletionId id{endpoint, next_request_id_++, unix_time_s()};
  auto channel = std::make_shared<TokenChannel>();
  // A stream counts as open before its request can reach the engine, so
  // stop() never misses one.
  std::shared_ptr<OpenStream> stream;
  if (completion.stream) stream = std::make_shared<OpenStream>(open_streams_, id, completion, channel, served_);

  Request request;
  request.id = id.request_id;
  request.prompt = completion.prompt;
  request.max_tokens = completion.max_tokens;
  request.sampling = completion.sampling;
  request.n = completion.n;
  request.top_logprobs = completion.top_logprobs;
  request.arrival_ms = clock_.now_ms();
  post_submission(std::move(request), channel);

  // The engine's answer to the submission comes first: a request it rejects
  // (InputError) gets its 400 here, before any 200 or stream has started.
  const ChannelItem answer = channel->pop();
  if (answer.kind == ChannelItem::Kind::Failed) return answer_error(response, answer.failure);
  if (stream)
    answer_as_stream(response, std::move(stream));
  else
    answer_when_finished(response, id, completion, *channel);
}

void CompletionServer::post_submission(Request request, std::shared_ptr<TokenChannel> channel) {
  bool refused = false;
  {
    std::lock_guard lock(inbox_mutex_);
    refused = stopping_;
    if (!refused) submissions_.push_back({std::move(request), channel});
  }
  // 503: the server is going away, not the request's fault; try again elsewhere.
  if (refused)
    channel->push(ChannelItem::failed(kShuttingDown));
  else
    inbox_ready_.notify_one();
}

void CompletionServer::post_cancellation(int request_id) {
  {
    std::lock_guard lock(inbox_mutex_);
    cancellations_.push_back(request_id);
  }
  inbox_ready_.notify_one();
}

void CompletionServer::post_stop(int request_id, int sample) {
  {
    std::lock_guard lock(inbox_mutex_);
    stops_.push_back({request_id, sample});
  }
  inbox_ready_.notify_one();
}

void CompletionServer::answer_when_finished(httplib::Response& response, const CompletionId& id,
                                            const CompletionRequest& request, TokenChannel& channel) {
  ChoiceAssembler assembler(served_, request);
  std::vector<ChoiceDelta> choices(static_cast<std::size_t>(request.n));  // [n] each choice whole
  for (std::size_t index = 0; index < choices.size(); ++index) choices[index].index = static_cast<int>(index);
  while (!assembler.all_ended()) {
    const ChannelItem item = channel.pop();
    if (item.kind == ChannelItem::Kind::Failed) return answer_error(response, item.failure);
    const TokenEvent& token = item.token;
    const auto added = assembler.add(token.sample, token.token, token.finish, token.logprobs);
    if (!added) continue;  // a token made after its choice's stop string
    if (added->stop_string_matched) post_stop(id.request_id, token.sample);
    choices[static_cast<std::size_t>(token.sample)].append(added->delta);
  }
  response.set_content(completion_json(served_, id, choices, assembler.usage(), request.top_logprobs >= 0),
                       kJsonType);
}

void CompletionServer::answer_as_stream(httplib::Response& response, std::shared_ptr<OpenStream> stream) {
  const auto keep_alive = std::chrono::milliseconds(options_.keep_alive_ms);
  // httplib calls this again and again until sink.done(); false ends the
  // response (the client has gone: the write failed).
  auto provide = [this, stream, keep_alive](std::size_t, httplib::DataSink& sink) {
    const std::vector<ChannelItem> items = stream->channel().pop_all_for(keep_alive);
    if (items.empty()) return sink.write(kKeepAliveEvent.data(), kKeepAliveEvent.size());
    std::string events;
    for (const ChannelItem& item : items)
      if (!stream->ended()) events += stream->events_for(item, *this);  // nothing follows the last
    if (events.empty()) return true;  // only tokens of choices that had ended
    if (!sink.write(events.data(), events.size())) return false;
    if (stream->ended()) sink.done();
    return true;
  };
  // Runs when httplib is done with the response, however it ended. A stream
  // short of its end lost its client: the engine drops the request and frees
  // its blocks.
  auto release = [this, stream](bool) {
    if (!stream->ended()) post_cancellation(stream->id().request_id);
  };
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(kEventStreamType, std::move(provide), std::move(release));
}

// ---- the engine thread ----

void CompletionServer::run_engine() {
  for (;;) {
    Inbox inbox = wait_for_inbox();
    for (int request_id : inbox.cancellations) cancel(request_id);
    for (const StopRequest& stop : inbox.stops) stop_sample(stop);
    for (Submission& submission : inbox.submissions) {
      if (inbox.stopping)
        submission.channel->push(ChannelItem::failed(kShuttingDown));
      else
        admit(submission);
    }
    if (inbox.stopping) {
      end_live_requests(kShuttingDown);
      collect_finished();
      publish_stats();
      return;
    }
    if (engine_->has_work()) step_engine();
    collect_finished();
    publish_stats();
  }
}

CompletionServer::Inbox CompletionServer::wait_for_inbox() {
  std::unique_lock lock(inbox_mutex_);
  // With requests in the engine it steps at once: new ones join at the next iteration.
  if (!engine_->has_work())
    inbox_ready_.wait(lock, [&] {
      return stopping_ || !submissions_.empty() || !cancellations_.empty() || !stops_.empty();
    });
  return {std::exchange(submissions_, {}), std::exchange(cancellations_, {}), std::exchange(stops_, {}), stopping_};
}

void CompletionServer::admit(Submission& submission) {
  const int request_id = submission.request.id;
  const int samples = submission.request.n;
  try {
    engine_->submit(std::move(submission.request));
  } catch (const llm::InputError& error) {
    submission.channel->push(ChannelItem::failed(error_of(400, error.what())));
    return;
  } catch (const std::exception& error) {
    submission.channel->push(
        ChannelItem::failed(error_of(500, fmt::format("the engine could not take the request: {}", error.what()))));
    return;
  }
  live_[request_id] = {submission.channel, samples};
  submission.channel->push(ChannelItem::accepted());
}

void CompletionServer::cancel(int request_id) {
  // The request may have finished since its client left: nothing to free then.
  if (live_.erase(request_id) == 0) return;
  try {
    engine_->cancel(request_id);
  } catch (const std::exception& error) {
    fmt::print(stderr, "server: cancelling request {} failed: {}\n", request_id, error.what());
  }
}

void CompletionServer::stop_sample(const StopRequest& stop) {
  const auto found = live_.find(stop.request_id);
  // The sample may have ended by itself meanwhile (the end token, max_tokens): nothing to do then.
  if (found == live_.end() || !engine_->stop_sample(stop.request_id, stop.sample)) return;
  if (--found->second.live_samples == 0) live_.erase(found);
}

void CompletionServer::step_engine() {
  try {
    engine_->step();
  } catch (const std::exception& error) {
    // Which request broke the iteration is unknown, and so is the engine's
    // state halfway through it: every request in it fails (and is cancelled,
    // freeing its blocks), and the server goes on with the next ones.
    const long long live = static_cast<long long>(live_.size());
    end_live_requests(error_of(500, fmt::format("the engine failed: {}", error.what())));
    failed_ += live;
  }
}

void CompletionServer::deliver(const TokenEvent& event) {
  const auto found = live_.find(event.request_id);
  if (found == live_.end()) return;  // cancelled in this iteration
  found->second.channel->push(ChannelItem::generated(event));
  if (event.finish != FinishReason::None && --found->second.live_samples == 0) live_.erase(found);
}

void CompletionServer::end_live_requests(const ApiError& reason) {
  for (auto& [request_id, live] : live_) {
    try {
      engine_->cancel(request_id);
    } catch (const std::exception& error) {
      fmt::print(stderr, "server: cancelling request {} failed: {}\n", request_id, error.what());
    }
    live.channel->push(ChannelItem::failed(reason));
  }
  live_.clear();
}

void CompletionServer::collect_finished() {
  // Taken every iteration: the engine keeps finished records until asked,
  // and a server that never asked would grow without end.
  for (const RequestRecord& record : engine_->take_finished()) {
    if (record.finish == FinishReason::Cancelled)
      ++cancelled_;
    else
      ++finished_;
  }
}

void CompletionServer::publish_stats() {
  ServerStats now;
  now.running = engine_->running();
  now.waiting = engine_->waiting();
  now.blocks_used = engine_->cache().blocks().used_blocks();
  now.finished = finished_;
  now.cancelled = cancelled_;
  now.failed = failed_;
  now.preemptions = engine_->preemptions();
  std::lock_guard lock(stats_mutex_);
  stats_ = now;
}

ServerStats CompletionServer::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

// ---- start and stop (the owner's thread) ----

void CompletionServer::start() {
  if (started_) throw llm::InputError("CompletionServer::start() called twice");
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
  } else {
    port_ = http_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0)
    throw llm::InputError(fmt::format("cannot listen on {}:{} (is the port in use?)", options_.host, options_.port));
  // httplib listens with a backlog of 5 connections (built into the
  // library): a load that connects a few hundred clients at once would have
  // the kernel drop the others' handshakes and retry them a second later, a
  // delay that is no part of serving. Linux takes a second listen() on a
  // listening socket as a new backlog.
  ::listen(listening_socket_, SOMAXCONN);
  publish_stats();
  started_ = true;
  engine_thread_ = std::thread(&CompletionServer::run_engine, this);
  listening_thread_ = std::thread([this] {
    // httplib starts its handler threads from this one: they inherit the mask.
    ignore_broken_pipes_in_this_thread();
    http_->listen_after_bind();
  });
  // Connections already queue in the backlog, but stop() only ends an accept
  // loop that has started: wait for it, so a stop() right after start() cannot hang.
  while (!http_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void CompletionServer::stop() {
  if (!started_ || stopped_) return;
  stopped_ = true;
  {
    std::lock_guard lock(inbox_mutex_);
    stopping_ = true;
  }
  inbox_ready_.notify_one();
  // First the engine: it fails every request still in it, so each handler
  // waiting on a channel answers. Then the streams write their last event
  // (a write to a client that reads nothing fails at httplib's write
  // timeout), and only then httplib stops, joining its handler threads.
  engine_thread_.join();
  for (int open = open_streams_.load(); open > 0; open = open_streams_.load()) open_streams_.wait(open);
  http_->stop();
  listening_thread_.join();
}

// ---- serve mode ----

namespace {

// The write end of the pipe a signal wakes serve_until_signal through. A
// signal handler receives nothing but the signal number, so it is a global;
// an atomic int is lock-free, safe to read in a handler.
std::atomic<int> g_signal_pipe = -1;

extern "C" void write_signal_byte(int) {
  const int saved_errno = errno;  // a handler must leave errno as it found it
  const char byte = 1;
  [[maybe_unused]] const ssize_t written = ::write(g_signal_pipe.load(), &byte, 1);  // async-signal-safe
  errno = saved_errno;
}

// SIGINT and SIGTERM write a byte to a pipe while this lives; the previous
// handlers come back when it ends.
class SignalPipe {
 public:
  SignalPipe() {
    if (::pipe(ends_) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
    g_signal_pipe = ends_[1];
    struct sigaction action {};
    action.sa_handler = write_signal_byte;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_interrupt_);
    sigaction(SIGTERM, &action, &previous_terminate_);
  }
  ~SignalPipe() {
    sigaction(SIGINT, &previous_interrupt_, nullptr);
    sigaction(SIGTERM, &previous_terminate_, nullptr);
    g_signal_pipe = -1;
    ::close(ends_[0]);
    ::close(ends_[1]);
  }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  void wait() const {
    char byte = 0;
    while (::read(ends_[0], &byte, 1) < 0 && errno == EINTR) {
    }
  }

 private:
  int ends_[2] = {-1, -1};  // [0] read, [1] write
  struct sigaction previous_interrupt_ {};
  struct sigaction previous_terminate_ {};
};

}  // namespace

void serve_until_signal(CompletionServer& server) {
  const SignalPipe signals;
  server.start();
  fmt::print("serving {} on http://{}:{} (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
             "GET /health, GET /v1/stats); Ctrl-C stops\n",
             server.served_model().name, server.host(), server.port());
  std::fflush(stdout);
  signals.wait();
  fmt::print("stopping: requests still open are answered 503\n");
  server.stop();
}

}  // namespace step07
