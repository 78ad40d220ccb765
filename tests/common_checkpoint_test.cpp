// The llama2.c checkpoint format: save/load round trips, and every malformed
// file is rejected with an InputError whose message says what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/errors.hpp"
#include "llm/weights.hpp"
#include "test_support.hpp"

namespace llm {
namespace {

using ::llm::testing::HasSubstr;
using ::llm::testing::read_bytes;
using ::llm::testing::write_bytes;

// Small and odd on purpose: head_dim 6, GQA 3/1, nothing a power of two.
ModelConfig small_config(bool shared_classifier) {
  return make_config(/*dim=*/18, /*hidden_dim=*/35, /*n_layers=*/2, /*n_heads=*/3, /*n_kv_heads=*/1,
                     /*vocab_size=*/37, /*seq_len=*/11, shared_classifier);
}

void write_header(const std::string& path, const std::vector<std::int32_t>& header, std::size_t padding = 0) {
  std::vector<char> bytes(header.size() * sizeof(std::int32_t) + padding, 0);
  std::memcpy(bytes.data(), header.data(), header.size() * sizeof(std::int32_t));
  write_bytes(path, bytes);
}

// The message of the InputError load_checkpoint throws (fails the test if none).
std::string load_error(const std::string& path) {
  try {
    load_checkpoint(path);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "load_checkpoint('" << path << "') did not throw InputError";
  return "";
}

void expect_same_weights(const ModelWeights& got, const ModelWeights& want) {
  const ModelConfig& g = got.config;
  const ModelConfig& w = want.config;
  EXPECT_EQ(g.dim, w.dim);
  EXPECT_EQ(g.hidden_dim, w.hidden_dim);
  EXPECT_EQ(g.n_layers, w.n_layers);
  EXPECT_EQ(g.n_heads, w.n_heads);
  EXPECT_EQ(g.n_kv_heads, w.n_kv_heads);
  EXPECT_EQ(g.vocab_size, w.vocab_size);
  EXPECT_EQ(g.seq_len, w.seq_len);
  EXPECT_EQ(g.shared_classifier, w.shared_classifier);
  // Exact equality: the file stores the same fp32 bits.
  EXPECT_EQ(got.token_embedding, want.token_embedding);
  ASSERT_EQ(got.layers.size(), want.layers.size());
  for (std::size_t l = 0; l < want.layers.size(); ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerWeights& a = got.layers[l];
    const LayerWeights& b = want.layers[l];
    EXPECT_EQ(a.attention_norm, b.attention_norm);
    EXPECT_EQ(a.wq, b.wq);
    EXPECT_EQ(a.wk, b.wk);
    EXPECT_EQ(a.wv, b.wv);
    EXPECT_EQ(a.wo, b.wo);
    EXPECT_EQ(a.ffn_norm, b.ffn_norm);
    EXPECT_EQ(a.w1, b.w1);
    EXPECT_EQ(a.w2, b.w2);
    EXPECT_EQ(a.w3, b.w3);
  }
  EXPECT_EQ(got.final_norm, want.final_norm);
  EXPECT_EQ(got.classifier, want.classifier);
  EXPECT_EQ(got.classifier_matrix(), want.classifier_matrix());
}

// A valid checkpoint of small_config on disk, for the corruption tests.
std::string saved_small_checkpoint(const std::string& name) {
  const std::string path = testing::temp_path(name);
  save_checkpoint(random_weights(small_config(true), 7), path);
  return path;
}

TEST(CheckpointRoundTrip, SharedClassifierIsExact) {
  const ModelWeights original = random_weights(small_config(true), 123);
  // Norm gains are 1 in random_weights; make them distinct so a swapped
  // tensor order would show.
  ModelWeights weights = original;
  for (std::size_t l = 0; l < weights.layers.size(); ++l) {
    weights.layers[l].attention_norm = testing::random_vector(weights.config.dim, 10 + l);
    weights.layers[l].ffn_norm = testing::random_vector(weights.config.dim, 20 + l);
  }
  weights.final_norm = testing::random_vector(weights.config.dim, 30);
  const std::string path = testing::temp_path("roundtrip_shared.bin");
  save_checkpoint(weights, path);
  EXPECT_EQ(std::filesystem::file_size(path), checkpoint_file_bytes(weights.config));
  expect_same_weights(load_checkpoint(path), weights);
}

TEST(CheckpointRoundTrip, SeparateClassifierIsExact) {
  const ModelWeights weights = random_weights(small_config(false), 456);
  ASSERT_FALSE(weights.classifier.empty());
  const std::string path = testing::temp_path("roundtrip_separate.bin");
  save_checkpoint(weights, path);
  EXPECT_EQ(std::filesystem::file_size(path), checkpoint_file_bytes(weights.config));
  const ModelWeights loaded = load_checkpoint(path);
  EXPECT_FALSE(loaded.config.shared_classifier);
  expect_same_weights(loaded, weights);
}

TEST(CheckpointRoundTrip, SeparateClassifierMakesTheFileLargerByOneMatrix) {
  const ModelConfig shared = small_config(true);
  const ModelConfig separate = small_config(false);
  EXPECT_EQ(checkpoint_file_bytes(separate) - checkpoint_file_bytes(shared),
            sizeof(float) * static_cast<std::size_t>(shared.vocab_size) * shared.dim);
}

TEST(CheckpointLoad, RejectsFileTruncatedBy4Bytes) {
  const std::string path = saved_small_checkpoint("cut4.bin");
  std::vector<char> bytes = read_bytes(path);
  bytes.resize(bytes.size() - 4);
  write_bytes(path, bytes);
  const std::string message = load_error(path);
  EXPECT_TRUE(HasSubstr(message, "truncated"));
  EXPECT_TRUE(HasSubstr(message, path));
}

TEST(CheckpointLoad, RejectsFileTruncatedToHalf) {
  const std::string path = saved_small_checkpoint("half.bin");
  std::vector<char> bytes = read_bytes(path);
  bytes.resize(bytes.size() / 2);
  write_bytes(path, bytes);
  EXPECT_TRUE(HasSubstr(load_error(path), "truncated"));
}

TEST(CheckpointLoad, RejectsFileWith4ExtraBytes) {
  const std::string path = saved_small_checkpoint("extra4.bin");
  std::vector<char> bytes = read_bytes(path);
  bytes.insert(bytes.end(), 4, '\0');
  write_bytes(path, bytes);
  const std::string message = load_error(path);
  EXPECT_TRUE(HasSubstr(message, "larger than its header says"));
  EXPECT_TRUE(HasSubstr(message, path));
}

TEST(CheckpointLoad, RejectsMissingFile) {
  const std::string path = testing::temp_path("no_such_model.bin");
  std::filesystem::remove(path);
  const std::string message = load_error(path);
  EXPECT_TRUE(HasSubstr(message, "does not exist"));
  EXPECT_TRUE(HasSubstr(message, path));
}

TEST(CheckpointLoad, RejectsFileShorterThanHeader) {
  const std::string path = testing::temp_path("short_header.bin");
  write_header(path, {64, 172, 5});  // 12 of the 28 header bytes
  EXPECT_TRUE(HasSubstr(load_error(path), "too short"));
  write_bytes(path, {});
  EXPECT_TRUE(HasSubstr(load_error(path), "too short"));
}

// Each case: a header with one impossible value (padded so the file is not
// merely short), and a word the message must contain.
struct BadHeader {
  const char* what;
  std::vector<std::int32_t> header;  // dim, hidden, layers, heads, kv_heads, vocab, seq_len
  const char* expected;
};

TEST(CheckpointLoad, RejectsNonsenseHeadersWithAMessageNamingTheProblem) {
  const std::vector<BadHeader> cases = {
      {"negative dim", {-64, 172, 5, 8, 4, 512, 512}, "dim must be positive"},
      {"zero hidden_dim", {64, 0, 5, 8, 4, 512, 512}, "hidden_dim must be positive"},
      {"zero layers", {64, 172, 0, 8, 4, 512, 512}, "n_layers must be positive"},
      {"zero heads", {64, 172, 5, 0, 4, 512, 512}, "n_heads must be positive"},
      {"negative kv heads", {64, 172, 5, 8, -4, 512, 512}, "n_kv_heads must be positive"},
      {"zero vocab", {64, 172, 5, 8, 4, 0, 512}, "vocab_size"},
      {"INT32_MIN vocab", {64, 172, 5, 8, 4, INT32_MIN, 512}, "vocab_size"},
      {"negative seq_len", {64, 172, 5, 8, 4, 512, -1}, "seq_len must be positive"},
      {"n_heads not dividing dim", {64, 172, 5, 6, 3, 512, 512}, "not a multiple of n_heads"},
      {"n_kv_heads not dividing n_heads", {64, 172, 5, 8, 3, 512, 512}, "not a multiple of n_kv_heads"},
      {"odd head_dim", {63, 172, 5, 7, 7, 512, 512}, "must be even"},
      {"absurd dim", {1 << 30, 172, 5, 8, 4, 512, 512}, "implausibly large"},
      {"absurd seq_len", {64, 172, 5, 8, 4, 512, 1 << 30}, "implausibly large"},
      {"absurd vocab", {64, 172, 5, 8, 4, -(1 << 30), 512}, "implausibly large"},
  };
  const std::string path = testing::temp_path("bad_header.bin");
  for (const BadHeader& c : cases) {
    SCOPED_TRACE(c.what);
    write_header(path, c.header, 4096);
    const std::string message = load_error(path);
    EXPECT_TRUE(HasSubstr(message, c.expected));
    EXPECT_TRUE(HasSubstr(message, path));
  }
}

TEST(CheckpointLoad, HugeButPlausibleHeaderOnASmallFileIsTruncatedNotAllocated) {
  // Within the sanity bounds, but the implied size (hundreds of TB) must be
  // checked against the file before any tensor is allocated.
  const std::string path = testing::temp_path("huge_header.bin");
  write_header(path, {65536, 262144, 1024, 1024, 1024, 1 << 20, 1 << 20}, 4096);
  EXPECT_TRUE(HasSubstr(load_error(path), "truncated"));
}

TEST(CheckpointLoad, RejectsATextFile) {
  const std::string path = testing::temp_path("not_a_model.txt");
  std::ofstream(path) << "This is a plain text file, certainly not a llama2.c checkpoint.\n"
                      << "Its first bytes read as absurd integers.\n";
  EXPECT_TRUE(HasSubstr(load_error(path), "invalid model config"));
}

// The stream reader behind load_checkpoint (what the fuzz target feeds).
TEST(CheckpointRead, FromMemoryIsTheSameAsFromTheFile) {
  const std::string path = saved_small_checkpoint("for_read.bin");
  const std::vector<char> bytes = read_bytes(path);
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  expect_same_weights(read_checkpoint(in, "in memory"), load_checkpoint(path));

  std::istringstream truncated(std::string(bytes.begin(), bytes.end() - 4));
  try {
    read_checkpoint(truncated, "in memory");
    ADD_FAILURE() << "a truncated checkpoint was read";
  } catch (const InputError& e) {
    EXPECT_TRUE(HasSubstr(e.what(), "model file 'in memory' is truncated"));
  }
}

TEST(CheckpointRead, HugeButPlausibleHeaderInMemoryIsTruncatedNotAllocated) {
  const std::int32_t header[7] = {65536, 262144, 1024, 1024, 1024, 1 << 20, 1 << 20};
  std::istringstream in(std::string(reinterpret_cast<const char*>(header), sizeof(header)) + std::string(64, '\0'));
  EXPECT_THROW(read_checkpoint(in, "in memory"), InputError);
}

TEST(Stories260KCheckpoint, LoadsWithTheDocumentedShape) {
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  const ModelWeights weights = load_checkpoint(model_path);
  const ModelConfig& c = weights.config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_TRUE(weights.classifier.empty());
  EXPECT_EQ(checkpoint_file_bytes(c), std::filesystem::file_size(model_path));
}

TEST(Stories260KCheckpoint, ResavingReproducesTheFile) {
  // save_checkpoint writes the RoPE tables as llama2.c's export does; the
  // trained file's tables may differ in the last ulp, so compare everything
  // else exactly and the tables loosely.
  LLM_REQUIRE_MODEL_FILE(model_path, "stories260K.bin");
  const ModelWeights weights = load_checkpoint(model_path);
  const std::string path = testing::temp_path("stories260K_resaved.bin");
  save_checkpoint(weights, path);
  const std::vector<char> original = read_bytes(model_path);
  const std::vector<char> resaved = read_bytes(path);
  ASSERT_EQ(resaved.size(), original.size());
  const ModelConfig& c = weights.config;
  const std::size_t rope_floats = 2 * static_cast<std::size_t>(c.seq_len) * (c.head_dim() / 2);
  const std::size_t rope_end = original.size();  // shared classifier: the tables end the file
  const std::size_t rope_begin = rope_end - rope_floats * sizeof(float);
  EXPECT_TRUE(std::equal(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(rope_begin),
                         resaved.begin()));
  std::vector<float> a(rope_floats), b(rope_floats);
  std::memcpy(a.data(), original.data() + rope_begin, rope_floats * sizeof(float));
  std::memcpy(b.data(), resaved.data() + rope_begin, rope_floats * sizeof(float));
  for (std::size_t i = 0; i < rope_floats; ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << "RoPE table value " << i;
}

}  // namespace
}  // namespace llm
