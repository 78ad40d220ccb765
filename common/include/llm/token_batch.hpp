#pragma once
// TokenBatch: the rows one forward pass processes. Each row is a token of some
// sequence at some position, so one type serves prefill (many positions of one
// sequence), decode (one position of each of many sequences), speculative
// verification (k+1 positions) and chunked prefill mixed with decode.
#include <initializer_list>
#include <span>
#include <vector>

namespace llm {

struct TokenBatch {
  std::vector<int> tokens;     // [n_rows] token ids
  std::vector<int> positions;  // [n_rows] position of each token in its sequence
  std::vector<int> sequences;  // [n_rows] which cache slot (sequence) each row belongs to

  int size() const { return static_cast<int>(tokens.size()); }
  void clear() { tokens.clear(); positions.clear(); sequences.clear(); }
  void add(int token, int position, int sequence) {
    tokens.push_back(token);
    positions.push_back(position);
    sequences.push_back(sequence);
  }

  // A run of positions start..start+n-1 of one sequence.
  static TokenBatch prefill(std::span<const int> tokens, int start_position, int sequence);
  static TokenBatch prefill(std::initializer_list<int> tokens, int start_position, int sequence) {
    return prefill(std::span<const int>(tokens.begin(), tokens.size()), start_position, sequence);
  }
  // Decode: one token per sequence, at the given positions.
  static TokenBatch single(int token, int position, int sequence) {
    TokenBatch b;
    b.add(token, position, sequence);
    return b;
  }
};

// Which rows of a batch get logits (the classifier is a vocab x dim product per
// row, so computing it for every prompt token is wasted work in prefill).
enum class LogitsFor {
  LastRowOfEachSequence,  // generation: the next-token distribution only
  AllRows,                // speculative verification, perplexity
};

}  // namespace llm
