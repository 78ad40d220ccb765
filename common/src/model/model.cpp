#include "llm/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "llm/errors.hpp"

namespace llm {

void validate_batch(const ModelConfig& config, const TokenBatch& batch, const KvCache& cache) {
  const int n = batch.size();
  if (n == 0) throw InputError("forward called with an empty batch");
  if (batch.positions.size() != batch.tokens.size() || batch.sequences.size() != batch.tokens.size())
    throw InputError("batch tokens, positions and sequences differ in length");

  // Sequences whose run of rows has ended (a handful: a linear search beats a
  // std::set, whose node allocations would cost more than a decode step's checks).
  thread_local std::vector<int> finished_sequences;
  finished_sequences.clear();
  for (int r = 0; r < n; ++r) {
    const int token = batch.tokens[r], pos = batch.positions[r], seq = batch.sequences[r];
    if (token < 0 || token >= config.vocab_size)
      throw InputError(fmt::format("token id {} at batch row {} is out of range [0, {})", token, r, config.vocab_size));
    if (pos >= config.seq_len)
      throw InputError(fmt::format(
          "position {} is beyond the model's context of {} tokens (prompt plus generated tokens too long)", pos,
          config.seq_len));
    const bool continues_run = r > 0 && batch.sequences[r - 1] == seq;
    if (continues_run) {
      if (pos != batch.positions[r - 1] + 1)
        throw InputError(fmt::format("batch rows of sequence {} are not consecutive positions ({} after {})", seq,
                                     pos, batch.positions[r - 1]));
    } else {
      if (std::find(finished_sequences.begin(), finished_sequences.end(), seq) != finished_sequences.end())
        throw InputError(fmt::format("the rows of sequence {} must be contiguous in the batch", seq));
      cache.check_writable(seq, pos);  // no gap after the cached prefix
    }
    if (r + 1 == n || batch.sequences[r + 1] != seq) finished_sequences.push_back(seq);
  }
}

void check_cache(const ModelConfig& config, const std::string& model_device, const KvCache& cache,
                 bool kernels_read_its_elements) {
  if (cache.device_name() != model_device || !cache.fits(config))
    throw InputError(fmt::format("a {} model needs a KV cache in {} memory shaped for it (got a {} cache{})",
                                 model_device, model_device, cache.device_name(),
                                 cache.fits(config) ? "" : " of other layers or K/V width"));
  if (!kernels_read_its_elements)
    throw InputError("this model's attention kernels read fp32 K/V only; the cache stores another element type");
}

void reserve_batch(const TokenBatch& batch, KvCache& cache) {
  const int n = batch.size();
  int first_row = 0;  // the first row of the current sequence's run
  for (int r = 0; r < n; ++r) {
    if (r > 0 && batch.sequences[r] != batch.sequences[r - 1]) first_row = r;
    const bool last_of_sequence = r + 1 == n || batch.sequences[r + 1] != batch.sequences[r];
    if (last_of_sequence) cache.reserve(batch.sequences[r], batch.positions[first_row], batch.positions[r] + 1);
  }
  cache.prepare();
}

void validate_generation(const ModelConfig& config, std::span<const int> prompt, int total_positions) {
  if (prompt.empty()) throw InputError("the prompt must hold at least the BOS token");
  const int context = config.seq_len;
  if (static_cast<int>(prompt.size()) > context)
    throw InputError(fmt::format("the prompt is {} tokens; the model's context is {}", prompt.size(), context));
  if (total_positions > context)
    throw InputError(fmt::format("--steps {} exceeds the model's context of {} positions", total_positions, context));
  if (total_positions < static_cast<int>(prompt.size()))
    throw InputError(fmt::format("--steps {} is shorter than the prompt ({} tokens)", total_positions, prompt.size()));
}

}  // namespace llm
