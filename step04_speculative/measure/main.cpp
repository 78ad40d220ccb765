// Step 04: speculative decoding.
//
// Decode spends one full target pass per token, and that pass is memory-bound:
// it streams every weight to do a few FLOPs per byte, so checking k+1 tokens
// in one pass costs about as much as producing one. A cheap drafter proposes
// k tokens, the target verifies them in a single forward over k+1 positions,
// and the KV caches roll back past the first rejected draft.
//
// Runs plain decoding (step 01's KV-cache loop, the baseline and reference)
// and every drafter x k on the CPU and (when present) CUDA, checks that greedy
// speculative output is token-for-token identical to plain decoding, and
// prints per configuration: acceptance rate alpha, tokens per target pass,
// target passes saved, the measured decode speedup, and the speedup the
// standard formula predicts from alpha and separately measured pass costs.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/generated_text.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/harness/progress.hpp"
#include "llm/harness/result_rows.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/step_command_line.hpp"
#include "llm/harness/timer.hpp"
#include "llm/sampler.hpp"  // argmax
#include "step01_kv_cache/generation.hpp"
#include "step04_speculative/early_exit_drafter.hpp"
#include "step04_speculative/measure/pass_costs.hpp"
#include "step04_speculative/speculative_decoder.hpp"
#include "step04_speculative/speedup_formula.hpp"
#include "step04_speculative/variants.hpp"

namespace {

// The largest --k. The pass-cost calibration times a target pass over every
// row count 1..k+1, (k+1)(k+2)/2 rows for each of cost_runs runs plus 3
// warm-ups, and again for every drafter x k of the sweep: its work grows as
// k^2. At 64 a calibration is 2,145 rows per run, 48 times the default
// sweep's (k = 8: 45 rows). More drafts only pay for a drafter that is
// almost always right: a round emits at most 1 / (1 - alpha) tokens on
// average, whatever k is.
constexpr int kMaxDrafts = 64;

struct Step04Options {
  llm::CommonOptions common;
  std::vector<int> ks;                   // --k: drafts per round (empty: 2,4,8; --quick 2,4)
  std::string draft_model_path;          // --draft-model
  std::string draft_tokenizer_path;      // --draft-tokenizer
  std::vector<int> draft_layers;         // --draft-layers (empty: 1 and n_layers/2)
  int ngram = 3;                         // --ngram
  int repeats = 5;                       // --repeats
  int cost_runs = 41;                    // timed forwards per calibrated pass cost
};

// Returns the exit status when the program should stop (--help, a bad flag, --list).
std::optional<int> parse_options(int argc, char** argv, Step04Options& options) {
  return llm::parse_step_command_line(
      "Step 04: speculative decoding. A cheap drafter proposes k tokens, the target verifies them in one "
      "pass, on CPU and CUDA.",
      argc, argv, options.common, [&options](CLI::App& app) {
        llm::in_range(app.add_option("--k", options.ks, "drafts per round, a list (e.g. --k 2,4,8)")->delimiter(','),
                      1, kMaxDrafts);
        app.add_option("--draft-model", options.draft_model_path,
                       "llama2.c checkpoint of the draft model (same vocabulary as the target); default: the target "
                       "itself, an always-right but full-cost drafter");
        app.add_option("--draft-tokenizer", options.draft_tokenizer_path,
                       "the draft model's tokenizer.bin; checked to be identical to the target's");
        llm::at_least(app.add_option("--draft-layers", options.draft_layers,
                                     "early-exit self-draft: the target's first L layers, a list (default 1 and "
                                     "n_layers/2; below the target's layers)")
                          ->delimiter(','),
                      1);
        llm::at_least(app.add_option("--ngram", options.ngram, "n-gram prompt lookup: longest suffix to match"), 1)
            ->capture_default_str();
        llm::at_least(app.add_option("--repeats", options.repeats,
                                     "timed generations per configuration (median reported)"),
                      1)
            ->capture_default_str();
      },
      [] { llm::print_variant_list(step04::variants(), 12); });
}

// --quick: fewer positions, runs and ks; then the defaults of flags not given.
void apply_quick_and_validate(Step04Options& options) {
  if (options.common.quick) {
    options.common.steps = std::min(options.common.steps, 64);
    options.repeats = 1;
    options.cost_runs = 9;
    if (options.ks.empty()) options.ks = {2, 4};
  }
  if (options.ks.empty()) options.ks = {2, 4, 8};
  if (!options.draft_tokenizer_path.empty() && options.draft_model_path.empty())
    throw llm::InputError("--draft-tokenizer is only used with --draft-model");
}

// Early-exit depths (default 1 and n_layers/2, only 1 with --quick),
// validated up front so a bad value fails before any run; without one, the
// early-exit variant is left out of `selected`.
void settle_draft_layers(Step04Options& options, const llm::ModelWeights& target, std::vector<int>& selected) {
  const int n_layers = target.config.n_layers;
  if (options.draft_layers.empty()) {
    if (n_layers > 1) options.draft_layers = {1};
    if (n_layers / 2 > 1 && !options.common.quick) options.draft_layers.push_back(n_layers / 2);
  }
  for (int layers : options.draft_layers) step04::early_exit_weights(target, layers);  // throws when out of range
  if (options.draft_layers.empty())
    selected.erase(std::remove(selected.begin(), selected.end(), step04::variant_id::kEarlyExit), selected.end());
}

// The committed tokens at which the pass costs are measured: the prompt and
// half the generated tokens, the middle of the generation (attention cost
// grows with position), at least 2. The verification pass of the calibration
// then covers positions n-1 .. n-1+max_k.
std::size_t calibration_tokens(std::size_t prompt_tokens, std::size_t generated_tokens) {
  return std::max<std::size_t>(2, prompt_tokens + generated_tokens / 2);
}

// Before any run: the largest k must leave room, after the calibration
// point, for its verification pass inside the context. Plain decoding
// generates at most positions - prompt + 1 tokens (it may stop earlier at
// BOS, which only moves the calibration point back).
void check_drafts_fit(int max_k, std::size_t prompt_tokens, int positions, const llm::ModelConfig& config) {
  const std::size_t most_generated = static_cast<std::size_t>(positions) - prompt_tokens + 1;
  const auto calibration = static_cast<int>(calibration_tokens(prompt_tokens, most_generated));
  if (calibration + max_k > config.seq_len)
    throw llm::InputError(fmt::format(
        "--k {} does not fit: the pass costs are measured after {} tokens (the middle of {} positions), and a "
        "verification pass over k+1 rows from there must end inside the context of {} positions, so k can be at "
        "most {} here (or give fewer --steps)",
        max_k, calibration, positions, config.seq_len, config.seq_len - calibration));
}

// Before any run: the speedup is measured over the tokens decoded after the
// first one, and a round at the largest k verifies k+1 of them, so the
// generation must leave at least that many (--steps 1 once timed no token at
// all and printed an infinite gap).
void check_room_to_decode(int max_k, std::size_t prompt_tokens, int positions, const llm::CommonOptions& common) {
  const int decoded_after_the_first = positions - static_cast<int>(prompt_tokens);
  if (decoded_after_the_first < max_k + 1)
    throw llm::InputError(fmt::format(
        "--steps {}{} leaves {} token(s) to decode after the first generated one (the prompt takes {} of the {} "
        "positions), but a round at k = {} verifies k+1 = {}: give {} or more, or a smaller --k",
        common.steps, common.quick ? " (--quick's cap)" : "", std::max(0, decoded_after_the_first), prompt_tokens,
        positions, max_k, max_k + 1,
        fmt::format("{}--steps {}", common.quick ? "no --quick and " : "", static_cast<int>(prompt_tokens) + max_k + 1)));
}

// Plain decoding (step 01's generate_cached): the reference tokens, and the
// decode time (every token after the first; the prompt's prefill is the same
// work in both loops, so neither side counts it).
struct PlainRun {
  step01::GenerationResult first;
  double decode_ms = 0.0;  // median over repeats
  int decode_tokens() const { return static_cast<int>(first.tokens.size()) - 1; }
};

PlainRun measure_plain(llm::Model& model, std::span<const int> prompt, int positions, const llm::CommonOptions& options,
                       int repeats) {
  PlainRun run;
  std::vector<double> decode;  // [repeats] ms of every token after the first
  for (int r = -1; r < repeats; ++r) {  // r = -1: warm-up
    llm::Sampler sampler(model.config().vocab_size, options.temperature, options.top_p, options.seed);
    step01::GenerationResult result = step01::generate_cached(model, prompt, positions, sampler);
    if (r < 0) continue;
    decode.push_back(result.total_ms - result.token_ms.front());
    if (r == 0) run.first = std::move(result);
  }
  run.decode_ms = llm::TimingStats::from_samples(decode).median_ms;
  return run;
}

struct SpeculativeRun {
  step04::SpeculativeResult first;
  double decode_ms = 0.0;        // median over repeats
  double plain_decode_ms = 0.0;  // plain decoding, timed in alternation with the speculative runs
  int decode_tokens() const { return static_cast<int>(first.tokens.size()) - 1; }
};

// Alternates plain and speculative generations (warm-up pair first), so a
// change in machine load between configurations hits both sides alike.
SpeculativeRun measure_speculative(llm::Model& target, step04::Drafter& drafter, std::span<const int> prompt,
                                   int positions, int k, const llm::CommonOptions& options, int repeats) {
  const step04::SamplingSettings sampling{options.temperature, options.top_p};
  SpeculativeRun run;
  step04::SpeculativeDecoder decoder(target, drafter);
  std::vector<double> decode, plain_decode;  // [repeats] each: decode ms, speculative and plain
  for (int r = -1; r < repeats; ++r) {
    llm::Sampler plain_sampler(target.config().vocab_size, options.temperature, options.top_p, options.seed);
    const step01::GenerationResult plain = step01::generate_cached(target, prompt, positions, plain_sampler);
    llm::Sampler rng(target.config().vocab_size, options.temperature, options.top_p, options.seed);  // same seed each run
    step04::SpeculativeResult result = decoder.generate(prompt, positions, k, sampling, rng);
    if (r < 0) continue;
    plain_decode.push_back(plain.total_ms - plain.token_ms.front());
    decode.push_back(result.decode_ms);
    if (r == 0) run.first = std::move(result);
  }
  run.decode_ms = llm::TimingStats::from_samples(decode).median_ms;
  run.plain_decode_ms = llm::TimingStats::from_samples(plain_decode).median_ms;
  return run;
}

// One drafter configuration of the sweep (a variant with its settings).
struct DrafterConfig {
  const llm::Variant<step04::MakeDrafterFn>* variant;
  step04::DrafterSetup setup;
};

// --draft-tokenizer: the draft's tokenizer must be the target's, piece for piece.
void check_same_tokenizer(const llm::Tokenizer& draft, const llm::Tokenizer& target, const std::string& path) {
  if (draft.vocab_size() != target.vocab_size())
    throw llm::InputError(fmt::format("--draft-tokenizer {} has {} tokens but the target's tokenizer has {}", path,
                                      draft.vocab_size(), target.vocab_size()));
  for (int id = 0; id < target.vocab_size(); ++id)
    if (draft.piece(id) != target.piece(id))
      throw llm::InputError(fmt::format(
          "--draft-tokenizer {} differs from the target's tokenizer at id {} ('{}' vs '{}'): the draft and the "
          "target must use the same tokenizer",
          path, id, draft.piece(id), target.piece(id)));
}

// The draft model: --draft-model, else the target itself (alpha = 1 in
// greedy mode, cost ratio ~1: the "perfect but expensive" drafter).
struct DraftModel {
  std::optional<llm::ModelWeights> loaded;  // --draft-model's weights; empty: the target drafts
  std::string name = "self";

  const llm::ModelWeights& weights(const llm::ModelWeights& target) const { return loaded ? *loaded : target; }
};

DraftModel load_draft_model(const Step04Options& options, const llm::LoadedModel& target) {
  DraftModel draft;
  if (options.draft_model_path.empty()) return draft;
  draft.loaded = llm::load_checkpoint(options.draft_model_path);
  draft.name = options.draft_model_path.substr(options.draft_model_path.find_last_of('/') + 1);
  step04::check_same_vocabulary(draft.loaded->config, target.weights.config, draft.name);
  if (!options.draft_tokenizer_path.empty())
    check_same_tokenizer(llm::Tokenizer::load(options.draft_tokenizer_path, draft.loaded->config.vocab_size),
                         target.tokenizer, options.draft_tokenizer_path);
  return draft;
}

llm::Results make_results(const Step04Options& options, const llm::LoadedModel& loaded,
                          const llm::DeviceSelection& devices, const std::string& draft_name,
                          std::size_t prompt_tokens, int positions) {
  const step04::SamplingSettings sampling{options.common.temperature, options.common.top_p};
  llm::Results results("step04_speculative", "speculative decoding: draft k tokens, verify them in one target pass");
  results.set_device_info(llm::device_info_for(devices));
  results.set_config("model", loaded.name);
  results.set_config("model_config", loaded.weights.config.describe());
  results.set_config("draft_model", draft_name);
  results.set_config("prompt_tokens", static_cast<long long>(prompt_tokens));
  results.set_config("positions", static_cast<long long>(positions));
  results.set_config("temperature", static_cast<double>(options.common.temperature));
  results.set_config("top_p", static_cast<double>(options.common.top_p));
  results.set_config("mode", std::string(sampling.greedy() ? "greedy" : "sampling"));
  results.set_config("repeats", static_cast<long long>(options.repeats));
  results.set_config("quick", options.common.quick);
  results.set_config("full", options.common.full);
  results.set_config("speedup_measures", std::string("decode only: time per generated token after the first, "
                                                     "plain / speculative"));
  results.set_config("speedup_baseline", std::string("plain decoding on the same device, timed in alternation with "
                                                     "each configuration; decode only, excludes prefill"));
  results.add_note("speedup = plain decoding's time per generated token / this row's, same device; decode only: "
                   "excludes the prompt's prefill and the first token");
  results.set_config("formula", std::string("predicted = E(alpha,k) / (k c + v(k)), E = (1-alpha^(k+1))/(1-alpha); "
                                            "c, v measured separately; textbook sets v = 1"));
  return results;
}

// What one device's run needs besides the device: the target, the drafters'
// settings, the prompt, and where the rows go.
struct SweepInputs {
  const Step04Options& options;
  const llm::LoadedModel& loaded;
  const DraftModel& draft;
  const std::vector<int>& selected;  // variant ids
  std::span<const int> prompt;
  int positions;
  int max_k;  // the largest --k
  llm::RunProgress* progress;  // one part per device's plain run and per configuration
};

// One row of the speculative-decoding table.
struct SweepRow {
  std::string device, drafter;
  int k;
  double alpha, tokens_per_pass, tokens_per_pass_pred, passes_saved, c, v, measured, predicted, textbook;
  bool identical;
  std::string near_tie;  // greedy, not identical: why the first parting is a near-tie (judge_greedy_tokens)
};

void add_plain_row(llm::Results& results, const std::string& device, const PlainRun& plain,
                   const std::vector<int>& cpu_reference_tokens) {
  llm::ResultRow row;
  row.device = device;
  row.variant = "plain";
  row.id = step04::variant_id::kPlain;
  row.time_ms = plain.decode_ms;
  row.speedup = 1.0;
  row.ok = true;
  row.throughput_key = "tokens_per_s";
  row.throughput = 1000.0 / (plain.decode_ms / std::max(1, plain.decode_tokens()));
  row.extra["k"] = 0LL;
  row.extra["decode_tokens"] = static_cast<long long>(plain.decode_tokens());
  row.extra["target_passes"] = static_cast<long long>(plain.decode_tokens());
  row.extra["tokens_per_pass"] = 1.0;
  row.extra["tokens_identical_to_cpu"] = llm::compare_tokens(plain.first.tokens, cpu_reference_tokens).ok;
  results.add_row(std::move(row));
}

// Every selected drafter with its settings; early exit once per --draft-layers.
std::vector<DrafterConfig> drafter_configs(const SweepInputs& in, const step04::ModelFactory& factory) {
  std::vector<DrafterConfig> configs;
  for (const auto& v : step04::variants()) {
    if (v.id == step04::variant_id::kPlain || !llm::is_selected(in.selected, v.id)) continue;
    step04::DrafterSetup setup{&in.loaded.weights, &in.draft.weights(in.loaded.weights), in.draft.name, 1,
                               in.options.ngram, factory};
    if (v.id == step04::variant_id::kEarlyExit) {
      for (int layers : in.options.draft_layers) {
        setup.draft_layers = layers;
        configs.push_back({&v, setup});
      }
    } else {
      configs.push_back({&v, setup});
    }
  }
  return configs;
}

// What one configuration measured, beside its run: the pass costs taken
// right after it, and the prediction they give.
struct ConfigurationCosts {
  step04::TargetCosts target;
  std::vector<double> v_of_j;  // [max_k + 1] verify cost in target steps
  double c = 0.0;              // draft step / target step
  step04::SpeedupPrediction predicted;
  double textbook = 0.0;
};

// The results row of one configuration (its JSON keys).
llm::ResultRow configuration_row(const std::string& device, const step04::Drafter& drafter, int variant_id, int k,
                                 const SpeculativeRun& spec, const ConfigurationCosts& costs, double measured,
                                 bool tokens_identical, bool ok, int max_k) {
  const step04::SpeculativeStats& st = spec.first.stats;
  const double spec_ms_per_token = spec.decode_ms / std::max(1, spec.decode_tokens());
  const double gap = measured / costs.predicted.speedup - 1.0;
  llm::ResultRow row;
  row.device = device;
  row.variant = fmt::format("{} k={}", drafter.name(), k);
  row.id = variant_id;
  row.time_ms = spec.decode_ms;
  row.speedup = measured;
  row.max_rel_err = 0.0;
  row.ok = ok;
  row.throughput_key = "tokens_per_s";
  row.throughput = 1000.0 / spec_ms_per_token;
  row.extra["drafter"] = drafter.name();
  row.extra["k"] = static_cast<long long>(k);
  row.extra["decode_tokens"] = static_cast<long long>(spec.decode_tokens());
  row.extra["target_passes"] = static_cast<long long>(st.rounds);
  row.extra["drafted"] = st.drafted;
  row.extra["tested"] = st.tested;
  row.extra["accepted"] = st.accepted;
  row.extra["draft_steps"] = st.draft_steps;
  row.extra["alpha"] = st.alpha();
  row.extra["accepted_per_drafted"] = st.drafted ? static_cast<double>(st.accepted) / st.drafted : 0.0;
  row.extra["tokens_per_pass"] = static_cast<double>(spec.decode_tokens()) / std::max(1, st.rounds);
  row.extra["tokens_per_pass_predicted"] = costs.predicted.tokens_per_pass;
  row.extra["passes_saved_fraction"] = 1.0 - static_cast<double>(st.rounds) / std::max(1, spec.decode_tokens());
  row.extra["draft_cost_ratio_c"] = costs.c;
  row.extra["verify_cost_ratio_v"] = costs.v_of_j[static_cast<std::size_t>(k)];
  row.extra["predicted_draft_cost_per_round"] = costs.predicted.draft_cost;
  row.extra["predicted_verify_cost_per_round"] = costs.predicted.verify_cost;
  row.extra["predicted_speedup"] = costs.predicted.speedup;
  row.extra["textbook_speedup"] = costs.textbook;
  row.extra["prediction_gap"] = gap;
  row.extra["within_20pct"] = std::abs(gap) <= 0.20;
  row.extra["target_step_ms"] = costs.target.step_ms;
  row.extra["plain_decode_ms"] = spec.plain_decode_ms;
  row.extra["draft_ms"] = st.draft_ms;
  row.extra["verify_ms"] = st.verify_ms;
  row.extra["overhead_ms"] = spec.first.decode_ms - st.draft_ms - st.verify_ms;
  row.extra["tokens_identical"] = tokens_identical;
  row.extra["best_k_for_alpha"] = static_cast<long long>(step04::best_k(st.alpha(), costs.c, costs.v_of_j, max_k));
  return row;
}

// Greedy speculative decoding emits plain decoding's tokens: each is the
// argmax of the same logits row, computed once in a pass of 1 row and once in
// a verify pass of k + 1 rows. Where those two computations give the same row
// (the CUDA model's half GEMV adds each row alone) or rows within fp32's last
// bits (the CPU model's loops), the tokens must be identical
// (verify_rows_differ says where not). Past --max-gemv-rows the half products
// run on cuBLAS, whose sums come in another order, and rounding to fp16/bf16
// turns that into logits a few rounding steps apart (compare.hpp's
// same_rounding_logits_tolerance); cuBLAS's fp32 kernels too may differ by
// the row count. Then at a near-tie the pass may pick the other token: the
// first parting passes, explained, when plain decoding's own row there makes
// the two tokens a near-tie that a row within `tolerance` can swap; after it
// the two runs have different histories and are not compared. Returns ""
// when the parting is not explained.
std::string explain_greedy_parting(std::span<const int> speculative, const PlainRun& plain, llm::Tolerance tolerance) {
  const std::vector<int>& reference = plain.first.tokens;
  const auto [spec_token, plain_token] =
      std::mismatch(speculative.begin(), speculative.end(), reference.begin(), reference.end());
  if (spec_token == speculative.end() || plain_token == reference.end()) return "";  // one ended before the other
  const auto t = static_cast<std::size_t>(plain_token - reference.begin());
  const std::size_t vocab = plain.first.logits.size() / reference.size();  // reference holds token t: not empty
  if (vocab == 0 || plain.first.logits.size() != vocab * reference.size()) return "";  // no row per token kept
  const std::span<const float> row = std::span<const float>(plain.first.logits).subspan(t * vocab, vocab);
  if (llm::argmax(row) != *plain_token) return "";  // not the row plain decoding drew its token from
  const llm::NearTie tie = llm::near_tie(row, *plain_token, *spec_token, tolerance);
  if (!tie.swappable) return "";
  return fmt::format("token {} is {} in plain decoding, {} here: plain decoding's logits of the two are {:.4f} / "
                     "{:.4f}, {:.2e} apart, a near-tie that a row within the tolerance can swap ({:.2e})",
                     t, *plain_token, *spec_token, tie.chosen_logit, tie.other_logit, tie.gap, tie.limit);
}

// One drafter at one k: speculative runs against plain decoding, the pass
// costs right after them, the prediction, the check. Adds the results row and
// returns the table's row.
SweepRow measure_configuration(llm::Results& results, const std::string& device, llm::Model& target,
                               step04::Drafter& drafter, const DrafterConfig& config, int k, const PlainRun& plain,
                               std::span<const int> cost_context, const SweepInputs& in) {
  const step04::SamplingSettings sampling{in.options.common.temperature, in.options.common.top_p};
  const SpeculativeRun spec =
      measure_speculative(target, drafter, in.prompt, in.positions, k, in.options.common, in.options.repeats);
  const step04::SpeculativeStats& st = spec.first.stats;
  // The costs again, right after the runs they predict (load drifts).
  ConfigurationCosts costs;
  costs.target = step04::measure_target_costs(target, cost_context, in.max_k, in.options.cost_runs);
  costs.v_of_j = costs.target.verify_cost_ratio();
  costs.c = step04::measure_draft_step_ms(drafter, cost_context, k, sampling, in.options.cost_runs) /
            costs.target.step_ms;
  const double alpha = st.alpha();
  costs.predicted = step04::predict_speedup(alpha, st.drafted_per_round, st.steps_per_round, costs.c, costs.v_of_j);
  costs.textbook = drafter.one_step_per_token()
                       ? step04::textbook_speedup(alpha, k, costs.c)
                       : costs.predicted.tokens_per_pass / (costs.c + 1.0);  // one lookup per round, v = 1
  const double spec_ms_per_token = spec.decode_ms / std::max(1, spec.decode_tokens());
  const double measured = (spec.plain_decode_ms / std::max(1, plain.decode_tokens())) / spec_ms_per_token;
  const auto token_check = llm::compare_tokens(spec.first.tokens, plain.first.tokens);
  // Greedy: identical to plain decoding (or, where rows are not
  // batch-invariant, parted at a near-tie), or the step is wrong. Sampling:
  // exact in distribution, not token for token (a different random
  // stream); tests/step04_rejection_sampler_test.cpp checks that.
  const llm::cuda::CudaRunOptions cuda = llm::cuda_run_options(in.options.common);
  const bool verify_rows_differ =  // from plain decoding's 1-row rows: cuBLAS runs the verify pass
      device == "cuda" && (cuda.dtype == llm::cuda::WeightDtype::Float32 || k + 1 > cuda.max_gemv_rows);
  const std::string near_tie =
      sampling.greedy() && !token_check.ok && verify_rows_differ
          ? explain_greedy_parting(spec.first.tokens, plain,
                                   llm::same_rounding_logits_tolerance(llm::compare_dtype(cuda.dtype)))
          : "";
  const bool ok = !sampling.greedy() || token_check.ok || !near_tie.empty();

  llm::ResultRow row =
      configuration_row(device, drafter, config.variant->id, k, spec, costs, measured, token_check.ok, ok, in.max_k);
  if (!near_tie.empty()) row.extra["tokens_part_at_a_near_tie"] = near_tie;
  if (!ok)
    llm::report_failed_check(device + " " + row.variant,
                             "speculative output differs from plain decoding (" + token_check.summary() + ")");
  results.add_row(std::move(row));
  const double tokens_per_pass = static_cast<double>(spec.decode_tokens()) / std::max(1, st.rounds);
  const double passes_saved = 1.0 - static_cast<double>(st.rounds) / std::max(1, spec.decode_tokens());
  return {device,   drafter.name(), k,        alpha,    tokens_per_pass, costs.predicted.tokens_per_pass,
          passes_saved, costs.c,    costs.v_of_j[static_cast<std::size_t>(k)], measured, costs.predicted.speedup,
          costs.textbook, token_check.ok, near_tie};
}

// Plain decoding and every drafter x k on one device. The first device's
// plain tokens are the reference of the others' (and its text is printed).
std::vector<SweepRow> run_on_device(llm::Results& results, const std::string& device, const SweepInputs& in,
                                    std::vector<int>& cpu_reference_tokens) {
  // --dtype and --no-graphs apply to the target and to the model drafters alike.
  const llm::cuda::CudaRunOptions cuda = llm::cuda_run_options(in.options.common);
  auto target = llm::make_model_on(device, in.loaded.weights, cuda);
  const step04::ModelFactory factory = [device, cuda](const llm::ModelWeights& w) {
    return llm::make_model_on(device, w, cuda);
  };

  // Baseline: plain decoding, one target pass per token.
  in.progress->start(fmt::format("{}: plain decoding and the target's pass costs", device));
  const PlainRun plain = measure_plain(*target, in.prompt, in.positions, in.options.common, in.options.repeats);
  if (cpu_reference_tokens.empty()) {
    cpu_reference_tokens = plain.first.tokens;
    llm::print_generated_text(in.loaded.tokenizer, in.prompt, plain.first.tokens);
  }
  add_plain_row(results, device, plain, cpu_reference_tokens);

  // Costs for the formula, at the middle of the generation.
  std::vector<int> sequence(in.prompt.begin(), in.prompt.end());  // [prompt + generated]
  sequence.insert(sequence.end(), plain.first.tokens.begin(), plain.first.tokens.end());
  const std::size_t midpoint = calibration_tokens(in.prompt.size(), plain.first.tokens.size());
  const std::span<const int> cost_context(sequence.data(), std::min(midpoint, sequence.size()));
  {
    const step04::TargetCosts costs = step04::measure_target_costs(*target, cost_context, in.max_k, in.options.cost_runs);
    fmt::print("[{}] target pass at position {}: 1 row {:.4f} ms;", device, cost_context.size() - 1, costs.step_ms);
    const std::vector<double> v_of_j = costs.verify_cost_ratio();
    for (int j = 1; j <= in.max_k; ++j) fmt::print(" {} rows x{:.2f}", j + 1, v_of_j[static_cast<std::size_t>(j)]);
    fmt::print("\n");
  }

  std::vector<SweepRow> sweep;
  for (const DrafterConfig& config : drafter_configs(in, factory)) {
    std::unique_ptr<step04::Drafter> drafter = config.variant->fn(config.setup);
    for (int k : in.options.ks) {
      in.progress->start(fmt::format("{}: {} at k = {}", device, drafter->name(), k));
      sweep.push_back(measure_configuration(results, device, *target, *drafter, config, k, plain, cost_context, in));
    }
  }
  return sweep;
}

void print_sweep(const std::vector<SweepRow>& sweep, bool greedy, const std::string& draft_name) {
  fmt::print("speculative decoding, per drafter and k (decode only; alpha per drafted token the target examined)\n");
  fmt::print("{:<6} {:<26} {:>3} {:>6} {:>9} {:>9} {:>7} {:>7} {:>6} {:>9} {:>9} {:>6} {:>9} {:>9}\n", "device",
             "drafter", "k", "alpha", "tok/pass", "predicted", "saved", "c", "v(k)", "speedup", "predicted", "gap",
             "textbook", "identical");
  int within = 0;
  for (const SweepRow& r : sweep) {
    const double gap = r.measured / r.predicted - 1.0;
    within += std::abs(gap) <= 0.20;
    fmt::print("{:<6} {:<26} {:>3} {:>6.3f} {:>9.2f} {:>9.2f} {:>6.0f}% {:>7.3f} {:>6.2f} {:>8.2f}x {:>8.2f}x "
               "{:>+5.0f}% {:>8.2f}x {:>9}\n",
               r.device, r.drafter, r.k, r.alpha, r.tokens_per_pass, r.tokens_per_pass_pred, 100.0 * r.passes_saved,
               r.c, r.v, r.measured, r.predicted, 100.0 * gap, r.textbook,
               !greedy ? "n/a" : r.identical ? "yes" : r.near_tie.empty() ? "NO" : "near-tie");
  }
  for (const SweepRow& r : sweep)
    if (!r.near_tie.empty()) fmt::print("near-tie: {} {} k={}: {}\n", r.device, r.drafter, r.k, r.near_tie);
  fmt::print("measured speedup within 20% of the prediction: {} of {} configurations\n", within, sweep.size());
  fmt::print("speedup = plain decoding's time per generated token / speculative's, same device, decode only "
             "(excludes prefill);\n"
             "c = draft step / target step; v(k) = target pass over k+1 rows / over 1 row (both measured apart from "
             "the runs);\npredicted = E / (k c + v), textbook = E / (k c + 1) (v = 1: the memory-bound ideal)\n");
  if (draft_name == "self")
    fmt::print("draft_model(self): no --draft-model given, so the target drafts for itself (alpha = 1 in greedy "
               "mode, c ~ 1):\nan always-right drafter that costs as much as the target never pays.\n");
}

int run_step04(int argc, char** argv) {
  Step04Options options;
  if (const auto exit_status = parse_options(argc, argv, options)) return *exit_status;
  apply_quick_and_validate(options);
  std::vector<int> selected = llm::parse_variant_selection(options.common.variant, llm::variant_ids(step04::variants()));
  const llm::DeviceSelection devices = llm::select_devices(options.common.device);

  // The target, the prompt, how far to generate, and the drafters' models.
  const llm::LoadedModel loaded = llm::load_model(options.common);
  const llm::ModelConfig& config = loaded.weights.config;
  const std::vector<int> prompt = llm::encode_prompt(loaded, options.common);
  const int positions = llm::generation_positions(options.common, config, prompt.size());
  const int max_k = *std::max_element(options.ks.begin(), options.ks.end());
  check_drafts_fit(max_k, prompt.size(), positions, config);
  check_room_to_decode(max_k, prompt.size(), positions, options.common);
  settle_draft_layers(options, loaded.weights, selected);
  const DraftModel draft = load_draft_model(options, loaded);

  // Plain decoding, then every drafter x k, per device.
  llm::Results results = make_results(options, loaded, devices, draft.name, prompt.size(), positions);
  const std::vector<std::string> device_names = llm::selected_device_names(devices);
  SweepInputs inputs{options, loaded, draft, selected, prompt, positions, max_k, nullptr};
  const std::size_t configurations = drafter_configs(inputs, {}).size() * options.ks.size();
  llm::RunProgress progress("step04_speculative", static_cast<int>(device_names.size() * (1 + configurations)));
  inputs.progress = &progress;
  std::vector<SweepRow> sweep;
  std::vector<int> cpu_reference_tokens;  // the first device's plain tokens
  for (const std::string& device : device_names) {
    const std::vector<SweepRow> rows = run_on_device(results, device, inputs, cpu_reference_tokens);
    sweep.insert(sweep.end(), rows.begin(), rows.end());
  }

  fmt::print("{}\n", results.format_table());
  const step04::SamplingSettings sampling{options.common.temperature, options.common.top_p};
  print_sweep(sweep, sampling.greedy(), draft.name);
  return llm::finish_run(results, options.common, devices);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_main(argc, argv, run_step04); }
