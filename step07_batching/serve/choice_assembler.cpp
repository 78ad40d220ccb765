#include "step07_batching/serve/choice_assembler.hpp"

#include <fmt/format.h>

#include <utility>

#include "llm/errors.hpp"

namespace step07 {

ChoiceAssembler::ChoiceAssembler(const ServedModel& model, const CompletionRequest& request)
    : model_(model), prompt_tokens_(static_cast<int>(request.prompt.size())), with_logprobs_(request.top_logprobs >= 0) {
  choices_.reserve(static_cast<std::size_t>(request.n));
  for (int sample = 0; sample < request.n; ++sample)
    choices_.push_back({TextPieces(model, request.prompt.back()), StopMatcher(request.stop), request.prompt.back()});
}

std::optional<ChoiceAssembler::Added> ChoiceAssembler::add(int sample, int token, FinishReason finish,
                                                           const std::optional<TokenLogprobs>& logprobs) {
  if (sample < 0 || sample >= static_cast<int>(choices_.size()))
    throw llm::InputError(fmt::format("a token for sample {} of a request with {} choices", sample, choices_.size()));
  Choice& choice = choices_[static_cast<std::size_t>(sample)];
  if (choice.ended) return std::nullopt;

  Added added;
  ChoiceDelta& delta = added.delta;
  delta.index = sample;
  delta.first = !std::exchange(choice.started, true);
  delta.tokens.push_back(token);
  if (with_logprobs_ && logprobs) delta.logprobs.push_back(logged_token(model_, choice.previous_token, *logprobs, token));
  choice.previous_token = token;
  ++choice.tokens;

  std::string piece = choice.pieces.next(token);
  if (finish != FinishReason::None) piece += choice.pieces.flush();
  const StopMatcher::Output sent = choice.stops.feed(piece);
  delta.text = sent.text;
  if (sent.stopped) {
    delta.finish = FinishReason::Stop;
    added.stop_string_matched = finish == FinishReason::None;  // the engine has not ended it by itself
  } else if (finish != FinishReason::None) {
    delta.text += choice.stops.flush();  // no stop string can complete any more
    delta.finish = finish;
  }
  delta.text_offset = std::exchange(choice.text_sent, choice.text_sent + delta.text.size());
  if (delta.finish != FinishReason::None) {
    choice.ended = true;
    ++ended_choices_;
  }
  return added;
}

Usage ChoiceAssembler::usage() const {
  Usage usage;
  usage.prompt_tokens = prompt_tokens_;
  for (const Choice& choice : choices_) usage.completion_tokens += choice.tokens;
  return usage;
}

}  // namespace step07
