#include "llm/harness/cli.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>

#include "llm/checkpoint.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/results.hpp"

namespace llm {

void add_common_options(CLI::App& app, CommonOptions& o) {
  app.add_option("--model", o.model_path, "llama2.c checkpoint (.bin); overrides --preset");
  app.add_option("--tokenizer", o.tokenizer_path, "llama2.c tokenizer (.bin) for --model");
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.name);
  app.add_option("--preset", o.preset, "built-in model with seeded random weights")
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "text to start from (default: generation from BOS)");
  app.add_option("--steps", o.steps, "positions to run, prompt included")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--temperature", o.temperature, "0 = greedy")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--top-p", o.top_p, "nucleus sampling mass (0 or 1 = off)")->check(CLI::Range(0.0f, 1.0f))->capture_default_str();
  app.add_option("--seed", o.seed, "seed for preset weights, inputs and sampling")->capture_default_str();
  app.add_option("--device", o.device, "where to run")->check(CLI::IsMember({"cpu", "cuda", "all"}))->capture_default_str();
  app.add_option("--variant", o.variant, "variant ids to run (comma-separated) or 'all'")->capture_default_str();
  app.add_flag("--list", o.list_variants, "list the variants and exit");
  app.add_option("--json", o.json_path, "also write the results as JSON to this file");
  app.add_flag("--quick", o.quick, "a run of seconds (CI): fewer steps and repetitions");
}

LoadedModel load_model(const CommonOptions& o) {
  if (!o.model_path.empty()) {
    ModelWeights weights = load_checkpoint(o.model_path);
    if (o.tokenizer_path.empty())
      throw InputError("--model needs --tokenizer (the tokenizer.bin that goes with the checkpoint)");
    Tokenizer tokenizer = Tokenizer::load(o.tokenizer_path, weights.config.vocab_size);
    std::string name = o.model_path.substr(o.model_path.find_last_of('/') + 1);
    return {name, std::move(weights), std::move(tokenizer)};
  }
  if (!o.tokenizer_path.empty()) throw InputError("--tokenizer is only used with --model");
  const Preset& preset = find_preset(o.preset);
  return {"preset " + preset.name, random_weights(preset.config, o.seed),
          Tokenizer::byte_level(preset.config.vocab_size)};
}

DeviceSelection select_devices(const std::string& flag) {
  DeviceSelection s;
  s.cpu = flag == "cpu" || flag == "all";
  if (flag == "cuda" || flag == "all") {
    const cuda::DeviceStatus status = cuda::device_status();
    if (status.usable) {
      s.cuda = true;
    } else if (flag == "cuda") {
      throw DeviceError("--device cuda: no usable CUDA device (" + status.reason + ")");
    } else {
      s.skipped_reason = status.reason;
    }
  }
  return s;
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

DeviceInfo device_info_for(const DeviceSelection& devices) {
  DeviceInfo info = query_device_info();
  if (!devices.skipped_reason.empty()) info.cuda_note = devices.skipped_reason;
  return info;
}

int finish_run(const Results& results, const CommonOptions& options, const DeviceSelection& devices,
               bool other_checks_passed) {
  if (!devices.skipped_reason.empty()) fmt::print("\nCUDA rows skipped: {}\n", devices.skipped_reason);
  if (!options.json_path.empty()) {
    results.write_json(options.json_path);
    fmt::print("results written to {}\n", options.json_path);
  }
  if (!other_checks_passed || !results.all_ok()) {
    std::fprintf(stderr, "error: a variant disagrees with its reference (see the table)\n");
    return 1;
  }
  return 0;
}

int run_main(int argc, char** argv, int (*body)(int, char**)) {
  try {
    return body(argc, argv);
  } catch (const InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const KvCacheFullError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const DeviceError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory (try a smaller --preset or fewer --steps)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace llm
