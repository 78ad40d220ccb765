#include "step07_batching/measure/replay.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <span>
#include <string>

#include "llm/sampler.hpp"  // argmax
#include "step05_paged_attention/measure/paged_generation.hpp"

namespace step07 {

ReplayResult replay(llm::Model& model, const std::vector<Request>& requests, const EngineOptions& options,
                    const std::vector<std::vector<int>>* watch) {
  ServingClock clock;
  Engine engine(model, options, clock);
  ReplayResult result;
  if (watch != nullptr)
    // One comparison per token; a row is copied only where a request parts.
    engine.set_token_listener([&result, watch](const TokenEvent& event) {
      const std::vector<int>& solo = watch->at(static_cast<std::size_t>(event.request_id));
      const auto index = static_cast<std::size_t>(event.index);
      if (event.sample != 0 || result.partings.contains(event.request_id)) return;
      if (index < solo.size() && solo[index] == event.token) return;
      result.partings[event.request_id] = {event.index, std::vector<float>(event.logits.begin(), event.logits.end())};
    });
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

bool batch_invariant(const llm::Model& model) { return model.device_name() == "cpu"; }

namespace {

// [vocab] the logits row `request`'s token `token` is drawn from when it runs
// alone on `model` with `solo` (its solo tokens) fed back before it.
std::vector<float> solo_logits_row(llm::Model& model, const Request& request, const std::vector<int>& solo,
                                   int token) {
  const auto cache = model.make_cache(1, model.config().seq_len);
  std::span<const float> logits = model.forward(llm::TokenBatch::prefill(request.prompt, 0, 0), *cache);
  const int prompt_length = static_cast<int>(request.prompt.size());
  for (int i = 0; i < token; ++i)
    logits = model.forward(llm::TokenBatch::single(solo.at(static_cast<std::size_t>(i)), prompt_length + i, 0), *cache);
  return {logits.begin(), logits.end()};
}

// check_replay's verdict on `record`, which parts from `solo` at token t:
// the run's kept row and the solo row recomputed alone must agree within
// `tolerance`, each row's greedy token being the one drawn from it.
PartingVerdict judge_greedy_parting(llm::Model& model, const Request& request, const RequestRecord& record,
                                    const std::vector<int>& solo, int t, const ReplayResult& run,
                                    llm::Tolerance tolerance) {
  const auto kept = run.partings.find(record.id);
  if (kept == run.partings.end() || kept->second.token != t)
    return {false, " (the run kept no logits row for that token)"};
  const int want = solo[static_cast<std::size_t>(t)], got = record.generated[static_cast<std::size_t>(t)];
  const std::vector<float>& here = kept->second.logits;
  const std::vector<float> alone = solo_logits_row(model, request, solo, t);
  if (llm::argmax(alone) != want || llm::argmax(here) != got)
    return {false, " (a row's greedy token is not the token drawn from it)"};
  const llm::CompareResult close = llm::compare(here, alone, tolerance);
  if (!close.ok) return {false, ": the two logits rows there are past the tolerance: " + close.summary()};
  const auto at = [](const std::vector<float>& row, int id) { return row[static_cast<std::size_t>(id)]; };
  return {true, fmt::format(": the two rows agree within the tolerance (max_abs {:.2e}); the two tokens' logits are "
                            "{:.4f} / {:.4f} alone, {:.4f} / {:.4f} here",
                            close.max_abs_err, at(alone, want), at(alone, got), at(here, want), at(here, got))};
}

// check_tokens_only's verdict on `record`, which parts from `solo` at token
// t: the solo row's logits of the two tokens within twice the tolerance.
PartingVerdict judge_near_tie_parting(llm::Model& model, const Request& request, const RequestRecord& record,
                                      const std::vector<int>& solo, int t, llm::Tolerance tolerance) {
  const int want = solo[static_cast<std::size_t>(t)], got = record.generated[static_cast<std::size_t>(t)];
  const std::vector<float> alone = solo_logits_row(model, request, solo, t);
  if (llm::argmax(alone) != want) return {false, " (the solo row's greedy token is not the solo token)"};
  if (got < 0 || got >= static_cast<int>(alone.size())) return {false, " (the run's token is not in the vocabulary)"};
  const llm::NearTie tie = llm::near_tie(alone, want, got, tolerance);
  if (!tie.swappable)
    return {false, fmt::format(": alone the two tokens' logits are {:.4f} / {:.4f}, {:.2e} apart, more than a row "
                               "within the tolerance can swap ({:.2e})",
                               tie.chosen_logit, tie.other_logit, tie.gap, tie.limit)};
  return {true, fmt::format(": alone the two tokens' logits are {:.4f} / {:.4f}, {:.2e} apart, a near-tie that a row "
                            "within the tolerance can swap ({:.2e}); the batched row is not seen over HTTP",
                            tie.chosen_logit, tie.other_logit, tie.gap, tie.limit)};
}

// judge_partings with each parting's request found in the trace and its
// solo tokens handed to `verdict`(request, record, solo tokens, t): what the
// greedy checks, in process and over HTTP, share.
using RequestVerdict =
    std::function<PartingVerdict(const Request&, const RequestRecord&, const std::vector<int>&, int)>;
OutputCheck judge_trace_partings(OutputCheck check, const std::vector<Request>& requests,
                                 const std::vector<RequestRecord>& records, const std::vector<std::vector<int>>& solo,
                                 const RequestVerdict& verdict) {
  return judge_partings(check, records, solo, [&](const RequestRecord& record, int t) {
    const auto request = std::find_if(requests.begin(), requests.end(),
                                      [&record](const Request& candidate) { return candidate.id == record.id; });
    if (request == requests.end()) return PartingVerdict{false, " (the request is not in the trace)"};
    return verdict(*request, record, solo.at(static_cast<std::size_t>(record.id)), t);
  });
}

}  // namespace

OutputCheck check_tokens_only(llm::Model& model, const std::vector<Request>& requests,
                              const std::vector<RequestRecord>& records, const std::vector<std::vector<int>>& solo,
                              llm::Tolerance tolerance) {
  const OutputCheck check = check_outputs(records, solo);
  if (batch_invariant(model)) return check;
  return explain_partings_by_near_ties(check, model, requests, records, solo, tolerance);
}

OutputCheck explain_partings_by_near_ties(OutputCheck check, llm::Model& model, const std::vector<Request>& requests,
                                          const std::vector<RequestRecord>& records,
                                          const std::vector<std::vector<int>>& solo, llm::Tolerance tolerance) {
  return judge_trace_partings(
      check, requests, records, solo,
      [&](const Request& request, const RequestRecord& record, const std::vector<int>& tokens, int t) {
        return judge_near_tie_parting(model, request, record, tokens, t, tolerance);
      });
}

OutputCheck check_replay(llm::Model& model, const std::vector<Request>& requests, const ReplayResult& run,
                         const std::vector<std::vector<int>>& solo, llm::Tolerance tolerance) {
  const OutputCheck check = check_outputs(run.records, solo);
  if (batch_invariant(model)) return check;
  return explain_partings(check, model, requests, run, solo, tolerance);
}

OutputCheck explain_partings(OutputCheck check, llm::Model& model, const std::vector<Request>& requests,
                             const ReplayResult& run, const std::vector<std::vector<int>>& solo,
                             llm::Tolerance tolerance) {
  return judge_trace_partings(
      check, requests, run.records, solo,
      [&](const Request& request, const RequestRecord& record, const std::vector<int>& tokens, int t) {
        return judge_greedy_parting(model, request, record, tokens, t, run, tolerance);
      });
}

OutputCheck judge_partings(OutputCheck check, const std::vector<RequestRecord>& records,
                           const std::vector<std::vector<int>>& reference,
                           const std::function<PartingVerdict(const RequestRecord&, int)>& judge) {
  if (check.ok() || check.requests != check.expected) return check;
  check.first_difference.clear();
  for (const RequestRecord& record : records) {
    const std::vector<int>& want = reference.at(static_cast<std::size_t>(record.id));
    if (record.generated == want) continue;
    const auto [got_token, want_token] =
        std::mismatch(record.generated.begin(), record.generated.end(), want.begin(), want.end());
    const int t = static_cast<int>(got_token - record.generated.begin());
    std::string text = fmt::format("request {}: token {} is {} alone, {} here", record.id, t,
                                   want_token == want.end() ? -1 : *want_token,
                                   got_token == record.generated.end() ? -1 : *got_token);
    const bool ended = got_token == record.generated.end() || want_token == want.end();
    const PartingVerdict verdict = ended ? PartingVerdict{false, " (one run ended before the other)"} : judge(record, t);
    text += verdict.why;
    if (verdict.explained) ++check.explained;
    std::string& first = verdict.explained ? check.first_explained : check.first_difference;
    if (first.empty()) first = std::move(text);
  }
  return check;
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
