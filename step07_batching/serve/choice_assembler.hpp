#pragma once
// ChoiceAssembler: a request's tokens, as the engine generates them (every
// sample interleaved), turned into what the answer says about each choice.
// One per request, on the handler thread that answers it; the server writes
// what it returns as one JSON answer or as stream chunks (completion_api.hpp).
//
// Per choice (one per sample, n in all):
//   token ids      as generated, up to the token that ended the choice
//   text           TextPieces (an unfinished UTF-8 character held back),
//                  then StopMatcher (a possible start of a stop string held
//                  back; text from a stop string on is never sent)
//   logprobs       the engine's TokenLogprobs as text (logged_token), when asked
//   finish         "length" or "stop" from the engine (the end token,
//                  max_tokens), or "stop" when a stop string matched: the
//                  server then ends the sample in the engine, and tokens the
//                  engine made in the meantime are dropped here
#include <optional>
#include <vector>

#include "step07_batching/serve/completion_api.hpp"

namespace step07 {

class ChoiceAssembler {
 public:
  ChoiceAssembler(const ServedModel& model, const CompletionRequest& request);

  // What one token adds to its choice.
  struct Added {
    ChoiceDelta delta;                 // delta.finish != None: the choice has ended
    bool stop_string_matched = false;  // the server must end the sample in the engine
  };
  // Token `token` of sample `sample`, with the engine's finish reason and
  // log-probabilities. nullopt when that choice has ended already.
  std::optional<Added> add(int sample, int token, FinishReason finish, const std::optional<TokenLogprobs>& logprobs);

  bool all_ended() const { return ended_choices_ == static_cast<int>(choices_.size()); }
  Usage usage() const;

 private:
  struct Choice {
    TextPieces pieces;
    StopMatcher stops;
    int previous_token;   // the token before the next one (for pieces and logprobs)
    int tokens = 0;       // generated so far, counted in the usage
    std::size_t text_sent = 0;  // bytes of text in its deltas so far (where the next one's text_offset is)
    bool started = false; // its first delta has gone out
    bool ended = false;
  };

  const ServedModel& model_;
  int prompt_tokens_;
  bool with_logprobs_;
  std::vector<Choice> choices_;  // [n]
  int ended_choices_ = 0;
};

}  // namespace step07
