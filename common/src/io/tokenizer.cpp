#include "llm/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <istream>
#include <queue>
#include <string>

#include "llm/errors.hpp"

namespace llm {

Tokenizer Tokenizer::load(const std::string& path, int vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot open tokenizer file '{}'", path));
  return read(in, vocab_size, path);
}

Tokenizer Tokenizer::read(std::istream& in, int vocab_size, const std::string& name) {
  // encode() emits <unk>, <s> and </s> by id (0, 1, 2): a smaller vocabulary
  // would hand the model ids it has no embedding for.
  if (vocab_size < 3)
    throw InputError(fmt::format("tokenizer file '{}': a vocabulary needs at least 3 tokens (<unk>, <s>, </s>), "
                                 "the model has {}", name, vocab_size));
  std::int32_t max_token_length = 0;
  if (!in.read(reinterpret_cast<char*>(&max_token_length), sizeof(max_token_length)) ||
      max_token_length <= 0 || max_token_length > 4096)
    throw InputError(fmt::format("tokenizer file '{}' has no valid header", name));

  Tokenizer t;
  // Grown entry by entry: memory follows what the file holds, not what the
  // caller's vocab_size claims.
  for (int i = 0; i < vocab_size; ++i) {
    float score = 0.0f;
    std::int32_t length = 0;
    if (!in.read(reinterpret_cast<char*>(&score), sizeof(score)) ||
        !in.read(reinterpret_cast<char*>(&length), sizeof(length)))
      throw InputError(fmt::format(
          "tokenizer file '{}' ends after {} tokens; the model needs {} (wrong tokenizer for this model?)",
          name, i, vocab_size));
    if (length < 0 || length > max_token_length)
      throw InputError(fmt::format("tokenizer file '{}': token {} has impossible length {}", name, i, length));
    std::string piece(static_cast<std::size_t>(length), '\0');
    if (length > 0 && !in.read(piece.data(), length))
      throw InputError(fmt::format("tokenizer file '{}' is truncated inside token {}", name, i));
    t.scores_.push_back(score);
    t.pieces_.push_back(std::move(piece));
  }
  // The file has no token count of its own: the model's vocab_size says how
  // many entries to read. Bytes after them mean a file written for a larger
  // vocabulary (Llama 2's 32000-token tokenizer.bin beside a 512-token
  // model), whose first entries would decode the model's ids into garbage.
  if (in.peek() != std::char_traits<char>::eof())
    throw InputError(fmt::format(
        "tokenizer file '{}' has data left after the model's {} tokens: it was written for a larger vocabulary "
        "(wrong tokenizer for this model?)",
        name, vocab_size));
  for (int i = vocab_size - 1; i >= 0; --i) t.piece_to_id_[t.pieces_[static_cast<std::size_t>(i)]] = i;
  t.measure_longest_piece();
  return t;
}

Tokenizer Tokenizer::byte_level(int vocab_size) {
  if (vocab_size < 259)
    throw InputError(fmt::format("a byte-level tokenizer needs a vocabulary of at least 259 (got {})", vocab_size));
  Tokenizer t;
  t.pieces_.resize(static_cast<std::size_t>(vocab_size));
  t.scores_.assign(static_cast<std::size_t>(vocab_size), 0.0f);
  t.pieces_[0] = "<unk>";
  t.pieces_[1] = "\n<s>\n";
  t.pieces_[2] = "\n</s>\n";
  for (int b = 0; b < 256; ++b) t.pieces_[static_cast<std::size_t>(3 + b)] = fmt::format("<0x{:02X}>", b);
  // Ids past the bytes exist only because the preset's vocabulary is larger;
  // they decode to nothing and are never produced by encode().
  for (int i = 259; i < vocab_size; ++i) t.pieces_[static_cast<std::size_t>(i)] = "";
  for (int i = 0; i < 259; ++i) t.piece_to_id_[t.pieces_[static_cast<std::size_t>(i)]] = i;
  t.measure_longest_piece();
  return t;
}

void Tokenizer::measure_longest_piece() {
  max_piece_bytes_ = 1;
  for (const std::string& piece : pieces_)
    max_piece_bytes_ = std::max(max_piece_bytes_, static_cast<int>(piece.size()));
}

const std::string& Tokenizer::piece(int token) const {
  if (token < 0 || token >= vocab_size())
    throw InputError(fmt::format("token id {} is out of range [0, {})", token, vocab_size()));
  return pieces_[static_cast<std::size_t>(token)];
}

int Tokenizer::lookup(const std::string& piece) const {
  auto it = piece_to_id_.find(piece);
  return it == piece_to_id_.end() ? -1 : it->second;
}

namespace {

// llama2.c's "no merge yet" score: a pair whose merged piece scores no higher
// (or a NaN score) never merges, in both merge loops.
constexpr float kNoMerge = -1e10f;

// One symbol of the text being merged: a node of a doubly linked list over
// the initial tokens. A merge keeps the left node (its token becomes the
// merged one) and unlinks the right node, so the list order of the nodes is
// always the order of their indices: a node's index is its position.
struct Symbol {
  int token;
  int prev;                  // -1: the first symbol
  int next;                  // -1: the last symbol
  std::uint32_t version = 0;  // bumped when the token changes or the node is unlinked
};

// A merge that was possible when it was queued: nodes left and right (then
// adjacent) into `merged`. Stale once either node's version moved on.
struct Candidate {
  float score;
  int left;
  int right;
  int merged;
  std::uint32_t left_version;
  std::uint32_t right_version;
};

// The queue's order: the highest score first; on a tie the leftmost pair,
// as llama2.c's scan (a later pair must score strictly more to win).
struct MergesLater {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

std::vector<int> Tokenizer::initial_tokens(std::string_view text, bool add_bos) const {
  std::vector<int> tokens;
  tokens.reserve(text.size() + 3);
  if (add_bos) tokens.push_back(kBos);
  // SentencePiece's add_dummy_prefix: the text is encoded as if it began with
  // a space, so "Once" at the start is the same token as " Once" mid-sentence.
  if (!text.empty()) {
    const int space = lookup(" ");
    if (space >= 0) tokens.push_back(space);
  }

  // One token per UTF-8 code point, or one <0xXX> token per byte when the
  // code point is not in the vocabulary (byte fallback).
  std::string code_point;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if ((byte & 0xC0) != 0x80) code_point.clear();  // a leading byte starts a code point
    code_point.push_back(static_cast<char>(byte));
    const bool next_continues =
        i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
    if (next_continues && code_point.size() < 4) continue;
    const int id = lookup(code_point);
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      // The first 3 ids are <unk>, <s>, </s>; bytes start at id 3. A
      // vocabulary too small to hold the byte (fewer than 259 tokens) has
      // <unk> for it: its ids must stay in range.
      for (unsigned char b : code_point) {
        const int byte_id = static_cast<int>(b) + 3;
        tokens.push_back(byte_id < vocab_size() ? byte_id : kUnk);
      }
    }
    code_point.clear();
  }
  return tokens;
}

int Tokenizer::merge_of(int left, int right) const {
  const int id = lookup(pieces_[static_cast<std::size_t>(left)] + pieces_[static_cast<std::size_t>(right)]);
  return id >= 0 && scores_[static_cast<std::size_t>(id)] > kNoMerge ? id : -1;
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  // 1. Code points (or byte fallback), after the optional BOS and the dummy prefix.
  std::vector<int> tokens = initial_tokens(text, add_bos);
  const std::size_t first = add_bos ? 1 : 0;  // BOS never merges

  // 2. Greedy BPE, as encode_by_rescanning: merge the adjacent pair whose
  //    concatenation scores best (the leftmost on a tie) until no adjacent pair
  //    is in the vocabulary. Rescanning every pair after each merge costs
  //    O(n^2); here every possible merge waits in a priority queue, and a
  //    merge queues only the two pairs it creates (with its left and right
  //    neighbours). A queued pair one of whose symbols has changed since is
  //    skipped when it comes out (lazy invalidation). O(n log n).
  const int n = static_cast<int>(tokens.size() - first);
  std::vector<Symbol> symbols;  // [n] the tokens after BOS, linked
  symbols.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int token = tokens[first + static_cast<std::size_t>(i)];
    symbols.push_back({token, /*prev=*/i - 1, /*next=*/i + 1 < n ? i + 1 : -1});
  }
  std::priority_queue<Candidate, std::vector<Candidate>, MergesLater> queue;
  auto queue_pair = [&](int left, int right) {
    const Symbol& l = symbols[static_cast<std::size_t>(left)];
    const Symbol& r = symbols[static_cast<std::size_t>(right)];
    const int merged = merge_of(l.token, r.token);
    if (merged < 0) return;
    queue.push({scores_[static_cast<std::size_t>(merged)], left, right, merged, l.version, r.version});
  };
  for (int i = 0; i + 1 < n; ++i) queue_pair(i, i + 1);

  while (!queue.empty()) {
    const Candidate best = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<std::size_t>(best.left)];
    Symbol& right = symbols[static_cast<std::size_t>(best.right)];
    if (left.version != best.left_version || right.version != best.right_version) continue;  // stale
    left.token = best.merged;
    ++left.version;
    ++right.version;  // unlinked: every pair queued with it is stale
    left.next = right.next;
    if (left.next >= 0) symbols[static_cast<std::size_t>(left.next)].prev = best.left;
    if (left.prev >= 0) queue_pair(left.prev, best.left);
    if (left.next >= 0) queue_pair(best.left, left.next);
  }

  tokens.resize(first);
  for (int i = n > 0 ? 0 : -1; i >= 0; i = symbols[static_cast<std::size_t>(i)].next)
    tokens.push_back(symbols[static_cast<std::size_t>(i)].token);
  if (add_eos) tokens.push_back(kEos);
  return tokens;
}

std::vector<int> Tokenizer::encode_by_rescanning(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<int> tokens = initial_tokens(text, add_bos);
  const std::size_t first = add_bos ? 1 : 0;  // BOS never merges
  // llama2.c's loop: scan every adjacent pair, merge the best-scoring one
  // (strictly better: the leftmost wins a tie), repeat until none merges.
  while (true) {
    float best_score = kNoMerge;
    int best_id = -1;
    std::size_t best_index = 0;
    for (std::size_t i = first; i + 1 < tokens.size(); ++i) {
      const int id = merge_of(tokens[i], tokens[i + 1]);
      if (id >= 0 && scores_[static_cast<std::size_t>(id)] > best_score) {
        best_score = scores_[static_cast<std::size_t>(id)];
        best_id = id;
        best_index = i;
      }
    }
    if (best_id < 0) break;
    tokens[best_index] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_index) + 1);
  }
  if (add_eos) tokens.push_back(kEos);
  return tokens;
}

std::string Tokenizer::decode(int previous, int token) const {
  std::string_view text = piece(token);
  // After BOS, SentencePiece drops the dummy-prefix space.
  if (previous == kBos && !text.empty() && text.front() == ' ') text.remove_prefix(1);
  // Raw byte tokens look like "<0x0A>".
  unsigned value = 0;
  if (text.size() == 6 && text.substr(0, 3) == "<0x" && text[5] == '>' &&
      std::isxdigit(static_cast<unsigned char>(text[3])) && std::isxdigit(static_cast<unsigned char>(text[4]))) {
    value = static_cast<unsigned>(std::stoul(std::string(text.substr(3, 2)), nullptr, 16));
    return std::string(1, static_cast<char>(value));
  }
  return std::string(text);
}

std::string Tokenizer::decode_printable(int previous, int token) const {
  std::string text = decode(previous, token);
  if (text.size() == 1) {
    const auto byte = static_cast<unsigned char>(text[0]);
    if (!(std::isprint(byte) || std::isspace(byte))) return "";
  }
  return text;
}

void save_tokenizer(const Tokenizer& tokenizer, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError(fmt::format("cannot write tokenizer file '{}'", path));
  // The header is the longest piece in bytes (run.c sizes its merge buffer
  // from it); at least 1, as the loaders require.
  auto written_piece = [&tokenizer](int id) {
    // llama2.c's run.c reads each piece with fread(piece, length, 1), which
    // reports a 0-byte read as a failure: an empty piece (the byte-level
    // tokenizer's unused ids) is written as a placeholder run.c can read.
    return tokenizer.piece(id).empty() ? fmt::format("<unused{}>", id) : tokenizer.piece(id);
  };
  std::int32_t max_token_length = 1;
  for (int i = 0; i < tokenizer.vocab_size(); ++i)
    max_token_length = std::max(max_token_length, static_cast<std::int32_t>(written_piece(i).size()));
  out.write(reinterpret_cast<const char*>(&max_token_length), sizeof(max_token_length));
  for (int i = 0; i < tokenizer.vocab_size(); ++i) {
    const float score = tokenizer.score(i);
    const std::string piece = written_piece(i);
    const auto length = static_cast<std::int32_t>(piece.size());
    out.write(reinterpret_cast<const char*>(&score), sizeof(score));
    out.write(reinterpret_cast<const char*>(&length), sizeof(length));
    out.write(piece.data(), length);
  }
  if (!out) throw InputError(fmt::format("writing tokenizer file '{}' failed", path));
}

}  // namespace llm
