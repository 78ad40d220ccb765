// Fuzz target: Tokenizer::encode on arbitrary bytes (a prompt as the user
// types it: any bytes, invalid UTF-8 included), with stories260K's real
// tokenizer (tok512.bin, found as the tests find model files: $LLM_MODELS_DIR,
// else ../shared/models) or, without it, the built-in byte-level one.
// Checks: the ids are those of llama2.c's merge loop (encode_by_rescanning),
// every id is in the vocabulary, BOS first and EOS last, and decoding the ids
// gives back the text (the dummy-prefix space dropped after BOS, as llama2.c
// prints it).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llm/tokenizer.hpp"
#include "model_file.hpp"  // tests/: the real model files, found as the tests find them

namespace {

const llm::Tokenizer& tokenizer() {
  static const llm::Tokenizer t = [] {
    if (const std::optional<std::string> path = llm::testing::model_file("tok512.bin")) {
      std::fprintf(stderr, "fuzz_tokenizer_encode: %s (vocab 512)\n", path->c_str());
      return llm::Tokenizer::load(*path, 512);
    }
    std::fprintf(stderr, "fuzz_tokenizer_encode: tok512.bin not found; the byte-level tokenizer (vocab 512)\n");
    return llm::Tokenizer::byte_level(512);
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // The reference loop is quadratic in the prompt's length: a long input
  // would only make the fuzzer slow.
  if (size > 512) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const llm::Tokenizer& t = tokenizer();
  const std::vector<int> ids = t.encode(text, /*add_bos=*/true, /*add_eos=*/true);
  if (ids != t.encode_by_rescanning(text, /*add_bos=*/true, /*add_eos=*/true)) {
    std::fprintf(stderr, "encode and encode_by_rescanning differ on %zu bytes\n", size);
    std::abort();
  }
  if (ids.size() < 2 || ids.front() != llm::Tokenizer::kBos || ids.back() != llm::Tokenizer::kEos) std::abort();
  std::string decoded;
  for (std::size_t i = 1; i + 1 < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= t.vocab_size()) std::abort();
    decoded += t.decode(ids[i - 1], ids[i]);
  }
  // A text that spells a byte token ("<0x41>") may merge into it and decode
  // as the byte, as in llama2.c; the round trip is checked for other texts.
  if (text.find("<0x") == std::string_view::npos && decoded != text) {
    std::fprintf(stderr, "round trip failed: %zu bytes in, %zu bytes out\n", text.size(), decoded.size());
    std::abort();
  }
  return 0;
}
