// Step 07's server, over real HTTP on loopback: whole and streamed answers
// carry the tokens the model generates for the request alone; concurrent
// requests too; every bad request gets its 4xx and a JSON error in OpenAI's
// shape; a client that leaves mid-stream gets its request cancelled and its
// KV blocks freed; the load client times every token; a real model answers
// text with text. The OpenAI API as clients use it: chat completions (the
// same tokens as the completion of the chat template's prompt), the models
// list, n choices (choice j is what seed + j draws alone; one prefill), stop
// strings (cut text, "stop", the sample ended in the engine), logprobs, the
// usage chunk of a stream, and over-long input refused at once.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/config.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/tokenizer.hpp"
#include "llm/weights.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step07_batching/serve/completion_api.hpp"
#include "step07_batching/serve/load_client.hpp"
#include "step07_batching/measure/replay.hpp"
#include "step07_batching/serve/server.hpp"
#include "step07_batching/measure/serving_metrics.hpp"
#include "test_support.hpp"

namespace {

using Json = nlohmann::json;
using llm::testing::HasSubstr;

// The model under test, slowed down or broken on purpose. Slow: the tiny
// preset alone generates its whole context in less time than a client needs
// to read a first event and leave, and the disconnect and shutdown tests need
// a stream still running when its client (or the server) goes. Broken: every
// forward throws, as a device error would.
class AlteredModel final : public llm::Model {
 public:
  enum class Alteration { Slow, Broken };
  AlteredModel(llm::Model& model, Alteration alteration) : model_(model), alteration_(alteration) {}
  const llm::ModelConfig& config() const override { return model_.config(); }
  std::string device_name() const override { return model_.device_name(); }
  std::unique_ptr<llm::KvCache> make_cache(int num_sequences, int capacity) const override {
    return model_.make_cache(num_sequences, capacity);
  }
  std::span<const float> forward(const llm::TokenBatch& batch, llm::KvCache& cache, llm::LogitsFor which) override {
    if (alteration_ == Alteration::Broken) throw std::runtime_error("the device fell off the bus");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // 500 tokens: half a second at least
    return model_.forward(batch, cache, which);
  }

 private:
  llm::Model& model_;
  Alteration alteration_;
};

step07::ServerOptions small_server() {
  step07::ServerOptions options;
  options.engine.scheduler.max_sequences = 4;
  options.engine.scheduler.token_budget = 600;  // the longest prompt (the context) plus a row per other slot
  options.engine.block_size = 16;
  options.http_threads = 16;
  options.keep_alive_ms = 200;
  return options;
}

std::string completion_body(const std::vector<int>& prompt, int max_tokens, bool stream) {
  return Json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"stream", stream}}.dump();
}

// The token ids of a streamed answer, checking the events' shape on the way:
// one token each, "finish_reason" null but on the last, then [DONE].
std::vector<int> streamed_tokens(const std::string& body, std::string* finish_reason = nullptr,
                                 std::string* text = nullptr) {
  step07::SseDecoder decoder;
  const std::vector<std::string> events = decoder.feed(body);
  EXPECT_GE(events.size(), 2u) << body;
  if (events.size() < 2) return {};
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<int> tokens;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    const Json event = Json::parse(events[i]);
    const Json& choice = event.at("choices").at(0);
    EXPECT_EQ(event.at("object"), "text_completion");
    EXPECT_EQ(choice.at("tokens").size(), 1u);
    tokens.push_back(choice.at("tokens").at(0).get<int>());
    const bool last = i + 2 == events.size();
    EXPECT_EQ(choice.at("finish_reason").is_null(), !last) << "event " << i << ": " << events[i];
    if (last && finish_reason) *finish_reason = choice.at("finish_reason").get<std::string>();
    if (text) *text += choice.at("text").get<std::string>();
  }
  return tokens;
}

TEST(Step07CompletionApi, SseDecoderReassemblesEventsCutAnywhere) {
  const std::string stream = "data: {\"a\": 1}\n\n: waiting\n\ndata: one\r\ndata: two\r\n\r\ndata: [DONE]\n\n";
  step07::SseDecoder decoder;
  std::vector<std::string> events;
  for (const char byte : stream)  // one byte per read: every cut there is
    for (std::string& data : decoder.feed(std::string_view(&byte, 1))) events.push_back(std::move(data));
  EXPECT_EQ(events, (std::vector<std::string>{"{\"a\": 1}", "one\ntwo", "[DONE]"}));
}

TEST(Step07CompletionApi, TextPiecesHoldBackAnUnfinishedCharacter) {
  const llm::Tokenizer bytes = llm::Tokenizer::byte_level(512);  // id 3 + b is the byte b
  step07::ServedModel model;
  model.tokenizer = &bytes;
  step07::TextPieces pieces(model, llm::Tokenizer::kBos);
  EXPECT_EQ(pieces.next(3 + 'a'), "a");
  EXPECT_EQ(pieces.next(3 + 0xC3), "");  // the first byte of "é" (C3 A9)...
  EXPECT_EQ(pieces.next(3 + 0xA9), "\xC3\xA9");  // ...comes out with its second
  EXPECT_EQ(pieces.next(3 + 0xE2), "");  // a 3-byte character cut short by the end
  EXPECT_EQ(pieces.next(llm::Tokenizer::kBos), "");  // the end token adds no text
  EXPECT_EQ(pieces.flush(), "\xE2");
}

class Step07Server : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    weights_ = std::make_unique<llm::ModelWeights>(llm::random_weights(llm::find_preset("tiny").config, 7));
    paged_model_ = step05::make_paged_model_on("cpu", *weights_);
    baseline_ = llm::make_model_on("cpu", *weights_);
  }
  static void TearDownTestSuite() {
    baseline_.reset();
    paged_model_.reset();
    weights_.reset();
  }

  void start(llm::Model& model, const std::string& name = "preset tiny", const llm::Tokenizer* tokenizer = nullptr) {
    server_ = std::make_unique<step07::CompletionServer>(model, name, tokenizer, small_server());
    server_->start();
  }
  void SetUp() override { start(*paged_model_); }
  void TearDown() override { server_->stop(); }
  // Restarts the server on `model`, which the fixture keeps: own_model_ is
  // declared before server_, so it outlives the server.
  void restart_with(std::unique_ptr<llm::Model> model, const std::string& name = "preset tiny",
                    const llm::Tokenizer* tokenizer = nullptr) {
    server_->stop();
    server_.reset();
    own_model_ = std::move(model);
    start(*own_model_, name, tokenizer);
  }

  httplib::Client client() const {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(std::chrono::seconds(10));
    return client;
  }
  httplib::Result complete(const std::string& body) const {
    return client().Post("/v1/completions", body, "application/json");
  }
  Json stats() const {
    const httplib::Result answer = client().Get("/v1/stats");
    EXPECT_TRUE(answer && answer->status == 200);
    return answer ? Json::parse(answer->body) : Json::object();
  }
  // The stats once `settled` holds for them, or after 5 s. The engine thread
  // publishes them after its iteration, a moment after the last answer left.
  Json stats_once(const std::function<bool(const Json&)>& settled) const {
    Json now = stats();
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!settled(now) && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      now = stats();
    }
    return now;
  }
  static bool idle(const Json& stats) {
    return stats.value("blocks_used", -1) == 0 && stats.value("running", -1) == 0 && stats.value("waiting", -1) == 0;
  }
  // The tokens the request generates alone, greedy, through a contiguous cache.
  static std::vector<int> solo(const std::vector<int>& prompt, int max_tokens) {
    step07::Request request;
    request.prompt = prompt;
    request.max_tokens = max_tokens;
    return step07::solo_outputs(*baseline_, {request}).front();
  }

  static std::unique_ptr<llm::ModelWeights> weights_;
  static std::unique_ptr<llm::Model> paged_model_;  // the engine's (paged attention kernels)
  static std::unique_ptr<llm::Model> baseline_;     // the solo reference's
  std::unique_ptr<llm::Model> own_model_;            // a test's own model, if it has one
  std::unique_ptr<llm::Tokenizer> own_tokenizer_;    // and its tokenizer
  std::unique_ptr<step07::CompletionServer> server_;
};
std::unique_ptr<llm::ModelWeights> Step07Server::weights_;
std::unique_ptr<llm::Model> Step07Server::paged_model_;
std::unique_ptr<llm::Model> Step07Server::baseline_;

TEST_F(Step07Server, WholeAndStreamedAnswersCarryTheSoloTokens) {
  const std::vector<int> prompt = {1, 45, 300, 7, 99, 12};
  const std::vector<int> expected = solo(prompt, 24);

  const httplib::Result whole = complete(completion_body(prompt, 24, false));
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  EXPECT_EQ(whole->get_header_value("Content-Type"), "application/json");
  const Json answer = Json::parse(whole->body);
  EXPECT_TRUE(answer.at("id").get<std::string>().starts_with("cmpl-"));
  EXPECT_EQ(answer.at("object"), "text_completion");
  EXPECT_EQ(answer.at("model"), "preset tiny");
  EXPECT_GT(answer.at("created").get<long long>(), 1'600'000'000);
  const Json& choice = answer.at("choices").at(0);
  EXPECT_EQ(choice.at("tokens").get<std::vector<int>>(), expected);
  const std::string finish = expected.back() == llm::Tokenizer::kBos ? "stop" : "length";
  EXPECT_EQ(choice.at("finish_reason"), finish);
  EXPECT_EQ(choice.at("text"), "");  // no tokenizer: no text
  EXPECT_EQ(answer.at("usage").at("prompt_tokens"), prompt.size());
  EXPECT_EQ(answer.at("usage").at("completion_tokens"), expected.size());
  EXPECT_EQ(answer.at("usage").at("total_tokens"), prompt.size() + expected.size());

  const httplib::Result streamed = complete(completion_body(prompt, 24, true));
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
  std::string streamed_finish;
  EXPECT_EQ(streamed_tokens(streamed->body, &streamed_finish), expected);
  EXPECT_EQ(streamed_finish, finish);
}

TEST_F(Step07Server, ConcurrentRequestsFinishWithTheirSoloTokens) {
  struct Case {
    std::vector<int> prompt;
    int max_tokens;
    bool stream;
    std::vector<int> expected;  // solo
    std::vector<int> got;
  };
  std::vector<Case> cases;  // more requests than slots (4): some wait for one
  for (int i = 0; i < 7; ++i) {
    std::vector<int> prompt = llm::testing::random_tokens(3 + 5 * i, weights_->config.vocab_size, 100 + i);
    prompt.front() = llm::Tokenizer::kBos;
    const int max_tokens = 10 + 7 * i;
    cases.push_back({prompt, max_tokens, i % 2 == 0, solo(prompt, max_tokens), {}});
  }
  std::vector<std::thread> clients;  // [cases] one connection each, all at once
  for (Case& c : cases) {
    clients.emplace_back([this, &c] {
      const httplib::Result answer = complete(completion_body(c.prompt, c.max_tokens, c.stream));
      if (!answer || answer->status != 200) return;
      c.got = c.stream ? streamed_tokens(answer->body)
                       : Json::parse(answer->body).at("choices").at(0).at("tokens").get<std::vector<int>>();
    });
  }
  for (std::thread& client : clients) client.join();
  for (std::size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(cases[i].got, cases[i].expected) << "request " << i;
  const Json now = stats_once([&](const Json& now) { return idle(now) && now.value("finished", 0u) == cases.size(); });
  EXPECT_TRUE(idle(now)) << now.dump();
  EXPECT_EQ(now.at("finished"), cases.size()) << now.dump();
}

TEST_F(Step07Server, BadRequestsGetTheir4xxAndAJsonError) {
  struct Case {
    std::string what;
    std::string method;
    std::string path;
    std::string body;
    int status;
    std::string message_part;
  };
  const std::vector<int> long_prompt(600, 5);  // the context is 512
  std::vector<int> too_long = long_prompt;
  too_long.front() = llm::Tokenizer::kBos;
  const std::vector<Case> cases = {
      {"malformed JSON", "POST", "/v1/completions", R"({"prompt": [1, 2)", 400, "not valid JSON"},
      {"not an object", "POST", "/v1/completions", "[1, 2, 3]", 400, "must be a JSON object"},
      {"unknown field", "POST", "/v1/completions", R"({"prompt": [1], "max_token": 5})", 400, "'max_token'"},
      {"wrong type", "POST", "/v1/completions", R"({"prompt": [1], "max_tokens": "5"})", 400, "integer"},
      {"max_tokens 0", "POST", "/v1/completions", R"({"prompt": [1], "max_tokens": 0})", 400, "at least 1"},
      {"max_tokens -3", "POST", "/v1/completions", R"({"prompt": [1], "max_tokens": -3})", 400, "(got -3)"},
      {"token id out of range", "POST", "/v1/completions", R"({"prompt": [1, 512]})", 400, "out of range [0, 512)"},
      {"negative token id", "POST", "/v1/completions", R"({"prompt": [1, -1]})", 400, "out of range"},
      {"no BOS", "POST", "/v1/completions", R"({"prompt": [5, 6]})", 400, "must start with BOS"},
      {"no prompt", "POST", "/v1/completions", R"({"max_tokens": 3})", 400, "prompt is missing"},
      {"top_p 0", "POST", "/v1/completions", R"({"prompt": [1], "top_p": 0})", 400, "top_p"},
      {"negative temperature", "POST", "/v1/completions", R"({"prompt": [1], "temperature": -0.5})", 400,
       "temperature"},
      {"negative seed", "POST", "/v1/completions", R"({"prompt": [1], "seed": -1})", 400, "seed"},
      {"stream not a bool", "POST", "/v1/completions", R"({"prompt": [1], "stream": 1})", 400, "stream"},
      {"a fractional token id", "POST", "/v1/completions", R"({"prompt": [1, 2.5]})", 400, "prompt[1] is 2.5"},
      {"nested prompt", "POST", "/v1/completions", R"({"prompt": [[1, 2]]})", 400, "not a token id"},
      {"null prompt", "POST", "/v1/completions", R"({"prompt": null})", 400, "a string or an array"},
      {"max_tokens past 64 bits", "POST", "/v1/completions",
       R"({"prompt": [1], "max_tokens": 100000000000000000000})", 400, "integer"},
      {"max_tokens past 32 bits", "POST", "/v1/completions", R"({"prompt": [1], "max_tokens": 9000000000})", 400,
       "the context is 512"},
      {"empty body", "POST", "/v1/completions", "", 400, "not valid JSON"},
      {"prompt beyond the context", "POST", "/v1/completions", completion_body(too_long, 1, false), 400,
       "prompt of 600 tokens + max_tokens 1 needs 600 positions; the context is 512"},
      {"output beyond the context", "POST", "/v1/completions", completion_body({1, 2, 3}, 511, false), 400,
       "prompt of 3 tokens + max_tokens 511 needs 513 positions; the context is 512"},
      {"text without a tokenizer", "POST", "/v1/completions", R"({"prompt": "Once upon a time"})", 400,
       "token ids"},
      {"unknown path", "GET", "/v2/everything", "", 404, "no route GET /v2/everything"},
      {"wrong method", "GET", "/v1/completions", "", 405, "use POST"},
  };
  for (const Case& c : cases) {
    httplib::Client http = client();
    const httplib::Result answer =
        c.method == "GET" ? http.Get(c.path.c_str()) : http.Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(answer) << c.what;
    EXPECT_EQ(answer->status, c.status) << c.what << ": " << answer->body;
    const Json error = Json::parse(answer->body, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(error.is_object() && error.contains("error")) << c.what << ": " << answer->body;
    EXPECT_EQ(error["error"].value("type", ""), "invalid_request_error") << c.what;
    EXPECT_TRUE(HasSubstr(error["error"].value("message", ""), c.message_part)) << c.what;
  }
  // None of it reached the engine, and the server still serves.
  const Json now = stats();
  EXPECT_EQ(now.at("running"), 0);
  EXPECT_EQ(now.at("finished"), 0);
  const httplib::Result answer = complete(completion_body({1, 2}, 3, false));
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 200);
  const httplib::Result health = client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(Json::parse(health->body), Json({{"status", "ok"}}));
}

// A raw socket: send a streaming request, read its first bytes, close.
void leave_mid_stream(int port, const std::string& body) {
  const int connection = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(connection, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(connection, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(connection, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string received;  // until the first event has come
  char buffer[4096];
  while (received.find("data: {") == std::string::npos) {
    const ssize_t n = ::recv(connection, buffer, sizeof(buffer), 0);
    ASSERT_GT(n, 0) << "the stream ended before its first event: " << received;
    received.append(buffer, static_cast<std::size_t>(n));
  }
  EXPECT_TRUE(HasSubstr(received, "HTTP/1.1 200"));
  ::close(connection);
}

TEST_F(Step07Server, ClientLeavingMidStreamFreesTheBlocks) {
  restart_with(std::make_unique<AlteredModel>(*paged_model_, AlteredModel::Alteration::Slow));
  // 500 tokens at 1 ms or more each: the stream outlives its client by far.
  const std::vector<int> prompt = {1, 45, 300, 7, 99, 12};
  leave_mid_stream(server_->port(), completion_body(prompt, 500, true));

  const Json now = stats_once([](const Json& now) { return idle(now) && now.value("cancelled", 0) == 1; });
  EXPECT_TRUE(idle(now)) << now.dump();
  EXPECT_EQ(now.at("cancelled"), 1) << now.dump();
  EXPECT_EQ(now.at("finished"), 0) << "the request ran to its end: the cancellation went untested";
}

TEST_F(Step07Server, StopAnswersTheOpenRequests) {
  restart_with(std::make_unique<AlteredModel>(*paged_model_, AlteredModel::Alteration::Slow));
  std::optional<httplib::Result> streamed, whole;  // two requests of 500 tokens: neither ends before the stop
  std::thread stream_client([&] { streamed = complete(completion_body({1, 45, 300, 7}, 500, true)); });
  std::thread whole_client([&] { whole = complete(completion_body({1, 45, 300, 8}, 500, false)); });
  const Json now = stats_once([](const Json& now) { return now.value("running", 0) == 2; });
  EXPECT_EQ(now.at("running"), 2) << now.dump();
  server_->stop();
  stream_client.join();
  whole_client.join();

  ASSERT_TRUE(whole && *whole);
  EXPECT_EQ((*whole)->status, 503) << (*whole)->body;
  EXPECT_TRUE(HasSubstr((*whole)->body, "shutting down"));
  ASSERT_TRUE(streamed && *streamed);
  const httplib::Response& stream = **streamed;
  EXPECT_EQ(stream.status, 200);  // the stream had started: the error is its last event
  EXPECT_TRUE(HasSubstr(stream.body, R"("type":"server_error")")) << stream.body;
  EXPECT_TRUE(stream.body.ends_with(step07::kDoneEvent)) << stream.body;
  // A request after the stop finds nobody listening.
  EXPECT_FALSE(complete(completion_body({1, 2}, 3, false)));
}

TEST_F(Step07Server, EngineErrorFailsTheRequestsNotTheServer) {
  restart_with(std::make_unique<AlteredModel>(*paged_model_, AlteredModel::Alteration::Broken));
  const httplib::Result whole = complete(completion_body({1, 2, 3}, 5, false));
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->status, 500);
  const Json error = Json::parse(whole->body).at("error");
  EXPECT_EQ(error.at("type"), "server_error");
  EXPECT_TRUE(HasSubstr(error.at("message").get<std::string>(), "fell off the bus"));

  const httplib::Result streamed = complete(completion_body({1, 2, 3}, 5, true));
  ASSERT_TRUE(streamed);
  EXPECT_TRUE(HasSubstr(streamed->body, "fell off the bus")) << streamed->body;
  EXPECT_TRUE(streamed->body.ends_with(step07::kDoneEvent)) << streamed->body;

  const Json now = stats_once([](const Json& now) { return now.value("failed", 0) == 2; });
  EXPECT_EQ(now.at("failed"), 2) << now.dump();
  EXPECT_TRUE(idle(now)) << now.dump();
}

TEST_F(Step07Server, LoadClientTimesEveryToken) {
  std::vector<step07::Request> workload;  // four requests 20 ms apart
  for (int i = 0; i < 4; ++i) {
    step07::Request request;
    request.id = i;
    request.prompt = llm::testing::random_tokens(4 + 3 * i, weights_->config.vocab_size, 200 + i);
    request.prompt.front() = llm::Tokenizer::kBos;
    request.max_tokens = 12 + 4 * i;
    request.arrival_ms = 20.0 * i;
    workload.push_back(request);
  }
  const step07::LoadResult load = step07::run_load("127.0.0.1", server_->port(), workload, {0, 10.0, true});
  EXPECT_EQ(load.sent, 4);
  EXPECT_EQ(load.failed, 0) << load.first_failure;
  EXPECT_EQ(load.unfinished, 0);
  ASSERT_EQ(load.records.size(), 4u);
  const auto expected = step07::solo_outputs(*baseline_, workload);
  for (const step07::RequestRecord& record : load.records) {
    EXPECT_EQ(record.generated, expected[static_cast<std::size_t>(record.id)]) << "request " << record.id;
    ASSERT_EQ(record.token_ms.size(), record.generated.size());
    EXPECT_GE(record.token_ms.front(), record.arrival_ms);
    EXPECT_TRUE(std::is_sorted(record.token_ms.begin(), record.token_ms.end()));
  }
  const step07::ServingMetrics metrics = step07::summarize_serving(load.records, {}, 4);
  EXPECT_EQ(metrics.requests, 4);
  EXPECT_GT(metrics.output_tokens_per_s, 0.0);
  EXPECT_GT(metrics.ttft_ms.p50, 0.0);

  // Bounded in requests.
  const step07::LoadResult two = step07::run_load("127.0.0.1", server_->port(), workload, {2, 10.0, false});
  EXPECT_EQ(two.sent, 2);
  EXPECT_EQ(two.records.size(), 2u);
}

TEST_F(Step07Server, LoadStopsAtItsDeadline) {
  restart_with(std::make_unique<AlteredModel>(*paged_model_, AlteredModel::Alteration::Slow));
  std::vector<step07::Request> workload(2);
  workload[0].prompt = {1, 45, 300, 7};
  workload[0].max_tokens = 500;  // half a second at least: still running at the deadline
  workload[1].id = 1;
  workload[1].prompt = {1, 2};
  workload[1].arrival_ms = 60'000.0;  // after the deadline: never sent
  const step07::LoadResult load = step07::run_load("127.0.0.1", server_->port(), workload, {0, 0.15, true});
  EXPECT_EQ(load.sent, 1);
  EXPECT_EQ(load.not_sent, 1);
  EXPECT_EQ(load.unfinished, 1);
  EXPECT_EQ(load.failed, 0) << load.first_failure;
  EXPECT_TRUE(load.records.empty());
  // The client's leaving cancelled the request on the server.
  const Json now = stats_once([](const Json& now) { return idle(now) && now.value("cancelled", 0) == 1; });
  EXPECT_EQ(now.at("cancelled"), 1) << now.dump();
}

TEST_F(Step07Server, TextPromptGetsTextOnStories260K) {
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  LLM_REQUIRE_MODEL_FILE(tokenizer_path, "tok512.bin");
  const llm::ModelWeights weights = llm::load_checkpoint(model_path);
  own_tokenizer_ = std::make_unique<llm::Tokenizer>(llm::Tokenizer::load(tokenizer_path, weights.config.vocab_size));
  const llm::Tokenizer& tokenizer = *own_tokenizer_;
  restart_with(step05::make_paged_model_on("cpu", weights), "stories260K.bin", &tokenizer);

  const std::string body = R"({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 40)";
  const httplib::Result whole = complete(body + "}");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const Json choice = Json::parse(whole->body).at("choices").at(0);
  const std::string text = choice.at("text").get<std::string>();
  EXPECT_GT(text.size(), 20u) << text;
  EXPECT_EQ(Json::parse(whole->body).at("model"), "stories260K.bin");
  const auto baseline = llm::make_model_on("cpu", weights);
  step07::Request request;
  request.prompt = tokenizer.encode("Once upon a time", true, false);
  request.max_tokens = 40;
  EXPECT_EQ(choice.at("tokens").get<std::vector<int>>(), step07::solo_outputs(*baseline, {request}).front());

  // The streamed pieces add up to the same text.
  const httplib::Result streamed = complete(body + R"(, "stream": true})");
  ASSERT_TRUE(streamed);
  std::string streamed_text;
  streamed_tokens(streamed->body, nullptr, &streamed_text);
  EXPECT_EQ(streamed_text, text);
}

// ---------------------------------------------------------------------------
// The OpenAI API as its clients use it, on stories260K and its tokenizer
// (text in, text out; the tests skip without the model files).

class Step07OpenAiApi : public Step07Server {
 protected:
  void SetUp() override {
    LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
    LLM_REQUIRE_MODEL_FILE(tokenizer_path, "tok512.bin");
    stories_ = std::make_unique<llm::ModelWeights>(llm::load_checkpoint(model_path));
    own_tokenizer_ = std::make_unique<llm::Tokenizer>(llm::Tokenizer::load(tokenizer_path, stories_->config.vocab_size));
    stories_paged_ = step05::make_paged_model_on("cpu", *stories_);
    stories_solo_ = llm::make_model_on("cpu", *stories_);
    start(*stories_paged_, "stories260K.bin", own_tokenizer_.get());
  }
  // The server and a slowed model refer to the members below, which go
  // before the base's: both go first.
  void TearDown() override {
    if (server_) server_->stop();
    server_.reset();
    own_model_.reset();
  }
  // The server again, on stories260K slowed down (streams outlive their clients).
  void restart_slow() {
    restart_with(std::make_unique<AlteredModel>(*stories_paged_, AlteredModel::Alteration::Slow), "stories260K.bin",
                 own_tokenizer_.get());
  }
  httplib::Result post(const std::string& path, const Json& body) const {
    return client().Post(path.c_str(), body.dump(), "application/json");
  }
  // A 200's body as JSON (a failure names the status and the body).
  static Json ok_json(const httplib::Result& answer) {
    EXPECT_TRUE(answer);
    if (!answer) return Json::object();
    EXPECT_EQ(answer->status, 200) << answer->body;
    return Json::parse(answer->body, nullptr, /*allow_exceptions=*/false);
  }
  // The data of a stream's events, [DONE] checked and dropped.
  static std::vector<Json> chunks(const httplib::Result& answer) {
    std::vector<Json> parsed;
    EXPECT_TRUE(answer && answer->status == 200) << (answer ? answer->body : "no answer");
    if (!answer) return parsed;
    step07::SseDecoder decoder;
    std::vector<std::string> events = decoder.feed(answer->body);
    EXPECT_FALSE(events.empty());
    if (events.empty()) return parsed;
    EXPECT_EQ(events.back(), "[DONE]");
    events.pop_back();
    for (const std::string& event : events) parsed.push_back(Json::parse(event));
    return parsed;
  }
  // The tokens a text prompt generates alone, greedy.
  std::vector<int> solo_text(const std::string& text, int max_tokens) const {
    step07::Request request;
    request.prompt = own_tokenizer_->encode(text, true, false);
    request.max_tokens = max_tokens;
    return step07::solo_outputs(*stories_solo_, {request}).front();
  }
  void expect_idle_after(long long finished_samples) const {
    const Json now =
        stats_once([&](const Json& now) { return idle(now) && now.value("finished", 0LL) == finished_samples; });
    EXPECT_TRUE(idle(now)) << now.dump();
    EXPECT_EQ(now.value("finished", 0LL), finished_samples) << now.dump();
  }

  std::unique_ptr<llm::ModelWeights> stories_;
  std::unique_ptr<llm::Model> stories_paged_;  // the server's
  std::unique_ptr<llm::Model> stories_solo_;   // the solo reference's
};

TEST_F(Step07OpenAiApi, ModelsListsTheServedModel) {
  const Json models = ok_json(client().Get("/v1/models"));
  EXPECT_EQ(models.at("object"), "list");
  ASSERT_EQ(models.at("data").size(), 1u);
  const Json& model = models.at("data").at(0);
  EXPECT_EQ(model.at("id"), "stories260K.bin");
  EXPECT_EQ(model.at("object"), "model");
  EXPECT_GT(model.at("created").get<long long>(), 1'600'000'000);
  EXPECT_TRUE(model.at("owned_by").is_string());
}

// The chat template of a base model is the plain text: one user message
// gets the tokens that its text gets as a completion prompt.
TEST_F(Step07OpenAiApi, ChatAnswersWhatTheCompletionOfItsTemplateAnswers) {
  const std::vector<int> expected = solo_text("Once upon a time", 20);
  const Json chat = ok_json(post("/v1/chat/completions",
                                 {{"model", "stories260K"},
                                  {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                                  {"max_tokens", 20}}));
  EXPECT_TRUE(chat.at("id").get<std::string>().starts_with("chatcmpl-"));
  EXPECT_EQ(chat.at("object"), "chat.completion");
  const Json& choice = chat.at("choices").at(0);
  EXPECT_EQ(choice.at("message").at("role"), "assistant");
  EXPECT_EQ(choice.at("tokens").get<std::vector<int>>(), expected);
  const Json completion = ok_json(post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 20}}));
  EXPECT_EQ(choice.at("message").at("content"), completion.at("choices").at(0).at("text"));
  EXPECT_EQ(chat.at("usage"), completion.at("usage"));

  // Streamed: the role first, then deltas that add up to the same content.
  const std::vector<Json> stream = chunks(post("/v1/chat/completions",
                                               {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                                                {"max_tokens", 20},
                                                {"stream", true}}));
  ASSERT_FALSE(stream.empty());
  EXPECT_EQ(stream.front().at("object"), "chat.completion.chunk");
  EXPECT_EQ(stream.front().at("choices").at(0).at("delta").at("role"), "assistant");
  std::string content;
  std::vector<int> tokens;
  for (const Json& chunk : stream) {
    const Json& delta = chunk.at("choices").at(0).at("delta");
    content += delta.value("content", "");
    for (const Json& token : chunk.at("choices").at(0).at("tokens")) tokens.push_back(token.get<int>());
  }
  EXPECT_EQ(content, choice.at("message").at("content"));
  EXPECT_EQ(tokens, expected);
  EXPECT_FALSE(stream.back().at("choices").at(0).at("finish_reason").is_null());
  expect_idle_after(3);
}

// n choices of one prompt: choice j is what seed + j draws alone, the same
// on a second run, and every sample's blocks come back.
TEST_F(Step07OpenAiApi, NChoicesAreTheSeedsSamplesAndCostOnePrefill) {
  const Json body = {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0.9},
                     {"seed", 40},                   {"n", 4}};
  const Json four = ok_json(post("/v1/completions", body));
  ASSERT_EQ(four.at("choices").size(), 4u);
  EXPECT_EQ(four.at("choices"), ok_json(post("/v1/completions", body)).at("choices"))
      << "the same seeded request drew other tokens";
  int completion_tokens = 0;
  std::set<std::vector<int>> distinct;
  for (int j = 0; j < 4; ++j) {
    const Json& choice = four.at("choices").at(static_cast<std::size_t>(j));
    EXPECT_EQ(choice.at("index"), j);
    Json alone_body = body;
    alone_body["n"] = 1;
    alone_body["seed"] = 40 + j;
    const Json alone = ok_json(post("/v1/completions", alone_body));
    EXPECT_EQ(choice.at("tokens"), alone.at("choices").at(0).at("tokens")) << "choice " << j;
    EXPECT_EQ(choice.at("text"), alone.at("choices").at(0).at("text")) << "choice " << j;
    completion_tokens += static_cast<int>(choice.at("tokens").size());
    distinct.insert(choice.at("tokens").get<std::vector<int>>());
  }
  EXPECT_GT(distinct.size(), 1u) << "four samples at temperature 0.9 drew the same tokens";
  EXPECT_EQ(four.at("usage").at("completion_tokens"), completion_tokens);
  EXPECT_EQ(four.at("usage").at("prompt_tokens"), own_tokenizer_->encode("Once upon a time", true, false).size());

  // Streamed: every choice's chunks, in any interleaving, add up to the whole answer's.
  Json streamed_body = body;
  streamed_body["stream"] = true;
  std::map<int, std::vector<int>> streamed_tokens_of;  // choice -> its tokens
  std::map<int, std::string> finish_of;
  for (const Json& chunk : chunks(post("/v1/completions", streamed_body))) {
    const Json& choice = chunk.at("choices").at(0);
    for (const Json& token : choice.at("tokens")) streamed_tokens_of[choice.at("index").get<int>()].push_back(token);
    if (!choice.at("finish_reason").is_null()) finish_of[choice.at("index").get<int>()] = choice.at("finish_reason");
  }
  ASSERT_EQ(streamed_tokens_of.size(), 4u);
  EXPECT_EQ(finish_of.size(), 4u) << "a choice without its last chunk";
  for (int j = 0; j < 4; ++j)
    EXPECT_EQ(streamed_tokens_of[j], four.at("choices").at(static_cast<std::size_t>(j)).at("tokens").get<std::vector<int>>());
  expect_idle_after(4 + 4 + 4 + 4);
}

// A stop string cuts the text before it, finishes the choice with "stop",
// and ends the sample in the engine (its blocks come back at once).
TEST_F(Step07OpenAiApi, StopStringsCutTheTextAndEndTheSample) {
  const Json free = ok_json(post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 40}}));
  const std::string text = free.at("choices").at(0).at("text");
  ASSERT_GT(text.size(), 12u) << text;
  const std::string stop = text.substr(6, 3);  // a piece of the greedy text
  const std::string before = text.substr(0, text.find(stop));
  for (const bool stream : {false, true}) {
    const httplib::Result answer = post(
        "/v1/completions",
        {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"stop", {"never there", stop}}, {"stream", stream}});
    std::string got;
    std::string finish;
    if (stream) {
      for (const Json& chunk : chunks(answer)) {
        got += chunk.at("choices").at(0).at("text").get<std::string>();
        if (!chunk.at("choices").at(0).at("finish_reason").is_null())
          finish = chunk.at("choices").at(0).at("finish_reason");
      }
    } else {
      const Json whole = ok_json(answer);
      got = whole.at("choices").at(0).at("text");
      finish = whole.at("choices").at(0).at("finish_reason");
      EXPECT_LT(whole.at("usage").at("completion_tokens").get<int>(), 40);
    }
    EXPECT_EQ(got, before) << "stream " << stream << ", stop '" << stop << "'";
    EXPECT_EQ(finish, "stop") << "stream " << stream;
  }
  // The stopped samples finished as "stop" in the engine, not as cancelled.
  const Json now = stats_once([](const Json& now) { return idle(now) && now.value("finished", 0) == 3; });
  EXPECT_TRUE(idle(now)) << now.dump();
  EXPECT_EQ(now.at("finished"), 3) << now.dump();
  EXPECT_EQ(now.at("cancelled"), 0) << now.dump();
}

// logprobs at temperature 0: the sampled token is the most likely one.
TEST_F(Step07OpenAiApi, LogprobsReportTheSampledDistribution) {
  const Json completion =
      ok_json(post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"logprobs", 2}}));
  const Json& logprobs = completion.at("choices").at(0).at("logprobs");
  ASSERT_EQ(logprobs.at("token_logprobs").size(), 8u) << logprobs.dump();
  for (std::size_t i = 0; i < 8; ++i) {
    const float logprob = logprobs.at("token_logprobs").at(i);
    EXPECT_LE(logprob, 0.0f);
    const Json& top = logprobs.at("top_logprobs").at(i);
    ASSERT_GE(top.size(), 1u);  // two alternatives, fewer where two decode to the same text
    float best = -1e30f;
    for (const auto& [text, value] : top.items()) best = std::max(best, value.get<float>());
    EXPECT_FLOAT_EQ(logprob, best) << "token " << i << " was not the most likely at temperature 0";
  }
  const Json chat = ok_json(post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                                          {"max_tokens", 5},
                                                          {"logprobs", true},
                                                          {"top_logprobs", 2}}));
  const Json& content = chat.at("choices").at(0).at("logprobs").at("content");
  ASSERT_EQ(content.size(), 5u);
  for (const Json& entry : content) {
    EXPECT_LE(entry.at("logprob").get<float>(), 0.0f);
    EXPECT_TRUE(entry.at("bytes").is_array());
    EXPECT_EQ(entry.at("top_logprobs").size(), 2u);
  }
  const Json plain = ok_json(post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}}));
  EXPECT_TRUE(plain.at("choices").at(0).at("logprobs").is_null());
}

// stream_options.include_usage: "usage": null in every chunk, then a last
// chunk with no choices and the usage.
TEST_F(Step07OpenAiApi, AStreamEndsWithItsUsageWhenAsked) {
  const std::vector<Json> stream =
      chunks(post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"n", 2},
                                      {"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  ASSERT_GE(stream.size(), 2u);
  for (std::size_t i = 0; i + 1 < stream.size(); ++i) EXPECT_TRUE(stream[i].at("usage").is_null()) << stream[i];
  const Json& last = stream.back();
  EXPECT_TRUE(last.at("choices").empty()) << last;
  EXPECT_EQ(last.at("usage").at("completion_tokens"), 12);
  EXPECT_EQ(last.at("usage").at("total_tokens"), last.at("usage").at("prompt_tokens").get<int>() + 12);
}

// OpenAI's error shape for every 4xx, with the field at fault; input too
// large for the context is refused before any tokenizing.
TEST_F(Step07OpenAiApi, ErrorsHaveOpenAisShapeAndOverlongInputIsRefusedAtOnce) {
  const httplib::Result negative = post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", -5}});
  ASSERT_TRUE(negative);
  EXPECT_EQ(negative->status, 400);
  const Json error = Json::parse(negative->body).at("error");
  EXPECT_EQ(error.at("param"), "max_tokens");
  EXPECT_TRUE(error.contains("code"));
  EXPECT_EQ(error.at("type"), "invalid_request_error");

  const httplib::Result too_many = post("/v1/completions", {{"prompt", "Once"}, {"n", 5}});  // small_server(): 4 slots
  ASSERT_TRUE(too_many);
  EXPECT_EQ(too_many->status, 400) << too_many->body;
  EXPECT_EQ(Json::parse(too_many->body).at("error").at("param"), "n");

  // Refused by the bound on bytes per token, before any tokenizing (the message says "bytes").
  const httplib::Result megabyte = post("/v1/chat/completions",
                                        {{"messages", {{{"role", "user"}, {"content", std::string(1'000'000, 'x')}}}}});
  ASSERT_TRUE(megabyte);
  EXPECT_EQ(megabyte->status, 400) << megabyte->body.substr(0, 300);
  const Json megabyte_error = Json::parse(megabyte->body).at("error");
  EXPECT_EQ(megabyte_error.at("code"), "context_length_exceeded");
  EXPECT_TRUE(HasSubstr(megabyte_error.at("message").get<std::string>(), "a prompt of 1000000 bytes is at least"))
      << megabyte_error;

  const httplib::Result huge = client().Post("/v1/completions", std::string(2 << 20, ' '), "application/json");
  ASSERT_TRUE(huge);
  EXPECT_EQ(huge->status, 413);
  EXPECT_TRUE(Json::parse(huge->body).at("error").at("message").is_string()) << huge->body;

  const httplib::Result wrong_method = client().Get("/v1/chat/completions");
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->status, 405);
  EXPECT_EQ(wrong_method->get_header_value("Allow"), "POST");
  const Json now = stats();
  EXPECT_EQ(now.at("finished"), 0) << "a bad request reached the engine";
}

// A client that leaves a stream of n = 3 cancels every sample.
TEST_F(Step07OpenAiApi, LeavingAStreamOfNChoicesFreesEveryBlock) {
  restart_slow();
  leave_mid_stream(server_->port(), Json{{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"n", 3},
                                         {"stream", true}}.dump());
  const Json now = stats_once([](const Json& now) { return idle(now) && now.value("cancelled", 0) == 3; });
  EXPECT_TRUE(idle(now)) << now.dump();
  EXPECT_EQ(now.at("cancelled"), 3) << now.dump();
}

}  // namespace
