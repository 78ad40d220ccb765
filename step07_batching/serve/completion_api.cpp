#include "step07_batching/serve/completion_api.hpp"

#include <fmt/format.h>

#include <pthread.h>

#include <array>
#include <climits>
#include <csignal>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

namespace step07 {
namespace {

using Json = nlohmann::json;

ApiError bad_request(std::string message) { return {400, std::move(message)}; }

// Dumps JSON for the wire. A piece cut inside a UTF-8 character is held back
// by TextPieces, but a completion can still end inside one (max_tokens
// reached mid-character): such bytes become U+FFFD instead of an exception.
std::string wire(const Json& json) { return json.dump(-1, ' ', false, Json::error_handler_t::replace); }

// An integer field's value, or nullopt for a non-integer. JSON integers past
// the int64 range (nlohmann keeps them unsigned) saturate: they are rejected
// by the range checks that follow anyway.
std::optional<long long> integer_of(const Json& value) {
  if (value.is_number_unsigned())
    return static_cast<long long>(std::min<std::uint64_t>(value.get<std::uint64_t>(), LLONG_MAX));
  if (value.is_number_integer()) return value.get<std::int64_t>();
  return std::nullopt;
}

// A request's fields as they are read: the prompt is checked against the
// context only once max_tokens is known, whatever the fields' order.
struct FieldsRead {
  CompletionRequest request;
  bool has_prompt = false;
};

// Reads one field into `read`; an error when its value is unusable.
using FieldReader = std::optional<ApiError> (*)(const Json& value, const ServedModel& model, FieldsRead& read);

std::optional<ApiError> read_token_ids(const Json& ids, const ServedModel& model, std::vector<int>& prompt) {
  if (ids.empty()) return bad_request("prompt is an empty array: send at least the BOS token (1)");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::optional<long long> id = integer_of(ids[i]);
    if (!id) return bad_request(fmt::format("prompt[{}] is {}, not a token id (an integer)", i, ids[i].dump()));
    if (*id < 0 || *id >= model.vocab_size)
      return bad_request(fmt::format("prompt[{}] = {} is out of range [0, {})", i, *id, model.vocab_size));
    prompt.push_back(static_cast<int>(*id));
  }
  if (prompt.front() != llm::Tokenizer::kBos)
    return bad_request(fmt::format("a prompt of token ids must start with BOS ({}); it starts with {}",
                                   llm::Tokenizer::kBos, prompt.front()));
  return std::nullopt;
}

std::optional<ApiError> read_prompt(const Json& value, const ServedModel& model, FieldsRead& read) {
  read.has_prompt = true;
  if (value.is_string()) {
    if (!model.has_tokenizer())
      return bad_request("this model has no tokenizer: send the prompt as an array of token ids, BOS (1) first");
    read.request.prompt = model.tokenizer->encode(value.get<std::string>(), /*add_bos=*/true, /*add_eos=*/false);
    return std::nullopt;
  }
  if (value.is_array()) return read_token_ids(value, model, read.request.prompt);
  return bad_request("prompt must be a string or an array of token ids");
}

std::optional<ApiError> read_max_tokens(const Json& value, const ServedModel&, FieldsRead& read) {
  const std::optional<long long> max_tokens = integer_of(value);
  if (!max_tokens) return bad_request(fmt::format("max_tokens must be an integer (got {})", value.dump()));
  if (*max_tokens < 1) return bad_request(fmt::format("max_tokens must be at least 1 (got {})", *max_tokens));
  // Past INT_MAX the context check rejects it anyway; clamping keeps it an int.
  read.request.max_tokens = static_cast<int>(std::min<long long>(*max_tokens, INT_MAX));
  return std::nullopt;
}

std::optional<ApiError> read_temperature(const Json& value, const ServedModel&, FieldsRead& read) {
  if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0.0)
    return bad_request(fmt::format("temperature must be a number >= 0 (0: greedy); got {}", value.dump()));
  read.request.sampling.temperature = value.get<float>();
  return std::nullopt;
}

std::optional<ApiError> read_top_p(const Json& value, const ServedModel&, FieldsRead& read) {
  if (!value.is_number() || !(value.get<double>() > 0.0 && value.get<double>() <= 1.0))
    return bad_request(fmt::format("top_p must be a number in (0, 1]; got {}", value.dump()));
  read.request.sampling.top_p = value.get<float>();
  return std::nullopt;
}

std::optional<ApiError> read_seed(const Json& value, const ServedModel&, FieldsRead& read) {
  if (!value.is_number_unsigned())
    return bad_request(fmt::format("seed must be an unsigned integer; got {}", value.dump()));
  read.request.sampling.seed = value.get<std::uint64_t>();
  return std::nullopt;
}

std::optional<ApiError> read_stream(const Json& value, const ServedModel&, FieldsRead& read) {
  if (!value.is_boolean()) return bad_request(fmt::format("stream must be true or false; got {}", value.dump()));
  read.request.stream = value.get<bool>();
  return std::nullopt;
}

// Clients name a model in every request; one server serves one, so the name only has to be a string.
std::optional<ApiError> read_model(const Json& value, const ServedModel&, FieldsRead&) {
  if (!value.is_string()) return bad_request(fmt::format("model must be a string; got {}", value.dump()));
  return std::nullopt;
}

struct Field {
  std::string_view name;
  FieldReader read;
};
constexpr std::array<Field, 7> kFields = {{
    {"prompt", read_prompt},
    {"max_tokens", read_max_tokens},
    {"temperature", read_temperature},
    {"top_p", read_top_p},
    {"seed", read_seed},
    {"stream", read_stream},
    {"model", read_model},
}};

std::optional<ApiError> read_field(const std::string& name, const Json& value, const ServedModel& model,
                                   FieldsRead& read) {
  for (const Field& field : kFields)
    if (field.name == name) return field.read(value, model, read);
  return bad_request(fmt::format(
      "unknown field '{}' (this server reads prompt, max_tokens, temperature, top_p, seed, stream and model)", name));
}

// The engine's own rule: the first token comes out of the prefill, so the
// sequence holds prompt + max_tokens - 1 positions at its end.
std::optional<ApiError> check_context(const CompletionRequest& request, const ServedModel& model) {
  const long long positions = static_cast<long long>(request.prompt.size()) + request.max_tokens - 1;
  if (positions <= model.context_length) return std::nullopt;
  return bad_request(fmt::format("prompt of {} tokens + max_tokens {} needs {} positions; the context is {}",
                                 request.prompt.size(), request.max_tokens, positions, model.context_length));
}

// How many bytes a UTF-8 character starting with `lead` has (1 for a byte
// that cannot start one: it is passed on as it is).
std::size_t utf8_length(unsigned char lead) {
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Where an unfinished UTF-8 character at the end of `text` starts (text.size() when there is none).
std::size_t unfinished_character_start(const std::string& text) {
  const std::size_t lookback = std::min<std::size_t>(text.size(), 3);  // an unfinished character has 3 bytes at most
  for (std::size_t back = 1; back <= lookback; ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: the lead is further back
    return utf8_length(byte) > back ? text.size() - back : text.size();
  }
  return text.size();
}

// Server-sent events: lines end in "\n" (this server) or "\r\n" (others), an
// event ends at a blank line. Returns the index just past the blank line
// that ends the event starting at `start`, npos when it has not arrived yet.
std::size_t end_of_event(std::string_view text, std::size_t start) {
  for (std::size_t line_start = start;;) {
    const std::size_t line_end = text.find('\n', line_start);
    if (line_end == std::string_view::npos) return std::string_view::npos;
    const std::string_view line = text.substr(line_start, line_end - line_start);
    if (line.empty() || line == "\r") return line_end + 1;
    line_start = line_end + 1;
  }
}

// The data of one event (its "data:" lines joined by newlines); nullopt for
// an event without any (a comment, as kKeepAliveEvent).
std::optional<std::string> event_data(std::string_view event) {
  std::optional<std::string> data;
  for (std::size_t line_start = 0, line_end; (line_end = event.find('\n', line_start)) != std::string_view::npos;
       line_start = line_end + 1) {
    std::string_view line = event.substr(line_start, line_end - line_start);
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (!line.starts_with("data:")) continue;  // comments and the fields other than data
    line.remove_prefix(5);
    if (line.starts_with(' ')) line.remove_prefix(1);
    if (data)
      *data += '\n';
    else
      data.emplace();
    data->append(line);
  }
  return data;
}

Json choice_json(std::string text, std::vector<int> tokens, FinishReason finish) {
  return {{"index", 0},
          {"text", std::move(text)},
          {"tokens", std::move(tokens)},
          {"finish_reason", finish == FinishReason::None ? Json(nullptr) : Json(finish_reason_name(finish))}};
}

Json completion_header(const ServedModel& model, const CompletionId& id) {
  return {{"id", fmt::format("cmpl-{}", id.request_id)},
          {"object", "text_completion"},
          {"created", id.created_s},
          {"model", model.name}};
}

FinishReason finish_reason_of(const Json& value) {
  if (value == "stop") return FinishReason::Stop;
  if (value == "length") return FinishReason::Length;
  if (value.is_null()) return FinishReason::None;
  return FinishReason::Cancelled;  // anything else ended the request early
}

}  // namespace

ServedModel make_served_model(const llm::ModelConfig& config, std::string name, const llm::Tokenizer* tokenizer) {
  return {std::move(name), config.vocab_size, config.seq_len, tokenizer};
}

std::string_view error_type(int status) { return status >= 500 ? "server_error" : "invalid_request_error"; }

std::string error_json(const ApiError& error) {
  return wire({{"error", {{"message", error.message}, {"type", error_type(error.status)}}}});
}

ParsedCompletion parse_completion_request(std::string_view body, const ServedModel& model) {
  const Json json = Json::parse(body, /*callback=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return bad_request("the body is not valid JSON");
  if (!json.is_object()) return bad_request(fmt::format("the body must be a JSON object, not {}", json.type_name()));
  FieldsRead read;
  for (const auto& [name, value] : json.items())
    if (auto error = read_field(name, value, model, read)) return *error;
  if (!read.has_prompt) return bad_request("prompt is missing");
  if (auto error = check_context(read.request, model)) return *error;
  return read.request;
}

std::string completion_request_json(const Request& request, bool stream) {
  return wire({{"prompt", request.prompt},
               {"max_tokens", request.max_tokens},
               {"temperature", request.sampling.temperature},
               {"top_p", request.sampling.top_p},
               {"seed", request.sampling.seed},
               {"stream", stream}});
}

TextPieces::TextPieces(const ServedModel& model, int last_prompt_token)
    : tokenizer_(model.has_tokenizer() ? model.tokenizer : nullptr), previous_(last_prompt_token) {}

std::string TextPieces::next(int token) {
  const int previous = std::exchange(previous_, token);
  if (tokenizer_ == nullptr || token == llm::Tokenizer::kBos) return "";
  held_back_ += tokenizer_->decode(previous, token);
  const std::size_t unfinished = unfinished_character_start(held_back_);
  std::string piece = held_back_.substr(0, unfinished);
  held_back_.erase(0, unfinished);
  return piece;
}

std::string TextPieces::flush() { return std::exchange(held_back_, {}); }

std::string completion_json(const ServedModel& model, const CompletionId& id, const FinishedCompletion& completion) {
  Json json = completion_header(model, id);
  json["choices"] = Json::array({choice_json(completion.text, completion.tokens, completion.finish)});
  const auto generated = static_cast<int>(completion.tokens.size());
  json["usage"] = {{"prompt_tokens", completion.prompt_tokens},
                   {"completion_tokens", generated},
                   {"total_tokens", completion.prompt_tokens + generated}};
  return wire(json);
}

std::string token_event(const ServedModel& model, const CompletionId& id, int token, const std::string& text,
                        FinishReason finish) {
  Json json = completion_header(model, id);
  json["choices"] = Json::array({choice_json(text, {token}, finish)});
  return fmt::format("data: {}\n\n", wire(json));
}

std::string error_event(const ApiError& error) { return fmt::format("data: {}\n\n", error_json(error)); }

std::vector<std::string> SseDecoder::feed(std::string_view bytes) {
  pending_.append(bytes);
  std::vector<std::string> events;  // [events completed by these bytes] their data
  std::size_t event_start = 0;
  for (std::size_t event_end; (event_end = end_of_event(pending_, event_start)) != std::string::npos;) {
    if (auto data = event_data(std::string_view(pending_).substr(event_start, event_end - event_start)))
      events.push_back(std::move(*data));
    event_start = event_end;
  }
  pending_.erase(0, event_start);
  return events;
}

ReceivedCompletion parse_completion_json(std::string_view json_text) {
  ReceivedCompletion received;
  const Json json = Json::parse(json_text, /*callback=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    received.error = fmt::format("unreadable response: {}", json_text.substr(0, 200));
    return received;
  }
  if (json.contains("error")) {
    const Json& message = json["error"].is_object() ? json["error"].value("message", Json()) : Json();
    received.error = message.is_string() ? message.get<std::string>() : json["error"].dump();
    return received;
  }
  const Json choices = json.value("choices", Json::array());
  if (!choices.is_array() || choices.empty() || !choices[0].is_object() || !choices[0].contains("tokens")) {
    received.error = fmt::format("a response without choices[0].tokens: {}", json_text.substr(0, 200));
    return received;
  }
  const Json& choice = choices[0];
  if (choice["tokens"].is_array())
    for (const Json& token : choice["tokens"])
      if (token.is_number_integer()) received.tokens.push_back(token.get<int>());
  received.finish = finish_reason_of(choice.value("finish_reason", Json()));
  return received;
}

void ignore_broken_pipes_in_this_thread() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

}  // namespace step07
