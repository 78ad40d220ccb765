// The llama2.c tokenizer: encoding matches run.c, decoding inverts encoding
// (byte fallback included), and malformed files are rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "llm/errors.hpp"
#include "llm/tokenizer.hpp"
#include "test_support.hpp"

namespace llm {
namespace {

using ::llm::testing::HasSubstr;
using ::llm::testing::read_bytes;
using ::llm::testing::write_bytes;

// The message of the InputError Tokenizer::load throws (fails the test if none).
std::string load_error(const std::string& path, int vocab_size) {
  try {
    Tokenizer::load(path, vocab_size);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "Tokenizer::load('" << path << "', " << vocab_size << ") did not throw InputError";
  return "";
}

// Decodes `ids` as a generation loop prints them: each token after the one before.
std::string decode_all(const Tokenizer& tok, const std::vector<int>& ids) {
  std::string text;
  for (std::size_t i = 0; i < ids.size(); ++i) text += tok.decode(i == 0 ? -1 : ids[i - 1], ids[i]);
  return text;
}

// BOS, then the text: decoding after BOS drops the dummy-prefix space.
std::string round_trip(const Tokenizer& tok, const std::string& text) {
  const std::vector<int> ids = tok.encode(text, /*add_bos=*/true, /*add_eos=*/false);
  std::string decoded;
  for (std::size_t i = 1; i < ids.size(); ++i) decoded += tok.decode(ids[i - 1], ids[i]);
  return decoded;
}

// A tokenizer file in llama2.c's format holding exactly `pieces` ((piece,
// score) pairs, id 0 first): max_token_length, then score, length, bytes each.
std::string write_pieces_file(const std::string& name, const std::vector<std::pair<std::string, float>>& pieces) {
  const std::string path = testing::temp_path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const std::int32_t max_length = 16;
  out.write(reinterpret_cast<const char*>(&max_length), sizeof(max_length));
  for (const auto& [piece, score] : pieces) {
    const auto length = static_cast<std::int32_t>(piece.size());
    out.write(reinterpret_cast<const char*>(&score), sizeof(score));
    out.write(reinterpret_cast<const char*>(&length), sizeof(length));
    out.write(piece.data(), length);
  }
  return path;
}

// A full tokenizer file: <unk>, <s>, </s>, the 256 byte tokens (ids 3..258),
// then `extra` (piece, score) pairs from id 259.
std::string write_tokenizer_file(const std::string& name, const std::vector<std::pair<std::string, float>>& extra) {
  std::vector<std::pair<std::string, float>> pieces = {{"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    pieces.emplace_back(hex, 0.0f);
  }
  pieces.insert(pieces.end(), extra.begin(), extra.end());
  return write_pieces_file(name, pieces);
}

// ids 259..265 of the synthetic vocabulary.
const std::vector<std::pair<std::string, float>> kSyntheticPieces = {
    {" ", 0.0f}, {"a", 0.0f}, {"b", 0.0f}, {"c", 0.0f}, {"ab", 1.0f}, {"bc", 5.0f}, {" a", 3.0f}};
constexpr int kSyntheticVocab = 259 + 7;

const std::vector<std::string> kSentences = {
    "Once upon a time, there was a little girl named Lily.",
    "She said: \"Hi!\" (and smiled); then 42 cats ran 3.5 miles... Why?",
    "Line one\nLine two\n\nLine four, tab\there.",
    "caf\xC3\xA9 \xE2\x98\x95",  // "café ☕": é and ☕ need byte fallback or rare tokens
    "  leading spaces and trailing  ",
    "1234567890 + 0987654321 = ?",
};

// --- A synthetic vocabulary (no model files needed) -----------------------

TEST(TokenizerSynthetic, MergesTheHighestScoringPairFirst) {
  const Tokenizer tok = Tokenizer::load(write_tokenizer_file("synthetic.bin", kSyntheticPieces), kSyntheticVocab);
  // [" ", a, b, c]: "bc" (5) beats " a" (3) and "ab" (1); then " a" merges.
  // Merging left to right, or "ab" first, would give [" ", "ab", "c"].
  EXPECT_EQ(tok.encode("abc", false, false), (std::vector<int>{265, 264}));
  EXPECT_EQ(tok.encode("abc", true, true), (std::vector<int>{Tokenizer::kBos, 265, 264, Tokenizer::kEos}));
}

TEST(TokenizerSynthetic, UnknownCharactersFallBackToByteTokens) {
  const Tokenizer tok = Tokenizer::load(write_tokenizer_file("synthetic.bin", kSyntheticPieces), kSyntheticVocab);
  // "z" is not in the vocabulary: its byte token is id 3 + 'z'.
  EXPECT_EQ(tok.encode("z", false, false), (std::vector<int>{259, 3 + 'z'}));
  // A 2-byte code point becomes two byte tokens, which decode back to it.
  const std::vector<int> ids = tok.encode("\xC3\xA9", false, false);
  EXPECT_EQ(ids, (std::vector<int>{259, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(decode_all(tok, ids), " \xC3\xA9");
}

TEST(TokenizerSynthetic, EmptyTextHasNoDummyPrefix) {
  const Tokenizer tok = Tokenizer::load(write_tokenizer_file("synthetic.bin", kSyntheticPieces), kSyntheticVocab);
  EXPECT_TRUE(tok.encode("", false, false).empty());
  EXPECT_EQ(tok.encode("", true, true), (std::vector<int>{Tokenizer::kBos, Tokenizer::kEos}));
}

TEST(TokenizerSynthetic, PieceOfAnOutOfRangeIdThrows) {
  const Tokenizer tok = Tokenizer::load(write_tokenizer_file("synthetic.bin", kSyntheticPieces), kSyntheticVocab);
  EXPECT_EQ(tok.piece(kSyntheticVocab - 1), " a");
  EXPECT_THROW(tok.piece(-1), InputError);
  EXPECT_THROW(tok.piece(kSyntheticVocab), InputError);
  EXPECT_THROW(tok.decode(Tokenizer::kBos, kSyntheticVocab), InputError);
}

TEST(TokenizerLoad, RejectsAMissingFile) {
  const std::string path = testing::temp_path("no_such_tokenizer.bin");
  std::remove(path.c_str());
  EXPECT_TRUE(HasSubstr(load_error(path, 512), "cannot open"));
}

TEST(TokenizerLoad, RejectsABadHeader) {
  const std::string path = testing::temp_path("bad_header_tokenizer.bin");
  write_bytes(path, {'\xff', '\xff', '\xff', '\xff', 'x', 'y'});  // max_token_length -1
  EXPECT_TRUE(HasSubstr(load_error(path, 259), "no valid header"));
  write_bytes(path, {'\x01'});  // shorter than the header
  EXPECT_TRUE(HasSubstr(load_error(path, 259), "no valid header"));
}

TEST(TokenizerLoad, RejectsATruncatedFile) {
  const std::string full = write_tokenizer_file("full_tokenizer.bin", kSyntheticPieces);
  const std::vector<char> bytes = read_bytes(full);
  const std::string path = testing::temp_path("cut_tokenizer.bin");

  write_bytes(path, {bytes.begin(), bytes.end() - 1});  // inside the last piece's bytes
  EXPECT_TRUE(HasSubstr(load_error(path, kSyntheticVocab), "truncated inside token"));

  write_bytes(path, {bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2)});
  EXPECT_THROW(Tokenizer::load(path, kSyntheticVocab), InputError);
}

TEST(TokenizerLoad, RejectsAFileWithFewerTokensThanTheVocabulary) {
  const std::string path = write_tokenizer_file("short_vocab.bin", kSyntheticPieces);
  const std::string message = load_error(path, kSyntheticVocab + 1);
  EXPECT_TRUE(HasSubstr(message, "ends after 266 tokens"));
  EXPECT_TRUE(HasSubstr(message, "needs 267"));
  EXPECT_TRUE(HasSubstr(message, "wrong tokenizer for this model?"));
}

// The file has no token count: the model's vocab_size says how many entries to
// read, and anything after them means a tokenizer for a larger vocabulary.
TEST(TokenizerLoad, RejectsAFileWithMoreTokensThanTheVocabulary) {
  const std::string path = write_tokenizer_file("long_vocab.bin", kSyntheticPieces);
  const std::string message = load_error(path, kSyntheticVocab - 1);
  EXPECT_TRUE(HasSubstr(message, "data left after the model's 265 tokens"));
  EXPECT_TRUE(HasSubstr(message, "wrong tokenizer for this model?"));
}

TEST(TokenizerLoad, RejectsBytesAfterTheLastToken) {
  std::vector<char> bytes = read_bytes(write_tokenizer_file("exact_vocab.bin", kSyntheticPieces));
  bytes.push_back('\0');
  const std::string path = testing::temp_path("trailing_byte.bin");
  write_bytes(path, bytes);
  EXPECT_TRUE(HasSubstr(load_error(path, kSyntheticVocab), "wrong tokenizer for this model?"));
}

TEST(TokenizerLoad, RejectsATokenLongerThanTheDeclaredMaximum) {
  const std::string path = write_tokenizer_file("long_piece.bin", {{std::string(17, 'x'), 0.0f}});
  EXPECT_TRUE(HasSubstr(load_error(path, 260), "impossible length"));
}

// --- The byte-level tokenizer of the built-in presets ---------------------

TEST(ByteLevelTokenizer, RoundTripsEveryByteValue) {
  const Tokenizer tok = Tokenizer::byte_level(512);
  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  std::shuffle(text.begin(), text.end(), std::mt19937(5));
  text += "\xC3\xA9 \xE2\x98\x95 \x80\x80\xFF";  // valid and invalid UTF-8

  const std::vector<int> ids = tok.encode(text, false, false);
  ASSERT_EQ(ids.size(), text.size());  // no dummy prefix, no merges: one id per byte
  for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], 3 + static_cast<unsigned char>(text[i]));
  EXPECT_EQ(decode_all(tok, ids), text);
  EXPECT_EQ(round_trip(tok, text), text);
}

TEST(ByteLevelTokenizer, SpecialTokensAndUnusedIds) {
  const Tokenizer tok = Tokenizer::byte_level(300);
  EXPECT_EQ(tok.vocab_size(), 300);
  const std::vector<int> ids = tok.encode("hi", true, true);
  EXPECT_EQ(ids, (std::vector<int>{Tokenizer::kBos, 3 + 'h', 3 + 'i', Tokenizer::kEos}));
  EXPECT_EQ(tok.decode(Tokenizer::kBos, 3 + ' '), " ");  // a byte token is not a dummy prefix
  EXPECT_EQ(tok.decode(5, 299), "");
  EXPECT_THROW(tok.piece(300), InputError);
  EXPECT_THROW(Tokenizer::byte_level(258), InputError);
}

TEST(ByteLevelTokenizer, SavedAndLoadedBackIsTheSameTokenizer) {
  const Tokenizer tok = Tokenizer::byte_level(300);
  const std::string path = testing::temp_path("byte_level_300.bin");
  save_tokenizer(tok, path);
  const Tokenizer loaded = Tokenizer::load(path, 300);
  for (int id = 0; id < 300; ++id) {
    // Unused ids have empty pieces, which run.c cannot read: they get a name.
    ASSERT_EQ(loaded.piece(id), id < 259 ? tok.piece(id) : "<unused" + std::to_string(id) + ">") << "id " << id;
    ASSERT_EQ(loaded.score(id), tok.score(id)) << "id " << id;
  }
  EXPECT_EQ(loaded.encode("hi there", true, false), tok.encode("hi there", true, false));
}

// --- tok512.bin, the tokenizer of stories260K -----------------------------

TEST(Tok512, EncodesLikeLlama2cRunC) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  const Tokenizer tok = Tokenizer::load(path, 512);
  // run.c on the same files: the greedy story begins with these ids.
  EXPECT_EQ(tok.encode("Once upon a time", false, false), (std::vector<int>{403, 407, 261, 378}));
  EXPECT_EQ(tok.encode("Once upon a time", true, false), (std::vector<int>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok.encode("Once upon a time", true, true), (std::vector<int>{1, 403, 407, 261, 378, 2}));
}

TEST(Tok512, SavingItWritesTheSameBytes) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  const std::string copy = testing::temp_path("tok512_saved.bin");
  save_tokenizer(Tokenizer::load(path, 512), copy);
  EXPECT_EQ(testing::read_bytes(copy), testing::read_bytes(path));
}

TEST(Tok512, DecodingTheEncodingGivesBackTheText) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  const Tokenizer tok = Tokenizer::load(path, 512);
  for (const std::string& text : kSentences) {
    SCOPED_TRACE(text);
    EXPECT_EQ(round_trip(tok, text), text);
    // Without BOS the dummy-prefix space stays.
    EXPECT_EQ(decode_all(tok, tok.encode(text, false, false)), " " + text);
  }
}

TEST(Tok512, MultiByteCharactersUseByteFallback) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  const Tokenizer tok = Tokenizer::load(path, 512);
  const std::vector<int> ids = tok.encode("\xE2\x98\x95", false, false);  // ☕
  ASSERT_EQ(ids.size(), 4u);  // dummy prefix, then 3 byte tokens
  EXPECT_EQ(ids[1], 3 + 0xE2);
  EXPECT_EQ(ids[2], 3 + 0x98);
  EXPECT_EQ(ids[3], 3 + 0x95);
}

TEST(Tok512, ByteTokensDecodeToTheRawByte) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  const Tokenizer tok = Tokenizer::load(path, 512);
  EXPECT_EQ(tok.piece(13), "<0x0A>");
  EXPECT_EQ(tok.decode(400, 13), "\n");
  EXPECT_EQ(tok.piece(3 + 0xE2), "<0xE2>");
  EXPECT_EQ(tok.decode(400, 3 + 0xE2), "\xE2");
  EXPECT_EQ(tok.decode(400, 3), std::string(1, '\0'));
}

TEST(Tok512, DecodePrintableDropsALoneControlByte) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  const Tokenizer tok = Tokenizer::load(path, 512);
  EXPECT_EQ(tok.decode(400, 3 + 0x01), "\x01");
  EXPECT_EQ(tok.decode_printable(400, 3 + 0x01), "");
  EXPECT_EQ(tok.decode_printable(400, 3 + 0x1B), "");  // ESC
  EXPECT_EQ(tok.decode_printable(400, 13), "\n");      // whitespace stays
  EXPECT_EQ(tok.decode_printable(400, 403), tok.decode(400, 403));
  EXPECT_EQ(tok.decode_printable(Tokenizer::kBos, 403), "Once");
}

TEST(Tok512, PieceOfAnOutOfRangeIdThrows) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  const Tokenizer tok = Tokenizer::load(path, 512);
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_THROW(tok.piece(512), InputError);
  EXPECT_THROW(tok.piece(-1), InputError);
  EXPECT_THROW(tok.decode(1, 512), InputError);
}

TEST(Tok512, TruncatedCopyIsRejected) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  const std::vector<char> bytes = read_bytes(path);
  const std::string cut = testing::temp_path("tok512_cut.bin");
  write_bytes(cut, {bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2)});
  EXPECT_THROW(Tokenizer::load(cut, 512), InputError);
  write_bytes(cut, {bytes.begin(), bytes.end() - 1});
  EXPECT_TRUE(HasSubstr(load_error(cut, 512), "truncated"));
}

TEST(Tok512, TooSmallForALargerVocabulary) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  const std::string message = load_error(path, 32000);
  EXPECT_TRUE(HasSubstr(message, "ends after 512 tokens"));
  EXPECT_TRUE(HasSubstr(message, "wrong tokenizer for this model?"));
}

// --- tokenizer.bin, the 32000-token Llama 2 vocabulary --------------------

// stories260K (vocab 512) with Llama 2's tokenizer.bin: its first 512 pieces
// would load and decode every id into the wrong text.
TEST(Llama2Tokenizer, IsRejectedForA512TokenModel) {
  LLM_REQUIRE_MODEL_FILE(path, "tokenizer.bin");
  EXPECT_TRUE(HasSubstr(load_error(path, 512), "wrong tokenizer for this model?"));
}

TEST(Llama2Tokenizer, EncodesHelloWorldAndRoundTrips) {
  LLM_REQUIRE_MODEL_FILE(path, "tokenizer.bin");
  const Tokenizer tok = Tokenizer::load(path, 32000);
  EXPECT_EQ(tok.vocab_size(), 32000);
  // SentencePiece's Llama 2 ids: "▁Hello" 15043, "▁world" 3186.
  EXPECT_EQ(tok.encode("Hello world", true, false), (std::vector<int>{1, 15043, 3186}));
  for (const std::string& text : kSentences) {
    SCOPED_TRACE(text);
    EXPECT_EQ(round_trip(tok, text), text);
  }
}

// --- encode() against llama2.c's merge loop (encode_by_rescanning) ---------

// Texts that stress the merge order: nothing, one character, long runs of one
// character (every pair ties), words, code points with and without tokens,
// invalid UTF-8, byte-token spellings, and random mixes of the vocabulary's
// own pieces (many merges, many ties between overlapping pairs).
std::vector<std::string> awkward_texts(const Tokenizer& tok, unsigned seed) {
  std::vector<std::string> texts = {"", " ", "a", "\n", "\xFF", "\xC3", "\xC3\xA9", "\xF0\x9F\x98\x80",
                                    "<0x41>", "<0x41><0x42>b", "  ", "\t\t\n\n"};
  texts.insert(texts.end(), kSentences.begin(), kSentences.end());
  for (const char* unit : {"a", " ", "e", "ab", " the", "\xC3\xA9", "\xE2\x98\x95", "\x80", "1"})
    for (int repeats : {2, 3, 4, 5, 7, 8, 16, 33, 100}) {
      std::string text;
      for (int i = 0; i < repeats; ++i) text += unit;
      texts.push_back(text);
    }
  std::mt19937 rng(seed);
  auto below = [&rng](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
  const std::string letters = "abcdefghijklmnopqrstuvwxyz ABC.,!?'\n0123456789";
  for (int t = 0; t < 60; ++t) {
    std::string ascii, bytes, pieces;
    const std::size_t length = 1 + below(200);
    for (std::size_t i = 0; i < length; ++i) ascii += letters[below(letters.size())];
    for (std::size_t i = 0; i < length; ++i) bytes += static_cast<char>(below(256));
    while (pieces.size() < length) {
      // A piece of the vocabulary as its text: byte tokens as their byte.
      const int id = static_cast<int>(3 + below(static_cast<std::size_t>(tok.vocab_size() - 3)));
      pieces += tok.decode(400, id);
    }
    texts.insert(texts.end(), {ascii, bytes, pieces});
  }
  return texts;
}

// Both merge loops on every awkward text, with and without BOS/EOS.
void expect_encodings_match_rescanning(const Tokenizer& tok, unsigned seed) {
  for (const std::string& text : awkward_texts(tok, seed)) {
    for (const bool bos : {false, true}) {
      const std::vector<int> fast = tok.encode(text, bos, !bos);
      const std::vector<int> reference = tok.encode_by_rescanning(text, bos, !bos);
      ASSERT_EQ(fast, reference) << "text of " << text.size() << " bytes: '" << text << "', bos " << bos;
    }
  }
}

TEST(EncodeMatchesRescanning, Tok512) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  expect_encodings_match_rescanning(Tokenizer::load(path, 512), 11);
}

TEST(EncodeMatchesRescanning, Llama2Tokenizer) {
  LLM_REQUIRE_MODEL_FILE(path, "tokenizer.bin");
  expect_encodings_match_rescanning(Tokenizer::load(path, 32000), 12);
}

TEST(EncodeMatchesRescanning, SyntheticAndByteLevelVocabularies) {
  expect_encodings_match_rescanning(
      Tokenizer::load(write_tokenizer_file("synthetic_match.bin", kSyntheticPieces), kSyntheticVocab), 13);
  expect_encodings_match_rescanning(Tokenizer::byte_level(300), 14);
}

// Every merge scores the same: the order is decided by position alone, the
// leftmost pair first. Scores at llama2.c's -1e10 floor (or NaN, or -inf)
// never merge; -0 ties with +0.
TEST(EncodeMatchesRescanning, TiesAndScoresThatNeverMerge) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::string path = write_tokenizer_file(
      "ties.bin", {{" ", 0.0f}, {"a", 0.0f}, {"b", 0.0f}, {"aa", 0.0f}, {"aaaa", 0.0f}, {" a", -0.0f},
                   {"ab", 0.0f}, {"ba", -1e10f}, {"bb", nan}, {"aaa", 0.0f}, {"c", 0.0f},
                   {"cc", -std::numeric_limits<float>::infinity()}, {"abab", 0.0f}});
  const Tokenizer tok = Tokenizer::load(path, 259 + 13);
  // [" ", a, a, a, a]: " a" (-0) ties with each "aa" (0) and, leftmost,
  // merges first; then the leftmost "aa" ([" a", aa, a]); then "aaa".
  EXPECT_EQ(tok.encode("aaaa", true, false), (std::vector<int>{Tokenizer::kBos, 264, 268}));
  // "ba", "bb" and "cc" are never merged.
  EXPECT_EQ(tok.encode("bbcc", true, false), (std::vector<int>{Tokenizer::kBos, 259, 261, 261, 269, 269}));
  std::mt19937 rng(15);
  for (int t = 0; t < 300; ++t) {
    std::string text;
    const int length = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < length; ++i) text += "aabbc "[std::uniform_int_distribution<int>(0, 5)(rng)];
    for (const bool bos : {false, true})
      ASSERT_EQ(tok.encode(text, bos, false), tok.encode_by_rescanning(text, bos, false)) << "'" << text << "'";
  }
}

// A prompt far longer than any context still encodes in one pass over a
// priority queue; its ids are those of the rescanning loop (checked on a
// length the quadratic reference can afford).
TEST(EncodeMatchesRescanning, ALongStory) {
  LLM_REQUIRE_MODEL_FILE(path, "tok512.bin");
  const Tokenizer tok = Tokenizer::load(path, 512);
  std::string story;
  while (story.size() < 3000) story += kSentences[story.size() % kSentences.size()] + " ";
  EXPECT_EQ(tok.encode(story, true, false), tok.encode_by_rescanning(story, true, false));
}

// --- Found by fuzzing (fuzz/fuzz_tokenizer_load.cpp) ----------------------

// A vocabulary of fewer than 259 tokens has no byte token for most bytes:
// byte fallback used to emit id 3 + byte anyway, and the merge loop then read
// past the end of the pieces (a heap overflow). Such bytes are <unk> now.
TEST(TokenizerFuzzFindings, ASmallVocabularyEncodesBytesItCannotHoldAsUnk) {
  // No byte tokens; a piece's score is its length.
  const std::string path = write_pieces_file("small_vocab.bin", {{"<unk>", 5.0f}, {"\n<s>\n", 5.0f}, {"\n</s>\n", 6.0f},
                                                                  {" ", 1.0f}, {"a", 1.0f}, {"b", 1.0f}, {" a", 2.0f},
                                                                  {"ab", 2.0f}});
  const Tokenizer tok = Tokenizer::load(path, 8);
  // "z" and the two bytes of "é" have no token: <unk> each.
  const std::vector<int> ids = tok.encode("ab z\xC3\xA9", /*add_bos=*/true, /*add_eos=*/true);
  for (int id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, tok.vocab_size());
  }
  // [" ", a, b, " ", <unk> x3]: " a" and "ab" score the same, the first wins.
  EXPECT_EQ(ids, (std::vector<int>{Tokenizer::kBos, 6, 5, 3, Tokenizer::kUnk, Tokenizer::kUnk, Tokenizer::kUnk,
                                   Tokenizer::kEos}));
}

// encode() emits <unk>, <s> and </s> by id: a vocabulary without them is refused.
TEST(TokenizerFuzzFindings, RejectsAVocabularyWithoutTheThreeSpecialTokens) {
  const std::string path = write_pieces_file("two_tokens.bin", {{"<unk>", 5.0f}, {"\n<s>\n", 5.0f}});
  EXPECT_TRUE(HasSubstr(load_error(path, 2), "at least 3 tokens"));
  const std::vector<char> bytes = read_bytes(path);
  std::istringstream one_token(std::string(bytes.begin(), bytes.begin() + 4 + 8 + 5));  // header, "<unk>"
  EXPECT_THROW(Tokenizer::read(one_token, 1), InputError);
}

// The stream reader behind load(): the same tokenizer from bytes in memory.
TEST(TokenizerRead, FromMemoryIsTheSameAsFromTheFile) {
  const std::string path = write_tokenizer_file("synthetic_for_read.bin", kSyntheticPieces);
  const std::vector<char> bytes = read_bytes(path);
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  const Tokenizer from_memory = Tokenizer::read(in, kSyntheticVocab);
  const Tokenizer from_file = Tokenizer::load(path, kSyntheticVocab);
  ASSERT_EQ(from_memory.vocab_size(), from_file.vocab_size());
  for (int i = 0; i < kSyntheticVocab; ++i) {
    EXPECT_EQ(from_memory.piece(i), from_file.piece(i));
    EXPECT_EQ(from_memory.score(i), from_file.score(i));
  }
  std::istringstream truncated(std::string(bytes.begin(), bytes.end() - 1));
  try {
    Tokenizer::read(truncated, kSyntheticVocab, "in memory");
    ADD_FAILURE() << "a truncated tokenizer was read";
  } catch (const InputError& e) {
    EXPECT_TRUE(HasSubstr(e.what(), "'in memory' is truncated inside token"));
  }
}

}  // namespace
}  // namespace llm
