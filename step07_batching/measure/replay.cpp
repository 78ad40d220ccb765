#include "step07_batching/measure/replay.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "step05_paged_attention/measure/paged_generation.hpp"

namespace step07 {

ReplayResult replay(llm::Model& model, const std::vector<Request>& requests, const EngineOptions& options) {
  ServingClock clock;
  Engine engine(model, options, clock);
  ReplayResult result;
  std::size_t next = 0;  // the first request not yet submitted
  while (next < requests.size() || engine.has_work()) {
    while (next < requests.size() && requests[next].arrival_ms <= clock.now_ms()) engine.submit(requests[next++]);
    if (!engine.has_work()) {
      clock.skip_to(requests[next].arrival_ms);  // idle until the next arrival: skip the gap
      continue;
    }
    engine.step();
    result.peak_blocks_used = std::max(result.peak_blocks_used, engine.cache().blocks().used_blocks());
  }
  result.records = engine.take_finished();
  std::sort(result.records.begin(), result.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.id < b.id; });
  result.iterations = engine.iterations();
  result.max_sequences = engine.scheduler().options().max_sequences;
  result.kv_blocks = engine.cache().blocks().n_blocks();
  result.blocks = engine.cache().blocks().counters();
  result.metrics = summarize_serving(result.records, result.iterations, result.max_sequences);
  return result;
}

std::vector<std::vector<int>> solo_outputs(llm::Model& model, const std::vector<Request>& requests) {
  const auto cache = model.make_cache(1, model.config().seq_len);
  std::vector<std::vector<int>> outputs;
  outputs.reserve(requests.size());
  for (const Request& request : requests) {
    // greedy_in_slot counts positions as llama2.c's -n: the prompt plus one
    // per token fed back; max_tokens tokens feed back all but the last.
    const int positions = static_cast<int>(request.prompt.size()) + request.max_tokens - 1;
    outputs.push_back(step05::greedy_in_slot(model, *cache, 0, request.prompt, 0, positions).tokens);
    cache->truncate(0, 0);
  }
  return outputs;
}

OutputCheck check_outputs(const std::vector<RequestRecord>& records, const std::vector<std::vector<int>>& solo) {
  OutputCheck check;
  check.expected = static_cast<int>(solo.size());
  for (const RequestRecord& record : records) {
    ++check.requests;
    const std::vector<int>& expected = solo.at(static_cast<std::size_t>(record.id));
    if (record.generated == expected) {
      ++check.identical;
      continue;
    }
    if (!check.first_difference.empty()) continue;
    const auto [got, want] = std::mismatch(record.generated.begin(), record.generated.end(), expected.begin(),
                                           expected.end());
    check.first_difference = fmt::format("request {}: token {} is {} alone, {} here ({} vs {} tokens)", record.id,
                                         got - record.generated.begin(),
                                         want == expected.end() ? -1 : *want,
                                         got == record.generated.end() ? -1 : *got, expected.size(),
                                         record.generated.size());
  }
  if (check.requests != static_cast<int>(solo.size()) && check.first_difference.empty())
    check.first_difference = fmt::format("{} of {} requests finished", check.requests, solo.size());
  return check;
}

}  // namespace step07
