// Fuzz target: the llama2.c checkpoint reader on arbitrary bytes.
// Every input must either load (a consistent model whose tensors have the
// sizes its header implies) or be refused with llm::InputError. Any other
// exception, a crash, a leak, undefined behaviour or an allocation the input
// does not pay for (run with -malloc_limit_mb) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "llm/checkpoint.hpp"
#include "llm/errors.hpp"
#include "llm/weights.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size), std::ios::binary);
  try {
    const llm::ModelWeights w = llm::read_checkpoint(in, "fuzz input");
    // Loaded: the header was valid and every byte was accounted for.
    w.config.validate();
    if (llm::checkpoint_file_bytes(w.config) != size) std::abort();
    const std::size_t d = static_cast<std::size_t>(w.config.dim);
    if (w.token_embedding.size() != static_cast<std::size_t>(w.config.vocab_size) * d) std::abort();
    if (w.layers.size() != static_cast<std::size_t>(w.config.n_layers)) std::abort();
    if (w.final_norm.size() != d) std::abort();
  } catch (const llm::InputError&) {
    // Refused with a message: the expected outcome for almost every input.
  }
  return 0;
}
