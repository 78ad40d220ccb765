#pragma once
// Tokenizer in llama2.c's tokenizer.bin format: int32 max_token_length, then
// for every token a float32 merge score, an int32 byte length and the bytes.
// Encoding is SentencePiece-style BPE: start from UTF-8 code points (bytes as
// <0xXX> fallback tokens), then repeatedly merge the adjacent pair whose merged
// string has the highest score.
#include <istream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llm {

class Tokenizer {
 public:
  static constexpr int kUnk = 0;
  static constexpr int kBos = 1;  // beginning of sequence
  static constexpr int kEos = 2;  // end of sequence

  // Loads a tokenizer.bin for a model with `vocab_size` tokens (at least 3:
  // <unk>, <s>, </s>). Throws InputError if the file is missing or truncated,
  // or holds fewer or more tokens than that (a tokenizer for another model).
  static Tokenizer load(const std::string& path, int vocab_size);
  // The same from a stream (a file, or bytes in memory: the fuzz targets);
  // `name` stands for the file in the messages.
  static Tokenizer read(std::istream& in, int vocab_size, const std::string& name = "<memory>");
  // A tokenizer with no file for the built-in presets: ids 0..2 are
  // <unk>,<s>,</s>; id 3+b is the byte b; ids above 258 decode to nothing.
  static Tokenizer byte_level(int vocab_size);

  // Encodes like llama2.c's encode(): optional BOS, a dummy-prefix " " token
  // when the text is non-empty, code points (or byte fallback), BPE merges.
  // Every id is below vocab_size(): where a vocabulary of fewer than 259
  // tokens has no byte token (id 3 + byte), the byte becomes <unk> (run.c
  // would index past its vocabulary).
  // The merges take O(n log n) in the text's length (a priority queue of
  // candidate pairs), where llama2.c's loop takes O(n^2).
  std::vector<int> encode(std::string_view text, bool add_bos, bool add_eos) const;
  // encode() with llama2.c's merge loop as it reads: rescan every adjacent
  // pair after each merge (quadratic). The reference encode() is tested
  // against: the same ids for every text.
  std::vector<int> encode_by_rescanning(std::string_view text, bool add_bos, bool add_eos) const;

  // The text of `token` following `previous`, as llama2.c's decode(): after BOS
  // a leading space is dropped; <0xXX> tokens decode to their raw byte.
  std::string decode(int previous, int token) const;
  // Like decode(), but a lone non-printable byte becomes "" (llama2.c's
  // safe_printf), so a terminal never receives control codes.
  std::string decode_printable(int previous, int token) const;

  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  // The longest piece's length in bytes (at least 1), computed once when the
  // vocabulary is built. No token encodes more of a text than its piece's
  // bytes (a byte-fallback token's piece "<0xXX>" stands for one byte), so a
  // text of B bytes encodes to at least ceil(B / max_piece_bytes()) tokens:
  // a bound known without encoding, with which a server refuses a prompt too
  // long for the context before it spends any time tokenizing it.
  int max_piece_bytes() const { return max_piece_bytes_; }
  const std::string& piece(int token) const;
  float score(int token) const { return scores_.at(static_cast<std::size_t>(token)); }

 private:
  int lookup(const std::string& piece) const;  // -1 when not in the vocabulary
  // The tokens before any merge: optional BOS, the dummy-prefix space, one
  // token per code point (or per byte, as fallback).
  std::vector<int> initial_tokens(std::string_view text, bool add_bos) const;
  // The token that tokens `left` and `right`, adjacent, merge into; -1 when
  // their concatenation is not in the vocabulary or scores too low to merge.
  int merge_of(int left, int right) const;
  // Sets max_piece_bytes_ from pieces_ (once they are all in).
  void measure_longest_piece();

  std::vector<std::string> pieces_;  // [vocab_size]
  std::vector<float> scores_;        // [vocab_size] merge priority
  std::unordered_map<std::string, int> piece_to_id_;
  int max_piece_bytes_ = 1;  // the longest of pieces_ in bytes, at least 1
};

// Writes `tokenizer` in the same tokenizer.bin format (loadable by run.c and
// by Tokenizer::load with the same vocabulary size). An empty piece is written
// as "<unusedN>" (N its id): run.c cannot read a piece of length 0.
void save_tokenizer(const Tokenizer& tokenizer, const std::string& path);

}  // namespace llm
