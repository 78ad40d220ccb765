#pragma once
// The wire format of POST /v1/completions, an OpenAI-style completion API,
// shared by the server (server.hpp), which reads requests and writes
// responses, and the load client (load_client.hpp), which does the opposite.
//
// A request is a JSON object:
//   prompt       a string (encoded with the model's tokenizer, BOS first) or
//                an array of token ids starting with BOS (1)
//   max_tokens   integer >= 1, default 16
//   temperature  >= 0, default 0 (greedy);  top_p in (0, 1], default 0.9
//   seed         unsigned integer, default 0;  stream  bool, default false
//   model        a string, accepted and ignored (OpenAI clients send it)
// Anything else is a 400 naming the field: a typo must not be silently ignored.
//
// A response is one JSON object, or with "stream": true server-sent events,
// one per token, ended by "data: [DONE]":
//   {"id": "cmpl-7", "object": "text_completion", "created": <unix s>, "model": "<name>",
//    "choices": [{"index": 0, "text": "...", "tokens": [ids], "finish_reason": "stop" | "length" | null}],
//    "usage": {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}}   (no usage in events)
// Errors: {"error": {"message": "...", "type": "invalid_request_error" | "server_error"}}.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "llm/config.hpp"
#include "llm/tokenizer.hpp"
#include "step07_batching/request.hpp"

namespace step07 {

// The model as the API sees it: the name responses carry, the limits every
// request is checked against, and the tokenizer of text prompts and pieces.
struct ServedModel {
  std::string name;                           // "stories260K.bin", "preset tiny"
  int vocab_size = 0;                         // token ids must be in [0, vocab_size)
  int context_length = 0;                     // positions one sequence may hold (the model's seq_len)
  const llm::Tokenizer* tokenizer = nullptr;  // null or an empty vocabulary: token ids only, no text
  bool has_tokenizer() const { return tokenizer != nullptr && tokenizer->vocab_size() > 0; }
};
ServedModel make_served_model(const llm::ModelConfig& config, std::string name, const llm::Tokenizer* tokenizer);

// What the server answers instead of a completion. The HTTP status says whose
// fault it is: 4xx the request's (its message says what to change), 5xx the
// server's.
struct ApiError {
  int status = 400;
  std::string message;
};
// "invalid_request_error" for 4xx, "server_error" for 5xx (OpenAI's names).
std::string_view error_type(int status);
// {"error": {"message": ..., "type": ...}}
std::string error_json(const ApiError& error);

// A valid completion request, ready for the engine (minus the id the server assigns).
struct CompletionRequest {
  std::vector<int> prompt;  // [prompt_length] token ids, BOS first, each in [0, vocab)
  int max_tokens = 16;
  SamplingParams sampling;  // temperature 0, top_p 0.9, seed 0 unless the request says otherwise
  bool stream = false;
};
using ParsedCompletion = std::variant<CompletionRequest, ApiError>;

// Parses and checks a request body; never throws. Every problem is a 400 with
// a message: malformed JSON, not an object, an unknown field, a wrong type, a
// value out of range, a token id outside the vocabulary, a text prompt
// without a tokenizer, or prompt + max_tokens - 1 positions beyond the context.
ParsedCompletion parse_completion_request(std::string_view body, const ServedModel& model);

// The body the load client sends for `request` (its prompt as token ids).
std::string completion_request_json(const Request& request, bool stream);

// The text each generated token adds, as the steps print it: the tokenizer's
// decode of (previous token, token); the end token (BOS) adds nothing, nor
// does any token without a tokenizer. Byte-fallback tokens can split one
// UTF-8 character over several tokens, and a JSON string must be valid UTF-8,
// so a piece holds back an unfinished character until its last byte has
// come; the pieces concatenate to the whole text.
class TextPieces {
 public:
  TextPieces(const ServedModel& model, int last_prompt_token);
  std::string next(int token);  // the text `token` completes
  std::string flush();          // what is still held back (the end of the completion)

 private:
  const llm::Tokenizer* tokenizer_;  // null: every piece is ""
  int previous_;                     // the token before the next one
  std::string held_back_;            // the first bytes of an unfinished UTF-8 character
};

// Identifies one completion in every response and event about it.
struct CompletionId {
  int request_id = 0;          // "cmpl-<request_id>"
  std::int64_t created_s = 0;  // unix time the request was received
};

// The non-streaming response of a finished request.
struct FinishedCompletion {
  int prompt_tokens = 0;
  std::vector<int> tokens;  // [generated] the end token included, as the engine generated them
  std::string text;         // the pieces of every token
  FinishReason finish = FinishReason::Length;
};
std::string completion_json(const ServedModel& model, const CompletionId& id, const FinishedCompletion& completion);

// Server-sent events of a streaming response: one per token ("finish_reason"
// null until the last), an error event when the request fails mid-stream,
// and the end of the stream.
std::string token_event(const ServedModel& model, const CompletionId& id, int token, const std::string& text,
                        FinishReason finish);
std::string error_event(const ApiError& error);
inline constexpr std::string_view kDoneEvent = "data: [DONE]\n\n";
// A comment line, which clients ignore: a stream with no token for a while
// (a request waiting for a slot) sends one now and then, so a server notices
// a client that has gone away, and a client sees that the server is alive.
inline constexpr std::string_view kKeepAliveEvent = ": waiting\n\n";

// Splits a stream of bytes into server-sent events, however the bytes are cut
// into reads. Returns the data of each event completed by `bytes` (its
// "data:" lines joined by newlines); events without data (comments) are skipped.
class SseDecoder {
 public:
  std::vector<std::string> feed(std::string_view bytes);

 private:
  std::string pending_;  // bytes of an event whose blank line has not arrived yet
};

// What a client reads from a completion response or one stream event.
struct ReceivedCompletion {
  std::vector<int> tokens;                   // "tokens" of the first choice
  FinishReason finish = FinishReason::None;  // its "finish_reason" (None: null)
  std::optional<std::string> error;          // an error object's message, or why the JSON is unreadable
};
ReceivedCompletion parse_completion_json(std::string_view json);

// Writing to a socket whose peer has gone raises SIGPIPE, whose default
// action ends the process, and httplib sends without MSG_NOSIGNAL. Every
// thread of this step that writes to sockets (the server's handler threads,
// the load client's) blocks it first; the write then just fails, and a
// thread's mask passes on to the threads it starts.
void ignore_broken_pipes_in_this_thread();

}  // namespace step07
