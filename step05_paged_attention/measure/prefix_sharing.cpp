#include "step05_paged_attention/measure/prefix_sharing.hpp"

#include <algorithm>
#include <random>

#include "llm/errors.hpp"
#include "llm/tokenizer.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step05_paged_attention/paged_kv_cache.hpp"

namespace step05 {
namespace {

// Positions a request runs: its prompt, then generated_tokens - 1 decode
// rows (the prefill's last row gives the first token).
int total_positions(const std::vector<int>& prompt, const PrefixSharingOptions& options) {
  return static_cast<int>(prompt.size()) + options.generated_tokens - 1;
}

// Serves every request once, in order, in its own slot of a fresh cache, and
// keeps them all resident to the end (so blocks_used is what N concurrent
// requests hold). ttft_ms collects (lookup + prefill) per request, split by
// hit and miss.
void serve_once(const std::string& device, llm::Model& model, const std::vector<std::vector<int>>& prompts,
                const PrefixSharingOptions& options, bool sharing, PrefixSharingRun& run,
                std::vector<double>& miss_ms, std::vector<double>& hit_ms) {
  const int n = static_cast<int>(prompts.size());
  PagedKvCacheOptions cache_options;
  cache_options.num_sequences = n;
  cache_options.block_size = options.block_size;
  // Room for every request without sharing: the same pool both ways, so
  // blocks_used compares like with like.
  cache_options.n_blocks = blocks_for_sequences(n, total_positions(prompts.front(), options), options.block_size);
  auto cache = make_paged_kv_cache(device, model.config(), cache_options);
  run.sharing = sharing;
  run.prefill_rows = 0;
  run.tokens.assign(static_cast<std::size_t>(n), {});
  for (int r = 0; r < n; ++r) {
    const std::vector<int>& prompt = prompts[static_cast<std::size_t>(r)];
    llm::Stopwatch lookup;
    const int cached = sharing ? cache->share_cached_prefix(r, prompt) : 0;
    const double lookup_ms = lookup.elapsed_ms();
    const GreedyRun greedy = greedy_in_slot(model, *cache, r, prompt, cached, total_positions(prompt, options));
    // What the request computed becomes reusable (its full blocks only).
    if (sharing) {
      std::vector<int> written(prompt);
      written.insert(written.end(), greedy.tokens.begin(), greedy.tokens.end());
      cache->publish(r, written);
    }
    (cached > 0 ? hit_ms : miss_ms).push_back(lookup_ms + greedy.prefill_ms);
    if (cached > 0) run.cached_positions = cached;
    run.prefill_rows += static_cast<long long>(prompt.size()) - cached;
    run.tokens[static_cast<std::size_t>(r)] = greedy.tokens;
  }
  run.blocks_used = cache->blocks().used_blocks();
}

PrefixSharingRun serve(const std::string& device, llm::Model& model, const std::vector<std::vector<int>>& prompts,
                       const PrefixSharingOptions& options, bool sharing) {
  PrefixSharingRun run;
  std::vector<double> miss_ms, hit_ms, unused_miss, unused_hit;
  // One untimed serve first: the first forwards of a process pay for
  // allocations and cold caches that no later request sees.
  serve_once(device, model, prompts, options, sharing, run, unused_miss, unused_hit);
  for (int repeat = 0; repeat < std::max(1, options.repeats); ++repeat)
    serve_once(device, model, prompts, options, sharing, run, miss_ms, hit_ms);
  run.ttft_miss = llm::TimingStats::from_samples(miss_ms);
  if (!hit_ms.empty()) run.ttft_hit = llm::TimingStats::from_samples(hit_ms);
  return run;
}

}  // namespace

std::vector<std::vector<int>> make_shared_prefix_prompts(llm::Model& model, std::span<const int> opening,
                                                         const PrefixSharingOptions& options) {
  const llm::ModelConfig& config = model.config();
  const int room = config.seq_len - options.question_tokens - options.generated_tokens;
  const int system_tokens = std::min(options.system_prompt_tokens, room);
  if (options.n_requests < 2 || options.question_tokens < 1 || options.generated_tokens < 1 ||
      system_tokens <= static_cast<int>(opening.size()))
    throw llm::InputError("prefix sharing needs 2+ requests, 1+ question and generated tokens, and a system prompt "
                          "longer than the opening that fits the context with them");
  // The system prompt: the opening and the model's greedy continuation of it
  // (in a contiguous cache). Should the model end its text early (BOS), the
  // rest is seeded random ids, as the questions are.
  auto cache = model.make_cache(1, system_tokens);
  const GreedyRun text = greedy_in_slot(model, *cache, 0, opening, 0, system_tokens - 1);
  std::vector<int> system(opening.begin(), opening.end());
  for (const int token : text.tokens)
    if (static_cast<int>(system.size()) < system_tokens && token != llm::Tokenizer::kBos) system.push_back(token);
  std::mt19937_64 rng(options.seed);
  // Ids from 3 up: 0-2 are llama2.c's <unk>, BOS and EOS.
  std::uniform_int_distribution<int> token(3, config.vocab_size - 1);
  while (static_cast<int>(system.size()) < system_tokens) system.push_back(token(rng));
  std::vector<std::vector<int>> prompts;
  for (int r = 0; r < options.n_requests; ++r) {
    std::vector<int> prompt = system;
    for (int q = 0; q < options.question_tokens; ++q) prompt.push_back(token(rng));
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

PrefixSharingResult run_prefix_sharing(const std::string& device, llm::Model& model,
                                       const std::vector<std::vector<int>>& prompts,
                                       const PrefixSharingOptions& options) {
  PrefixSharingResult result;
  result.device = device;
  result.prompt_tokens = static_cast<int>(prompts.front().size());
  result.system_prompt_tokens = result.prompt_tokens - options.question_tokens;
  result.without_sharing = serve(device, model, prompts, options, false);
  result.with_sharing = serve(device, model, prompts, options, true);
  result.identical = result.without_sharing.tokens == result.with_sharing.tokens;
  return result;
}

}  // namespace step05
