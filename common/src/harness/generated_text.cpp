#include "llm/harness/generated_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace llm {

std::string printable_text(const Tokenizer& tokenizer, std::span<const int> tokens) {
  std::string text;
  for (std::size_t i = 1; i < tokens.size(); ++i) text += tokenizer.decode_printable(tokens[i - 1], tokens[i]);
  return text;
}

std::string generated_text(const Tokenizer& tokenizer, std::span<const int> prompt, std::span<const int> generated) {
  const auto end_of_story = std::find(generated.begin(), generated.end(), Tokenizer::kBos);
  std::vector<int> tokens(prompt.begin(), prompt.end());  // [prompt + generated up to BOS]
  tokens.insert(tokens.end(), generated.begin(), end_of_story);
  return printable_text(tokenizer, tokens);
}

void print_generated_text(const Tokenizer& tokenizer, std::span<const int> prompt, std::span<const int> generated) {
  fmt::print("{}\n\n", generated_text(tokenizer, prompt, generated));
}

}  // namespace llm
