#include "step07_batching/serve/completion_api.hpp"

#include <fmt/format.h>

#include <pthread.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <csignal>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

namespace step07 {
namespace {

using Json = nlohmann::json;

// A 400 blaming `param`, the field at fault ("" when it is the body as a whole).
ApiError bad_request(std::string param, std::string message, std::string code = {}) {
  return {400, std::move(message), std::move(param), std::move(code)};
}

// Dumps JSON for the wire. A piece cut inside a UTF-8 character is held back
// by TextPieces, but a completion can still end inside one (max_tokens
// reached mid-character), and a logged token can be a lone byte: such bytes
// become U+FFFD instead of an exception.
std::string wire(const Json& json) { return json.dump(-1, ' ', false, Json::error_handler_t::replace); }

// How many bytes a UTF-8 character starting with `lead` has (1 for a byte
// that cannot start one: it is passed on as it is).
std::size_t utf8_length(unsigned char lead) {
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Where an unfinished UTF-8 character at the end of `text` starts (text.size() when there is none).
std::size_t unfinished_character_start(std::string_view text) {
  const std::size_t lookback = std::min<std::size_t>(text.size(), 3);  // an unfinished character has 3 bytes at most
  for (std::size_t back = 1; back <= lookback; ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: the lead is further back
    return utf8_length(byte) > back ? text.size() - back : text.size();
  }
  return text.size();
}

// A value as an error message quotes it: a scalar as its JSON, cut short; an
// array or an object by its kind only. Dumping a container could quote a
// megabyte, or recurse as deep as the body nests.
std::string shown(const Json& value) {
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  constexpr std::size_t kLongest = 40;  // bytes of a quoted scalar
  std::string text = wire(value);
  if (text.size() <= kLongest) return text;
  text.resize(kLongest);
  text.resize(unfinished_character_start(text));  // the message stays valid UTF-8
  return text + "...";
}

// An integer field's value, or nullopt for a non-integer. JSON integers past
// the int64 range (nlohmann keeps them unsigned) saturate: they are rejected
// by the range checks that follow anyway.
std::optional<long long> integer_of(const Json& value) {
  if (value.is_number_unsigned())
    return static_cast<long long>(std::min<std::uint64_t>(value.get<std::uint64_t>(), LLONG_MAX));
  if (value.is_number_integer()) return value.get<std::int64_t>();
  return std::nullopt;
}

// Reads the integer field `param` into `out` when it is in [low, high]
// (high LLONG_MAX: no upper bound); `why`, when given, says where the bound
// comes from, after the range in the message.
std::optional<ApiError> read_integer(const Json& value, const std::string& param, long long low, long long high,
                                     long long& out, std::string_view why = {}) {
  const std::optional<long long> integer = integer_of(value);
  if (!integer) return bad_request(param, fmt::format("{} must be an integer (got {})", param, shown(value)));
  if (*integer < low || *integer > high) {
    const std::string range =
        high == LLONG_MAX ? fmt::format("at least {}", low) : fmt::format("from {} to {}", low, high);
    return bad_request(param, fmt::format("{} must be {} (got {}){}", param, range, *integer, why));
  }
  out = *integer;
  return std::nullopt;
}

std::string_view endpoint_path(Endpoint endpoint) {
  return endpoint == Endpoint::ChatCompletions ? "/v1/chat/completions" : "/v1/completions";
}

// A request's fields as they are read. What depends on several fields waits
// until all are read, whatever their order in the body: the prompt's text is
// encoded only once max_tokens is known (a text too long for the context is
// refused without encoding it), and the pairs of fields that must agree are
// checked then.
struct FieldsRead {
  CompletionRequest request;
  std::optional<std::string> prompt_text;    // a text prompt, or chat_prompt() of the messages
  std::optional<int> max_tokens;             // "max_tokens"
  std::optional<int> max_completion_tokens;  // chat's newer name for it
  bool chat_logprobs = false;                // chat's "logprobs": true
  std::optional<int> chat_top_logprobs;      // chat's "top_logprobs"
  bool has_stream_options = false;           // "stream_options" was sent (and not null)
};

// Reads one field into `read`; an error when its value is unusable.
using FieldReader = std::optional<ApiError> (*)(const Json& value, const ServedModel& model, FieldsRead& read);

std::optional<ApiError> read_token_ids(const Json& ids, const ServedModel& model, std::vector<int>& prompt) {
  if (ids.empty()) return bad_request("prompt", "prompt is an empty array: send at least the BOS token (1)");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string param = fmt::format("prompt[{}]", i);
    const std::optional<long long> id = integer_of(ids[i]);
    if (!id) return bad_request(param, fmt::format("{} is {}, not a token id (an integer)", param, shown(ids[i])));
    if (*id < 0 || *id >= model.vocab_size)
      return bad_request(param, fmt::format("{} = {} is out of range [0, {})", param, *id, model.vocab_size));
    prompt.push_back(static_cast<int>(*id));
  }
  if (prompt.front() != llm::Tokenizer::kBos)
    return bad_request("prompt[0]", fmt::format("a prompt of token ids must start with BOS ({}); it starts with {}",
                                                llm::Tokenizer::kBos, prompt.front()));
  return std::nullopt;
}

std::optional<ApiError> read_prompt(const Json& value, const ServedModel& model, FieldsRead& read) {
  if (value.is_string()) {
    if (!model.has_tokenizer())
      return bad_request("prompt",
                         "this model has no tokenizer: send the prompt as an array of token ids, BOS (1) first");
    read.prompt_text = value.get<std::string>();
    return std::nullopt;
  }
  if (value.is_array()) return read_token_ids(value, model, read.request.prompt);
  return bad_request("prompt", fmt::format("prompt must be a string or an array of token ids (got {})", shown(value)));
}

// The content of a chat message, `param` ("messages[1].content"): a string,
// or an array of text parts, concatenated. Other parts (images, audio) are
// refused: this model reads text.
std::optional<ApiError> read_content(const Json& value, const std::string& param, std::string& content) {
  if (value.is_string()) {
    content = value.get<std::string>();
    return std::nullopt;
  }
  if (!value.is_array())
    return bad_request(param,
                       fmt::format("{} must be a string or an array of text parts (got {})", param, shown(value)));
  for (std::size_t i = 0; i < value.size(); ++i) {
    const Json& part = value[i];
    const std::string part_param = fmt::format("{}[{}]", param, i);
    if (!part.is_object())
      return bad_request(part_param, fmt::format(R"({} must be an object {{"type": "text", "text": ...}} (got {}))",
                                                 part_param, shown(part)));
    // The type first, whatever the order of the keys: an image part is
    // refused for its type, not for the key its image comes in.
    const auto type = part.find("type");
    if (type == part.end()) return bad_request(part_param + ".type", part_param + ".type is missing");
    if (*type != "text")
      return bad_request(part_param + ".type",
                         fmt::format(R"({}.type is {}: this model reads text parts only ("text"))", part_param,
                                     shown(*type)));
    const auto text = part.find("text");
    if (text == part.end()) return bad_request(part_param + ".text", part_param + ".text is missing");
    if (!text->is_string())
      return bad_request(part_param + ".text",
                         fmt::format("{}.text must be a string (got {})", part_param, shown(*text)));
    for (const auto& [key, ignored] : part.items())
      if (key != "type" && key != "text")
        return bad_request(part_param + "." + key,
                           fmt::format("unknown field '{}' in {} (a text part has type and text)", key, part_param));
    content += text->get<std::string>();
  }
  return std::nullopt;
}

constexpr std::array<std::string_view, 4> kRoles = {"system", "developer", "user", "assistant"};

// One chat message, `where` ("messages[1]"): its role and content, and
// optionally a participant's name (a string, dropped as the template drops roles).
std::optional<ApiError> read_message(const Json& json, const std::string& where, ChatMessage& message) {
  if (!json.is_object())
    return bad_request(where,
                       fmt::format("{} must be an object with a role and a content (got {})", where, shown(json)));
  bool has_role = false;
  bool has_content = false;
  for (const auto& [key, value] : json.items()) {
    const std::string param = fmt::format("{}.{}", where, key);
    if (key == "role") {
      if (!value.is_string() || std::ranges::find(kRoles, value.get_ref<const std::string&>()) == kRoles.end())
        return bad_request(param, fmt::format(R"({} must be "system", "developer", "user" or "assistant" (got {}))",
                                              param, shown(value)));
      message.role = value.get<std::string>();
      has_role = true;
    } else if (key == "content") {
      if (auto error = read_content(value, param, message.content)) return error;
      has_content = true;
    } else if (key == "name") {
      if (!value.is_string())
        return bad_request(param, fmt::format("{} must be a string (got {})", param, shown(value)));
    } else {
      return bad_request(param,
                         fmt::format("unknown field '{}' in {} (a message has role, content and name)", key, where));
    }
  }
  if (!has_role) return bad_request(where + ".role", where + ".role is missing");
  if (!has_content) return bad_request(where + ".content", where + ".content is missing");
  return std::nullopt;
}

std::optional<ApiError> read_messages(const Json& value, const ServedModel& model, FieldsRead& read) {
  if (!value.is_array() || value.empty())
    return bad_request("messages", fmt::format(R"(messages must be a non-empty array of {{"role", "content"}} )"
                                               "objects (got {})",
                                               value.is_array() ? "an empty array" : shown(value)));
  if (!model.has_tokenizer())
    return bad_request("messages",
                       "this model has no tokenizer, so it cannot read chat messages: send token ids to "
                       "/v1/completions");
  std::vector<ChatMessage> messages(value.size());  // [messages]
  for (std::size_t i = 0; i < value.size(); ++i)
    if (auto error = read_message(value[i], fmt::format("messages[{}]", i), messages[i])) return error;
  read.prompt_text = chat_prompt(messages);
  return std::nullopt;
}

std::optional<ApiError> read_max_tokens_named(const Json& value, const std::string& param, std::optional<int>& out) {
  long long max_tokens = 0;
  if (auto error = read_integer(value, param, 1, LLONG_MAX, max_tokens)) return error;
  // Past INT_MAX the context check rejects it anyway; clamping keeps it an int.
  out = static_cast<int>(std::min<long long>(max_tokens, INT_MAX));
  return std::nullopt;
}

std::optional<ApiError> read_max_tokens(const Json& value, const ServedModel&, FieldsRead& read) {
  return read_max_tokens_named(value, "max_tokens", read.max_tokens);
}

std::optional<ApiError> read_max_completion_tokens(const Json& value, const ServedModel&, FieldsRead& read) {
  return read_max_tokens_named(value, "max_completion_tokens", read.max_completion_tokens);
}

// A number field as the float the sampler gets; nullopt for a non-number or
// one beyond float's range (1e300 is a double, and converting it to a float
// is undefined behaviour).
std::optional<float> float_of(const Json& value) {
  if (!value.is_number()) return std::nullopt;
  const double number = value.get<double>();
  if (!std::isfinite(number) || std::abs(number) > std::numeric_limits<float>::max()) return std::nullopt;
  return static_cast<float>(number);
}

std::optional<ApiError> read_temperature(const Json& value, const ServedModel&, FieldsRead& read) {
  const std::optional<float> temperature = float_of(value);
  if (!temperature || *temperature < 0.0f)
    return bad_request("temperature",
                       fmt::format("temperature must be a number >= 0 (0: greedy); got {}", shown(value)));
  read.request.sampling.temperature = *temperature;
  return std::nullopt;
}

std::optional<ApiError> read_top_p(const Json& value, const ServedModel&, FieldsRead& read) {
  // Checked as a float: 1e-50 is above 0 as a double, and 0 as a float.
  const std::optional<float> top_p = float_of(value);
  if (!top_p || !(*top_p > 0.0f && *top_p <= 1.0f))
    return bad_request("top_p", fmt::format("top_p must be a number in (0, 1]; got {}", shown(value)));
  read.request.sampling.top_p = *top_p;
  return std::nullopt;
}

std::optional<ApiError> read_seed(const Json& value, const ServedModel&, FieldsRead& read) {
  if (!value.is_number_unsigned())
    return bad_request("seed", fmt::format("seed must be an unsigned integer; got {}", shown(value)));
  read.request.sampling.seed = value.get<std::uint64_t>();
  return std::nullopt;
}

std::optional<ApiError> read_n(const Json& value, const ServedModel& model, FieldsRead& read) {
  long long n = 0;
  if (auto error = read_integer(value, "n", 1, model.max_choices, n,
                                fmt::format(": each choice decodes in a cache slot of its own, and this server has {}",
                                            model.max_choices)))
    return error;
  read.request.n = static_cast<int>(n);
  return std::nullopt;
}

// OpenAI's limit on the number of stop strings.
constexpr std::size_t kMostStopStrings = 4;
// Bytes of one stop string at most. The end of the text that may begin a
// stop string is held back, and every piece compares it with each stop
// string's prefixes: O(length^2) per piece. Stop strings are words and
// markers; 256 bytes keeps that cost negligible whatever the request sends.
constexpr std::size_t kLongestStopString = 256;

std::optional<ApiError> read_stop_string(const Json& value, const std::string& param, std::vector<std::string>& stop) {
  if (!value.is_string() || value.get_ref<const std::string&>().empty())
    return bad_request(param, fmt::format("{} must be a non-empty string (got {})", param, shown(value)));
  if (value.get_ref<const std::string&>().size() > kLongestStopString)
    return bad_request(param, fmt::format("{} has {} bytes; a stop string has {} at most", param,
                                          value.get_ref<const std::string&>().size(), kLongestStopString));
  stop.push_back(value.get<std::string>());
  return std::nullopt;
}

std::optional<ApiError> read_stop(const Json& value, const ServedModel&, FieldsRead& read) {
  if (value.is_string()) return read_stop_string(value, "stop", read.request.stop);
  if (!value.is_array() || value.size() > kMostStopStrings) {
    const std::string count = value.is_array() ? fmt::format("{} in ", value.size()) : "";  // "5 in an array"
    return bad_request("stop", fmt::format("stop must be a string or an array of up to {} strings (got {}{})",
                                           kMostStopStrings, count, shown(value)));
  }
  for (std::size_t i = 0; i < value.size(); ++i)
    if (auto error = read_stop_string(value[i], fmt::format("stop[{}]", i), read.request.stop)) return error;
  return std::nullopt;
}

std::optional<ApiError> read_stream(const Json& value, const ServedModel&, FieldsRead& read) {
  if (!value.is_boolean())
    return bad_request("stream", fmt::format("stream must be true or false; got {}", shown(value)));
  read.request.stream = value.get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_stream_options(const Json& value, const ServedModel&, FieldsRead& read) {
  if (!value.is_object())
    return bad_request("stream_options",
                       fmt::format(R"(stream_options must be an object such as {{"include_usage": true}} (got {}))",
                                   shown(value)));
  read.has_stream_options = true;
  for (const auto& [key, option] : value.items()) {
    const std::string param = "stream_options." + key;
    if (key != "include_usage")
      return bad_request(param, fmt::format("unknown field '{}' in stream_options (it has include_usage)", key));
    if (option.is_null()) continue;  // the default, as for a top-level field
    if (!option.is_boolean())
      return bad_request(param, fmt::format("{} must be true or false; got {}", param, shown(option)));
    read.request.include_usage = option.get<bool>();
  }
  return std::nullopt;
}

// Completions' logprobs: how many alternatives to report beside the sampled token.
std::optional<ApiError> read_completion_logprobs(const Json& value, const ServedModel&, FieldsRead& read) {
  long long top = 0;
  if (auto error = read_integer(value, "logprobs", 0, 5, top,
                                ": how many alternatives to report beside each sampled token"))
    return error;
  read.request.top_logprobs = static_cast<int>(top);
  return std::nullopt;
}

// Chat's logprobs: whether to report them at all (top_logprobs says how many alternatives).
std::optional<ApiError> read_chat_logprobs(const Json& value, const ServedModel&, FieldsRead& read) {
  if (!value.is_boolean())
    return bad_request("logprobs", fmt::format("logprobs must be true or false; got {}", shown(value)));
  read.chat_logprobs = value.get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_top_logprobs(const Json& value, const ServedModel&, FieldsRead& read) {
  long long top = 0;
  if (auto error = read_integer(value, "top_logprobs", 0, 20, top)) return error;
  read.chat_top_logprobs = static_cast<int>(top);
  return std::nullopt;
}

constexpr char kModel[] = "model";  // one server serves one model: the name is not checked
constexpr char kUser[] = "user";    // the end user's id, for the provider's abuse monitoring

// Fields clients send that name the caller or the model: a string, accepted and ignored.
template <const char* kName>
std::optional<ApiError> read_ignored_string(const Json& value, const ServedModel&, FieldsRead&) {
  if (!value.is_string()) return bad_request(kName, fmt::format("{} must be a string; got {}", kName, shown(value)));
  return std::nullopt;
}

// Which endpoints read a field.
enum class ReadBy { Completions, Chat, Both };

struct Field {
  std::string_view name;
  ReadBy read_by;
  bool required;  // absent or null: a 400 (any other absent or null field takes its default)
  FieldReader read;
  bool read_on(Endpoint endpoint) const {
    return read_by == ReadBy::Both || (read_by == ReadBy::Chat) == (endpoint == Endpoint::ChatCompletions);
  }
};
// Both endpoints' fields; a name may appear once per endpoint ("logprobs"
// means different things on each).
constexpr std::array<Field, 16> kFields = {{
    {"model", ReadBy::Both, false, read_ignored_string<kModel>},
    {"prompt", ReadBy::Completions, true, read_prompt},
    {"messages", ReadBy::Chat, true, read_messages},
    {"max_tokens", ReadBy::Both, false, read_max_tokens},
    {"max_completion_tokens", ReadBy::Chat, false, read_max_completion_tokens},
    {"temperature", ReadBy::Both, false, read_temperature},
    {"top_p", ReadBy::Both, false, read_top_p},
    {"seed", ReadBy::Both, false, read_seed},
    {"n", ReadBy::Both, false, read_n},
    {"stop", ReadBy::Both, false, read_stop},
    {"stream", ReadBy::Both, false, read_stream},
    {"stream_options", ReadBy::Both, false, read_stream_options},
    {"logprobs", ReadBy::Completions, false, read_completion_logprobs},
    {"logprobs", ReadBy::Chat, false, read_chat_logprobs},
    {"top_logprobs", ReadBy::Chat, false, read_top_logprobs},
    {"user", ReadBy::Both, false, read_ignored_string<kUser>},
}};

const Field* field_named(std::string_view name, Endpoint endpoint) {
  for (const Field& field : kFields)
    if (field.name == name && field.read_on(endpoint)) return &field;
  return nullptr;
}

ApiError unknown_field(const std::string& name, Endpoint endpoint) {
  const Endpoint other = endpoint == Endpoint::Completions ? Endpoint::ChatCompletions : Endpoint::Completions;
  if (field_named(name, other) != nullptr)
    return bad_request(name, fmt::format("'{}' is a field of {}, not of {}", name, endpoint_path(other),
                                         endpoint_path(endpoint)));
  std::string known;
  for (const Field& field : kFields)
    if (field.read_on(endpoint)) known += fmt::format("{}{}", known.empty() ? "" : ", ", field.name);
  return bad_request(name, fmt::format("unknown field '{}' ({} reads {})", name, endpoint_path(endpoint), known));
}

// A text encodes to BOS and at least ceil(bytes / max_piece_bytes) tokens
// (llm::Tokenizer::max_piece_bytes): a text whose bound alone overflows the
// context is refused without being encoded. The dummy-prefix space is not
// counted, since a vocabulary without a " " token adds none: the bound stays
// a bound for every tokenizer.
std::optional<ApiError> check_text_can_fit(std::string_view text, const CompletionRequest& request,
                                           const ServedModel& model, const std::string& param) {
  const long long piece_bytes = model.tokenizer->max_piece_bytes();
  const long long fewest_tokens = 1 + (static_cast<long long>(text.size()) + piece_bytes - 1) / piece_bytes;
  const long long positions = fewest_tokens + request.max_tokens - 1;
  if (positions <= model.context_length) return std::nullopt;
  return bad_request(param,
                     fmt::format("a prompt of {} bytes is at least {} tokens (a token holds {} bytes at most); with "
                                 "max_tokens {} it needs at least {} positions; the context is {}",
                                 text.size(), fewest_tokens, piece_bytes, request.max_tokens, positions,
                                 model.context_length),
                     "context_length_exceeded");
}

// The engine's own rule: the first token comes out of the prefill, so the
// sequence holds prompt + max_tokens - 1 positions at its end.
std::optional<ApiError> check_context(const CompletionRequest& request, const ServedModel& model,
                                      const std::string& param) {
  const long long positions = static_cast<long long>(request.prompt.size()) + request.max_tokens - 1;
  if (positions <= model.context_length) return std::nullopt;
  return bad_request(param,
                     fmt::format("prompt of {} tokens + max_tokens {} needs {} positions; the context is {}",
                                 request.prompt.size(), request.max_tokens, positions, model.context_length),
                     "context_length_exceeded");
}

// The checks that involve several fields, once all are read; then the
// prompt's text, if any, is encoded and the whole checked against the context.
std::optional<ApiError> finish_reading(FieldsRead& read, const ServedModel& model) {
  CompletionRequest& request = read.request;
  if (read.max_tokens && read.max_completion_tokens && *read.max_tokens != *read.max_completion_tokens)
    return bad_request("max_completion_tokens",
                       fmt::format("max_tokens ({}) and max_completion_tokens ({}) disagree: send one of them",
                                   *read.max_tokens, *read.max_completion_tokens));
  request.max_tokens = read.max_completion_tokens.value_or(read.max_tokens.value_or(request.max_tokens));
  if (read.chat_top_logprobs && !read.chat_logprobs)
    return bad_request("top_logprobs", R"(top_logprobs needs "logprobs": true)");
  if (read.chat_logprobs) request.top_logprobs = read.chat_top_logprobs.value_or(0);
  if (read.has_stream_options && !request.stream)
    return bad_request("stream_options", R"(stream_options is only allowed with "stream": true)");
  const std::string prompt_param = request.endpoint == Endpoint::ChatCompletions ? "messages" : "prompt";
  if (read.prompt_text) {
    if (auto error = check_text_can_fit(*read.prompt_text, request, model, prompt_param)) return error;
    request.prompt = model.tokenizer->encode(*read.prompt_text, /*add_bos=*/true, /*add_eos=*/false);
  }
  return check_context(request, model, prompt_param);
}

ParsedCompletion parse_request(std::string_view body, const ServedModel& model, Endpoint endpoint) {
  const Json json = Json::parse(body, /*callback=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return bad_request("", "the body is not valid JSON");
  if (!json.is_object())
    return bad_request("", fmt::format("the body must be a JSON object, not {}", json.type_name()));
  FieldsRead read;
  read.request.endpoint = endpoint;
  for (const auto& [name, value] : json.items()) {
    const Field* field = field_named(name, endpoint);
    if (field == nullptr) return unknown_field(name, endpoint);
    if (value.is_null() && !field->required) continue;  // null: the default, as OpenAI reads it
    if (auto error = field->read(value, model, read)) return *error;
  }
  for (const Field& field : kFields)
    if (field.required && field.read_on(endpoint) && !json.contains(field.name))
      return bad_request(std::string(field.name), fmt::format("{} is missing", field.name));
  if (auto error = finish_reading(read, model)) return *error;
  return read.request;
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

Json finish_reason_json(FinishReason finish) {
  return finish == FinishReason::None ? Json(nullptr) : Json(finish_reason_name(finish));
}

Json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

// What every response and chunk about one completion starts with. `chunk`:
// a stream's chunk (chat names its chunks differently from its answers).
Json response_header(const ServedModel& model, const CompletionId& id, bool chunk) {
  const bool chat = id.endpoint == Endpoint::ChatCompletions;
  const char* object = !chat ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion";
  return {{"id", fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", id.request_id)},
          {"object", object},
          {"created", id.created_s},
          {"model", model.name}};
}

// Completions' logprobs: parallel arrays, one entry per token, and the top
// alternatives as {text: logprob} (two alternatives with the same text keep
// the more likely one's). text_offset is where each token's text starts in
// the choice's text: the tokens' texts laid end to end from delta.text_offset,
// and never past the end of what was sent (a stop string cuts the text short
// of the tokens that spelled it, and the end token adds none).
Json completion_logprobs_json(const ChoiceDelta& delta) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(), offsets = Json::array();
  const std::size_t text_end = delta.text_offset + delta.text.size();
  std::size_t offset = delta.text_offset;
  for (const LoggedToken& token : delta.logprobs) {
    tokens.push_back(token.text);
    token_logprobs.push_back(token.logprob);
    Json top = Json::object();
    for (const auto& [text, logprob] : token.top) top.emplace(text, logprob);  // emplace keeps the first (likelier)
    top_logprobs.push_back(std::move(top));
    offsets.push_back(std::min(offset, text_end));
    offset += token.text.size();
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

// Chat's logprobs: one object per token, its text also as UTF-8 bytes (which
// a client joins to rebuild characters split over tokens).
Json chat_token_json(const std::string& text, float logprob) {
  Json bytes = Json::array();
  for (const char byte : text) bytes.push_back(static_cast<unsigned char>(byte));
  return {{"token", text}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

Json chat_logprobs_json(const ChoiceDelta& delta) {
  Json content = Json::array();
  for (const LoggedToken& token : delta.logprobs) {
    Json entry = chat_token_json(token.text, token.logprob);
    Json top = Json::array();
    for (const auto& [text, logprob] : token.top) top.push_back(chat_token_json(text, logprob));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}};
}

// One choice of an answer (`chunk` false: all of it) or of a stream chunk.
Json choice_json(Endpoint endpoint, const ChoiceDelta& choice, bool with_logprobs, bool chunk) {
  Json json = {{"index", choice.index}};
  if (endpoint == Endpoint::Completions) {
    json["text"] = choice.text;
  } else if (!chunk) {
    json["message"] = {{"role", "assistant"}, {"content", choice.text}};
  } else {
    // A chunk's delta: the role in the choice's first chunk, the text added
    // (possibly ""); a last chunk with no text left has an empty delta.
    Json delta = Json::object();
    if (choice.first) delta["role"] = "assistant";
    if (choice.first || !choice.text.empty() || choice.finish == FinishReason::None) delta["content"] = choice.text;
    json["delta"] = std::move(delta);
  }
  json["tokens"] = choice.tokens;
  if (!with_logprobs)
    json["logprobs"] = nullptr;
  else if (endpoint == Endpoint::Completions)
    json["logprobs"] = completion_logprobs_json(choice);
  else
    json["logprobs"] = chat_logprobs_json(choice);
  json["finish_reason"] = finish_reason_json(choice.finish);
  return json;
}

std::string event(const Json& json) { return fmt::format("data: {}\n\n", wire(json)); }

FinishReason finish_reason_of(const Json& value) {
  if (value == "stop") return FinishReason::Stop;
  if (value == "length") return FinishReason::Length;
  if (value.is_null()) return FinishReason::None;
  return FinishReason::Cancelled;  // anything else ended the request early
}

}  // namespace

ServedModel make_served_model(const llm::ModelConfig& config, std::string name, const llm::Tokenizer* tokenizer,
                              int max_choices, std::int64_t created_s) {
  ServedModel model;
  model.name = std::move(name);
  model.vocab_size = config.vocab_size;
  model.context_length = config.seq_len;
  model.max_choices = max_choices;
  model.created_s = created_s;
  model.tokenizer = tokenizer;
  return model;
}

std::string_view error_type(int status) { return status >= 500 ? "server_error" : "invalid_request_error"; }

std::string error_json(const ApiError& error) {
  const auto or_null = [](const std::string& text) { return text.empty() ? Json(nullptr) : Json(text); };
  return wire({{"error",
                {{"message", error.message},
                 {"type", error_type(error.status)},
                 {"param", or_null(error.param)},
                 {"code", or_null(error.code)}}}});
}

std::string chat_prompt(std::span<const ChatMessage> messages) {
  std::string prompt;
  for (const ChatMessage& message : messages) {
    if (&message != messages.data()) prompt += '\n';
    prompt += message.content;
  }
  return prompt;
}

ParsedCompletion parse_completion_request(std::string_view body, const ServedModel& model) {
  return parse_request(body, model, Endpoint::Completions);
}

ParsedCompletion parse_chat_request(std::string_view body, const ServedModel& model) {
  return parse_request(body, model, Endpoint::ChatCompletions);
}

std::string models_json(const ServedModel& model) {
  return wire({{"object", "list"},
               {"data", Json::array({{{"id", model.name},
                                      {"object", "model"},
                                      {"created", model.created_s},
                                      {"owned_by", "llm-inference-course"}}})}});
}

std::string completion_request_json(const Request& request, bool stream) {
  Json json = {{"prompt", request.prompt},
               {"max_tokens", request.max_tokens},
               {"temperature", request.sampling.temperature},
               {"top_p", request.sampling.top_p},
               {"seed", request.sampling.seed},
               {"stream", stream}};
  // Sent only when asked for: a body with the defaults stays the body every server reads.
  if (request.n != 1) json["n"] = request.n;
  if (request.top_logprobs >= 0) json["logprobs"] = request.top_logprobs;
  return wire(json);
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

void ChoiceDelta::append(const ChoiceDelta& later) {
  text += later.text;
  tokens.insert(tokens.end(), later.tokens.begin(), later.tokens.end());
  logprobs.insert(logprobs.end(), later.logprobs.begin(), later.logprobs.end());
  finish = later.finish;
}

StopMatcher::StopMatcher(std::vector<std::string> stop) : stop_(std::move(stop)) {
  // An empty stop string would match before any text: the parser refuses
  // them, and the matcher ignores them.
  std::erase(stop_, std::string());
}

StopMatcher::Output StopMatcher::feed(std::string_view piece) {
  std::string text = std::exchange(held_back_, {});
  text += piece;
  // A stop string complete in the text ends it: the earliest, when several are.
  std::size_t stop_at = std::string::npos;
  for (const std::string& stop : stop_) stop_at = std::min(stop_at, text.find(stop));
  if (stop_at != std::string::npos) {
    text.resize(stop_at);
    return {std::move(text), true};
  }
  // Otherwise the longest end of the text that begins a stop string waits:
  // the next pieces may complete it. (No stop string is in the text, so an
  // end as long as a whole stop string cannot match it.)
  std::size_t hold = 0;
  for (const std::string& stop : stop_)
    for (std::size_t length = std::min(stop.size() - 1, text.size()); length > hold; --length)
      if (std::string_view(text).ends_with(std::string_view(stop).substr(0, length))) {
        hold = length;
        break;
      }
  held_back_ = text.substr(text.size() - hold);
  text.resize(text.size() - hold);
  return {std::move(text), false};
}

std::string StopMatcher::flush() { return std::exchange(held_back_, {}); }

LoggedToken logged_token(const ServedModel& model, int previous, const TokenLogprobs& logprobs, int token) {
  const auto text_of = [&](int id) {
    return model.has_tokenizer() ? model.tokenizer->decode(previous, id) : fmt::format("<{}>", id);
  };
  LoggedToken logged{text_of(token), logprobs.logprob, {}};
  logged.top.reserve(logprobs.top.size());
  for (const auto& [id, logprob] : logprobs.top) logged.top.emplace_back(text_of(id), logprob);
  return logged;
}

std::string completion_json(const ServedModel& model, const CompletionId& id, std::span<const ChoiceDelta> choices,
                            const Usage& usage, bool with_logprobs) {
  Json json = response_header(model, id, /*chunk=*/false);
  Json choices_json = Json::array();
  for (const ChoiceDelta& choice : choices)
    choices_json.push_back(choice_json(id.endpoint, choice, with_logprobs, /*chunk=*/false));
  json["choices"] = std::move(choices_json);
  json["usage"] = usage_json(usage);
  return wire(json);
}

std::string chunk_event(const ServedModel& model, const CompletionId& id, const ChoiceDelta& delta,
                        bool with_logprobs, bool include_usage) {
  Json json = response_header(model, id, /*chunk=*/true);
  json["choices"] = Json::array({choice_json(id.endpoint, delta, with_logprobs, /*chunk=*/true)});
  if (include_usage) json["usage"] = nullptr;  // OpenAI's shape: only the last chunk's is set
  return event(json);
}

std::string usage_event(const ServedModel& model, const CompletionId& id, const Usage& usage) {
  Json json = response_header(model, id, /*chunk=*/true);
  json["choices"] = Json::array();
  json["usage"] = usage_json(usage);
  return event(json);
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
