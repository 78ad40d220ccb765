#pragma once
// Token ids back to text, as llama2.c prints it: no BOS, every piece decoded
// after its predecessor (a leading space after BOS dropped), non-printable
// bytes left out.
#include <span>
#include <string>

#include "llm/tokenizer.hpp"

namespace llm {

// The text of tokens[1..]: each piece decoded after the token before it
// (tokens[0], usually BOS, prints nothing itself).
std::string printable_text(const Tokenizer& tokenizer, std::span<const int> tokens);

// The prompt (BOS first) followed by the generated tokens up to the first BOS
// among them (a model that starts a new story has ended this one).
std::string generated_text(const Tokenizer& tokenizer, std::span<const int> prompt, std::span<const int> generated);

// generated_text and a blank line, on stdout: what every generating step
// prints above its tables.
void print_generated_text(const Tokenizer& tokenizer, std::span<const int> prompt, std::span<const int> generated);

}  // namespace llm
