#pragma once
// The wire format of the server's OpenAI-compatible API, shared by the server
// (server.hpp), which reads requests and writes responses, and the load client
// (load_client.hpp), which does the opposite. Official OpenAI client
// libraries talk to it unchanged (scripts/openai_client/check.mjs).
//
//   POST /v1/completions       prompt -> text         ("text_completion", "cmpl-<id>")
//   POST /v1/chat/completions  messages -> message    ("chat.completion", "chatcmpl-<id>")
//   GET  /v1/models            the one model served   ("list" of one "model")
//
// A request is a JSON object. Both endpoints read
//   model        a string, accepted and ignored (clients send it; one server serves one model)
//   max_tokens   integer >= 1, default 16 (chat also takes max_completion_tokens)
//   temperature  >= 0, default 0 (greedy);  top_p in (0, 1], default 0.9
//   seed         unsigned integer, default 0
//   n            1..max_choices, default 1: completions of one prompt, which is prefilled once
//   stop         a string or an array of up to 4 non-empty strings (256 bytes each at
//                most): the text ends before the first one found (finish_reason "stop")
//   stream       bool, default false;  stream_options  {"include_usage": bool} (streams only)
//   user         a string, accepted and ignored
// and each its own:
//   completions  prompt: a string (encoded with the model's tokenizer, BOS
//                first) or an array of token ids starting with BOS (1);
//                logprobs: integer 0..5, the sampled token's log-probability
//                and the top-k alternatives' (null/absent: none)
//   chat         messages: [{"role": "system"|"developer"|"user"|"assistant",
//                "content": a string or [{"type": "text", "text": ...}]}],
//                at least one, made into a prompt by chat_prompt();
//                logprobs: bool; top_logprobs: integer 0..20 (needs logprobs: true)
// Anything else is a 400 naming the field: a typo must not be silently ignored.
//
// A response is one JSON object, or with "stream": true server-sent events
// ended by "data: [DONE]": one chunk per token per choice, "finish_reason"
// null until the choice's last chunk; a chat stream's first chunk of each
// choice carries {"role": "assistant"}; with include_usage every chunk has
// "usage": null and a last chunk with no choices carries the usage.
// Every choice also carries "tokens" (the token ids it generated), which
// clients ignore and the tests compare.
// Errors: {"error": {"message", "type", "param", "code"}}, OpenAI's shape.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "llm/config.hpp"
#include "llm/tokenizer.hpp"
#include "step07_batching/request.hpp"

namespace step07 {

enum class Endpoint { Completions, ChatCompletions };

// The model as the API sees it: the name responses carry, the limits every
// request is checked against, and the tokenizer of text prompts and pieces.
struct ServedModel {
  std::string name;                           // "stories260K.bin", "preset tiny"
  int vocab_size = 0;                         // token ids must be in [0, vocab_size)
  int context_length = 0;                     // positions one sequence may hold (the model's seq_len)
  int max_choices = 1;                        // n at most: each choice runs in a cache slot of its own
  std::int64_t created_s = 0;                 // unix time the server loaded it (GET /v1/models)
  const llm::Tokenizer* tokenizer = nullptr;  // null or an empty vocabulary: token ids only, no text
  bool has_tokenizer() const { return tokenizer != nullptr && tokenizer->vocab_size() > 0; }
};
ServedModel make_served_model(const llm::ModelConfig& config, std::string name, const llm::Tokenizer* tokenizer,
                              int max_choices, std::int64_t created_s);

// What the server answers instead of a completion. The HTTP status says whose
// fault it is: 4xx the request's (its message says what to change), 5xx the
// server's.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the request field at fault ("max_tokens", "messages[2].role"); "": none (null)
  std::string code;   // a stable reason, as OpenAI's ("context_length_exceeded"); "": none (null)
};
// "invalid_request_error" for 4xx (OpenAI's type for a wrong route too; the
// status tells the kinds apart, and clients raise their error class by it),
// "server_error" for 5xx.
std::string_view error_type(int status);
// {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}
std::string error_json(const ApiError& error);

// One message of a chat request.
struct ChatMessage {
  std::string role;     // "system", "developer", "user" or "assistant"
  std::string content;  // its text (content parts concatenated)
};

// THE CHAT TEMPLATE: how a conversation becomes the prompt text the model
// continues. A chat model is trained on one such format (Llama 2's
// "[INST] ... [/INST]", ChatML's "<|im_start|>role ... <|im_end|>"), and
// must be prompted in it. stories260K is no chat model: it was trained on
// plain children's stories, so its template is plain text, every message's
// content in order, joined by a newline, and the roles dropped: a single
// user message "Once upon a time" is the prompt "Once upon a time", and the
// chat endpoint answers what the completions endpoint does. Change this one
// function to serve a chat model.
std::string chat_prompt(std::span<const ChatMessage> messages);

// A valid request, ready for the engine (minus the id the server assigns).
struct CompletionRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::vector<int> prompt;          // [prompt_length] token ids, BOS first, each in [0, vocab)
  int max_tokens = 16;
  SamplingParams sampling;          // temperature 0, top_p 0.9, seed 0 unless the request says otherwise
  int n = 1;                        // choices, 1..max_choices
  std::vector<std::string> stop;    // [0..4] non-empty stop strings
  int top_logprobs = -1;            // -1: no logprobs; k >= 0: the sampled token's and the top k
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage: a last chunk with the usage
};
using ParsedCompletion = std::variant<CompletionRequest, ApiError>;

// Parse and check a request body; never throw. Every problem is a 400 with a
// message and the field at fault: malformed JSON, not an object, an unknown
// field, a wrong type, a value out of range, a token id outside the
// vocabulary, a text prompt without a tokenizer, or prompt + max_tokens - 1
// positions beyond the context (code "context_length_exceeded"). A text
// longer than the context could hold even at the longest token's bytes per
// token is refused before it is tokenized: a megabyte of prompt costs no
// tokenizer time.
ParsedCompletion parse_completion_request(std::string_view body, const ServedModel& model);  // /v1/completions
ParsedCompletion parse_chat_request(std::string_view body, const ServedModel& model);        // /v1/chat/completions

// GET /v1/models: {"object": "list", "data": [{"id": name, "object": "model",
// "created": created_s, "owned_by": "llm-inference-course"}]}.
std::string models_json(const ServedModel& model);

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

// Stop strings, checked on the decoded text: the text ends just before the
// first occurrence of any of them (the stop string itself is not sent), and
// the choice finishes with "stop". Text arrives piece by piece; an end of it
// that could still grow into a stop string ("Th" with stop "The") is held
// back until the next pieces show whether it does. Stop strings are valid
// UTF-8, so a match starts at a character boundary and what is held back
// never splits a character.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stop);  // empty: never stops, holds nothing back
  struct Output {
    std::string text;      // what can be sent now
    bool stopped = false;  // a stop string matched: `text` ends before it, and nothing follows
  };
  Output feed(std::string_view piece);
  std::string flush();  // the choice ended without a stop: what is still held back

 private:
  std::vector<std::string> stop_;
  std::string held_back_;  // the end of the text that may be the start of a stop string
};

// Identifies one completion in every response and event about it.
struct CompletionId {
  Endpoint endpoint = Endpoint::Completions;
  int request_id = 0;          // "cmpl-<request_id>", "chatcmpl-<request_id>"
  std::int64_t created_s = 0;  // unix time the request was received
};

// One generated token's log-probabilities as the answer reports them: by
// text, as the decoded pieces (the tokenizer's decode(previous, token)); by
// the token id's "<id>" where the model has no tokenizer.
struct LoggedToken {
  std::string text;
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;  // [k] most likely first
};
// `previous` is the token before `token` in the sequence.
LoggedToken logged_token(const ServedModel& model, int previous, const TokenLogprobs& logprobs, int token);

// What an answer says about one choice: all of it (a whole answer), or what
// one chunk of a stream adds.
struct ChoiceDelta {
  int index = 0;                             // the choice (0..n-1)
  std::string text;                          // text added (after stop strings cut it)
  std::size_t text_offset = 0;               // bytes of the choice's text before `text` (sent in earlier
                                             // chunks): where the completions logprobs' text_offset counts from
  std::vector<int> tokens;                   // token ids added
  std::vector<LoggedToken> logprobs;         // [tokens] when the request asked for logprobs
  FinishReason finish = FinishReason::None;  // None until the choice's end
  bool first = false;                        // a chat stream's first chunk of the choice: "role": "assistant"

  // A whole answer's choice grows by each of its deltas in turn.
  void append(const ChoiceDelta& later);
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;  // every choice's, counted to the token that ended it
};

// The whole answer: "choices" in index order, and "usage".
// `with_logprobs`: each choice has a "logprobs" object (else null).
std::string completion_json(const ServedModel& model, const CompletionId& id, std::span<const ChoiceDelta> choices,
                            const Usage& usage, bool with_logprobs);

// Server-sent events of a streaming response: a chunk ("data: {...}\n\n")
// of one choice; with include_usage ("usage": null in every chunk) the last
// chunk, with no choices and the usage; an error event when the request fails
// mid-stream; and the end of the stream.
std::string chunk_event(const ServedModel& model, const CompletionId& id, const ChoiceDelta& delta,
                        bool with_logprobs, bool include_usage);
std::string usage_event(const ServedModel& model, const CompletionId& id, const Usage& usage);
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
