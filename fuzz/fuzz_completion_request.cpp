// Fuzz target: step 07's OpenAI-compatible request parsing
// (step07_batching/serve/completion_api.hpp) on arbitrary bytes, read as the
// body of POST /v1/completions and of POST /v1/chat/completions, for the tiny
// preset as the server serves it (vocabulary and context 512, 4 choices, the
// built-in byte-level tokenizer). Checks:
//   - a refusal is a 400 with a message, whose error_json parses back with
//     the same param and code;
//   - an accepted request keeps every promise of CompletionRequest: a prompt
//     of ids in the vocabulary, BOS first, that fits the context with
//     max_tokens; n in 1..4; at most 4 non-empty stop strings; logprobs in
//     the endpoint's range; include_usage only when streaming;
//   - the load client's body for it (completion_request_json) parses back
//     into the same request;
//   - then it is answered as the server would, with its own prompt's tokens
//     standing for the generated ones: the ChoiceAssembler makes each
//     choice's deltas (the text never containing a stop string, a prefix of
//     the decoded tokens cut just before a stop string when one matched,
//     text_offset where the text so far ends, the usage adding up); every
//     chunk, the usage event and the whole answer are JSON that parses back
//     (valid UTF-8 whatever the bytes), and an SseDecoder reads back every
//     event.
// Any exception escaping, a crash or undefined behaviour is a finding too.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "llm/config.hpp"
#include "llm/tokenizer.hpp"
#include "step07_batching/request.hpp"
#include "step07_batching/serve/choice_assembler.hpp"
#include "step07_batching/serve/completion_api.hpp"

namespace {

using Json = nlohmann::json;

void check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "fuzz_completion_request: %s\n", what);
  std::abort();
}

const llm::Tokenizer& byte_tokenizer() {
  static const llm::Tokenizer tokenizer = llm::Tokenizer::byte_level(512);
  return tokenizer;
}

const step07::ServedModel& served() {
  static const step07::ServedModel model = [] {
    llm::ModelConfig config;
    config.vocab_size = 512;
    config.seq_len = 512;
    return step07::make_served_model(config, "preset tiny", &byte_tokenizer(), /*max_choices=*/4,
                                     /*created_s=*/1700000000);
  }();
  return model;
}

// The JSON `text` holds; aborts when it is not JSON (invalid UTF-8 included).
Json parsed_json(std::string_view text, const char* what) {
  Json json = Json::parse(text, /*callback=*/nullptr, /*allow_exceptions=*/false);
  check(!json.is_discarded(), what);
  return json;
}

void check_refusal(const step07::ApiError& error) {
  check(error.status == 400 && !error.message.empty(), "a refusal that is not a 400 with a message");
  const Json json = parsed_json(step07::error_json(error), "error_json is not JSON");
  const Json& body = json.at("error");
  check(body.at("param") == (error.param.empty() ? Json(nullptr) : Json(error.param)), "error_json's param");
  check(body.at("code") == (error.code.empty() ? Json(nullptr) : Json(error.code)), "error_json's code");
}

void check_request(const step07::CompletionRequest& request, step07::Endpoint endpoint) {
  const step07::ServedModel& model = served();
  check(request.endpoint == endpoint, "the request's endpoint");
  check(!request.prompt.empty() && request.prompt.front() == llm::Tokenizer::kBos, "a prompt without BOS first");
  check(std::ranges::all_of(request.prompt, [&](int id) { return id >= 0 && id < model.vocab_size; }),
        "a prompt id outside the vocabulary");
  check(request.max_tokens >= 1, "max_tokens below 1");
  check(static_cast<long long>(request.prompt.size()) + request.max_tokens - 1 <= model.context_length,
        "a request beyond the context");
  check(request.n >= 1 && request.n <= model.max_choices, "n outside 1..max_choices");
  check(request.stop.size() <= 4 &&
            std::ranges::none_of(request.stop, [](const std::string& stop) { return stop.empty(); }),
        "bad stop strings");
  const int most_logprobs = endpoint == step07::Endpoint::Completions ? 5 : 20;
  check(request.top_logprobs >= -1 && request.top_logprobs <= most_logprobs, "top_logprobs out of range");
  check(request.sampling.temperature >= 0.0f && request.sampling.top_p > 0.0f && request.sampling.top_p <= 1.0f,
        "sampling parameters out of range");
  check(request.stream || !request.include_usage, "include_usage without stream");
}

// The load client's body for the request reads back as the same request.
void check_round_trip(const step07::CompletionRequest& request) {
  if (request.top_logprobs > 5) return;  // chat's top_logprobs up to 20; completions' logprobs stops at 5
  step07::Request engine_request;
  engine_request.prompt = request.prompt;
  engine_request.max_tokens = request.max_tokens;
  engine_request.sampling = request.sampling;
  engine_request.n = request.n;
  engine_request.top_logprobs = request.top_logprobs;
  const step07::ParsedCompletion again =
      step07::parse_completion_request(step07::completion_request_json(engine_request, request.stream), served());
  const auto* read = std::get_if<step07::CompletionRequest>(&again);
  check(read != nullptr, "the load client's body for an accepted request is refused");
  check(read->prompt == request.prompt && read->max_tokens == request.max_tokens && read->n == request.n &&
            read->top_logprobs == request.top_logprobs && read->stream == request.stream &&
            read->sampling.temperature == request.sampling.temperature &&
            read->sampling.top_p == request.sampling.top_p && read->sampling.seed == request.sampling.seed,
        "the load client's body reads back as another request");
}

// Answers the request as the server would (ChoiceAssembler, then the
// writers), its prompt's first tokens standing for what each choice
// generates, the choices' tokens interleaved as the engine delivers them.
void answer(const step07::CompletionRequest& request) {
  const step07::ServedModel& model = served();
  const step07::CompletionId id{request.endpoint, 1, 1700000001};
  const bool with_logprobs = request.top_logprobs >= 0;
  // Tokens each choice "generates": at most 64, so that a long prompt stays quick.
  const std::vector<int> generated(request.prompt.begin(),
                                   request.prompt.begin() + std::min<std::ptrdiff_t>(request.prompt.size(), 64));
  const auto n = static_cast<std::size_t>(request.n);
  step07::ChoiceAssembler assembler(model, request);
  std::string stream;  // every event written, as a client receives them
  int events = 0;
  std::vector<step07::ChoiceDelta> whole(n);  // [n] each choice's whole answer
  std::vector<std::string> decoded(n);        // [n] each choice's text as if no stop string cut it
  std::vector<step07::TextPieces> pieces(n, step07::TextPieces(model, request.prompt.back()));
  for (std::size_t i = 0; i < generated.size(); ++i) {
    const int token = generated[i];
    const bool last = i + 1 == generated.size();
    for (std::size_t choice = 0; choice < n; ++choice) {
      decoded[choice] += pieces[choice].next(token);
      if (last) decoded[choice] += pieces[choice].flush();
      std::optional<step07::TokenLogprobs> logprobs;
      if (with_logprobs) {
        // Made-up log-probabilities; the alternatives are the next tokens of the prompt.
        logprobs.emplace();
        logprobs->logprob = -0.5f * static_cast<float>(i % 7);
        for (int k = 0; k < request.top_logprobs; ++k)
          logprobs->top.emplace_back(request.prompt[(i + 1 + static_cast<std::size_t>(k)) % request.prompt.size()],
                                     -static_cast<float>(k));
      }
      const auto added = assembler.add(static_cast<int>(choice), token,
                                       last ? step07::FinishReason::Length : step07::FinishReason::None, logprobs);
      if (!added) continue;  // the choice ended at a stop string
      const step07::ChoiceDelta& delta = added->delta;
      check(delta.index == static_cast<int>(choice) && delta.tokens == std::vector<int>{token}, "a delta's choice");
      check(delta.text_offset == whole[choice].text.size(), "a delta's text_offset");
      check(delta.logprobs.size() == (with_logprobs ? 1u : 0u), "a delta's logprobs");
      whole[choice].index = delta.index;
      whole[choice].append(delta);
      const std::string event = step07::chunk_event(model, id, delta, with_logprobs, request.include_usage);
      const Json chunk = parsed_json(std::string_view(event).substr(6), "a chunk is not JSON");
      check(chunk.at("choices").size() == 1, "a chunk without its one choice");
      stream += event;
      ++events;
    }
  }
  check(assembler.all_ended(), "a choice without its end");
  int completion_tokens = 0;
  for (std::size_t choice = 0; choice < n; ++choice) {
    const step07::ChoiceDelta& all = whole[choice];
    completion_tokens += static_cast<int>(all.tokens.size());
    // The text sent is the decoded text up to the first stop string, which it never contains.
    check(decoded[choice].starts_with(all.text), "the text sent is not the decoded text");
    for (const std::string& stop : request.stop) check(all.text.find(stop) == std::string::npos, "a stop string sent");
    if (all.finish == step07::FinishReason::Stop)
      check(std::ranges::any_of(request.stop, [&](const std::string& stop) {
              return std::string_view(decoded[choice]).substr(all.text.size()).starts_with(stop);
            }),
            "a stop without its stop string");
  }
  const step07::Usage usage = assembler.usage();
  check(usage.prompt_tokens == static_cast<int>(request.prompt.size()) && usage.completion_tokens == completion_tokens,
        "the usage");
  if (request.include_usage) {
    stream += step07::usage_event(model, id, usage);
    ++events;
  }
  stream += step07::kDoneEvent;
  step07::SseDecoder decoder;
  check(static_cast<int>(decoder.feed(stream).size()) == events + 1, "the stream's events do not read back");
  const Json json = parsed_json(step07::completion_json(model, id, whole, usage, with_logprobs),
                                "the whole answer is not JSON");
  check(json.at("choices").size() == whole.size(), "the whole answer's choices");
}

void run(std::string_view body, step07::Endpoint endpoint) {
  const step07::ParsedCompletion parsed = endpoint == step07::Endpoint::Completions
                                              ? step07::parse_completion_request(body, served())
                                              : step07::parse_chat_request(body, served());
  if (const auto* error = std::get_if<step07::ApiError>(&parsed)) {
    check_refusal(*error);
    return;
  }
  const auto& request = std::get<step07::CompletionRequest>(parsed);
  check_request(request, endpoint);
  check_round_trip(request);
  answer(request);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)served();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  run(body, step07::Endpoint::Completions);
  run(body, step07::Endpoint::ChatCompletions);
  return 0;
}
