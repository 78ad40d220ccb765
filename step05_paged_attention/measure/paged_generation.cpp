#include "step05_paged_attention/measure/paged_generation.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/timer.hpp"
#include "llm/sampler.hpp"
#include "llm/tokenizer.hpp"
#include "step01_kv_cache/generation.hpp"
#include "step05_paged_attention/measure/cuda_paged_runner.hpp"
#include "step05_paged_attention/paged_attention.hpp"
#include "step05_paged_attention/paged_kv_cache.hpp"

namespace step05 {

const std::vector<llm::Variant<KvStorage>>& variants() {
  static const std::vector<llm::Variant<KvStorage>> table = {
      {0, "contiguous", "one max-length slot per sequence (step 01's cache), reference attention", llm::Backend::Any,
       {false, false}},
      {1, "paged_reference", "K/V in blocks allocated on demand; the unchanged reference attention reads them",
       llm::Backend::Any, {true, false}},
      {2, "paged_kernels", "the same blocks read by this step's paged attention (a table lookup per block)",
       llm::Backend::Any, {true, true}},
  };
  return table;
}

std::unique_ptr<llm::Model> make_paged_model_on(const std::string& device, const llm::ModelWeights& weights) {
  if (device == "cpu") {
    llm::CpuModelOptions options;
    options.attention = paged_cpu_attention();
    return std::make_unique<llm::CpuModel>(weights, options);
  }
  if (device == "cuda") return make_cuda_paged_model(weights);
  throw llm::InputError(fmt::format("no model for device '{}' (cpu or cuda)", device));
}

GreedyRun greedy_in_slot(llm::Model& model, llm::KvCache& cache, int sequence, std::span<const int> prompt,
                         int cached, int total_positions) {
  llm::validate_generation(model.config(), prompt, total_positions);
  if (cached < 0 || cached >= static_cast<int>(prompt.size()) || cache.length(sequence) != cached)
    throw llm::InputError(fmt::format("slot {} holds {} positions; {} of a {}-token prompt were said to be cached",
                                      sequence, cache.length(sequence), cached, prompt.size()));
  GreedyRun run;
  llm::Stopwatch total;
  // Prefill: the prompt's uncached tail, at positions cached..; its last row
  // predicts the first token.
  const std::span<const int> uncached = prompt.subspan(static_cast<std::size_t>(cached));
  auto logits = model.forward(llm::TokenBatch::prefill(uncached, cached, sequence), cache);
  run.prefill_ms = total.elapsed_ms();
  run.tokens.push_back(llm::argmax(logits));
  llm::TokenBatch batch = llm::TokenBatch::single(0, 0, sequence);
  for (int position = static_cast<int>(prompt.size());
       run.tokens.back() != llm::Tokenizer::kBos && position < total_positions; ++position) {
    batch.tokens[0] = run.tokens.back();
    batch.positions[0] = position;
    logits = model.forward(batch, cache);
    run.tokens.push_back(llm::argmax(logits));
  }
  run.total_ms = total.elapsed_ms();
  return run;
}

namespace {

// Step 01's contiguous greedy generation: the tokens every run must match.
std::vector<int> reference_tokens(llm::Model& baseline, std::span<const int> prompt, int total_positions) {
  llm::Sampler greedy(baseline.config().vocab_size, 0.0f, 0.9f, 0);
  return step01::generate_cached(baseline, prompt, total_positions, greedy).tokens;
}

// The prompt followed by the tokens generated from it: what positions
// 0..n-1 of the sequence hold.
std::vector<int> concatenated(std::span<const int> prompt, std::span<const int> generated) {
  std::vector<int> all(prompt.begin(), prompt.end());
  all.insert(all.end(), generated.begin(), generated.end());
  return all;
}

// A paged cache of two slots with room for `positions` positions in each,
// and the two blocks a fork's copy-on-write can need on top (one per
// sequence writing into a shared block).
std::unique_ptr<PagedKvCache> two_slot_cache(const std::string& device, const llm::Model& model, int block_size,
                                             int positions) {
  PagedKvCacheOptions options;
  options.num_sequences = 2;
  options.block_size = block_size;
  options.n_blocks = blocks_for_sequences(2, positions, block_size) + 2;
  return make_paged_kv_cache(device, model.config(), options);
}

// A check of `scenario` before it runs: who and what.
GenerationCheck check_of(const std::string& device, const llm::Variant<KvStorage>& variant, int block_size,
                         const std::string& scenario) {
  GenerationCheck check;
  check.device = device;
  check.variant_id = variant.id;
  check.variant_name = variant.name;
  check.block_size = variant.fn.paged_cache ? block_size : 0;
  check.scenario = scenario;
  return check;
}

// A position halfway through the generated part of a run, plus `offset`:
// where the shared-prefix and fork scenarios cut the conversation. The
// offsets (3 and 1) keep the cut off block boundaries for most block sizes,
// so a partly filled block is shared.
int halfway(std::span<const int> prompt, int total_positions, int offset) {
  const int prompt_length = static_cast<int>(prompt.size());
  return prompt_length + (total_positions - prompt_length) / 2 + offset;
}

// The index of the second-largest logit: the token a fork's child takes so
// that it leaves the parent's path right after the fork.
int runner_up(std::span<const float> logits) {
  const int best = llm::argmax(logits);
  int second = best == 0 ? 1 : 0;
  for (int i = 0; i < static_cast<int>(logits.size()); ++i)
    if (i != best && logits[static_cast<std::size_t>(i)] > logits[static_cast<std::size_t>(second)]) second = i;
  return second;
}

// The prompt alone in slot 0.
GenerationCheck plain(const std::string& device, llm::Model& model, const llm::Variant<KvStorage>& variant,
                      int block_size, std::span<const int> prompt, int total_positions,
                      const std::vector<int>& expected) {
  GenerationCheck check = check_of(device, variant, block_size, "plain");
  std::unique_ptr<llm::KvCache> cache = variant.fn.paged_cache
                                            ? two_slot_cache(device, model, block_size, total_positions)
                                            : model.make_cache(1, total_positions);
  const GreedyRun run = greedy_in_slot(model, *cache, 0, prompt, 0, total_positions);
  check.tokens = run.tokens;
  check.tokens_generated = static_cast<int>(run.tokens.size());
  check.expected = expected;
  check.identical = run.tokens == expected;
  check.total_ms = run.total_ms;
  if (const auto* paged = dynamic_cast<const PagedKvCache*>(cache.get()))
    check.blocks_used = paged->blocks().used_blocks();
  return check;
}

// Request A generates from `prompt` and publishes its blocks; request B's
// prompt is A's first `b_prompt_length` positions (a follow-up in the same
// conversation), so B takes A's full blocks from the prefix cache and
// prefills only the rest.
GenerationCheck shared_prefix(const std::string& device, llm::Model& baseline, llm::Model& model,
                              const llm::Variant<KvStorage>& variant, int block_size, std::span<const int> prompt,
                              int total_positions, const std::vector<int>& expected_a) {
  GenerationCheck check = check_of(device, variant, block_size, "shared_prefix");
  auto cache = two_slot_cache(device, model, block_size, total_positions);
  const GreedyRun a = greedy_in_slot(model, *cache, 0, prompt, 0, total_positions);
  const std::vector<int> conversation = concatenated(prompt, a.tokens);
  cache->publish(0, conversation);
  const int b_prompt_length = std::min(cache->length(0), halfway(prompt, total_positions, 3));
  const std::span<const int> b_prompt(conversation.data(), static_cast<std::size_t>(b_prompt_length));
  check.cached_positions = cache->share_cached_prefix(1, b_prompt);
  const GreedyRun b = greedy_in_slot(model, *cache, 1, b_prompt, check.cached_positions, total_positions);
  check.tokens = b.tokens;
  check.expected = reference_tokens(baseline, b_prompt, total_positions);
  check.identical = a.tokens == expected_a && b.tokens == check.expected;
  check.total_ms = a.total_ms + b.total_ms;
  check.tokens_generated = static_cast<int>(a.tokens.size() + b.tokens.size());
  check.blocks_used = cache->blocks().used_blocks();
  return check;
}

// The parent prefills the first half of the conversation; the child forks
// from it (sharing every block, the last one partly filled) and takes the
// runner-up token where the parent takes the best one. Both then decode in
// one batch per step. The first write of each into the shared last block
// copies it, so neither sees the other's rows.
GenerationCheck fork(const std::string& device, llm::Model& baseline, llm::Model& model,
                     const llm::Variant<KvStorage>& variant, int block_size, std::span<const int> prompt,
                     int total_positions, const std::vector<int>& expected) {
  GenerationCheck check = check_of(device, variant, block_size, "fork");
  auto cache = two_slot_cache(device, model, block_size, total_positions);
  const std::vector<int> conversation = concatenated(prompt, expected);
  const int fork_at = std::min(static_cast<int>(conversation.size()) - 1, halfway(prompt, total_positions, 1));
  const std::span<const int> parent_prompt(conversation.data(), static_cast<std::size_t>(fork_at));
  llm::Stopwatch total;
  const auto logits = model.forward(llm::TokenBatch::prefill(parent_prompt, 0, 0), *cache);
  std::vector<int> parent = {llm::argmax(logits)}, child = {runner_up(logits)};
  cache->fork(0, 1);
  for (int position = fork_at; position < total_positions; ++position) {
    if (parent.back() == llm::Tokenizer::kBos || child.back() == llm::Tokenizer::kBos) break;
    llm::TokenBatch batch;
    batch.add(parent.back(), position, 0);
    batch.add(child.back(), position, 1);
    const auto next = model.forward(batch, *cache);  // [2, vocab]: the parent's row, then the child's
    const auto vocab = static_cast<std::size_t>(model.config().vocab_size);
    parent.push_back(llm::argmax(next.first(vocab)));
    child.push_back(llm::argmax(next.subspan(vocab, vocab)));
  }
  check.total_ms = total.elapsed_ms();
  check.copy_on_write = cache->blocks().counters().copy_on_write;
  check.blocks_used = cache->blocks().used_blocks();
  // The references: each prompt alone through step 01's contiguous cache,
  // cut to the positions the lock-step loop ran.
  std::vector<int> expected_parent = reference_tokens(baseline, parent_prompt, total_positions);
  std::vector<int> child_prompt(parent_prompt.begin(), parent_prompt.end());
  child_prompt.push_back(child.front());
  std::vector<int> expected_child = {child.front()};
  if (static_cast<int>(child_prompt.size()) <= total_positions) {
    const std::vector<int> rest = reference_tokens(baseline, child_prompt, total_positions);
    expected_child.insert(expected_child.end(), rest.begin(), rest.end());
  }
  expected_parent.resize(std::min(expected_parent.size(), parent.size()));
  expected_child.resize(std::min(expected_child.size(), child.size()));
  check.tokens = parent;
  check.tokens_generated = static_cast<int>(parent.size() + child.size());
  check.expected = expected_parent;
  check.identical = parent == expected_parent && child == expected_child;
  return check;
}

}  // namespace

std::vector<GenerationCheck> check_paged_generation(const std::string& device, llm::Model& baseline,
                                                    llm::Model& paged, std::span<const int> prompt,
                                                    int total_positions, const GenerationCheckOptions& options) {
  const std::vector<int> expected = reference_tokens(baseline, prompt, total_positions);
  std::vector<GenerationCheck> checks;
  for (const auto& variant : variants()) {
    if (std::find(options.variant_ids.begin(), options.variant_ids.end(), variant.id) == options.variant_ids.end())
      continue;
    llm::Model& model = variant.fn.paged_kernels ? paged : baseline;
    if (!variant.fn.paged_cache) {
      checks.push_back(plain(device, model, variant, 0, prompt, total_positions, expected));
    } else {
      for (const int block_size : options.block_sizes) {
        checks.push_back(plain(device, model, variant, block_size, prompt, total_positions, expected));
        checks.push_back(
            shared_prefix(device, baseline, model, variant, block_size, prompt, total_positions, expected));
        checks.push_back(fork(device, baseline, model, variant, block_size, prompt, total_positions, expected));
      }
    }
  }
  return checks;
}

}  // namespace step05
