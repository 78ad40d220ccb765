// The plumbing every step executable shares: its command line, --list, the
// prompt's positions, the generated text, results rows and failed checks.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "llm/config.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"
#include "llm/harness/generated_text.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/harness/progress.hpp"
#include "llm/harness/result_rows.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/step_command_line.hpp"
#include "llm/weights.hpp"
#include "test_support.hpp"

namespace llm {
namespace {

using ::llm::testing::HasSubstr;

// --- the command line ----------------------------------------------------------

// What parse_step_command_line returned and printed on stderr for `words`
// (the program name first).
struct ParseOutcome {
  std::optional<int> exit_status;
  std::string stderr_text;
};
ParseOutcome parse(std::vector<std::string> words, CommonOptions& common,
                   const std::function<void(CLI::App&)>& add_step_flags = {},
                   const std::vector<UnusedFlags>& unused = {}) {
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  ::testing::internal::CaptureStderr();
  ParseOutcome outcome;
  try {
    outcome.exit_status = parse_step_command_line("a step", static_cast<int>(argv.size()), argv.data(), common,
                                                  add_step_flags, {}, unused);
  } catch (...) {
    ::testing::internal::GetCapturedStderr();  // one capture at a time: end this one before the next test's
    throw;
  }
  outcome.stderr_text = ::testing::internal::GetCapturedStderr();
  return outcome;
}

TEST(StepCommandLine, ParsesTheCommonFlagsAndTheStepsOwn) {
  std::vector<std::string> words = {"step", "--quick", "--device", "cpu", "--repeats", "3"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  CommonOptions common;
  int repeats = 5;
  const auto exit_status =
      parse_step_command_line("a step", static_cast<int>(argv.size()), argv.data(), common,
                              [&](CLI::App& app) { app.add_option("--repeats", repeats, "timed runs"); }, {});
  EXPECT_FALSE(exit_status.has_value());
  EXPECT_TRUE(common.quick);
  EXPECT_EQ(common.device, "cpu");
  EXPECT_EQ(repeats, 3);
}

// How the CUDA model runs comes from the common flags: --dtype, --gemv and
// the switches become CudaRunOptions, and a name the model does not know is
// an InputError (the flags' own check refuses it first, with status 1).
TEST(StepCommandLine, TheCudaFlagsBecomeTheCudaRunOptions) {
  CommonOptions common;
  const cuda::CudaRunOptions defaults = cuda_run_options(common);
  EXPECT_EQ(defaults.dtype, cuda::WeightDtype::Float32);
  EXPECT_EQ(defaults.gemv, cuda::HalfGemvKernel::CudaCores);
  EXPECT_TRUE(defaults.graphs);
  EXPECT_TRUE(defaults.gemv_prefetch);
  EXPECT_TRUE(cuda::CudaRunOptions{}.gemv_prefetch);
  ASSERT_FALSE(parse({"step", "--dtype", "bf16", "--gemv", "tensor-cores", "--no-graphs", "--no-gemv-prefetch"}, common)
                   .exit_status);
  const cuda::CudaRunOptions run = cuda_run_options(common);
  EXPECT_EQ(run.dtype, cuda::WeightDtype::BFloat16);
  EXPECT_EQ(run.gemv, cuda::HalfGemvKernel::TensorCores);
  EXPECT_FALSE(run.graphs);
  EXPECT_FALSE(run.gemv_prefetch);
  Results results("stepXX", "a title");  // the JSON config records the prefetch
  set_sampling_config(results, common);
  EXPECT_TRUE(HasSubstr(results.to_json(), "\"cuda_gemv_prefetch\": false")) << results.to_json();
  for (const cuda::HalfGemvKernel kernel : {cuda::HalfGemvKernel::CudaCores, cuda::HalfGemvKernel::TensorCores})
    EXPECT_EQ(cuda::parse_half_gemv_kernel(cuda::to_string(kernel)), kernel);
  EXPECT_THROW(cuda::parse_half_gemv_kernel("mma"), InputError);
  CommonOptions refused;
  const ParseOutcome outcome = parse({"step", "--gemv", "mma"}, refused);
  ASSERT_TRUE(outcome.exit_status.has_value());
  EXPECT_EQ(*outcome.exit_status, 1);
  EXPECT_TRUE(HasSubstr(outcome.stderr_text, "--gemv"));
}

// --max-gemv-rows N: the half products of more than N rows run cuBLAS, and
// the JSON config records N. The default sends only one-row products to the
// GEMV (the command line's and the model's the same); 16, the GEMV's largest
// bucket, keeps every product of up to 16 rows on it; a row count the GEMV
// cannot take (0, 17) or no number at all is refused, naming the flag.
TEST(StepCommandLine, MaxGemvRowsBecomesTheCudaRunOptions) {
  CommonOptions common;
  EXPECT_EQ(common.max_gemv_rows, cuda::kDefaultMaxGemvRows);
  EXPECT_EQ(cuda_run_options(common).max_gemv_rows, cuda::kDefaultMaxGemvRows);
  EXPECT_EQ(cuda::CudaRunOptions{}.max_gemv_rows, cuda::kDefaultMaxGemvRows);
  EXPECT_EQ(cuda::kDefaultMaxGemvRows, 1);
  ASSERT_FALSE(parse({"step", "--max-gemv-rows", "16"}, common).exit_status);
  EXPECT_EQ(cuda_run_options(common).max_gemv_rows, cuda::kMaxGemvRows);
  Results results("stepXX", "a title");  // the JSON config says how the products ran
  set_sampling_config(results, common);
  EXPECT_TRUE(HasSubstr(results.to_json(), "\"cuda_max_gemv_rows\": 16")) << results.to_json();
  for (const char* refused_value : {"0", "17", "two"}) {
    SCOPED_TRACE(refused_value);
    CommonOptions refused;
    const ParseOutcome outcome = parse({"step", "--max-gemv-rows", refused_value}, refused);
    ASSERT_TRUE(outcome.exit_status.has_value());
    EXPECT_NE(*outcome.exit_status, 0);
    EXPECT_TRUE(HasSubstr(outcome.stderr_text, "--max-gemv-rows")) << outcome.stderr_text;
  }
}

// The JSON config a step writes for these options.
std::string json_config_of(const CommonOptions& options) {
  Results results("stepXX", "a title");
  set_sampling_config(results, options);
  return results.to_json();
}

// A switch of the CUDA model: `option` is `by_default` (in the parsed
// options and in CudaRunOptions{}) and the JSON config records `json_key`
// with that value; `flag` parses into `parsed`, flips it, and the JSON
// records the flipped value.
void expect_flag_flips(const std::string& flag, bool cuda::CudaRunOptions::*option, const std::string& json_key,
                       bool by_default, CommonOptions& parsed) {
  const auto json_records = [&json_key](const std::string& json, bool value) {
    EXPECT_TRUE(HasSubstr(json, "\"" + json_key + "\": " + (value ? "true" : "false"))) << json;
  };
  const CommonOptions defaults;
  EXPECT_EQ(cuda_run_options(defaults).*option, by_default);
  EXPECT_EQ(cuda::CudaRunOptions{}.*option, by_default);
  json_records(json_config_of(defaults), by_default);
  ASSERT_FALSE(parse({"step", flag}, parsed).exit_status);
  EXPECT_EQ(cuda_run_options(parsed).*option, !by_default);
  json_records(json_config_of(parsed), !by_default);
}

// A before-row switch of the CUDA model: `option` is on by default, `flag`
// turns it off (expect_flag_flips); with `off_without_fusions`, --no-fusions
// turns it off too.
void expect_before_row_switch(const std::string& flag, bool cuda::CudaRunOptions::*option,
                              const std::string& json_key, bool off_without_fusions, CommonOptions& parsed) {
  expect_flag_flips(flag, option, json_key, /*by_default=*/true, parsed);
  if (!off_without_fusions) return;
  CommonOptions no_fusions;
  ASSERT_FALSE(parse({"step", "--no-fusions"}, no_fusions).exit_status);
  const std::string unfused_json = json_config_of(no_fusions);
  EXPECT_TRUE(HasSubstr(unfused_json, "\"" + json_key + "\": false")) << unfused_json;
}

// An opt-in of the CUDA model: `option` is off by default, `flag` turns it on.
void expect_opt_in_switch(const std::string& flag, bool cuda::CudaRunOptions::*option, const std::string& json_key,
                          CommonOptions& parsed) {
  expect_flag_flips(flag, option, json_key, /*by_default=*/false, parsed);
}

// --merge-folding: split-KV decode attention merges its splits in the last
// split block, an opt-in since it measured slower than the merge kernel: off
// by default (options, run options, JSON), on with the flag, and off again
// in the JSON with --no-fusions, which the model then runs.
TEST(StepCommandLine, MergeFoldingIsAnOptIn) {
  CommonOptions folded;
  ASSERT_NO_FATAL_FAILURE(
      expect_opt_in_switch("--merge-folding", &cuda::CudaRunOptions::fold_merge, "cuda_merge_folding", folded));
  EXPECT_TRUE(cuda_run_options(folded).fusions);  // the other fusions stay on
  CommonOptions unfused;
  ASSERT_FALSE(parse({"step", "--merge-folding", "--no-fusions"}, unfused).exit_status);
  EXPECT_TRUE(HasSubstr(json_config_of(unfused), "\"cuda_merge_folding\": false")) << json_config_of(unfused);
}

// --gemv-prefetch-next: each GEMV asks L2 for the next product's first
// weights, an opt-in (it measured slower on a GPU): off by default
// (options, run options, JSON), on with the flag, the other GEMV switches
// untouched.
TEST(StepCommandLine, GemvPrefetchNextIsAnOptIn) {
  CommonOptions prefetching;
  ASSERT_NO_FATAL_FAILURE(expect_opt_in_switch("--gemv-prefetch-next", &cuda::CudaRunOptions::gemv_prefetch_next,
                                               "cuda_gemv_prefetch_next", prefetching));
  const cuda::CudaRunOptions run = cuda_run_options(prefetching);
  EXPECT_TRUE(run.gemv_prefetch);  // the other switches stay as they were
  EXPECT_TRUE(run.gemv_pipelining);
  EXPECT_TRUE(run.gemv_wave_fit);
}

// --no-rope-folding is the RoPE + K/V append kernel after the QKV product,
// the before row of folding it into the product: off in the run options and
// in the JSON, the other fusions on; --no-fusions turns it off too.
TEST(StepCommandLine, NoRopeFoldingBecomesTheCudaRunOptions) {
  CommonOptions common;
  ASSERT_NO_FATAL_FAILURE(expect_before_row_switch("--no-rope-folding", &cuda::CudaRunOptions::fold_rope,
                                                   "cuda_rope_folding", /*off_without_fusions=*/true, common));
  EXPECT_TRUE(cuda_run_options(common).fusions);
  EXPECT_TRUE(cuda_run_options(common).fold_norms);
}

// --no-gemv-wave-fit is the GEMV's column split of about two blocks per SM
// rounded up, the before row of fitting its blocks into whole waves: off in
// the run options, in the factory's switches and in the JSON, the rest on.
TEST(StepCommandLine, NoGemvWaveFitBecomesTheCudaRunOptions) {
  EXPECT_TRUE(cuda::HalfGemvLoads{}.whole_wave_split);
  CommonOptions common;
  ASSERT_NO_FATAL_FAILURE(expect_before_row_switch("--no-gemv-wave-fit", &cuda::CudaRunOptions::gemv_wave_fit,
                                                   "cuda_gemv_wave_fit", /*off_without_fusions=*/false, common));
  const cuda::CudaRunOptions run = cuda_run_options(common);
  EXPECT_TRUE(run.gemv_pipelining);  // the other switches stay on
  EXPECT_TRUE(run.gemv_prefetch);
  EXPECT_TRUE(run.fusions);
}

// --no-gemv-pipelining is the GEMV's serial weight loads, the before row of
// its pipelining: off in the run options and in the JSON, everything else on.
TEST(StepCommandLine, NoGemvPipeliningBecomesTheCudaRunOptions) {
  EXPECT_TRUE(cuda::HalfGemvLoads{}.pipelined);
  CommonOptions common;
  ASSERT_NO_FATAL_FAILURE(expect_before_row_switch("--no-gemv-pipelining", &cuda::CudaRunOptions::gemv_pipelining,
                                                   "cuda_gemv_pipelining", /*off_without_fusions=*/false, common));
  const cuda::CudaRunOptions run = cuda_run_options(common);
  EXPECT_TRUE(run.gemv_prefetch);  // the other switches stay on
  EXPECT_TRUE(run.fusions);
  EXPECT_TRUE(run.programmatic_launches);
}

// CLI11's own errors keep CLI11's message but exit 1, the status of every
// bad input (CLI11's codes are 105 to 109).
TEST(StepCommandLine, CommandLineErrorsStopWithStatusOne) {
  for (const std::vector<std::string>& words : std::vector<std::vector<std::string>>{
           {"step", "--no-such-flag"}, {"step", "--steps"}, {"step", "--steps", "abc"}, {"step", "--device", "gpu"},
           {"step", "--steps", "2.5"}}) {
    SCOPED_TRACE(words.back());
    CommonOptions common;
    const ParseOutcome outcome = parse(words, common);
    ASSERT_TRUE(outcome.exit_status.has_value());
    EXPECT_EQ(*outcome.exit_status, 1);
    EXPECT_TRUE(HasSubstr(outcome.stderr_text, "error: "));
    EXPECT_TRUE(HasSubstr(outcome.stderr_text, words[1]));  // the message names the flag
  }
}

TEST(StepCommandLine, HelpStopsWithStatusZeroAndStatesTheRanges) {
  CommonOptions common;
  ::testing::internal::CaptureStdout();
  const ParseOutcome outcome = parse({"step", "--help"}, common);
  const std::string help = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(outcome.exit_status.has_value());
  EXPECT_EQ(*outcome.exit_status, 0);
  EXPECT_TRUE(HasSubstr(help, "at least 1"));  // --steps
  EXPECT_TRUE(HasSubstr(help, "from 0 to 1"));  // --top-p
}

// The common flags' ranges, in words: the flag, what it allows, what it got;
// never CLI11's raw bounds (DBL_MAX printed with its 309 digits).
TEST(StepCommandLine, CommonRangeErrorsSayWhatIsAllowed) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--steps", "0"}, "error: --steps must be at least 1 (got 0)\n"},
      {{"--steps", "-1"}, "error: --steps must be at least 1 (got -1)\n"},
      {{"--temperature", "-1"}, "error: --temperature must be at least 0 (got -1)\n"},
      {{"--temperature", "nan"}, "error: --temperature must be a finite number, at least 0 (got nan)\n"},
      {{"--top-p", "1.5"}, "error: --top-p must be from 0 to 1 (got 1.5)\n"},
      {{"--top-p", "-0.1"}, "error: --top-p must be from 0 to 1 (got -0.1)\n"},
      {{"--seed", "-1"}, "error: --seed must be at least 0 (got -1)\n"},
  };
  for (const auto& [flag_and_value, message] : cases) {
    SCOPED_TRACE(message);
    CommonOptions common;
    std::vector<std::string> words = {"step"};
    words.insert(words.end(), flag_and_value.begin(), flag_and_value.end());
    const ParseOutcome outcome = parse(words, common);
    ASSERT_TRUE(outcome.exit_status.has_value());
    EXPECT_EQ(*outcome.exit_status, 1);
    EXPECT_EQ(outcome.stderr_text, message);
  }
}

// Found by fuzzing (fuzz/fuzz_command_line.cpp): CLI11 reads a negatable
// flag's value with std::stoll, whose std::out_of_range escaped
// parse_command_line and ended the program in std::terminate.
TEST(StepCommandLine, AHugeNumberAsAFlagValueIsAnErrorNotACrash) {
  for (const std::string& word : {"--no-causal=99999999999999999999", "--no-causal=-99999999999999999999",
                                  "--no-loopback=99999999999999999999"}) {
    SCOPED_TRACE(word);
    CommonOptions common;
    bool causal = true;
    bool loopback = true;
    const ParseOutcome outcome = parse({"step", word}, common, [&](CLI::App& app) {
      app.add_flag("--causal,!--no-causal", causal, "step 02's flag");
      app.add_flag("!--no-loopback", loopback, "step 07's flag");
    });
    ASSERT_TRUE(outcome.exit_status.has_value());
    EXPECT_EQ(*outcome.exit_status, 1);
    EXPECT_TRUE(HasSubstr(outcome.stderr_text, "error: a number on the command line is out of range"));
  }
}

// Also found by fuzzing: a --seed past 2^64 - 1 was read as 2^64 - 1.
TEST(StepCommandLine, ASeedPastSixtyFourBitsIsRefused) {
  for (const std::string& value : {"18446744073709551616", "99999999999999999999"}) {
    CommonOptions common;
    const ParseOutcome outcome = parse({"step", "--seed", value}, common);
    ASSERT_TRUE(outcome.exit_status.has_value());
    EXPECT_EQ(*outcome.exit_status, 1);
    EXPECT_EQ(outcome.stderr_text, "error: --seed must be at most 18446744073709551615 (got " + value + ")\n");
  }
  CommonOptions common;
  const ParseOutcome outcome = parse({"step", "--seed", "18446744073709551615"}, common);
  EXPECT_FALSE(outcome.exit_status.has_value());
  EXPECT_EQ(common.seed, UINT64_MAX);
}

// A number too large for its flag's type is CLI11's conversion error, status 1.
TEST(StepCommandLine, AHugeStepsIsAConversionError) {
  CommonOptions common;
  const ParseOutcome outcome = parse({"step", "--steps", "99999999999999999999"}, common);
  ASSERT_TRUE(outcome.exit_status.has_value());
  EXPECT_EQ(*outcome.exit_status, 1);
  EXPECT_TRUE(HasSubstr(outcome.stderr_text, "error: "));
  EXPECT_TRUE(HasSubstr(outcome.stderr_text, "--steps"));
}

TEST(StepCommandLine, ValuesAtTheEdgesOfTheirRangesAreAccepted) {
  CommonOptions common;
  const ParseOutcome outcome =
      parse({"step", "--steps", "1", "--temperature", "0", "--top-p", "1", "--seed", "0"}, common);
  EXPECT_FALSE(outcome.exit_status.has_value());
  EXPECT_EQ(outcome.stderr_text, "");
  EXPECT_EQ(common.steps, 1);
  EXPECT_EQ(common.top_p, 1.0f);
}

// A step's own flags: every value of a list is checked, and each kind of
// range says its rule.
TEST(StepCommandLine, StepFlagRangesCheckEveryValueOfAList) {
  std::vector<int> ks;
  double gib = 1.0;
  int port = -1;
  const auto add_flags = [&](CLI::App& app) {
    at_least(app.add_option("--k", ks, "drafts")->delimiter(','), 1);
    greater_than(app.add_option("--gib", gib, "memory"), 0);
    in_range(app.add_option("--port", port, "port"), 0, 65535);
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--k", "2,0,4"}, "error: --k must be at least 1 (got 0)\n"},
      {{"--gib", "0"}, "error: --gib must be more than 0 (got 0)\n"},
      {{"--gib", "inf"}, "error: --gib must be a finite number, more than 0 (got inf)\n"},
      {{"--port", "70000"}, "error: --port must be from 0 to 65535 (got 70000)\n"},
  };
  for (const auto& [flag_and_value, message] : cases) {
    SCOPED_TRACE(message);
    CommonOptions common;
    std::vector<std::string> words = {"step"};
    words.insert(words.end(), flag_and_value.begin(), flag_and_value.end());
    const ParseOutcome outcome = parse(words, common, add_flags);
    ASSERT_TRUE(outcome.exit_status.has_value());
    EXPECT_EQ(*outcome.exit_status, 1);
    EXPECT_EQ(outcome.stderr_text, message);
  }
  CommonOptions common;
  EXPECT_FALSE(parse({"step", "--k", "1,64", "--gib", "0.5", "--port", "0"}, common, add_flags).exit_status);
  EXPECT_EQ(ks, (std::vector<int>{1, 64}));
}

// Every step accepts every common flag; one the step does not use prints a
// note (with the program's name) and the run goes on.
TEST(StepCommandLine, AnUnusedCommonFlagGetsANoteAndTheRunGoesOn) {
  const std::vector<UnusedFlags> unused = {{{"--prompt", "--steps"}, "it runs on random inputs"}};
  CommonOptions common;
  ParseOutcome outcome = parse({"path/to/step02", "--prompt", "hi", "--device", "cpu"}, common, {}, unused);
  EXPECT_FALSE(outcome.exit_status.has_value());
  EXPECT_EQ(outcome.stderr_text, "step02: --prompt is not used by this step (it runs on random inputs)\n");

  CommonOptions defaults;
  outcome = parse({"step02", "--device", "cpu"}, defaults, {}, unused);  // not given: no note
  EXPECT_FALSE(outcome.exit_status.has_value());
  EXPECT_EQ(outcome.stderr_text, "");
}

TEST(StepCommandLine, AnUnusedFlagListNamingNoFlagIsAnError) {
  CommonOptions common;
  EXPECT_THROW(parse({"step"}, common, {}, {{{"--promt"}, "a typo"}}), CLI::Error);
}

// The three run sizes: the default (neither flag), --full, --quick; asking
// for the complete sweep and for seconds at once is a mistake.
TEST(StepCommandLine, FullIsACommonFlagAndExcludesQuick) {
  const auto parse = [](std::vector<std::string> words, CommonOptions& common) {
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    return parse_step_command_line("a step", static_cast<int>(argv.size()), argv.data(), common, {}, {});
  };
  CommonOptions neither;
  EXPECT_FALSE(parse({"step"}, neither).has_value());
  EXPECT_FALSE(neither.full);
  EXPECT_FALSE(neither.quick);
  CommonOptions full;
  EXPECT_FALSE(parse({"step", "--full"}, full).has_value());
  EXPECT_TRUE(full.full);
  EXPECT_FALSE(full.quick);
  CommonOptions both;
  ::testing::internal::CaptureStderr();
  const auto exit_status = parse({"step", "--full", "--quick"}, both);
  const std::string message = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(exit_status.has_value());
  EXPECT_NE(*exit_status, 0);
  EXPECT_TRUE(HasSubstr(message, "--full")) << message;
  EXPECT_TRUE(HasSubstr(message, "--quick")) << message;
}

TEST(StepCommandLine, ByRunSizePicksTheValueOfTheRunAskedFor) {
  CommonOptions options;
  EXPECT_EQ(by_run_size(options, 1, 2, 3), 2);  // neither flag: the default run
  options.full = true;
  EXPECT_EQ(by_run_size(options, 1, 2, 3), 3);
  options.full = false;
  options.quick = true;
  EXPECT_EQ(by_run_size<std::string>(options, "512", "1024", "32768"), "512");
}

TEST(StepCommandLine, ListPrintsTheVariantsAndStopsWithStatusZero) {
  std::vector<std::string> words = {"step", "--list"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  CommonOptions common;
  bool printed = false;
  const auto exit_status = parse_step_command_line("a step", static_cast<int>(argv.size()), argv.data(), common, {},
                                                   [&printed] { printed = true; });
  EXPECT_TRUE(printed);
  ASSERT_TRUE(exit_status.has_value());
  EXPECT_EQ(*exit_status, 0);
}

TEST(StepCommandLine, VariantListPadsNamesAndAddsDetails) {
  using Fn = int;
  const std::vector<Variant<Fn>> table = {{0, "plain", "the baseline", Backend::Any, 0},
                                          {1, "fast", "the trick", Backend::Cpu, 0}};
  EXPECT_EQ(format_variant_list(table, 6), "  0  plain  the baseline\n  1  fast   the trick\n");
  const std::function<VariantListDetails(const Variant<Fn>&)> details = [](const Variant<Fn>& v) {
    return VariantListDetails{std::string(backend_name(v.backend)) + " ", v.id == 1 ? "  [note]" : ""};
  };
  EXPECT_EQ(format_variant_list(table, 6, details), "  0  plain  any the baseline\n  1  fast   cpu the trick  [note]\n");
}

TEST(StepCommandLine, IsSelectedFindsAnId) {
  EXPECT_TRUE(is_selected({0, 2}, 2));
  EXPECT_FALSE(is_selected({0, 2}, 1));
  EXPECT_FALSE(is_selected({}, 0));
}

TEST(StepCommandLine, PositionsAreStepsCappedAtTheContext) {
  ModelConfig config = find_preset("tiny").config;
  CommonOptions options;
  options.steps = 100;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(generation_positions(options, config, 10), 100);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");  // within the context: nothing to say
  options.steps = 1000;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(generation_positions(options, config, 10), config.seq_len);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "note: --steps 1000 is more than the model's context of 512 positions; running 512\n");
}

TEST(StepCommandLine, APromptLongerThanThePositionsIsAnInputError) {
  ModelConfig config = find_preset("tiny").config;
  CommonOptions options;
  options.steps = 4;
  try {
    generation_positions(options, config, 5);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_TRUE(HasSubstr(e.what(), "the prompt is 5 tokens but --steps is 4"));
  }
}

// --- devices ----------------------------------------------------------------

TEST(ModelOnDevice, DevicesInPrintingOrder) {
  EXPECT_EQ(selected_device_names({true, true, ""}), (std::vector<std::string>{"cpu", "cuda"}));
  EXPECT_EQ(selected_device_names({false, true, ""}), (std::vector<std::string>{"cuda"}));
  EXPECT_EQ(selected_device_names({true, false, "no GPU"}), (std::vector<std::string>{"cpu"}));
}

TEST(ModelOnDevice, CpuModelAndUnknownDevice) {
  const ModelWeights weights = random_weights(find_preset("tiny").config, 1);
  const auto model = make_model_on("cpu", weights);
  EXPECT_EQ(model->device_name(), "cpu");
  EXPECT_THROW(make_model_on("tpu", weights), InputError);
}

// --- generated text -----------------------------------------------------------

TEST(GeneratedText, ByteLevelTokensPrintTheirBytesAndStopAtBos) {
  const Tokenizer tokenizer = Tokenizer::byte_level(512);
  const auto byte = [](char c) { return 3 + static_cast<unsigned char>(c); };
  const std::vector<int> prompt = {Tokenizer::kBos, byte('H'), byte('i')};
  const std::vector<int> generated = {byte('!'), byte('?'), Tokenizer::kBos, byte('x')};
  EXPECT_EQ(printable_text(tokenizer, prompt), "Hi");
  EXPECT_EQ(generated_text(tokenizer, prompt, generated), "Hi!?");
  EXPECT_EQ(generated_text(tokenizer, std::vector<int>{Tokenizer::kBos}, std::vector<int>{}), "");
}

// --- results rows and failed checks ---------------------------------------------

TEST(ResultRows, TimedRowTakesTheMedianAndTheCheck) {
  const TimingStats time = TimingStats::from_samples({3.0, 1.0, 2.0});
  CompareResult check;
  check.ok = true;
  check.max_rel_err = 1e-7;
  check.max_abs_err = 2e-7;
  const ResultRow row = timed_result_row("cpu", 1, "fast", time, 2.5, check);
  EXPECT_EQ(row.device, "cpu");
  EXPECT_EQ(row.id, 1);
  EXPECT_EQ(row.variant, "fast");
  EXPECT_EQ(row.time_ms, 2.0);
  EXPECT_EQ(row.speedup, 2.5);
  EXPECT_EQ(row.max_rel_err, 1e-7);
  EXPECT_TRUE(row.ok);
  EXPECT_EQ(std::get<double>(row.extra.at("time_min_ms")), 1.0);
  EXPECT_EQ(std::get<double>(row.extra.at("time_max_ms")), 3.0);
  EXPECT_EQ(std::get<double>(row.extra.at("max_abs_err")), 2e-7);
}

TEST(ResultRows, OnlyAFailedCheckIsReported) {
  CompareResult check;
  check.ok = true;
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE(report_if_failed("cpu fast", check));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  check.ok = false;
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(report_if_failed("cpu fast", check));
  const std::string message = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(HasSubstr(message, "check failed for cpu fast: ")) << message;
}

TEST(ResultRows, HeaderWithAndWithoutTheConfigLine) {
  Results results("stepXX", "a title");
  results.set_config("quick", true);
  const std::string with_config = results.format_header();
  const std::string without = results.format_header(Results::ConfigLine::Omitted);
  EXPECT_TRUE(HasSubstr(with_config, "== stepXX : a title ==\n"));
  EXPECT_TRUE(HasSubstr(with_config, "config: quick=true\n"));
  EXPECT_EQ(without.find("config:"), std::string::npos);
  EXPECT_TRUE(HasSubstr(without, "commit: "));
  EXPECT_EQ(results.format_table().rfind(with_config, 0), 0u);  // the table starts with the header
}

// A sampled run can be repeated from its JSON alone: every step's config
// records the sampling flags and the prompt text (finish_run adds them).
TEST(ResultRows, TheJsonConfigRecordsSamplingAndThePrompt) {
  CommonOptions options;
  options.temperature = 0.75f;
  options.top_p = 0.5f;
  options.seed = 7;
  options.prompt = "Once upon a \"time\"";
  options.json_path = (std::filesystem::temp_directory_path() /
                       ("step_harness_sampling_config_" + std::to_string(::getpid()) + ".json"))
                          .string();
  Results results("stepXX", "a title");
  results.set_config("quick", true);
  ResultRow row;
  row.ok = true;
  results.add_row(row);
  ::testing::internal::CaptureStdout();  // "results written to ..."
  EXPECT_EQ(finish_run(results, options, DeviceSelection{true, false, ""}), 0);
  ::testing::internal::GetCapturedStdout();
  std::ifstream file(options.json_path);
  const std::string json((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::filesystem::remove(options.json_path);
  EXPECT_TRUE(HasSubstr(json, "\"temperature\": 0.75")) << json;
  EXPECT_TRUE(HasSubstr(json, "\"top_p\": 0.5")) << json;
  EXPECT_TRUE(HasSubstr(json, "\"seed\": 7")) << json;
  EXPECT_TRUE(HasSubstr(json, R"("prompt": "Once upon a \"time\"")")) << json;
  EXPECT_TRUE(HasSubstr(json, "\"quick\": true")) << json;  // the step's own keys stay

  // A seed past a JSON integer's signed 64 bits keeps every digit, as a string.
  options.seed = UINT64_MAX;
  set_sampling_config(results, options);
  EXPECT_TRUE(HasSubstr(results.to_json(), "\"seed\": \"18446744073709551615\"")) << results.to_json();
}

TEST(RunProgress, EachPartIsALineOnStderr) {
  RunProgress progress("stepXX", 2);
  ::testing::internal::CaptureStderr();
  progress.start("the kernel table");
  progress.note("building the model");  // a stage inside part 1: indented, not counted
  progress.start("the model's prefill");
  // Each line ends with the seconds since the progress began.
  const std::string lines = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(std::regex_match(lines, std::regex(R"(stepXX: part 1 of 2: the kernel table \(at [0-9]+\.[0-9] s\)\n)"
                                                 R"(stepXX:   building the model \(at [0-9]+\.[0-9] s\)\n)"
                                                 R"(stepXX: part 2 of 2: the model's prefill \(at [0-9]+\.[0-9] s\)\n)")))
      << lines;
  EXPECT_EQ(progress.parts_started(), 2);
}

TEST(ResultRows, FormatMs) {
  EXPECT_EQ(format_ms(0.5), "500.0 us");
  EXPECT_EQ(format_ms(3.254), "3.25 ms");
  EXPECT_EQ(format_ms(1200.0), "1.20 s");
}

// Throughputs from 1,000 to 9,999 once printed as "9.29e+03" beside "10890".
TEST(ResultRows, FormatRateNeverUsesAnExponent) {
  EXPECT_EQ(format_rate(0.1234), "0.123");
  EXPECT_EQ(format_rate(9.294), "9.29");
  EXPECT_EQ(format_rate(45.61), "45.6");
  EXPECT_EQ(format_rate(156.1), "156");
  EXPECT_EQ(format_rate(9290.4), "9290");
  EXPECT_EQ(format_rate(10890.0), "10890");
  EXPECT_EQ(format_rate(2345678.0), "2.35M");
  for (double value : {0.00002, 0.5, 3.0, 1234.5, 99999.0}) {
    EXPECT_EQ(format_rate(value).find('e'), std::string::npos) << value;
  }
}

}  // namespace
}  // namespace llm
