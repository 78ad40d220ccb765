#include "step07_batching/serve/load_client.hpp"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <string_view>
#include <system_error>
#include <thread>

#include "llm/errors.hpp"
#include "step07_batching/serve/completion_api.hpp"
#include "step07_batching/serving_clock.hpp"

namespace step07 {
namespace {

// What every request's thread shares, read-only.
struct LoadTarget {
  std::string host;
  int port = 0;
  bool stream = true;
  double deadline_ms = 0.0;              // max_seconds, on the clock
  const ServingClock* clock = nullptr;  // the client's: 0 = the load's start
};

enum class Outcome {
  NotSent,     // arriving after the deadline
  Finished,    // "stop" or "length"
  Unfinished,  // still running at the deadline: cut off
  Failed,      // an HTTP error, an error event, a broken connection
};

// One request's trip to the server and back, on its own thread: sleep until
// the arrival, send, read the answer as it comes, then say how it went.
class Trip {
 public:
  Trip(const Request& request, const LoadTarget& target) : request_(request), target_(target) {
    record_.id = request.id;
    record_.prompt_length = static_cast<int>(request.prompt.size());
    // The arrival the workload asked for, not the moment the thread woke: a
    // send that starts late counts as waiting, as it would for a user.
    record_.arrival_ms = request.arrival_ms;
  }

  void run() {
    ignore_broken_pipes_in_this_thread();
    if (request_.arrival_ms >= target_.deadline_ms) return;  // NotSent
    const double wait_ms = request_.arrival_ms - target_.clock->now_ms();
    if (wait_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(wait_ms));
    send();
  }

  Outcome outcome() const { return outcome_; }
  const RequestRecord& record() const { return record_; }
  const std::string& failure() const { return failure_; }

 private:
  void send() {
    httplib::Client client(target_.host, target_.port);
    client.set_connection_timeout(std::chrono::seconds(5));
    // A read silent until past the deadline (a whole answer, or a server
    // without keep-alive events) fails a second after it: the load ends in time.
    const double silent_ms = std::max(0.0, target_.deadline_ms - target_.clock->now_ms()) + 1000.0;
    client.set_read_timeout(std::chrono::milliseconds(static_cast<long long>(silent_ms)));

    httplib::Request http_request;
    http_request.method = "POST";
    http_request.path = "/v1/completions";
    http_request.body = completion_request_json(request_, target_.stream);
    http_request.set_header("Content-Type", "application/json");
    http_request.response_handler = [this](const httplib::Response& response) {
      status_ = response.status;
      return true;
    };
    http_request.content_receiver = [this](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
      return receive(std::string_view(data, size));
    };
    httplib::Response response;
    httplib::Error error = httplib::Error::Success;
    client.send(http_request, response, error);
    conclude(error);
  }

  // httplib's content receiver: the body's bytes as they arrive. Returning
  // false closes the connection (the server then cancels the request).
  bool receive(std::string_view bytes) {
    if (status_ != 200 || !target_.stream) {
      body_.append(bytes);  // read whole at the end
    } else {
      for (const std::string& data : events_.feed(bytes)) take_event(data);
    }
    if (target_.clock->now_ms() <= target_.deadline_ms) return true;
    cut_ = true;
    return false;
  }

  void take_event(const std::string& data) {
    if (data == "[DONE]") return;
    const double now = target_.clock->now_ms();
    take_completion(parse_completion_json(data), now);
  }

  // Tokens of a whole answer or of one event, arrived at `now`.
  void take_completion(const ReceivedCompletion& received, double now) {
    if (received.error && failure_.empty()) failure_ = *received.error;
    for (const int token : received.tokens) {
      record_.generated.push_back(token);
      record_.token_ms.push_back(now);
    }
    if (received.finish != FinishReason::None) {
      record_.finish = received.finish;
      record_.finish_ms = now;
    }
  }

  void conclude(httplib::Error error) {
    if (status_ == 200 && !target_.stream && !body_.empty())
      take_completion(parse_completion_json(body_), target_.clock->now_ms());
    if (status_ != 200 && status_ != 0) {
      const ReceivedCompletion answer = parse_completion_json(body_);
      failure_ = fmt::format("HTTP {}: {}", status_, answer.error.value_or(body_));
    }
    const bool finished = record_.finish == FinishReason::Stop || record_.finish == FinishReason::Length;
    if (failure_.empty() && finished) {
      outcome_ = Outcome::Finished;
    } else if (failure_.empty() && (cut_ || target_.clock->now_ms() > target_.deadline_ms)) {
      outcome_ = Outcome::Unfinished;
    } else {
      outcome_ = Outcome::Failed;
      if (failure_.empty())
        failure_ = fmt::format("the connection ended before the last token ({})", httplib::to_string(error));
    }
  }

  const Request& request_;
  const LoadTarget& target_;
  RequestRecord record_;           // tokens and their arrival times on the client's clock
  Outcome outcome_ = Outcome::NotSent;
  std::string failure_;            // the first thing that went wrong
  int status_ = 0;                 // the HTTP status, once the headers came
  std::string body_;               // a whole answer (not streamed, or an error)
  SseDecoder events_;              // a stream's bytes into events
  bool cut_ = false;               // the deadline ended the read
};

LoadResult tally(const std::vector<Trip>& trips) {
  LoadResult result;
  for (const Trip& trip : trips) {
    switch (trip.outcome()) {
      case Outcome::NotSent: ++result.not_sent; continue;
      case Outcome::Finished: result.records.push_back(trip.record()); break;
      case Outcome::Unfinished: ++result.unfinished; break;
      case Outcome::Failed:
        ++result.failed;
        if (result.first_failure.empty())
          result.first_failure = fmt::format("request {}: {}", trip.record().id, trip.failure());
        break;
    }
    ++result.sent;
  }
  std::sort(result.records.begin(), result.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.id < b.id; });
  return result;
}

}  // namespace

LoadResult run_load(const std::string& host, int port, const std::vector<Request>& workload,
                    const LoadOptions& options) {
  if (!(options.max_seconds > 0.0) || options.max_requests < 0)
    throw llm::InputError(fmt::format("load: max_seconds must be > 0 and max_requests >= 0 (got {} and {})",
                                      options.max_seconds, options.max_requests));
  const std::size_t count = options.max_requests > 0
                                ? std::min(workload.size(), static_cast<std::size_t>(options.max_requests))
                                : workload.size();
  const ServingClock clock;
  const LoadTarget target{host, port, options.stream, options.max_seconds * 1000.0, &clock};
  std::vector<Trip> trips;  // [count] one per request, in workload order
  trips.reserve(count);
  for (std::size_t i = 0; i < count; ++i) trips.emplace_back(workload[i], target);
  std::vector<std::thread> threads;  // [count] each sleeps until its request's arrival
  threads.reserve(count);
  std::string refused;  // why the system refused a thread, if it did
  for (Trip& trip : trips) {
    try {
      threads.emplace_back(&Trip::run, &trip);
    } catch (const std::system_error& error) {
      refused = error.what();
      break;
    }
  }
  for (std::thread& thread : threads) thread.join();  // the started ones end by the deadline
  if (!refused.empty())
    throw llm::InputError(fmt::format("load: could not start a thread for each of {} requests ({}); send fewer",
                                      count, refused));
  return tally(trips);
}

}  // namespace step07
