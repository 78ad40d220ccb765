#include "llm/token_batch.hpp"

namespace llm {

TokenBatch TokenBatch::prefill(std::span<const int> tokens, int start_position, int sequence) {
  TokenBatch b;
  for (std::size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], start_position + static_cast<int>(i), sequence);
  return b;
}

}  // namespace llm
