#include "llm/harness/cli.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/results.hpp"

namespace llm {

namespace {

// `text` as a number, or nullopt when it is not one (then CLI11's own
// conversion rejects it, with its message).
std::optional<double> as_number(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  return value;
}

// Adds a check to `option`: `allowed` says whether a value may be used, and
// `rule` says in words what it may be ("at least 1"), both in the error and in
// --help. The check throws InputError with the whole sentence rather than
// returning CLI11's error string, which CLI11 would print as "--steps: ...";
// parse_command_line catches it.
CLI::Option* add_number_check(CLI::Option* option, const std::string& rule, std::function<bool(double)> allowed) {
  const std::string flag = option->get_name();
  option->check(CLI::Validator(
      [flag, rule, allowed](std::string& text) -> std::string {
        const std::optional<double> value = as_number(text);
        if (!value) return {};
        if (!std::isfinite(*value))
          throw InputError(fmt::format("{} must be a finite number, {} (got {})", flag, rule, text));
        if (!allowed(*value)) throw InputError(fmt::format("{} must be {} (got {})", flag, rule, text));
        return {};
      },
      rule));
  return option;
}

}  // namespace

CLI::Option* at_least(CLI::Option* option, double minimum) {
  return add_number_check(option, fmt::format("at least {}", minimum), [minimum](double v) { return v >= minimum; });
}

CLI::Option* greater_than(CLI::Option* option, double bound) {
  return add_number_check(option, fmt::format("more than {}", bound), [bound](double v) { return v > bound; });
}

CLI::Option* in_range(CLI::Option* option, double minimum, double maximum) {
  return add_number_check(option, fmt::format("from {} to {}", minimum, maximum),
                          [minimum, maximum](double v) { return v >= minimum && v <= maximum; });
}

void add_common_options(CLI::App& app, CommonOptions& o) {
  app.add_option("--model", o.model_path, "llama2.c checkpoint (.bin); overrides --preset");
  app.add_option("--tokenizer", o.tokenizer_path, "llama2.c tokenizer (.bin) for --model");
  std::vector<std::string> names;
  for (const auto& p : presets()) names.push_back(p.name);
  app.add_option("--preset", o.preset, "built-in model with seeded random weights")
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  app.add_option("--prompt", o.prompt, "text to start from (default: generation from BOS)");
  at_least(app.add_option("--steps", o.steps, "positions to run, prompt included (at most the model's context)"), 1)
      ->capture_default_str();
  at_least(app.add_option("--temperature", o.temperature, "0 = greedy"), 0)->capture_default_str();
  in_range(app.add_option("--top-p", o.top_p, "nucleus sampling mass (0 or 1 = off)"), 0, 1)->capture_default_str();
  // Unsigned: CLI11 would quietly turn -1 into 2^64 - 1, and reads a number
  // past 2^64 - 1 as 2^64 - 1 (strtoull saturates): both are refused.
  at_least(app.add_option("--seed", o.seed, "seed for preset weights, inputs and sampling"), 0)
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            errno = 0;
            (void)std::strtoull(text.c_str(), nullptr, 0);
            if (errno == ERANGE)
              throw InputError(fmt::format("--seed must be at most {} (got {})", UINT64_MAX, text));
            return {};
          },
          ""))
      ->capture_default_str();
  app.add_option("--device", o.device, "where to run")->check(CLI::IsMember({"cpu", "cuda", "all"}))->capture_default_str();
  app.add_option("--dtype", o.dtype, "element type of the CUDA model's weights (the CPU model is fp32)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--gemv", o.gemv,
                 "the kernel of the CUDA model's fp16/bf16 products of 1..N rows (--max-gemv-rows): cuda-cores "
                 "(fmaf, one per weight and row) or tensor-cores (mma.sync); more rows go through cuBLAS")
      ->check(CLI::IsMember({"cuda-cores", "tensor-cores"}))
      ->capture_default_str();
  in_range(app.add_option("--max-gemv-rows", o.max_gemv_rows,
                          "the CUDA model's fp16/bf16 products of up to N rows run the GEMV (--gemv), more rows "
                          "cuBLAS; 1.." + std::to_string(cuda::kMaxGemvRows) + " (" +
                              std::to_string(cuda::kMaxGemvRows) +
                              ": every forward of a few rows gives each row the bits it has alone)"),
           1, cuda::kMaxGemvRows)
      ->capture_default_str();
  app.add_flag("--no-gemv-prefetch", o.no_gemv_prefetch,
               "the CUDA model's GEMV asks L2 for no weights before it waits for the kernel before it (the before "
               "row of that prefetch, which programmatic dependent launch overlaps with the kernel before)");
  app.add_flag("--no-gemv-pipelining", o.no_gemv_pipelining,
               "the CUDA model's GEMV (CUDA cores, 1..4 rows) requests its next batch of weights only after it has "
               "multiplied the current one (the before row of requesting it first)");
  app.add_flag("--no-gemv-wave-fit", o.no_gemv_wave_fit,
               "the CUDA model's GEMVs split their columns into about two blocks per SM rounded up, which can leave "
               "a second wave of a few blocks (the before row of fitting the blocks into whole waves)");
  app.add_flag("--gemv-prefetch-next", o.gemv_prefetch_next,
               "each of the CUDA model's GEMVs asks L2 for the first weights of the product after it once its own "
               "are read, so that the next product's first loads find them there (an opt-in: it measured slower; "
               "the same results)");
  app.add_flag("--no-graphs", o.no_graphs,
               "launch every kernel of a CUDA decode forward from the host instead of replaying a CUDA graph");
  app.add_flag("--no-fusions", o.no_fusions,
               "the CUDA model without fused launches (Q/K/V and gate/up as separate products, residual add, "
               "RMSNorm, RoPE, the K/V append and split-KV attention's merge as separate kernels)");
  app.add_flag("--no-norm-folding", o.no_norm_folding,
               "keep the CUDA model's RMSNorm, SwiGLU and residual add as kernels of their own instead of folding "
               "them into the half-precision products (the before row of that fusion; --no-fusions implies it)");
  app.add_flag("--merge-folding", o.merge_folding,
               "merge the CUDA model's split-KV decode attention's partial results in the last split block to "
               "finish instead of in a kernel of its own (past 64 keys: one launch a layer fewer, but measured "
               "slower, so off by default; --no-fusions keeps it off)");
  app.add_flag("--no-rope-folding", o.no_rope_folding,
               "run the CUDA model's RoPE and K/V append as a kernel after the QKV product instead of in the "
               "product's last writes (one launch a layer more; the before row of that fusion; --no-fusions "
               "implies it)");
  app.add_flag("--no-pdl", o.no_pdl,
               "start each kernel of a CUDA forward only once the kernel before it has finished, instead of letting "
               "it start early and request its weights meanwhile (programmatic dependent launch, sm_90 and later; "
               "the before row)");
  app.add_option("--variant", o.variant, "variant ids to run (comma-separated) or 'all'")->capture_default_str();
  app.add_flag("--list", o.list_variants, "list the variants and exit");
  app.add_option("--json", o.json_path, "also write the results as JSON to this file");
  CLI::Option* quick = app.add_flag("--quick", o.quick, "a run of seconds (CI): fewer steps and repetitions");
  app.add_flag("--full", o.full,
               "the complete sweep whose numbers the docs quote (minutes); the default is a shorter run")
      ->excludes(quick);
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
      throw DeviceError("--device cuda: " + cuda::unusable_message(status));
    } else {
      s.skipped_reason = status.reason;
    }
  }
  return s;
}

namespace {

// A command line that cannot be read: the message, where to look, status 1.
int refuse_command_line(const std::string& message) {
  std::fprintf(stderr, "error: %s\nRun with --help for every flag and the values it takes.\n", message.c_str());
  return 1;
}

}  // namespace

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const InputError& e) {  // a value out of its range (add_number_check)
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const CLI::ParseError& e) {
    // CLI11 reports --help as an exception too, with exit code 0: it prints the help.
    if (e.get_exit_code() == 0) return app.exit(e);
    // Everything else is a bad command line: CLI11's message, then status 1
    // like all bad input (CLI11's own codes, 105 to 109, say nothing more).
    return refuse_command_line(e.what());
  } catch (const std::out_of_range& e) {
    // CLI11 reads a negatable flag's value (--no-causal=N) with std::stoll
    // and lets its out_of_range escape for a number past 64 bits.
    return refuse_command_line(fmt::format("a number on the command line is out of range ({})", e.what()));
  } catch (const std::invalid_argument& e) {
    return refuse_command_line(fmt::format("a value on the command line cannot be read ({})", e.what()));
  }
  return std::nullopt;
}

DeviceInfo device_info_for(const DeviceSelection& devices) {
  DeviceInfo info = query_device_info();
  if (!devices.skipped_reason.empty()) info.cuda_note = devices.skipped_reason;
  return info;
}

void set_sampling_config(Results& results, const CommonOptions& options) {
  results.set_config("temperature", static_cast<double>(options.temperature));
  results.set_config("top_p", static_cast<double>(options.top_p));
  // A JSON integer when it fits in one (any seed up to 2^63 - 1), else its digits.
  if (options.seed <= static_cast<std::uint64_t>(std::numeric_limits<long long>::max()))
    results.set_config("seed", static_cast<long long>(options.seed));
  else
    results.set_config("seed", std::to_string(options.seed));
  results.set_config("prompt", options.prompt);
  // How the CUDA model ran (where a step takes --dtype and --no-graphs).
  results.set_config("cuda_dtype", options.dtype);
  results.set_config("cuda_gemv", options.gemv);
  results.set_config("cuda_max_gemv_rows", static_cast<long long>(options.max_gemv_rows));
  results.set_config("cuda_gemv_prefetch", !options.no_gemv_prefetch);
  results.set_config("cuda_gemv_pipelining", !options.no_gemv_pipelining);
  results.set_config("cuda_gemv_wave_fit", !options.no_gemv_wave_fit);
  results.set_config("cuda_gemv_prefetch_next", options.gemv_prefetch_next);
  results.set_config("cuda_graphs", !options.no_graphs);
  results.set_config("cuda_fusions", !options.no_fusions);
  results.set_config("cuda_norm_folding", !options.no_fusions && !options.no_norm_folding);
  results.set_config("cuda_merge_folding", !options.no_fusions && options.merge_folding);
  results.set_config("cuda_rope_folding", !options.no_fusions && !options.no_rope_folding);
  results.set_config("cuda_programmatic_launches", !options.no_pdl);
}

int finish_run(const Results& results, const CommonOptions& options, const DeviceSelection& devices,
               bool other_checks_passed) {
  if (!devices.skipped_reason.empty()) fmt::print("\nCUDA rows skipped: {}\n", devices.skipped_reason);
  if (!options.json_path.empty()) {
    Results recorded = results;  // the step's results, plus the common flags' config keys
    set_sampling_config(recorded, options);
    recorded.write_json(options.json_path);
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
