#include "llm/model.hpp"

#include <fmt/format.h>

#include <set>

#include "llm/errors.hpp"

namespace llm {

void validate_batch(const ModelConfig& config, const TokenBatch& batch, const KvCache& cache) {
  const int n = batch.size();
  if (n == 0) throw InputError("forward called with an empty batch");
  if (batch.positions.size() != batch.tokens.size() || batch.sequences.size() != batch.tokens.size())
    throw InputError("batch tokens, positions and sequences differ in length");

  std::set<int> finished_sequences;  // sequences whose run of rows has ended
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
      if (pos >= cache.capacity())
        throw KvCacheFullError(fmt::format(
            "KV cache full: sequence {} needs position {} but the cache holds {} positions per sequence", seq, pos,
            cache.capacity()));
    } else {
      if (finished_sequences.count(seq))
        throw InputError(fmt::format("the rows of sequence {} must be contiguous in the batch", seq));
      cache.check_writable(seq, pos);  // no gap after the cached prefix, room in the cache
    }
    if (r + 1 == n || batch.sequences[r + 1] != seq) finished_sequences.insert(seq);
  }
}

}  // namespace llm
