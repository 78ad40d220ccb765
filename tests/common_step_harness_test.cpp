// The plumbing every step executable shares: its command line, --list, the
// prompt's positions, the generated text, results rows and failed checks.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "llm/config.hpp"
#include "llm/errors.hpp"
#include "llm/harness/generated_text.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/harness/result_rows.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/step_command_line.hpp"
#include "llm/weights.hpp"
#include "test_support.hpp"

namespace llm {
namespace {

using ::llm::testing::HasSubstr;

// --- the command line ----------------------------------------------------------

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

TEST(StepCommandLine, AnUnknownFlagStopsWithANonZeroStatus) {
  std::vector<std::string> words = {"step", "--no-such-flag"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  CommonOptions common;
  ::testing::internal::CaptureStderr();
  const auto exit_status = parse_step_command_line("a step", static_cast<int>(argv.size()), argv.data(), common, {}, {});
  ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(exit_status.has_value());
  EXPECT_NE(*exit_status, 0);
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
  EXPECT_EQ(generation_positions(options, config, 10), 100);
  options.steps = config.seq_len + 50;
  EXPECT_EQ(generation_positions(options, config, 10), config.seq_len);
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

TEST(ResultRows, FormatMs) {
  EXPECT_EQ(format_ms(0.5), "500.0 us");
  EXPECT_EQ(format_ms(3.254), "3.25 ms");
  EXPECT_EQ(format_ms(1200.0), "1.20 s");
}

}  // namespace
}  // namespace llm
