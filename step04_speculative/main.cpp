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
#include <cstdio>
#include <optional>

#include "llm/checkpoint.hpp"
#include "llm/cpu_model.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/timer.hpp"
#include "step01_kv_cache/generation.hpp"
#include "step04_speculative/early_exit_drafter.hpp"
#include "step04_speculative/pass_costs.hpp"
#include "step04_speculative/speculative_decoder.hpp"
#include "step04_speculative/speedup_formula.hpp"
#include "step04_speculative/variants.hpp"

namespace {

struct StepOptions {
  std::vector<int> ks = {2, 4, 8};       // --k: drafts per round
  std::string draft_model_path;          // --draft-model
  std::string draft_tokenizer_path;      // --draft-tokenizer
  std::vector<int> draft_layers;         // --draft-layers (default: 1 and n_layers/2)
  int ngram = 3;                         // --ngram
  int repeats = 5;                       // --repeats
  int cost_runs = 41;                    // timed forwards per calibrated pass cost
};

std::unique_ptr<llm::Model> make_model(const std::string& device, const llm::ModelWeights& weights) {
  if (device == "cpu") return std::make_unique<llm::CpuModel>(weights);
  return llm::cuda::make_cuda_model(weights);
}

// Plain decoding (step 01's generate_cached): the reference tokens, and the
// decode time (every token after the first; the prompt's prefill is the same
// work in both loops, so neither side counts it).
struct PlainRun {
  step01::GenerationResult first;
  double decode_ms = 0.0;  // median over repeats
  int decode_tokens() const { return static_cast<int>(first.tokens.size()) - 1; }
};

PlainRun measure_plain(llm::Model& model, std::span<const int> prompt, int positions, const llm::CommonOptions& o,
                       int repeats) {
  PlainRun run;
  std::vector<double> decode;
  for (int r = -1; r < repeats; ++r) {  // r = -1: warm-up
    llm::Sampler sampler(model.config().vocab_size, o.temperature, o.top_p, o.seed);
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
                                   int positions, int k, const llm::CommonOptions& o, int repeats) {
  const step04::SamplingSettings sampling{o.temperature, o.top_p};
  SpeculativeRun run;
  step04::SpeculativeDecoder decoder(target, drafter);
  std::vector<double> decode, plain_decode;
  for (int r = -1; r < repeats; ++r) {
    llm::Sampler plain_sampler(target.config().vocab_size, o.temperature, o.top_p, o.seed);
    const step01::GenerationResult plain = step01::generate_cached(target, prompt, positions, plain_sampler);
    llm::Sampler rng(target.config().vocab_size, o.temperature, o.top_p, o.seed);  // same seed each run
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

int body(int argc, char** argv) {
  CLI::App app{"Step 04: speculative decoding. A cheap drafter proposes k tokens, the target verifies them in one "
               "pass, on CPU and CUDA."};
  llm::CommonOptions o;
  StepOptions s;
  llm::add_common_options(app, o);
  auto* k_option = app.add_option("--k", s.ks, "drafts per round, a list (e.g. --k 2,4,8)")->delimiter(',');
  app.add_option("--draft-model", s.draft_model_path,
                 "llama2.c checkpoint of the draft model (same vocabulary as the target); default: the target "
                 "itself, an always-right but full-cost drafter");
  app.add_option("--draft-tokenizer", s.draft_tokenizer_path,
                 "the draft model's tokenizer.bin; checked to be identical to the target's");
  auto* layers_option = app.add_option("--draft-layers", s.draft_layers,
                                       "early-exit self-draft: the target's first L layers, a list (default 1 and "
                                       "n_layers/2)")
                            ->delimiter(',');
  app.add_option("--ngram", s.ngram, "n-gram prompt lookup: longest suffix to match")->capture_default_str();
  app.add_option("--repeats", s.repeats, "timed generations per configuration (median reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  if (const auto status = llm::parse_command_line(app, argc, argv)) return *status;

  const auto& table = step04::variants();
  if (o.list_variants) {
    for (const auto& v : table) fmt::print("{:>3}  {:<12} {}\n", v.id, v.name, v.what_changed);
    return 0;
  }
  if (o.quick) {
    o.steps = std::min(o.steps, 64);
    s.repeats = 1;
    s.cost_runs = 9;
    if (k_option->count() == 0) s.ks = {2, 4};
  }
  for (int k : s.ks)
    if (k < 1) throw llm::InputError(fmt::format("--k values must be at least 1 (got {})", k));
  if (s.ngram < 1) throw llm::InputError(fmt::format("--ngram must be at least 1 (got {})", s.ngram));
  if (!s.draft_tokenizer_path.empty() && s.draft_model_path.empty())
    throw llm::InputError("--draft-tokenizer is only used with --draft-model");
  std::vector<int> selected = llm::parse_variant_selection(o.variant, llm::variant_ids(table));
  const llm::DeviceSelection devices = llm::select_devices(o.device);
  const step04::SamplingSettings sampling{o.temperature, o.top_p};

  llm::LoadedModel loaded = llm::load_model(o);
  const llm::ModelConfig& config = loaded.weights.config;
  const std::vector<int> prompt = loaded.tokenizer.encode(o.prompt, /*add_bos=*/true, /*add_eos=*/false);
  const int positions = std::min(o.steps, config.seq_len);
  if (static_cast<int>(prompt.size()) > positions)
    throw llm::InputError(fmt::format("the prompt is {} tokens but --steps is {} (and the context {})", prompt.size(),
                                      positions, config.seq_len));
  const int max_k = *std::max_element(s.ks.begin(), s.ks.end());
  if (max_k >= config.seq_len)
    throw llm::InputError(fmt::format("--k {} must be below the context of {} positions", max_k, config.seq_len));

  // Early-exit depths: validated up front so a bad value fails before any run.
  if (layers_option->count() == 0) {
    if (config.n_layers > 1) s.draft_layers = {1};
    if (config.n_layers / 2 > 1 && !o.quick) s.draft_layers.push_back(config.n_layers / 2);
  }
  for (int layers : s.draft_layers) step04::early_exit_weights(loaded.weights, layers);  // throws when out of range
  if (s.draft_layers.empty())
    selected.erase(std::remove(selected.begin(), selected.end(), step04::variant_id::kEarlyExit), selected.end());

  // The draft model: --draft-model, else the target itself (alpha = 1 in
  // greedy mode, cost ratio ~1: the "perfect but expensive" drafter).
  std::optional<llm::ModelWeights> draft_weights;
  std::string draft_name = "self";
  if (!s.draft_model_path.empty()) {
    draft_weights = llm::load_checkpoint(s.draft_model_path);
    draft_name = s.draft_model_path.substr(s.draft_model_path.find_last_of('/') + 1);
    step04::check_same_vocabulary(draft_weights->config, config, draft_name);
    if (!s.draft_tokenizer_path.empty())
      check_same_tokenizer(llm::Tokenizer::load(s.draft_tokenizer_path, draft_weights->config.vocab_size),
                           loaded.tokenizer, s.draft_tokenizer_path);
  }
  const llm::ModelWeights& draft_model_weights = draft_weights ? *draft_weights : loaded.weights;

  llm::Results results("step04_speculative", "speculative decoding: draft k tokens, verify them in one target pass");
  results.set_device_info(llm::device_info_for(devices));
  results.set_config("model", loaded.name);
  results.set_config("model_config", config.describe());
  results.set_config("draft_model", draft_name);
  results.set_config("prompt_tokens", static_cast<long long>(prompt.size()));
  results.set_config("positions", static_cast<long long>(positions));
  results.set_config("temperature", static_cast<double>(o.temperature));
  results.set_config("top_p", static_cast<double>(o.top_p));
  results.set_config("mode", std::string(sampling.greedy() ? "greedy" : "sampling"));
  results.set_config("repeats", static_cast<long long>(s.repeats));
  results.set_config("quick", o.quick);
  results.set_config("speedup_measures", std::string("decode only: time per generated token after the first, "
                                                     "plain / speculative"));
  results.set_config("formula", std::string("predicted = E(alpha,k) / (k c + v(k)), E = (1-alpha^(k+1))/(1-alpha); "
                                            "c, v measured separately; textbook sets v = 1"));

  struct SweepRow {
    std::string device, drafter;
    int k;
    double alpha, tokens_per_pass, tokens_per_pass_pred, passes_saved, c, v, measured, predicted, textbook;
    bool identical;
  };
  std::vector<SweepRow> sweep;
  std::vector<int> cpu_reference_tokens;
  bool printed_text = false;

  for (const std::string device : {"cpu", "cuda"}) {
    if ((device == "cpu" && !devices.cpu) || (device == "cuda" && !devices.cuda)) continue;
    auto target = make_model(device, loaded.weights);
    const step04::ModelFactory factory = [device](const llm::ModelWeights& w) { return make_model(device, w); };

    // Baseline: plain decoding, one target pass per token.
    const PlainRun plain = measure_plain(*target, prompt, positions, o, s.repeats);
    if (cpu_reference_tokens.empty()) cpu_reference_tokens = plain.first.tokens;
    const double plain_ms_per_token = plain.decode_ms / std::max(1, plain.decode_tokens());
    if (!printed_text) {
      std::string text;
      for (std::size_t i = 1; i < prompt.size(); ++i) text += loaded.tokenizer.decode_printable(prompt[i - 1], prompt[i]);
      int previous = prompt.back();
      for (int token : plain.first.tokens) {
        if (token == llm::Tokenizer::kBos) break;
        text += loaded.tokenizer.decode_printable(previous, token);
        previous = token;
      }
      fmt::print("{}\n\n", text);
      printed_text = true;
    }
    {
      llm::ResultRow row;
      row.device = device;
      row.variant = "plain";
      row.id = step04::variant_id::kPlain;
      row.time_ms = plain.decode_ms;
      row.speedup = 1.0;
      row.ok = true;
      row.throughput_key = "tokens_per_s";
      row.throughput = 1000.0 / plain_ms_per_token;
      row.extra["k"] = 0LL;
      row.extra["decode_tokens"] = static_cast<long long>(plain.decode_tokens());
      row.extra["target_passes"] = static_cast<long long>(plain.decode_tokens());
      row.extra["tokens_per_pass"] = 1.0;
      row.extra["tokens_identical_to_cpu"] =
          llm::compare_tokens(plain.first.tokens, cpu_reference_tokens).ok;
      results.add_row(std::move(row));
    }

    // Costs for the formula, at the middle of the generation.
    std::vector<int> sequence = prompt;
    sequence.insert(sequence.end(), plain.first.tokens.begin(), plain.first.tokens.end());
    const std::size_t midpoint = std::max<std::size_t>(2, prompt.size() + plain.first.tokens.size() / 2);
    const std::span<const int> cost_context(sequence.data(), std::min(midpoint, sequence.size()));
    {
      const step04::TargetCosts costs = step04::measure_target_costs(*target, cost_context, max_k, s.cost_runs);
      fmt::print("[{}] target pass at position {}: 1 row {:.4f} ms;", device, cost_context.size() - 1, costs.step_ms);
      const std::vector<double> v_of_j = costs.verify_cost_ratio();
      for (int j = 1; j <= max_k; ++j) fmt::print(" {} rows x{:.2f}", j + 1, v_of_j[static_cast<std::size_t>(j)]);
      fmt::print("\n");
    }

    std::vector<DrafterConfig> configs;
    for (const auto& v : table) {
      if (v.id == step04::variant_id::kPlain) continue;
      if (std::find(selected.begin(), selected.end(), v.id) == selected.end()) continue;
      step04::DrafterSetup setup{&loaded.weights, &draft_model_weights, draft_name, 1, s.ngram, factory};
      if (v.id == step04::variant_id::kEarlyExit) {
        for (int layers : s.draft_layers) {
          setup.draft_layers = layers;
          configs.push_back({&v, setup});
        }
      } else {
        configs.push_back({&v, setup});
      }
    }

    for (const DrafterConfig& dc : configs) {
      std::unique_ptr<step04::Drafter> drafter = dc.variant->fn(dc.setup);
      for (int k : s.ks) {
        const SpeculativeRun spec = measure_speculative(*target, *drafter, prompt, positions, k, o, s.repeats);
        const step04::SpeculativeStats& st = spec.first.stats;
        // The costs again, right after the runs they predict (load drifts).
        const step04::TargetCosts costs = step04::measure_target_costs(*target, cost_context, max_k, s.cost_runs);
        const std::vector<double> v_of_j = costs.verify_cost_ratio();
        const double c =
            step04::measure_draft_step_ms(*drafter, cost_context, k, sampling, s.cost_runs) / costs.step_ms;
        const double alpha = st.alpha();
        const step04::SpeedupPrediction predicted =
            step04::predict_speedup(alpha, st.drafted_per_round, st.steps_per_round, c, v_of_j);
        const double textbook =
            drafter->one_step_per_token()
                ? step04::textbook_speedup(alpha, k, c)
                : predicted.tokens_per_pass / (c + 1.0);  // one lookup per round, v = 1
        const double spec_ms_per_token = spec.decode_ms / std::max(1, spec.decode_tokens());
        const double measured = (spec.plain_decode_ms / std::max(1, plain.decode_tokens())) / spec_ms_per_token;
        const double tokens_per_pass = static_cast<double>(spec.decode_tokens()) / std::max(1, st.rounds);
        const double passes_saved = 1.0 - static_cast<double>(st.rounds) / std::max(1, spec.decode_tokens());
        const double gap = measured / predicted.speedup - 1.0;
        const auto token_check = llm::compare_tokens(spec.first.tokens, plain.first.tokens);
        // Greedy: identical to plain decoding, or the step is wrong. Sampling:
        // exact in distribution, not token for token (a different random
        // stream); tests/step04_rejection_sampler_test.cpp checks that.
        const bool ok = !sampling.greedy() || token_check.ok;

        llm::ResultRow row;
        row.device = device;
        row.variant = fmt::format("{} k={}", drafter->name(), k);
        row.id = dc.variant->id;
        row.time_ms = spec.decode_ms;
        row.speedup = measured;
        row.max_rel_err = 0.0;
        row.ok = ok;
        row.throughput_key = "tokens_per_s";
        row.throughput = 1000.0 / spec_ms_per_token;
        row.extra["drafter"] = drafter->name();
        row.extra["k"] = static_cast<long long>(k);
        row.extra["decode_tokens"] = static_cast<long long>(spec.decode_tokens());
        row.extra["target_passes"] = static_cast<long long>(st.rounds);
        row.extra["drafted"] = st.drafted;
        row.extra["tested"] = st.tested;
        row.extra["accepted"] = st.accepted;
        row.extra["draft_steps"] = st.draft_steps;
        row.extra["alpha"] = alpha;
        row.extra["accepted_per_drafted"] = st.drafted ? static_cast<double>(st.accepted) / st.drafted : 0.0;
        row.extra["tokens_per_pass"] = tokens_per_pass;
        row.extra["tokens_per_pass_predicted"] = predicted.tokens_per_pass;
        row.extra["passes_saved_fraction"] = passes_saved;
        row.extra["draft_cost_ratio_c"] = c;
        row.extra["verify_cost_ratio_v"] = v_of_j[static_cast<std::size_t>(k)];
        row.extra["predicted_draft_cost_per_round"] = predicted.draft_cost;
        row.extra["predicted_verify_cost_per_round"] = predicted.verify_cost;
        row.extra["predicted_speedup"] = predicted.speedup;
        row.extra["textbook_speedup"] = textbook;
        row.extra["prediction_gap"] = gap;
        row.extra["within_20pct"] = std::abs(gap) <= 0.20;
        row.extra["target_step_ms"] = costs.step_ms;
        row.extra["plain_decode_ms"] = spec.plain_decode_ms;
        row.extra["draft_ms"] = st.draft_ms;
        row.extra["verify_ms"] = st.verify_ms;
        row.extra["overhead_ms"] = spec.first.decode_ms - st.draft_ms - st.verify_ms;
        row.extra["tokens_identical"] = token_check.ok;
        row.extra["best_k_for_alpha"] =
            static_cast<long long>(step04::best_k(alpha, c, v_of_j, max_k));
        if (!ok)
          std::fprintf(stderr, "check failed for %s %s: speculative output differs from plain decoding (%s)\n",
                       device.c_str(), row.variant.c_str(), token_check.summary().c_str());
        results.add_row(std::move(row));
        sweep.push_back({device, drafter->name(), k, alpha, tokens_per_pass, predicted.tokens_per_pass,
                         passes_saved, c, v_of_j[static_cast<std::size_t>(k)], measured, predicted.speedup,
                         textbook, token_check.ok});
      }
    }
  }
  fmt::print("{}\n", results.format_table());

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
               sampling.greedy() ? (r.identical ? "yes" : "NO") : "n/a");
  }
  fmt::print("measured speedup within 20% of the prediction: {} of {} configurations\n", within, sweep.size());
  fmt::print("c = draft step / target step; v(k) = target pass over k+1 rows / over 1 row (both measured apart from "
             "the runs);\npredicted = E / (k c + v), textbook = E / (k c + 1) (v = 1: the memory-bound ideal)\n");
  if (draft_name == "self")
    fmt::print("draft_model(self): no --draft-model given, so the target drafts for itself (alpha = 1 in greedy "
               "mode, c ~ 1):\nan always-right drafter that costs as much as the target never pays.\n");
  return llm::finish_run(results, o, devices);
}

}  // namespace

int main(int argc, char** argv) { return llm::run_main(argc, argv, body); }
