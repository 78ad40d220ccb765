#include "step06_quantization/measure/llama_bench.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "llm/errors.hpp"
#include "llm/harness/json_field.hpp"
#include "llm/harness/program.hpp"

namespace step06 {
namespace {

// The weights' type in llama.cpp's model description "<arch> <size> <type>":
// "llama ?B Q4_0" -> "Q4_0", "llama ?B all F32" -> "F32" (F32 is the one type
// llama.cpp calls "all"), "(guessed) " dropped (a file without the type key).
std::string type_from_model_type(const std::string& model_type) {
  const std::size_t arch_end = model_type.find(' ');
  const std::size_t size_end = arch_end == std::string::npos ? arch_end : model_type.find(' ', arch_end + 1);
  std::string type = size_end == std::string::npos ? model_type : model_type.substr(size_end + 1);
  for (const std::string prefix : {"(guessed) ", "all "})
    if (type.starts_with(prefix)) type.erase(0, prefix.size());
  return type;
}

// The command line of one decode test: `decode_tokens` tokens from position
// 0, `repeats` timed runs (llama-bench warms up first on its own), one
// thread. (Its KV cache stays in fp16, llama-bench's default and the widest
// type it takes for the cache; this step's rows keep fp32. At the course's
// context lengths the cache is a few percent of a token's bytes.)
std::vector<std::string> llama_bench_argv(const std::string& binary, const std::string& gguf, long long decode_tokens,
                                          std::size_t repeats) {
  return {binary, "-m", gguf, "-t", "1", "-p", "0", "-n", std::to_string(decode_tokens), "-r", std::to_string(repeats),
          "-o", "json"};
}

}  // namespace

void check_llama_bench_request(const std::string& binary, const std::vector<std::string>& ggufs, bool cpu_selected) {
  if (binary.empty() && ggufs.empty()) return;
  if (binary.empty() || ggufs.empty())
    throw llm::InputError(
        "--compare-llama-bench and --llama-gguf go together: the llama-bench binary and the GGUF file(s) of the "
        "same checkpoint as this run's model");
  if (!cpu_selected)
    throw llm::InputError("--compare-llama-bench times llama.cpp on one CPU thread beside this step's CPU rows: run "
                          "it with --device cpu or all");
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(binary) || ::access(binary.c_str(), X_OK) != 0)
    throw llm::InputError(fmt::format("--compare-llama-bench: {} is not an executable file", binary));
  for (const std::string& gguf : ggufs)
    if (!fs::is_regular_file(gguf)) throw llm::InputError(fmt::format("--llama-gguf: {} is not a file", gguf));
}

LlamaBenchResult parse_llama_bench_json(const std::string& json_text, const std::string& gguf,
                                        const std::string& command) {
  const std::string what = fmt::format("'{}'", command);
  const nlohmann::json tests = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!tests.is_array())
    throw llm::InputError(fmt::format("{} printed no llama-bench JSON (is it llama.cpp's llama-bench?); its "
                                      "output:\n{}",
                                      what, llm::last_lines(json_text, 20)));
  // Only -p 0 -n N was asked for; an older llama-bench may add a prompt test.
  const auto decode = std::find_if(tests.begin(), tests.end(), [](const nlohmann::json& test) {
    return test.is_object() && test.value("n_prompt", -1) == 0 && test.value("n_gen", 0) > 0;
  });
  if (decode == tests.end())
    throw llm::InputError(fmt::format("{} reported no decode test (n_prompt 0, n_gen > 0); its output:\n{}", what,
                                      llm::last_lines(json_text, 20)));
  // A missing or mistyped key: "'<command>': its decode test has no \"avg_ts\"".
  const std::string test = what + ": its decode test";
  LlamaBenchResult result;
  result.gguf = gguf;
  result.command = command;
  result.model_type = llm::required_json_field<std::string>(*decode, "model_type", test);
  result.type_name = type_from_model_type(result.model_type);
  result.model_size_bytes = llm::required_json_field<long long>(*decode, "model_size", test);
  result.model_parameters = llm::required_json_field<long long>(*decode, "model_n_params", test);
  result.decode_tokens = llm::required_json_field<long long>(*decode, "n_gen", test);
  result.avg_tokens_per_s = llm::required_json_field<double>(*decode, "avg_ts", test);
  result.stddev_tokens_per_s = llm::required_json_field<double>(*decode, "stddev_ts", test);
  result.samples_tokens_per_s = llm::required_json_field<std::vector<double>>(*decode, "samples_ts", test);
  result.build_commit = llm::required_json_field<std::string>(*decode, "build_commit", test);
  result.build_number = llm::required_json_field<long long>(*decode, "build_number", test);
  // A speed every ratio divides by: NaN or 0 would pass silently into them.
  if (!std::isfinite(result.avg_tokens_per_s) || result.avg_tokens_per_s <= 0)
    throw llm::InputError(fmt::format("{}: its decode speed is {} tokens/s", what, result.avg_tokens_per_s));
  return result;
}

LlamaBenchResult run_llama_bench(const std::string& binary, const std::string& gguf, int decode_tokens, int repeats) {
  const std::vector<std::string> argv =
      llama_bench_argv(binary, gguf, decode_tokens, static_cast<std::size_t>(repeats));
  const std::string command = llm::command_line(argv);
  const llm::ProgramOutput output = llm::run_program(argv);
  if (!output.how_it_ended.empty())
    throw llm::InputError(fmt::format("'{}' failed ({}); the end of its stderr:\n{}", command, output.how_it_ended,
                                      llm::last_lines(output.err, 15)));
  LlamaBenchResult result = parse_llama_bench_json(output.out, gguf, command);
  result.binary = binary;
  return result;
}

std::vector<LlamaBenchResult> run_llama_bench_files(const std::string& binary, const std::vector<std::string>& ggufs,
                                                    int decode_tokens, int repeats, llm::RunProgress& progress) {
  std::vector<LlamaBenchResult> results;
  for (const std::string& gguf : ggufs) {
    progress.start(fmt::format("llama.cpp's llama-bench on {}: {} decode tokens, {} runs, one thread",
                               std::filesystem::path(gguf).filename().string(), decode_tokens, repeats));
    results.push_back(run_llama_bench(binary, gguf, decode_tokens, repeats));
  }
  return results;
}

std::vector<LlamaComparison> pair_with_llama(const std::vector<LlamaBenchResult>& llama,
                                             const std::vector<ModelRow>& rows) {
  // The candidates: what llama-bench runs too (one CPU thread, round-to-nearest
  // weights, an fp32 KV cache); GPTQ/AWQ rows are the same speed as RTN's.
  std::vector<const ModelRow*> candidates;
  for (const ModelRow& row : rows)
    if (row.device == "cpu" && row.skipped.empty() && row.variant.algorithm == QuantAlgorithm::Rtn &&
        !row.variant.int8_kv && row.variant.dense_dtype == llm::cuda::WeightDtype::Float32)
      candidates.push_back(&row);
  const auto partner = [](const ModelRow& row, std::string role) {
    return LlamaPartner{row.variant.weights_name(), std::move(role), row.tokens_per_s, false};
  };
  const auto fastest = [](std::vector<LlamaPartner>& partners) {
    if (partners.empty()) return;
    std::max_element(partners.begin(), partners.end(), [](const LlamaPartner& a, const LlamaPartner& b) {
      return a.tokens_per_s < b.tokens_per_s;
    })->headline = true;
  };

  std::vector<LlamaComparison> comparisons;
  for (const LlamaBenchResult& result : llama) {
    LlamaComparison comparison{result, {}};
    std::vector<LlamaPartner>& partners = comparison.partners;
    if (result.type_name == "F32") {
      for (const ModelRow* row : candidates)
        if (!row->variant.weights) partners.push_back(partner(*row, ""));
      fastest(partners);
    } else if (result.type_name == "Q8_0") {
      // The same bytes either way: int8 dequantizes to fp32, int8-a8 is
      // Q8_0 x Q8_0's own product. Both shown, the faster one the ratio.
      for (const ModelRow* row : candidates)
        if (row->variant.weights && row->variant.weights->scheme == QuantScheme::Int8PerChannel)
          partners.push_back(partner(*row, ""));
      fastest(partners);
    } else if (result.type_name == "Q4_0") {
      // The fastest 4-bit row whatever its layout (the question a reader
      // asks: "what does 4 bits buy here?"), and Q4_0's own layout and
      // product when it ran (int4 symmetric in groups of 32 x int8 blocks).
      const ModelRow* best = nullptr;
      const ModelRow* same_layout = nullptr;
      for (const ModelRow* row : candidates) {
        if (!row->variant.weights || row->variant.weights->bits() != 4) continue;
        if (best == nullptr || row->tokens_per_s > best->tokens_per_s) best = row;
        if (row->variant.weights->name() == "int4sym-g32-a8") same_layout = row;
      }
      if (best != nullptr) {
        partners.push_back(partner(*best, best == same_layout ? "best 4-bit, Q4_0's layout" : "best 4-bit"));
        partners.back().headline = true;
      }
      if (same_layout != nullptr && same_layout != best) partners.push_back(partner(*same_layout, "Q4_0's layout"));
    }
    comparisons.push_back(std::move(comparison));
  }
  return comparisons;
}

void print_llama_comparison(const std::vector<LlamaComparison>& comparisons, const std::string& model_name,
                            int decode_tokens, int repeats) {
  if (comparisons.empty()) return;
  const LlamaBenchResult& first = comparisons.front().llama;
  const char* runs = repeats == 1 ? "run" : "runs";
  fmt::print("\nbeside llama.cpp (llama-bench, build {} ({})): {}, {} decode tokens one at a time, one thread each, "
             "this run;\n   llama.cpp: mean +- stddev of {} {} from position 0 (-t 1 -p 0 -n {} -r {}); here: "
             "median of {} {} after the prompt\n",
             first.build_commit, first.build_number, model_name, decode_tokens, repeats, runs, decode_tokens, repeats,
             repeats, runs);
  fmt::print("{:<16} {:>20}   {:<32} {:>10} {:>10}\n", "llama.cpp type", "tok/s", "this step", "tok/s",
             "ours/llama");
  for (const LlamaComparison& comparison : comparisons) {
    const std::string llama_speed =
        fmt::format("{:.1f} +- {:.1f}", comparison.llama.avg_tokens_per_s, comparison.llama.stddev_tokens_per_s);
    if (comparison.partners.empty()) {
      fmt::print("{:<16} {:>20}   {}\n", comparison.llama.type_name, llama_speed,
                 "- (no row of this step stores this type)");
      continue;
    }
    bool first_line = true;
    for (const LlamaPartner& partner : comparison.partners) {
      const std::string ours =
          partner.role.empty() ? partner.weights : fmt::format("{} ({})", partner.weights, partner.role);
      fmt::print("{:<16} {:>20}   {:<32} {:>10.1f} {:>9.2f}x{}\n", first_line ? comparison.llama.type_name : "",
                 first_line ? llama_speed : "", ours, partner.tokens_per_s, comparison.ratio(partner),
                 partner.headline && comparison.partners.size() > 1 ? " *" : "");
      first_line = false;
    }
  }
  fmt::print("   * : the pair's ratio (the faster int8 row; the fastest 4-bit row)\n");
}

void add_llama_rows(llm::Results& results, const std::vector<LlamaComparison>& comparisons) {
  if (comparisons.empty()) return;
  const LlamaBenchResult& first = comparisons.front().llama;
  results.set_config("llama_bench_build", fmt::format("{} ({})", first.build_commit, first.build_number));
  llm::JsonTable table{"llama_bench", {}};
  for (const LlamaComparison& comparison : comparisons) {
    const LlamaBenchResult& llama = comparison.llama;
    // "283.100,281.900,284.000": a flat table holds scalars only.
    const std::string samples = fmt::format("{:.3f}", fmt::join(llama.samples_tokens_per_s, ","));
    // File names only: a folder would name the machine it ran on.
    const std::string command = llm::command_line(
        llama_bench_argv(std::filesystem::path(llama.binary).filename().string(),
                         std::filesystem::path(llama.gguf).filename().string(), llama.decode_tokens,
                         llama.samples_tokens_per_s.size()));
    const llm::JsonObject base = {
        {"device", std::string("cpu")},
        {"llama_cpp_type", llama.type_name},
        {"llama_cpp_model_type", llama.model_type},
        {"gguf", std::filesystem::path(llama.gguf).filename().string()},
        {"llama_cpp_model_size_bytes", llama.model_size_bytes},
        {"llama_cpp_model_parameters", llama.model_parameters},
        {"decode_tokens", llama.decode_tokens},
        {"llama_cpp_tokens_per_s", llama.avg_tokens_per_s},
        {"llama_cpp_stddev_tokens_per_s", llama.stddev_tokens_per_s},
        {"llama_cpp_samples_tokens_per_s", samples},
        {"llama_cpp_build", fmt::format("{} ({})", llama.build_commit, llama.build_number)},
        {"llama_cpp_command", command},
    };
    if (comparison.partners.empty()) table.rows.push_back(base);
    for (const LlamaPartner& partner : comparison.partners) {
      llm::JsonObject line = base;
      line.emplace_back("weights", partner.weights);
      line.emplace_back("role", partner.role);
      line.emplace_back("tokens_per_s", partner.tokens_per_s);
      line.emplace_back("ratio_vs_llama_cpp", comparison.ratio(partner));
      line.emplace_back("headline", partner.headline);
      table.rows.push_back(std::move(line));
    }
  }
  results.add_table(std::move(table));
}

}  // namespace step06
