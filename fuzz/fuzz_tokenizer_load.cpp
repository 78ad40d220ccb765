// Fuzz target: the tokenizer.bin reader on arbitrary bytes.
// The first two bytes choose the vocabulary size the caller asks for (1 to
// 65536: a model's vocab_size comes from its checkpoint header); the rest is
// the file. A tokenizer that loads is then used: a fixed text is encoded and
// every id decoded, so a loaded tokenizer that cannot encode safely (ids out
// of its range, say) is a finding too. Anything but llm::InputError escaping,
// a crash, a leak, undefined behaviour or an allocation the input does not pay
// for is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "llm/errors.hpp"
#include "llm/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const int vocab_size = 1 + (data[0] | (data[1] << 8));
  std::istringstream in(std::string(reinterpret_cast<const char*>(data + 2), size - 2), std::ios::binary);
  try {
    const llm::Tokenizer t = llm::Tokenizer::read(in, vocab_size, "fuzz input");
    if (t.vocab_size() != vocab_size) std::abort();
    const std::vector<int> ids = t.encode("Once upon a time, \xC3\xA9t\xC3\xA9 \xF0\x9F\x98\x80 \xFF!\n", true, true);
    int previous = llm::Tokenizer::kBos;
    for (int id : ids) {
      if (id < 0 || id >= t.vocab_size()) std::abort();
      (void)t.decode_printable(previous, id);
      previous = id;
    }
  } catch (const llm::InputError&) {
  }
  return 0;
}
