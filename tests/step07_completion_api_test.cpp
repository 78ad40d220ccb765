// Step 07's OpenAI wire format without a server (completion_api.hpp): both
// endpoints' requests read field by field into a CompletionRequest, or
// refused with OpenAI's error shape naming the field; a prompt too long for
// the context refused before it is tokenized; the chat template; stop
// strings matched across pieces; logged tokens; and the JSON of answers,
// chunks and the usage event, parsed back and checked field by field.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "llm/tokenizer.hpp"
#include "step07_batching/request.hpp"
#include "step07_batching/serve/completion_api.hpp"
#include "test_support.hpp"

namespace {

using Json = nlohmann::json;
using llm::testing::HasSubstr;
using step07::ApiError;
using step07::ChoiceDelta;
using step07::CompletionRequest;
using step07::Endpoint;
using step07::FinishReason;
using step07::ParsedCompletion;

// The built-in byte-level tokenizer: id 3 + b is the byte b, every piece is
// "<0xXX>" (6 bytes), and it has no " " token (so no dummy prefix).
const llm::Tokenizer& byte_tokenizer() {
  static const llm::Tokenizer tokenizer = llm::Tokenizer::byte_level(512);
  return tokenizer;
}

// The tiny preset as the server serves it: 512 tokens of vocabulary and of context, 4 slots.
step07::ServedModel served(const llm::Tokenizer* tokenizer = &byte_tokenizer()) {
  step07::ServedModel model;
  model.name = "preset tiny";
  model.vocab_size = 512;
  model.context_length = 512;
  model.max_choices = 4;
  model.created_s = 1700000000;
  model.tokenizer = tokenizer;
  return model;
}

ParsedCompletion parse(Endpoint endpoint, const std::string& body, const step07::ServedModel& model = served()) {
  return endpoint == Endpoint::Completions ? step07::parse_completion_request(body, model)
                                           : step07::parse_chat_request(body, model);
}

// The request `body` parses into; a test failure (and a default request) when it is refused.
CompletionRequest accepted(Endpoint endpoint, const std::string& body, const step07::ServedModel& model = served()) {
  const ParsedCompletion parsed = parse(endpoint, body, model);
  if (const auto* error = std::get_if<ApiError>(&parsed)) {
    ADD_FAILURE() << body << " was refused: " << error->message;
    return {};
  }
  return std::get<CompletionRequest>(parsed);
}

// The error `body` is refused with; a test failure when it is accepted.
ApiError refused(Endpoint endpoint, const std::string& body, const step07::ServedModel& model = served()) {
  const ParsedCompletion parsed = parse(endpoint, body, model);
  if (std::holds_alternative<CompletionRequest>(parsed)) {
    ADD_FAILURE() << body << " was accepted";
    return {0, "accepted", "", ""};
  }
  return std::get<ApiError>(parsed);
}

// ---------------------------------------------------------------- requests

TEST(Step07ApiRequest, AMinimalRequestTakesEveryDefault) {
  for (const auto& [endpoint, body] :
       {std::pair{Endpoint::Completions, std::string(R"({"prompt": [1, 5]})")},
        std::pair{Endpoint::ChatCompletions, std::string(R"({"messages": [{"role": "user", "content": "a"}]})")}}) {
    const CompletionRequest request = accepted(endpoint, body);
    EXPECT_EQ(request.endpoint, endpoint);
    EXPECT_EQ(request.max_tokens, 16);
    EXPECT_EQ(request.sampling.temperature, 0.0f);
    EXPECT_EQ(request.sampling.top_p, 0.9f);
    EXPECT_EQ(request.sampling.seed, 0u);
    EXPECT_EQ(request.n, 1);
    EXPECT_TRUE(request.stop.empty());
    EXPECT_EQ(request.top_logprobs, -1);
    EXPECT_FALSE(request.stream);
    EXPECT_FALSE(request.include_usage);
  }
  EXPECT_EQ(accepted(Endpoint::Completions, R"({"prompt": [1, 5]})").prompt, (std::vector<int>{1, 5}));
}

TEST(Step07ApiRequest, CompletionsReadsEveryField) {
  const CompletionRequest request = accepted(Endpoint::Completions, R"({
      "model": "anything", "prompt": "ab", "max_tokens": 7, "temperature": 0.5, "top_p": 0.25,
      "seed": 42, "n": 3, "stop": ["x", "yz"], "stream": true, "stream_options": {"include_usage": true},
      "logprobs": 2, "user": "someone"})");
  EXPECT_EQ(request.prompt, (std::vector<int>{llm::Tokenizer::kBos, 3 + 'a', 3 + 'b'}));
  EXPECT_EQ(request.max_tokens, 7);
  EXPECT_EQ(request.sampling.temperature, 0.5f);
  EXPECT_EQ(request.sampling.top_p, 0.25f);
  EXPECT_EQ(request.sampling.seed, 42u);
  EXPECT_EQ(request.n, 3);
  EXPECT_EQ(request.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(request.stream);
  EXPECT_TRUE(request.include_usage);
  EXPECT_EQ(request.top_logprobs, 2);
}

TEST(Step07ApiRequest, ChatReadsEveryField) {
  const CompletionRequest request = accepted(Endpoint::ChatCompletions, R"({
      "model": "anything", "messages": [{"role": "system", "content": "a", "name": "narrator"},
                                        {"role": "user", "content": [{"type": "text", "text": "b"}]}],
      "max_completion_tokens": 9, "temperature": 1.5, "top_p": 1, "seed": 3, "n": 4, "stop": "z",
      "stream": true, "stream_options": {"include_usage": false}, "logprobs": true, "top_logprobs": 20,
      "user": "someone"})");
  // The template joins the contents with a newline: "a\nb".
  EXPECT_EQ(request.prompt, (std::vector<int>{llm::Tokenizer::kBos, 3 + 'a', 3 + '\n', 3 + 'b'}));
  EXPECT_EQ(request.max_tokens, 9);
  EXPECT_EQ(request.sampling.temperature, 1.5f);
  EXPECT_EQ(request.sampling.top_p, 1.0f);
  EXPECT_EQ(request.sampling.seed, 3u);
  EXPECT_EQ(request.n, 4);
  EXPECT_EQ(request.stop, (std::vector<std::string>{"z"}));
  EXPECT_TRUE(request.stream);
  EXPECT_FALSE(request.include_usage);
  EXPECT_EQ(request.top_logprobs, 20);
}

TEST(Step07ApiRequest, NullMeansTheDefault) {
  const std::string nulls = R"("model": null, "max_tokens": null, "temperature": null, "top_p": null,
      "seed": null, "n": null, "stop": null, "stream": null, "stream_options": null, "logprobs": null,
      "user": null)";
  for (const CompletionRequest& request :
       {accepted(Endpoint::Completions, R"({"prompt": [1], )" + nulls + "}"),
        accepted(Endpoint::ChatCompletions, R"({"messages": [{"role": "user", "content": "a"}],
            "max_completion_tokens": null, "top_logprobs": null, )" + nulls + "}")}) {
    EXPECT_EQ(request.max_tokens, 16);
    EXPECT_EQ(request.sampling.temperature, 0.0f);
    EXPECT_EQ(request.sampling.top_p, 0.9f);
    EXPECT_EQ(request.n, 1);
    EXPECT_TRUE(request.stop.empty());
    EXPECT_EQ(request.top_logprobs, -1);
    EXPECT_FALSE(request.stream);
  }
  // Inside stream_options too.
  EXPECT_FALSE(accepted(Endpoint::Completions,
                        R"({"prompt": [1], "stream": true, "stream_options": {"include_usage": null}})")
                   .include_usage);
}

TEST(Step07ApiRequest, TheTwoNamesOfMaxTokensMustAgree) {
  const std::string messages = R"("messages": [{"role": "user", "content": "a"}])";
  EXPECT_EQ(accepted(Endpoint::ChatCompletions, "{" + messages + R"(, "max_tokens": 5})").max_tokens, 5);
  EXPECT_EQ(accepted(Endpoint::ChatCompletions, "{" + messages + R"(, "max_completion_tokens": 6})").max_tokens, 6);
  EXPECT_EQ(accepted(Endpoint::ChatCompletions,
                     "{" + messages + R"(, "max_tokens": 7, "max_completion_tokens": 7})")
                .max_tokens,
            7);
  const ApiError error =
      refused(Endpoint::ChatCompletions, "{" + messages + R"(, "max_tokens": 7, "max_completion_tokens": 8})");
  EXPECT_EQ(error.param, "max_completion_tokens");
  EXPECT_TRUE(HasSubstr(error.message, "disagree"));
}

TEST(Step07ApiRequest, ChatLogprobsIsABoolAndTopLogprobsItsCount) {
  const std::string messages = R"("messages": [{"role": "user", "content": "a"}])";
  EXPECT_EQ(accepted(Endpoint::ChatCompletions, "{" + messages + R"(, "logprobs": true})").top_logprobs, 0);
  EXPECT_EQ(accepted(Endpoint::ChatCompletions, "{" + messages + R"(, "logprobs": true, "top_logprobs": 3})")
                .top_logprobs,
            3);
  EXPECT_EQ(accepted(Endpoint::ChatCompletions, "{" + messages + R"(, "logprobs": false})").top_logprobs, -1);
  EXPECT_EQ(accepted(Endpoint::Completions, R"({"prompt": [1], "logprobs": 0})").top_logprobs, 0);
  EXPECT_EQ(accepted(Endpoint::Completions, R"({"prompt": [1], "logprobs": 5})").top_logprobs, 5);
}

// Every way a request can be wrong: a 400 whose param names the field at
// fault, whose message says what is wrong, and a code where OpenAI has one.
TEST(Step07ApiRequest, EveryProblemIsA400NamingItsField) {
  struct Case {
    Endpoint endpoint;
    std::string body;
    std::string param;
    std::string message_part;
    std::string code = "";
  };
  const Endpoint completions = Endpoint::Completions;
  const Endpoint chat = Endpoint::ChatCompletions;
  const std::string user = R"("messages": [{"role": "user", "content": "a"}])";
  const std::vector<Case> cases = {
      // The body.
      {completions, R"({"prompt": [1)", "", "not valid JSON"},
      {chat, "", "", "not valid JSON"},
      {completions, "[1, 2]", "", "must be a JSON object, not array"},
      // Unknown fields, and the other endpoint's.
      {completions, R"({"prompt": [1], "max_token": 5})", "max_token", "unknown field 'max_token'"},
      {completions, R"({"prompt": [1], "max_token": 5})", "max_token", "/v1/completions reads model, prompt,"},
      {chat, "{" + user + R"(, "frequency_penalty": 0})", "frequency_penalty", "/v1/chat/completions reads"},
      {completions, R"({"prompt": [1], "messages": []})", "messages", "a field of /v1/chat/completions"},
      {chat, "{" + user + R"(, "prompt": "a"})", "prompt", "a field of /v1/completions, not of /v1/chat"},
      {completions, R"({"prompt": [1], "top_logprobs": 2})", "top_logprobs", "a field of /v1/chat/completions"},
      // Missing or null required fields.
      {completions, R"({"max_tokens": 3})", "prompt", "prompt is missing"},
      {chat, R"({"max_tokens": 3})", "messages", "messages is missing"},
      {completions, R"({"prompt": null})", "prompt", "a string or an array of token ids (got null)"},
      {chat, R"({"messages": null})", "messages", "non-empty array"},
      // The prompt.
      {completions, R"({"prompt": []})", "prompt", "empty array"},
      {completions, R"({"prompt": [1, 2.5]})", "prompt[1]", "prompt[1] is 2.5, not a token id"},
      {completions, R"({"prompt": [1, 512]})", "prompt[1]", "out of range [0, 512)"},
      {completions, R"({"prompt": [1, -1]})", "prompt[1]", "out of range"},
      {completions, R"({"prompt": [5, 6]})", "prompt[0]", "must start with BOS"},
      {completions, R"({"prompt": [[1, 2]]})", "prompt[0]", "is an array, not a token id"},
      {completions, R"({"prompt": {"text": "a"}})", "prompt", "(got an object)"},
      // Messages.
      {chat, R"({"messages": []})", "messages", "(got an empty array)"},
      {chat, R"({"messages": "hello"})", "messages", R"((got "hello"))"},
      {chat, R"({"messages": [{"role": "user", "content": "a"}, 7]})", "messages[1]", "must be an object"},
      {chat, R"({"messages": [{"content": "a"}]})", "messages[0].role", "messages[0].role is missing"},
      {chat, R"({"messages": [{"role": "user"}]})", "messages[0].content", "messages[0].content is missing"},
      {chat, R"({"messages": [{"role": "tool", "content": "a"}]})", "messages[0].role", R"((got "tool"))"},
      {chat, R"({"messages": [{"role": 1, "content": "a"}]})", "messages[0].role", "\"assistant\" (got 1)"},
      {chat, R"({"messages": [{"role": "user", "content": null}]})", "messages[0].content", "(got null)"},
      {chat, R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content", "array of text parts"},
      {chat, R"({"messages": [{"role": "user", "content": "a", "tool_calls": []}]})", "messages[0].tool_calls",
       "unknown field 'tool_calls' in messages[0]"},
      {chat, R"({"messages": [{"role": "user", "content": "a", "name": 3}]})", "messages[0].name",
       "must be a string"},
      {chat,
       R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text",
           "text": "b"}, {"type": "image_url", "image_url": {"url": "http://x"}}]}]})",
       "messages[1].content[1].type", "text parts only"},
      {chat, R"({"messages": [{"role": "user", "content": [{"text": "b"}]}]})", "messages[0].content[0].type",
       "is missing"},
      {chat, R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages[0].content[0].text",
       "is missing"},
      {chat, R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})",
       "messages[0].content[0].text", "must be a string"},
      {chat, R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "cache": 1}]}]})",
       "messages[0].content[0].cache", "unknown field 'cache'"},
      {chat, R"({"messages": [{"role": "user", "content": ["a"]}]})", "messages[0].content[0]", "must be an object"},
      // Numbers.
      {completions, R"({"prompt": [1], "max_tokens": "5"})", "max_tokens", "must be an integer (got \"5\")"},
      {completions, R"({"prompt": [1], "max_tokens": 0})", "max_tokens", "at least 1 (got 0)"},
      {completions, R"({"prompt": [1], "max_tokens": 100000000000000000000})", "max_tokens", "integer"},
      {chat, "{" + user + R"(, "max_completion_tokens": -2})", "max_completion_tokens", "at least 1 (got -2)"},
      {completions, R"({"prompt": [1], "temperature": -0.5})", "temperature", ">= 0"},
      {completions, R"({"prompt": [1], "temperature": 1e300})", "temperature", "1e+300"},
      {completions, R"({"prompt": [1], "temperature": "hot"})", "temperature", ">= 0"},
      {completions, R"({"prompt": [1], "top_p": 0})", "top_p", "(0, 1]"},
      {completions, R"({"prompt": [1], "top_p": 1e-50})", "top_p", "(0, 1]"},
      {completions, R"({"prompt": [1], "top_p": 1.5})", "top_p", "(0, 1]"},
      {completions, R"({"prompt": [1], "seed": -1})", "seed", "unsigned integer"},
      {completions, R"({"prompt": [1], "seed": 1.5})", "seed", "unsigned integer"},
      {completions, R"({"prompt": [1], "n": 0})", "n", "from 1 to 4 (got 0)"},
      {completions, R"({"prompt": [1], "n": 5})", "n", "a cache slot of its own, and this server has 4"},
      {chat, "{" + user + R"(, "n": "2"})", "n", "integer"},
      // Stop strings.
      {completions, R"({"prompt": [1], "stop": ""})", "stop", "non-empty string"},
      {completions, R"({"prompt": [1], "stop": 7})", "stop", "up to 4 strings (got 7)"},
      {completions, R"({"prompt": [1], "stop": ["a", "b", "c", "d", "e"]})", "stop", "(got 5 in an array)"},
      {completions, R"({"prompt": [1], "stop": ["a", "b", 3]})", "stop[2]", "non-empty string (got 3)"},
      {chat, "{" + user + R"(, "stop": ["a", ""]})", "stop[1]", "non-empty string"},
      {completions, R"({"prompt": [1], "stop": ")" + std::string(257, 's') + R"("})", "stop",
       "257 bytes; a stop string has 256 at most"},
      // Streaming.
      {completions, R"({"prompt": [1], "stream": 1})", "stream", "true or false"},
      {completions, R"({"prompt": [1], "stream_options": {"include_usage": true}})", "stream_options",
       "only allowed with \"stream\": true"},
      {chat, "{" + user + R"(, "stream": false, "stream_options": {}})", "stream_options", "only allowed"},
      {completions, R"({"prompt": [1], "stream": true, "stream_options": true})", "stream_options",
       "must be an object"},
      {completions, R"({"prompt": [1], "stream": true, "stream_options": {"include_usage": 1}})",
       "stream_options.include_usage", "true or false"},
      {completions, R"({"prompt": [1], "stream": true, "stream_options": {"continuous_usage": true}})",
       "stream_options.continuous_usage", "unknown field"},
      // Log-probabilities.
      {completions, R"({"prompt": [1], "logprobs": 6})", "logprobs", "from 0 to 5 (got 6)"},
      {completions, R"({"prompt": [1], "logprobs": true})", "logprobs", "must be an integer"},
      {chat, "{" + user + R"(, "logprobs": 2})", "logprobs", "true or false"},
      {chat, "{" + user + R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs", "from 0 to 20 (got 21)"},
      {chat, "{" + user + R"(, "top_logprobs": 2})", "top_logprobs", "needs \"logprobs\": true"},
      {chat, "{" + user + R"(, "logprobs": false, "top_logprobs": 2})", "top_logprobs", "needs"},
      // Strings accepted and ignored, but strings.
      {completions, R"({"prompt": [1], "model": 3})", "model", "model must be a string"},
      {chat, "{" + user + R"(, "user": {}})", "user", "user must be a string; got an object"},
      // The context, whatever the order of the fields.
      {completions, R"({"max_tokens": 511, "prompt": [1, 2, 3]})", "prompt",
       "prompt of 3 tokens + max_tokens 511 needs 513 positions; the context is 512", "context_length_exceeded"},
      {completions, R"({"prompt": [1], "max_tokens": 9000000000})", "prompt", "the context is 512",
       "context_length_exceeded"},
      {chat, "{" + user + R"(, "max_tokens": 512})", "messages", "is at least 2 tokens", "context_length_exceeded"},
  };
  for (const Case& c : cases) {
    const ApiError error = refused(c.endpoint, c.body);
    EXPECT_EQ(error.status, 400) << c.body;
    EXPECT_EQ(error.param, c.param) << c.body << ": " << error.message;
    EXPECT_TRUE(HasSubstr(error.message, c.message_part)) << c.body;
    EXPECT_EQ(error.code, c.code) << c.body;
  }
}

TEST(Step07ApiRequest, TextNeedsATokenizer) {
  const step07::ServedModel ids_only = served(nullptr);
  EXPECT_EQ(accepted(Endpoint::Completions, R"({"prompt": [1, 7]})", ids_only).prompt, (std::vector<int>{1, 7}));
  const ApiError text = refused(Endpoint::Completions, R"({"prompt": "Once"})", ids_only);
  EXPECT_EQ(text.param, "prompt");
  EXPECT_TRUE(HasSubstr(text.message, "no tokenizer"));
  const ApiError chat = refused(Endpoint::ChatCompletions, R"({"messages": [{"role": "user", "content": "a"}]})",
                                ids_only);
  EXPECT_EQ(chat.param, "messages");
  EXPECT_TRUE(HasSubstr(chat.message, "no tokenizer"));
  // An empty vocabulary is no tokenizer either.
  const llm::Tokenizer empty;
  EXPECT_EQ(refused(Endpoint::Completions, R"({"prompt": "Once"})", served(&empty)).param, "prompt");
}

// ---------------------------------------------------------------- prompt size

TEST(Step07ApiRequest, MaxPieceBytesBoundsTheTokensOfAnyText) {
  EXPECT_EQ(byte_tokenizer().max_piece_bytes(), 6);  // "<0x00>" and "\n</s>\n"
  std::vector<const llm::Tokenizer*> tokenizers = {&byte_tokenizer()};
  std::optional<llm::Tokenizer> real;
  if (const auto path = llm::testing::model_file("tok512.bin")) {
    real = llm::Tokenizer::load(*path, 512);
    EXPECT_EQ(real->max_piece_bytes(), 7);
    tokenizers.push_back(&*real);
  }
  const std::vector<std::string> texts = {"", "a", "Once upon a time, there was a little girl named Lily.",
                                          "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", std::string(300, ' '),
                                          std::string(1000, 'e')};
  for (const llm::Tokenizer* tokenizer : tokenizers)
    for (const std::string& text : texts) {
      const auto tokens = static_cast<long long>(tokenizer->encode(text, false, false).size());
      const long long bound = (static_cast<long long>(text.size()) + tokenizer->max_piece_bytes() - 1) /
                              tokenizer->max_piece_bytes();
      EXPECT_GE(tokens, bound) << text.size() << " bytes";
    }
}

TEST(Step07ApiRequest, AMegabyteOfPromptIsRefusedWithoutTokenizingIt) {
  const std::string megabyte(1 << 20, 'a');
  for (const Endpoint endpoint : {Endpoint::Completions, Endpoint::ChatCompletions}) {
    const std::string body =
        endpoint == Endpoint::Completions
            ? Json{{"prompt", megabyte}}.dump()
            : Json{{"messages", {{{"role", "user"}, {"content", megabyte}}}}}.dump();
    const ApiError error = refused(endpoint, body);
    // The bound's message (bytes), not the exact check's (tokens): the text
    // was never encoded. (What that saves is time, which a test does not
    // measure: the refusal's cost is reading the JSON.)
    EXPECT_TRUE(HasSubstr(error.message, "a prompt of 1048576 bytes is at least 174764 tokens")) << error.message;
    EXPECT_EQ(error.code, "context_length_exceeded");
    EXPECT_EQ(error.param, endpoint == Endpoint::Completions ? "prompt" : "messages");
  }
}

TEST(Step07ApiRequest, TheBoundRefusesOnlyWhatCannotFitAndTheTokensDecideTheRest) {
  // The byte-level tokenizer: 6 bytes per token at most, one token per byte
  // in fact. With max_tokens 1, BOS + ceil(bytes / 6) <= 512 passes the
  // bound: 3066 bytes do, and are refused once encoded (3067 tokens); 3067
  // bytes are refused by the bound.
  const auto body = [](std::size_t bytes) {
    return Json{{"prompt", std::string(bytes, 'a')}, {"max_tokens", 1}}.dump();
  };
  EXPECT_TRUE(HasSubstr(refused(Endpoint::Completions, body(3066)).message, "prompt of 3067 tokens"));
  EXPECT_TRUE(HasSubstr(refused(Endpoint::Completions, body(3067)).message, "a prompt of 3067 bytes"));
  // What fits is encoded as the tokenizer encodes it: BOS, then the text.
  EXPECT_EQ(accepted(Endpoint::Completions, body(511)).prompt.size(), 512u);
  EXPECT_TRUE(HasSubstr(refused(Endpoint::Completions, body(512)).message, "prompt of 513 tokens"));
}

TEST(Step07ApiRequest, ATextPromptIsTheRealTokenizersEncoding) {
  LLM_REQUIRE_MODEL_FILE(tokenizer_path, "tok512.bin");
  const llm::Tokenizer tokenizer = llm::Tokenizer::load(tokenizer_path, 512);
  const step07::ServedModel model = served(&tokenizer);
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const CompletionRequest request =
      accepted(Endpoint::Completions, Json{{"prompt", text}, {"max_tokens", 40}}.dump(), model);
  EXPECT_EQ(request.prompt, tokenizer.encode(text, /*add_bos=*/true, /*add_eos=*/false));
  EXPECT_LT(request.prompt.size(), text.size());  // merged: fewer tokens than bytes
  // A prompt of a few kilobytes passes the bound (7 bytes per token) and is
  // refused by its real length, as the message in tokens says.
  std::string story;
  while (story.size() < 3000) story += text + " ";
  EXPECT_TRUE(HasSubstr(refused(Endpoint::Completions, Json{{"prompt", story}}.dump(), model).message,
                        " tokens + max_tokens 16 needs"));
}

// ---------------------------------------------------------------- chat

TEST(Step07ChatTemplate, ContentsJoinedByANewlineRolesDropped) {
  using step07::ChatMessage;
  EXPECT_EQ(step07::chat_prompt(std::vector<ChatMessage>{{"user", "Once upon a time"}}), "Once upon a time");
  EXPECT_EQ(step07::chat_prompt(std::vector<ChatMessage>{
                {"system", "Tell a story."}, {"user", "Once upon"}, {"assistant", "a time"}}),
            "Tell a story.\nOnce upon\na time");
  EXPECT_EQ(step07::chat_prompt(std::vector<ChatMessage>{{"developer", ""}, {"user", "x"}}), "\nx");
  EXPECT_EQ(step07::chat_prompt({}), "");
}

TEST(Step07ChatTemplate, OneUserMessageIsTheCompletionsPromptOfItsText) {
  LLM_REQUIRE_MODEL_FILE(tokenizer_path, "tok512.bin");
  const llm::Tokenizer tokenizer = llm::Tokenizer::load(tokenizer_path, 512);
  for (const step07::ServedModel& model : {served(), served(&tokenizer)}) {
    const std::vector<int> completion =
        accepted(Endpoint::Completions, R"({"prompt": "Once upon a time"})", model).prompt;
    EXPECT_EQ(accepted(Endpoint::ChatCompletions,
                       R"({"messages": [{"role": "user", "content": "Once upon a time"}]})", model)
                  .prompt,
              completion);
    // Text parts are concatenated into the message's content.
    EXPECT_EQ(accepted(Endpoint::ChatCompletions, R"({"messages": [{"role": "user", "content": [
                  {"type": "text", "text": "Once upon"}, {"type": "text", "text": " a time"}]}]})",
                       model)
                  .prompt,
              completion);
    EXPECT_EQ(completion.front(), llm::Tokenizer::kBos);
    EXPECT_NE(completion.back(), llm::Tokenizer::kEos);
  }
}

// ---------------------------------------------------------------- stop strings

// The pieces `matcher` lets out for `pieces`, joined, and whether it stopped;
// flushed at the end when it did not.
std::pair<std::string, bool> run_matcher(step07::StopMatcher matcher, const std::vector<std::string>& pieces) {
  std::string text;
  for (const std::string& piece : pieces) {
    const step07::StopMatcher::Output out = matcher.feed(piece);
    text += out.text;
    if (out.stopped) return {text, true};
  }
  return {text + matcher.flush(), false};
}

TEST(Step07StopMatcher, WithoutStopStringsEveryPiecePassesAtOnce) {
  step07::StopMatcher matcher({});
  EXPECT_EQ(matcher.feed("The").text, "The");
  EXPECT_EQ(matcher.feed(" end").text, " end");
  EXPECT_EQ(matcher.flush(), "");
  // Empty stop strings are ignored: one would match before any text.
  EXPECT_EQ(run_matcher(step07::StopMatcher({""}), {"a", "b"}), (std::pair<std::string, bool>{"ab", false}));
}

TEST(Step07StopMatcher, AStopStringCutAcrossPiecesIsHeldBackThenCut) {
  step07::StopMatcher matcher({"The end"});
  step07::StopMatcher::Output out = matcher.feed("and Th");
  EXPECT_EQ(out.text, "and ");  // "Th" may begin "The end"
  EXPECT_FALSE(out.stopped);
  out = matcher.feed("e e");
  EXPECT_EQ(out.text, "");
  EXPECT_FALSE(out.stopped);
  out = matcher.feed("nd. More");
  EXPECT_EQ(out.text, "");  // the stop string and all after it are dropped
  EXPECT_TRUE(out.stopped);
}

TEST(Step07StopMatcher, AHeldBackStartThatDoesNotMatchIsReleased) {
  step07::StopMatcher matcher({"The end"});
  EXPECT_EQ(matcher.feed("Th").text, "");
  EXPECT_EQ(matcher.feed("e").text, "");
  const step07::StopMatcher::Output out = matcher.feed("re was");
  EXPECT_EQ(out.text, "There was");
  EXPECT_FALSE(out.stopped);
  // Overlapping starts: "aa" held, then "aab" completes at the second 'a'.
  EXPECT_EQ(run_matcher(step07::StopMatcher({"aab"}), {"xaa", "aab"}), (std::pair<std::string, bool>{"xaa", true}));
  EXPECT_EQ(run_matcher(step07::StopMatcher({"aab"}), {"xaa", "ac"}), (std::pair<std::string, bool>{"xaaac", false}));
}

TEST(Step07StopMatcher, TheEarliestOfSeveralStopStringsWins) {
  EXPECT_EQ(run_matcher(step07::StopMatcher({"cat", "dog"}), {"a dog and a cat"}),
            (std::pair<std::string, bool>{"a ", true}));
  EXPECT_EQ(run_matcher(step07::StopMatcher({"cat", "dog"}), {"a cat and a dog"}),
            (std::pair<std::string, bool>{"a ", true}));
  // One stop string held back while another completes in the same text.
  EXPECT_EQ(run_matcher(step07::StopMatcher({"Lily", "ly."}), {"sadly.", " Lily"}),
            (std::pair<std::string, bool>{"sad", true}));
  // A stop string at the very start leaves no text.
  EXPECT_EQ(run_matcher(step07::StopMatcher({"\n"}), {"\nOnce"}), (std::pair<std::string, bool>{"", true}));
}

TEST(Step07StopMatcher, FlushReleasesWhatIsHeldBackWhenTheChoiceEnds) {
  step07::StopMatcher matcher({"The end", "\xC3\xA9t\xC3\xA9"});  // "été": a match starts at a character
  EXPECT_EQ(matcher.feed("abc The e").text, "abc ");
  EXPECT_EQ(matcher.flush(), "The e");
  EXPECT_EQ(matcher.feed("un \xC3\xA9t").text, "un ");  // held back whole characters
  EXPECT_EQ(matcher.flush(), "\xC3\xA9t");
  EXPECT_EQ(matcher.flush(), "");
}

// ---------------------------------------------------------------- logged tokens

TEST(Step07LoggedToken, TokensAndAlternativesAsTheirDecodedText) {
  const step07::ServedModel model = served();
  const step07::TokenLogprobs logprobs{-0.25f, {{3 + 'b', -0.125f}, {3 + 'a', -2.5f}}};
  const step07::LoggedToken logged = step07::logged_token(model, llm::Tokenizer::kBos, logprobs, 3 + 'a');
  EXPECT_EQ(logged.text, "a");
  EXPECT_EQ(logged.logprob, -0.25f);
  EXPECT_EQ(logged.top, (std::vector<std::pair<std::string, float>>{{"b", -0.125f}, {"a", -2.5f}}));
  // Without a tokenizer, by id.
  const step07::LoggedToken by_id = step07::logged_token(served(nullptr), 1, logprobs, 9);
  EXPECT_EQ(by_id.text, "<9>");
  EXPECT_EQ(by_id.top[0].first, "<101>");
  EXPECT_EQ(by_id.top[1].first, "<100>");
}

TEST(Step07LoggedToken, TheRealTokenizerDropsTheDummySpaceAfterBos) {
  LLM_REQUIRE_MODEL_FILE(tokenizer_path, "tok512.bin");
  const llm::Tokenizer tokenizer = llm::Tokenizer::load(tokenizer_path, 512);
  const std::vector<int> once = tokenizer.encode("Once upon", false, false);  // the dummy " " merged in
  ASSERT_GE(once.size(), 2u);
  const step07::TokenLogprobs logprobs{-1.0f, {{once[1], -0.5f}}};
  const step07::LoggedToken first = step07::logged_token(served(&tokenizer), llm::Tokenizer::kBos, logprobs, once[0]);
  EXPECT_EQ(first.text, tokenizer.decode(llm::Tokenizer::kBos, once[0]));
  EXPECT_NE(first.text.front(), ' ');
  EXPECT_EQ(first.top[0].first, tokenizer.decode(llm::Tokenizer::kBos, once[1]));
  const step07::LoggedToken later = step07::logged_token(served(&tokenizer), once[0], logprobs, once[1]);
  EXPECT_EQ(later.text, tokenizer.decode(once[0], once[1]));
  EXPECT_EQ(later.text.front(), ' ');  // " upon" (or its start): mid-text, the space stays
}

// ---------------------------------------------------------------- responses

TEST(Step07ApiResponse, ModelsListsTheOneModel) {
  const Json models = Json::parse(step07::models_json(served()));
  EXPECT_EQ(models.at("object"), "list");
  ASSERT_EQ(models.at("data").size(), 1u);
  const Json& model = models["data"][0];
  EXPECT_EQ(model.at("id"), "preset tiny");
  EXPECT_EQ(model.at("object"), "model");
  EXPECT_EQ(model.at("created"), 1700000000);
  EXPECT_EQ(model.at("owned_by"), "llm-inference-course");
}

TEST(Step07ApiResponse, ErrorsHaveOpenAisShape) {
  const Json with_all = Json::parse(step07::error_json({400, "too long", "messages", "context_length_exceeded"}));
  ASSERT_TRUE(with_all.contains("error"));
  const Json& error = with_all["error"];
  EXPECT_EQ(error.size(), 4u);
  EXPECT_EQ(error.at("message"), "too long");
  EXPECT_EQ(error.at("type"), "invalid_request_error");
  EXPECT_EQ(error.at("param"), "messages");
  EXPECT_EQ(error.at("code"), "context_length_exceeded");
  const Json bare = Json::parse(step07::error_json({500, "the device fell off the bus", "", ""}))["error"];
  EXPECT_TRUE(bare.at("param").is_null());
  EXPECT_TRUE(bare.at("code").is_null());
  EXPECT_EQ(bare.at("type"), "server_error");
  EXPECT_EQ(step07::error_type(404), "invalid_request_error");
  EXPECT_EQ(step07::error_type(405), "invalid_request_error");
  EXPECT_EQ(step07::error_type(413), "invalid_request_error");
  EXPECT_EQ(step07::error_type(503), "server_error");
  // As a stream's last event.
  const std::string event = step07::error_event({400, "bad", "n", ""});
  ASSERT_TRUE(event.starts_with("data: ") && event.ends_with("\n\n")) << event;
  EXPECT_EQ(Json::parse(event.substr(6))["error"].at("param"), "n");
}

// Two choices of a completion with logprobs: "Hi" (tokens 'H' 'i', stopped)
// and "yo!" (three tokens, at the length limit).
std::vector<ChoiceDelta> two_choices() {
  ChoiceDelta first;
  first.index = 0;
  first.text = "Hi";
  first.tokens = {3 + 'H', 3 + 'i'};
  first.logprobs = {{"H", -0.5f, {{"H", -0.5f}, {"h", -1.5f}}}, {"i", -0.25f, {{"i", -0.25f}, {"o", -2.0f}}}};
  first.finish = FinishReason::Stop;
  ChoiceDelta second;
  second.index = 1;
  second.text = "yo!";
  second.tokens = {3 + 'y', 3 + 'o', 3 + '!'};
  second.logprobs = {{"y", -1.0f, {}}, {"o", -1.0f, {}}, {"!", -3.0f, {}}};
  second.finish = FinishReason::Length;
  return {first, second};
}

TEST(Step07ApiResponse, ACompletionAnswerHasEveryField) {
  const step07::CompletionId id{Endpoint::Completions, 7, 1700000123};
  const std::vector<ChoiceDelta> choices = two_choices();
  const Json answer = Json::parse(step07::completion_json(served(), id, choices, {5, 5}, /*with_logprobs=*/true));
  EXPECT_EQ(answer.at("id"), "cmpl-7");
  EXPECT_EQ(answer.at("object"), "text_completion");
  EXPECT_EQ(answer.at("created"), 1700000123);
  EXPECT_EQ(answer.at("model"), "preset tiny");
  EXPECT_EQ(answer.at("usage"), (Json{{"prompt_tokens", 5}, {"completion_tokens", 5}, {"total_tokens", 10}}));
  ASSERT_EQ(answer.at("choices").size(), 2u);
  const Json& hi = answer["choices"][0];
  EXPECT_EQ(hi.at("index"), 0);
  EXPECT_EQ(hi.at("text"), "Hi");
  EXPECT_EQ(hi.at("tokens"), (std::vector<int>{3 + 'H', 3 + 'i'}));
  EXPECT_EQ(hi.at("finish_reason"), "stop");
  const Json& logprobs = hi.at("logprobs");
  EXPECT_EQ(logprobs.at("tokens"), (std::vector<std::string>{"H", "i"}));
  EXPECT_EQ(logprobs.at("token_logprobs"), (std::vector<float>{-0.5f, -0.25f}));
  EXPECT_EQ(logprobs.at("top_logprobs")[1], (Json{{"i", -0.25f}, {"o", -2.0f}}));
  EXPECT_EQ(logprobs.at("text_offset"), (std::vector<int>{0, 1}));
  EXPECT_EQ(answer["choices"][1].at("finish_reason"), "length");
  EXPECT_EQ(answer["choices"][1]["logprobs"].at("text_offset"), (std::vector<int>{0, 1, 2}));
  // Without logprobs asked: null.
  const Json plain = Json::parse(step07::completion_json(served(), id, choices, {5, 5}, false));
  EXPECT_TRUE(plain["choices"][0].at("logprobs").is_null());
}

TEST(Step07ApiResponse, AChatAnswerHasAMessage) {
  const step07::CompletionId id{Endpoint::ChatCompletions, 8, 1700000123};
  const Json answer = Json::parse(step07::completion_json(served(), id, two_choices(), {2, 5}, true));
  EXPECT_EQ(answer.at("id"), "chatcmpl-8");
  EXPECT_EQ(answer.at("object"), "chat.completion");
  EXPECT_EQ(answer.at("usage").at("total_tokens"), 7);
  const Json& hi = answer.at("choices").at(0);
  EXPECT_EQ(hi.at("message"), (Json{{"role", "assistant"}, {"content", "Hi"}}));
  EXPECT_FALSE(hi.contains("text"));
  EXPECT_EQ(hi.at("tokens"), (std::vector<int>{3 + 'H', 3 + 'i'}));
  EXPECT_EQ(hi.at("finish_reason"), "stop");
  const Json& content = hi.at("logprobs").at("content");
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0].at("token"), "H");
  EXPECT_EQ(content[0].at("logprob"), -0.5f);
  EXPECT_EQ(content[0].at("bytes"), (std::vector<int>{'H'}));
  ASSERT_EQ(content[0].at("top_logprobs").size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1],
            (Json{{"token", "h"}, {"logprob", -1.5f}, {"bytes", std::vector<int>{'h'}}}));
  EXPECT_TRUE(answer["choices"][1]["logprobs"]["content"][2]["top_logprobs"].empty());
}

// The JSON of one server-sent event, checking its framing.
Json event_json(const std::string& event) {
  EXPECT_TRUE(event.starts_with("data: ")) << event;
  EXPECT_TRUE(event.ends_with("\n\n")) << event;
  step07::SseDecoder decoder;
  const std::vector<std::string> data = decoder.feed(event);
  if (data.size() != 1) {
    ADD_FAILURE() << "not one event: " << event;
    return {};
  }
  return Json::parse(data[0]);
}

TEST(Step07ApiResponse, CompletionChunksCarryTheTokensTextAndOffsets) {
  const step07::CompletionId id{Endpoint::Completions, 3, 1700000123};
  ChoiceDelta delta;
  delta.index = 2;
  delta.text = " upon";
  delta.text_offset = 4;  // "Once" went out before
  delta.tokens = {300};
  delta.logprobs = {{" upon", -0.75f, {{" upon", -0.75f}}}};
  const Json chunk = event_json(step07::chunk_event(served(), id, delta, true, /*include_usage=*/false));
  EXPECT_EQ(chunk.at("id"), "cmpl-3");
  EXPECT_EQ(chunk.at("object"), "text_completion");
  EXPECT_FALSE(chunk.contains("usage"));
  ASSERT_EQ(chunk.at("choices").size(), 1u);
  const Json& choice = chunk["choices"][0];
  EXPECT_EQ(choice.at("index"), 2);
  EXPECT_EQ(choice.at("text"), " upon");
  EXPECT_EQ(choice.at("tokens"), (std::vector<int>{300}));
  EXPECT_TRUE(choice.at("finish_reason").is_null());
  EXPECT_EQ(choice.at("logprobs").at("text_offset"), (std::vector<int>{4}));
  // With include_usage every chunk has "usage": null.
  const Json with_usage = event_json(step07::chunk_event(served(), id, delta, false, true));
  ASSERT_TRUE(with_usage.contains("usage"));
  EXPECT_TRUE(with_usage["usage"].is_null());
  EXPECT_TRUE(with_usage["choices"][0].at("logprobs").is_null());
}

TEST(Step07ApiResponse, ChatChunksCarryARoleFirstThenContent) {
  const step07::CompletionId id{Endpoint::ChatCompletions, 4, 1700000123};
  ChoiceDelta first;
  first.first = true;
  const Json opening = event_json(step07::chunk_event(served(), id, first, false, false));
  EXPECT_EQ(opening.at("id"), "chatcmpl-4");
  EXPECT_EQ(opening.at("object"), "chat.completion.chunk");
  EXPECT_EQ(opening["choices"][0].at("delta"), (Json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_FALSE(opening["choices"][0].contains("text"));

  ChoiceDelta middle;
  middle.text = "Once";
  middle.tokens = {400};
  EXPECT_EQ(event_json(step07::chunk_event(served(), id, middle, false, false))["choices"][0].at("delta"),
            (Json{{"content", "Once"}}));
  middle.text = "";  // a piece held back (half a character, the start of a stop string)
  EXPECT_EQ(event_json(step07::chunk_event(served(), id, middle, false, false))["choices"][0].at("delta"),
            (Json{{"content", ""}}));

  ChoiceDelta last;
  last.finish = FinishReason::Stop;
  const Json ending = event_json(step07::chunk_event(served(), id, last, false, false));
  EXPECT_EQ(ending["choices"][0].at("delta"), Json::object());
  EXPECT_EQ(ending["choices"][0].at("finish_reason"), "stop");
  last.text = " time";  // what was held back, released at the end
  EXPECT_EQ(event_json(step07::chunk_event(served(), id, last, false, false))["choices"][0].at("delta"),
            (Json{{"content", " time"}}));
}

TEST(Step07ApiResponse, TheUsageEventHasNoChoices) {
  for (const auto& [endpoint, object] : {std::pair{Endpoint::Completions, "text_completion"},
                                         std::pair{Endpoint::ChatCompletions, "chat.completion.chunk"}}) {
    const Json usage = event_json(step07::usage_event(served(), {endpoint, 5, 1700000123}, {4, 12}));
    EXPECT_EQ(usage.at("object"), object);
    EXPECT_EQ(usage.at("choices"), Json::array());
    EXPECT_EQ(usage.at("usage"), (Json{{"prompt_tokens", 4}, {"completion_tokens", 12}, {"total_tokens", 16}}));
    EXPECT_EQ(usage.at("created"), 1700000123);
  }
}

TEST(Step07ApiResponse, InvalidUtf8BecomesAReplacementCharacter) {
  ChoiceDelta cut;
  cut.text = "caf\xC3";  // a completion that ended inside "é"
  cut.logprobs = {{"\xC3", -1.0f, {{"\xC3", -1.0f}}}};
  cut.finish = FinishReason::Length;
  for (const Endpoint endpoint : {Endpoint::Completions, Endpoint::ChatCompletions}) {
    const std::string answer = step07::completion_json(served(), {endpoint, 1, 0}, {&cut, 1}, {1, 1}, true);
    const Json json = Json::parse(answer);  // valid UTF-8: it parses
    const Json& choice = json["choices"][0];
    const std::string text = endpoint == Endpoint::Completions ? choice.at("text").get<std::string>()
                                                                : choice.at("message").at("content").get<std::string>();
    EXPECT_EQ(text, "caf\xEF\xBF\xBD");
    if (endpoint == Endpoint::ChatCompletions)  // the raw byte survives in "bytes"
      EXPECT_EQ(choice["logprobs"]["content"][0].at("bytes"), (std::vector<int>{0xC3}));
  }
}

TEST(Step07ApiResponse, TheLoadClientsBodyParsesBackIntoItsRequest) {
  step07::Request request;
  request.prompt = {1, 20, 30};
  request.max_tokens = 9;
  request.sampling = {0.75f, 0.5f, 11};
  request.n = 2;
  request.top_logprobs = 3;
  const CompletionRequest parsed = accepted(Endpoint::Completions, step07::completion_request_json(request, true));
  EXPECT_EQ(parsed.prompt, request.prompt);
  EXPECT_EQ(parsed.max_tokens, 9);
  EXPECT_EQ(parsed.sampling.temperature, 0.75f);
  EXPECT_EQ(parsed.sampling.top_p, 0.5f);
  EXPECT_EQ(parsed.sampling.seed, 11u);
  EXPECT_EQ(parsed.n, 2);
  EXPECT_EQ(parsed.top_logprobs, 3);
  EXPECT_TRUE(parsed.stream);
  // The defaults are left out of the body.
  const Json plain = Json::parse(step07::completion_request_json(step07::Request{}, false));
  EXPECT_FALSE(plain.contains("n"));
  EXPECT_FALSE(plain.contains("logprobs"));
}

// The answers read back by the load client: the first choice's tokens and finish.
TEST(Step07ApiResponse, TheLoadClientReadsTheFirstChoice) {
  const std::vector<ChoiceDelta> choices = two_choices();
  for (const Endpoint endpoint : {Endpoint::Completions, Endpoint::ChatCompletions}) {
    const step07::ReceivedCompletion received =
        step07::parse_completion_json(step07::completion_json(served(), {endpoint, 1, 0}, choices, {1, 5}, false));
    EXPECT_FALSE(received.error.has_value());
    EXPECT_EQ(received.tokens, choices[0].tokens);
    EXPECT_EQ(received.finish, FinishReason::Stop);
  }
  const step07::ReceivedCompletion error = step07::parse_completion_json(step07::error_json({400, "no", "n", ""}));
  EXPECT_EQ(error.error, "no");
}

}  // namespace
