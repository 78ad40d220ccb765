#pragma once
// Generation through the paged cache (part 4 of the step) and the pieces the
// other parts share: the step's variant table (how K/V are stored and read),
// the models of each variant, and one greedy decode loop over any cache slot.
//
// The claim checked here: paging is exact. Greedy tokens through a paged
// cache of any block size (1, 7, 16, 64), with a prefix taken from the prefix
// cache, and in a forked sequence whose shared last block is copied on write,
// are the tokens of step 01's contiguous cache, token for token.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llm/harness/variant.hpp"
#include "llm/kv_cache.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"

namespace step05 {

// How a variant stores and reads K/V: its cache, and which attention
// kernels read it (the models themselves are built by the caller: the
// baseline with make_model_on, the paged one with make_paged_model_on).
struct KvStorage {
  bool paged_cache = false;    // false: the model's own contiguous cache (make_cache)
  bool paged_kernels = false;  // this step's kernels (make_paged_model_on) instead of the reference ones
};

// 0 contiguous        common's contiguous cache and reference kernels (the baseline)
// 1 paged_reference   a paged cache read by the unchanged reference kernels
// 2 paged_kernels     a paged cache read by this step's paged attention kernels
const std::vector<llm::Variant<KvStorage>>& variants();

// The unchanged model of `device` with this step's paged attention kernels
// in its attention hook (paged_attention.hpp on the CPU, cuda_paged_runner.hpp
// on the GPU).
std::unique_ptr<llm::Model> make_paged_model_on(const std::string& device, const llm::ModelWeights& weights);

// One sequence's greedy generation in slot `sequence` of `cache`, whose
// positions 0..cached-1 already hold the prompt's first `cached` tokens: one
// forward over prompt[cached..] (the prefill), then one row per token until
// total_positions positions have run or BOS is generated (step 01's rule, so
// the tokens compare one to one with step01::generate_cached).
struct GreedyRun {
  std::vector<int> tokens;   // [generated] the prompt excluded
  double prefill_ms = 0.0;   // the prefill forward: time to the first token
  double total_ms = 0.0;
};
GreedyRun greedy_in_slot(llm::Model& model, llm::KvCache& cache, int sequence, std::span<const int> prompt,
                         int cached, int total_positions);

// Part 4: one row per (device, variant, block size, scenario).
struct GenerationCheckOptions {
  std::vector<int> block_sizes = {1, 7, 16, 64};
  std::vector<int> variant_ids = {0, 1, 2};
};
struct GenerationCheck {
  std::string device;
  int variant_id = 0;
  std::string variant_name;
  int block_size = 0;         // 0: contiguous
  std::string scenario;       // "plain" | "shared_prefix" | "fork"
  std::vector<int> tokens;    // what this run generated (for "fork": the parent's)
  int tokens_generated = 0;   // by every sequence of the run (shared_prefix and fork run two)
  std::vector<int> expected;  // step 01's contiguous tokens
  bool identical = false;     // tokens == expected (and, for "fork", the child's too)
  double total_ms = 0.0;      // the run's forwards (both sequences' for shared_prefix and fork)
  int cached_positions = 0;   // shared_prefix: positions taken from the prefix cache
  long long copy_on_write = 0;  // fork: blocks copied on write
  int blocks_used = 0;        // blocks held at the end of the run
};
// `baseline` and `paged` are the models of variant 0 and 2 on `device`;
// prompt: [n] ids, BOS first; total_positions: prompt included.
std::vector<GenerationCheck> check_paged_generation(const std::string& device, llm::Model& baseline,
                                                    llm::Model& paged, std::span<const int> prompt,
                                                    int total_positions, const GenerationCheckOptions& options);

}  // namespace step05
