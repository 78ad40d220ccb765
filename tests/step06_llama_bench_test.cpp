// Step 06 beside llama.cpp's llama-bench: its JSON read (a recorded run),
// the command it is given, the pairing of llama.cpp types with this step's
// rows, the table and JSON rows, and every way a request or a run fails.
// llama-bench itself is never needed: stand-ins are shell scripts written
// here that print canned output or fail.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "llm/errors.hpp"
#include "llm/harness/progress.hpp"
#include "llm/harness/results.hpp"
#include "step06_quantization/measure/llama_bench.hpp"
#include "step06_quantization/measure/model_table.hpp"
#include "test_support.hpp"

namespace step06 {
namespace {

using llm::testing::HasSubstr;

// Recorded from llama-bench (llama.cpp de3ff81) on the small preset's
// checkpoint converted to GGUF and quantized with `llama-quantize --pure
// ... Q4_0`, run as `-t 1 -p 0 -n 31 -r 3 -o json`; keys this step does not
// read trimmed, the rest as printed.
constexpr const char* kRecordedQ4_0 = R"([
  {
    "build_commit": "de3ff81",
    "build_number": 1,
    "cpu_info": "AMD EPYC",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "small-q4_0.gguf",
    "model_type": "llama ?B Q4_0",
    "model_size": 13742208,
    "model_n_params": 24407712,
    "n_threads": 1,
    "type_k": "f16",
    "type_v": "f16",
    "n_prompt": 0,
    "n_gen": 31,
    "n_depth": 0,
    "test_time": "2026-11-26T21:06:01Z",
    "avg_ns": 24026183,
    "stddev_ns": 3878457,
    "avg_ts": 1312.664711,
    "stddev_ts": 209.074279,
    "samples_ns": [ 20375672, 23604717, 28098160 ],
    "samples_ts": [ 1521.42, 1313.3, 1103.28 ]
  }
]
)";

// One llama-bench test object: `model_type`'s type, n_prompt / n_gen, a speed.
std::string test_object(const std::string& model_type, int n_prompt, int n_gen, double tokens_per_s) {
  return fmt::format(R"({{"build_commit": "abc1234", "build_number": 4242, "model_type": "{}", "model_size": 1000,
    "model_n_params": 500, "n_prompt": {}, "n_gen": {}, "avg_ts": {}, "stddev_ts": 1.5,
    "samples_ts": [ {}, {} ]}})",
                     model_type, n_prompt, n_gen, tokens_per_s, tokens_per_s - 1.5, tokens_per_s + 1.5);
}

// Expects `call` to throw llm::InputError whose message holds every one of `parts`.
template <typename Call>
void expect_input_error(Call call, const std::vector<std::string>& parts) {
  try {
    call();
    FAIL() << "expected an InputError";
  } catch (const llm::InputError& e) {
    for (const std::string& part : parts) EXPECT_TRUE(HasSubstr(e.what(), part));
  }
}

TEST(Step06LlamaBench, ReadsTheRecordedDecodeTest) {
  const LlamaBenchResult result = parse_llama_bench_json(kRecordedQ4_0, "models/small-q4_0.gguf", "the command");
  EXPECT_EQ(result.gguf, "models/small-q4_0.gguf");
  EXPECT_EQ(result.command, "the command");
  EXPECT_EQ(result.model_type, "llama ?B Q4_0");
  EXPECT_EQ(result.type_name, "Q4_0");
  EXPECT_EQ(result.model_size_bytes, 13742208);
  EXPECT_EQ(result.model_parameters, 24407712);
  EXPECT_EQ(result.decode_tokens, 31);
  EXPECT_DOUBLE_EQ(result.avg_tokens_per_s, 1312.664711);
  EXPECT_DOUBLE_EQ(result.stddev_tokens_per_s, 209.074279);
  EXPECT_EQ(result.samples_tokens_per_s, (std::vector<double>{1521.42, 1313.3, 1103.28}));
  EXPECT_EQ(result.build_commit, "de3ff81");
  EXPECT_EQ(result.build_number, 1);
}

TEST(Step06LlamaBench, TheTypeIsTheModelDescriptionsLastPart) {
  // llama.cpp's descriptions: "<arch> <size> <type>", F32 as "all F32", a
  // file without its type key "(guessed)", k-quant mixtures with spaces.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"llama ?B (guessed) all F32", "F32"},
      {"llama ?B all F32", "F32"},
      {"llama 7B Q8_0", "Q8_0"},
      {"llama ?B Q4_K - Medium", "Q4_K - Medium"},
  };
  for (const auto& [model_type, type_name] : cases) {
    SCOPED_TRACE(model_type);
    const std::string json = "[" + test_object(model_type, 0, 16, 100.0) + "]";
    EXPECT_EQ(parse_llama_bench_json(json, "m.gguf", "cmd").type_name, type_name);
  }
}

TEST(Step06LlamaBench, PicksTheDecodeTestAmongOthers) {
  // An older llama-bench may add a prompt test; only the decode test counts.
  const std::string json =
      "[" + test_object("llama ?B Q8_0", 512, 0, 9000.0) + "," + test_object("llama ?B Q8_0", 0, 64, 800.0) + "]";
  const LlamaBenchResult result = parse_llama_bench_json(json, "m.gguf", "cmd");
  EXPECT_EQ(result.decode_tokens, 64);
  EXPECT_DOUBLE_EQ(result.avg_tokens_per_s, 800.0);
}

TEST(Step06LlamaBench, OutputThatIsNotADecodeTestIsAnError) {
  const auto parse = [](const std::string& json) {
    return [json] { parse_llama_bench_json(json, "m.gguf", "llama-bench -m m.gguf"); };
  };
  // Not JSON at all (llama-bench's markdown table: -o json missing).
  expect_input_error(parse("| model | size |\n| --- | --- |\n"),
                     {"'llama-bench -m m.gguf'", "printed no llama-bench JSON", "| model | size |"});
  expect_input_error(parse("{\"n_gen\": 32}"), {"printed no llama-bench JSON"});  // an object, not the array
  expect_input_error(parse("[" + test_object("llama ?B Q8_0", 512, 0, 9000.0) + "]"), {"no decode test"});
  expect_input_error(parse("[]"), {"no decode test"});
  // A key missing, or of another type.
  std::string without_speed = test_object("llama ?B Q8_0", 0, 32, 100.0);
  without_speed.replace(without_speed.find("\"avg_ts\""), 4, "\"avg_");
  expect_input_error(parse("[" + without_speed + "]"), {"no \"avg_ts\""});
  std::string speed_as_text = test_object("llama ?B Q8_0", 0, 32, 100.0);
  speed_as_text.replace(speed_as_text.find("\"avg_ts\": 100"), 13, "\"avg_ts\": \"fast\"");
  expect_input_error(parse("[" + speed_as_text + "]"), {"\"avg_ts\" is \"fast\""});
  // A speed that would divide every ratio: zero.
  expect_input_error(parse("[" + test_object("llama ?B Q8_0", 0, 32, 0.0) + "]"), {"decode speed is 0 tokens/s"});
}

// A stand-in for llama-bench: a shell script `body`, executable.
std::string fake_llama_bench(const std::string& name, const std::string& body) {
  return llm::testing::write_shell_script(name, body);
}

TEST(Step06LlamaBench, RunsOneThreadDecodeOnlyAndReadsStdoutAlone) {
  // It records its arguments, logs on stderr as llama-bench does, prints the recorded JSON on stdout.
  const std::string arguments = llm::testing::temp_path("llama_bench_arguments");
  const std::string json_path = llm::testing::temp_path("recorded_q4_0.json");
  const std::string json = kRecordedQ4_0;
  llm::testing::write_bytes(json_path, std::vector<char>(json.begin(), json.end()));
  const std::string binary = fake_llama_bench(
      "fake llama-bench", "printf '%s|' \"$@\" > '" + arguments + "'; echo 'llama_model_loader: loaded' >&2; cat '" +
                              json_path + "'");
  const std::string gguf = "/models/it's small.gguf";  // a space and a quote: no shell in between
  const LlamaBenchResult result = run_llama_bench(binary, gguf, 31, 3);
  const std::vector<char> recorded = llm::testing::read_bytes(arguments);
  EXPECT_EQ(std::string(recorded.begin(), recorded.end()),
            "-m|" + gguf + "|-t|1|-p|0|-n|31|-r|3|-o|json|");
  EXPECT_EQ(result.type_name, "Q4_0");
  EXPECT_EQ(result.gguf, gguf);
  EXPECT_EQ(result.binary, binary);
  EXPECT_EQ(result.command, binary + " -m " + gguf + " -t 1 -p 0 -n 31 -r 3 -o json");
}

TEST(Step06LlamaBench, AFailingRunIsAnErrorWithItsStatusAndTheEndOfItsStderr) {
  // 30 log lines, then the reason: the error keeps the end, not the start.
  const std::string binary = fake_llama_bench(
      "failing_llama_bench.sh",
      "i=0; while [ $i -lt 30 ]; do echo \"log line $i\" >&2; i=$((i + 1)); done; "
      "echo 'error: failed to load model' >&2; echo 'partial stdout'; exit 1");
  try {
    run_llama_bench(binary, "missing.gguf", 8, 1);
    FAIL() << "expected an InputError";
  } catch (const llm::InputError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(HasSubstr(message, "exit status 1"));
    EXPECT_TRUE(HasSubstr(message, "error: failed to load model"));
    EXPECT_TRUE(HasSubstr(message, "log line 29"));
    EXPECT_FALSE(HasSubstr(message, "log line 0\n")) << "the whole log, not its end:\n" << message;
    EXPECT_TRUE(HasSubstr(message, "-m missing.gguf"));
  }
  // Killed by a signal is not exit status 0.
  const std::string killed = fake_llama_bench("killed_llama_bench.sh", "kill -9 $$");
  expect_input_error([&] { run_llama_bench(killed, "m.gguf", 8, 1); }, {"killed by signal 9"});
}

TEST(Step06LlamaBench, ABinaryThatCannotRunOrPrintsNoDecodeTestIsAnError) {
  expect_input_error([] { run_llama_bench(llm::testing::temp_path("no_such_llama_bench"), "m.gguf", 8, 1); },
                     {"cannot run", "no_such_llama_bench"});
  // A file that is not executable.
  const std::string not_executable = llm::testing::temp_path("not_executable_llama_bench");
  llm::testing::write_bytes(not_executable, {'#', '!', '/', 'b', 'i', 'n', '/', 's', 'h', '\n'});
  std::filesystem::permissions(not_executable,
                               std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  expect_input_error([&] { run_llama_bench(not_executable, "m.gguf", 8, 1); }, {"cannot run", "Permission denied"});
  // Exit status 0, but something else printed.
  const std::string other_program = fake_llama_bench("not_llama_bench.sh", "echo hello");
  expect_input_error([&] { run_llama_bench(other_program, "m.gguf", 8, 1); },
                     {"printed no llama-bench JSON", "hello"});
}

TEST(Step06LlamaBench, RunsEveryFileAsAPartOfTheProgress) {
  const std::string binary = fake_llama_bench(
      "typed_llama_bench.sh", "case \"$2\" in *q8*) t=Q8_0;; *) t='all F32';; esac; echo \"[" +
                                  std::string(R"({\"build_commit\": \"abc\", \"build_number\": 7, \"model_type\": )"
                                              R"(\"llama ?B $t\", \"model_size\": 10, \"model_n_params\": 5, )"
                                              R"(\"n_prompt\": 0, \"n_gen\": $8, \"avg_ts\": 50.5, )"
                                              R"(\"stddev_ts\": 0.5, \"samples_ts\": [50, 51]})") +
                                  "]\"");
  llm::RunProgress progress("step06_quantization", 2);
  ::testing::internal::CaptureStderr();
  const std::vector<LlamaBenchResult> results =
      run_llama_bench_files(binary, {"/models/a-f32.gguf", "/models/a-q8_0.gguf"}, 12, 2, progress);
  const std::string stderr_text = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].type_name, "F32");
  EXPECT_EQ(results[1].type_name, "Q8_0");
  EXPECT_EQ(results[1].decode_tokens, 12);
  EXPECT_EQ(progress.parts_started(), 2);
  EXPECT_TRUE(HasSubstr(stderr_text, "part 1 of 2: llama.cpp's llama-bench on a-f32.gguf"));
  EXPECT_TRUE(HasSubstr(stderr_text, "part 2 of 2: llama.cpp's llama-bench on a-q8_0.gguf"));
}

TEST(Step06LlamaBench, ARequestIsCheckedBeforeAnyWork) {
  const std::string binary = fake_llama_bench("checked_llama_bench.sh", "exit 0");
  const std::string gguf = llm::testing::temp_path("checked.gguf");
  llm::testing::write_bytes(gguf, {'G', 'G', 'U', 'F'});
  EXPECT_NO_THROW(check_llama_bench_request("", {}, false));  // no comparison asked for
  EXPECT_NO_THROW(check_llama_bench_request(binary, {gguf}, true));
  expect_input_error([&] { check_llama_bench_request(binary, {}, true); }, {"go together"});
  expect_input_error([&] { check_llama_bench_request("", {gguf}, true); }, {"go together"});
  expect_input_error([&] { check_llama_bench_request(binary, {gguf}, false); }, {"--device cpu or all"});
  expect_input_error([&] { check_llama_bench_request(llm::testing::temp_path("absent"), {gguf}, true); },
                     {"--compare-llama-bench", "absent", "not an executable file"});
  expect_input_error([&] { check_llama_bench_request(gguf, {gguf}, true); }, {"not an executable file"});
  expect_input_error(
      [&] { check_llama_bench_request(binary, {gguf, llm::testing::temp_path("absent.gguf")}, true); },
      {"--llama-gguf", "absent.gguf", "not a file"});
}

// A CPU decode row of this step that ran.
ModelRow decode_row(const std::string& weights, double tokens_per_s) {
  ModelRow row;
  row.device = "cpu";
  row.model = "small.bin";
  if (weights != "fp32") row.variant.weights = QuantFormat::parse(weights);
  row.tokens_per_s = tokens_per_s;
  row.ok = true;
  return row;
}

LlamaBenchResult llama_result(const std::string& type_name, double tokens_per_s) {
  LlamaBenchResult result;
  result.gguf = "/models/small-" + type_name + ".gguf";
  result.binary = "/opt/llama.cpp/llama-bench";
  result.type_name = type_name;
  result.model_type = "llama ?B " + type_name;
  result.decode_tokens = 31;
  result.avg_tokens_per_s = tokens_per_s;
  result.stddev_tokens_per_s = 2.0;
  result.samples_tokens_per_s = {tokens_per_s - 2, tokens_per_s + 2};
  result.build_commit = "de3ff81";
  result.build_number = 1;
  return result;
}

// The loaded model's rows: the candidates, and rows that must never be
// paired (faster than every candidate, so a wrong filter shows).
std::vector<ModelRow> this_model_rows() {
  std::vector<ModelRow> rows = {decode_row("fp32", 400),         decode_row("int8", 1000),
                                decode_row("int8-a8", 1400),     decode_row("int4-g64", 1500),
                                decode_row("int4sym-g32-a8", 1300), decode_row("nf4", 900)};
  ModelRow cuda = decode_row("int4-g64", 9000);
  cuda.device = "cuda";
  ModelRow gptq = decode_row("int4-g128", 8000);
  gptq.variant.algorithm = QuantAlgorithm::Gptq;
  ModelRow int8_kv = decode_row("fp32", 7000);
  int8_kv.variant.int8_kv = true;
  ModelRow skipped = decode_row("int4-g32", 6000);
  skipped.skipped = "layer too small for the group";
  ModelRow fp16 = decode_row("fp32", 5000);
  fp16.variant.dense_dtype = llm::cuda::WeightDtype::Float16;
  rows.insert(rows.end(), {cuda, gptq, int8_kv, skipped, fp16});
  return rows;
}

TEST(Step06LlamaBench, PairsEachTypeWithItsRows) {
  const std::vector<LlamaComparison> comparisons = pair_with_llama(
      {llama_result("F32", 200), llama_result("Q8_0", 1250), llama_result("Q4_0", 1600), llama_result("Q6_K", 700)},
      this_model_rows());
  ASSERT_EQ(comparisons.size(), 4u);

  const LlamaComparison& f32 = comparisons[0];
  ASSERT_EQ(f32.partners.size(), 1u);
  EXPECT_EQ(f32.partners[0].weights, "fp32");
  EXPECT_DOUBLE_EQ(f32.partners[0].tokens_per_s, 400);  // not the int8-kv or fp16 rows
  EXPECT_TRUE(f32.partners[0].headline);
  EXPECT_DOUBLE_EQ(f32.ratio(f32.partners[0]), 2.0);

  // Q8_0: both int8 rows, the faster one the pair's ratio.
  const LlamaComparison& q8 = comparisons[1];
  ASSERT_EQ(q8.partners.size(), 2u);
  EXPECT_EQ(q8.partners[0].weights, "int8");
  EXPECT_FALSE(q8.partners[0].headline);
  EXPECT_EQ(q8.partners[1].weights, "int8-a8");
  EXPECT_TRUE(q8.partners[1].headline);
  EXPECT_DOUBLE_EQ(q8.ratio(q8.partners[1]), 1400.0 / 1250.0);

  // Q4_0: the fastest 4-bit CPU RTN row, then Q4_0's own layout.
  const LlamaComparison& q4 = comparisons[2];
  ASSERT_EQ(q4.partners.size(), 2u);
  EXPECT_EQ(q4.partners[0].weights, "int4-g64");
  EXPECT_EQ(q4.partners[0].role, "best 4-bit");
  EXPECT_TRUE(q4.partners[0].headline);
  EXPECT_EQ(q4.partners[1].weights, "int4sym-g32-a8");
  EXPECT_EQ(q4.partners[1].role, "Q4_0's layout");
  EXPECT_FALSE(q4.partners[1].headline);
  EXPECT_DOUBLE_EQ(q4.ratio(q4.partners[1]), 1300.0 / 1600.0);

  EXPECT_TRUE(comparisons[3].partners.empty());  // Q6_K: nothing here stores it
  EXPECT_EQ(comparisons[3].llama.type_name, "Q6_K");
}

TEST(Step06LlamaBench, Q4_0sLayoutIsNamedOnceWhenItIsTheFastest) {
  std::vector<ModelRow> rows = {decode_row("int4-g64", 900), decode_row("int4sym-g32-a8", 1700)};
  const std::vector<LlamaComparison> comparisons = pair_with_llama({llama_result("Q4_0", 1600)}, rows);
  ASSERT_EQ(comparisons.at(0).partners.size(), 1u);
  EXPECT_EQ(comparisons[0].partners[0].weights, "int4sym-g32-a8");
  EXPECT_EQ(comparisons[0].partners[0].role, "best 4-bit, Q4_0's layout");
  // Without any row of its kind (--variant 0), a type stands alone.
  EXPECT_TRUE(pair_with_llama({llama_result("Q8_0", 800)}, {decode_row("fp32", 400)}).at(0).partners.empty());
}

TEST(Step06LlamaBench, TheTableAndTheJsonCarryEveryLine) {
  const std::vector<LlamaComparison> comparisons =
      pair_with_llama({llama_result("Q8_0", 1250), llama_result("Q6_K", 700)}, this_model_rows());
  ::testing::internal::CaptureStdout();
  print_llama_comparison(comparisons, "small.bin", 31, 2);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(HasSubstr(printed, "build de3ff81 (1)"));
  EXPECT_TRUE(HasSubstr(printed, "-t 1 -p 0 -n 31 -r 2"));
  std::istringstream lines(printed);
  std::vector<std::string> table_lines;
  for (std::string line; std::getline(lines, line);)  // a type's first line, or a further row of its (indented)
    if (line.starts_with("Q") || line.starts_with(std::string(20, ' '))) table_lines.push_back(line);
  ASSERT_EQ(table_lines.size(), 3u) << printed;
  EXPECT_TRUE(HasSubstr(table_lines[0], "1250.0 +- 2.0"));
  EXPECT_TRUE(HasSubstr(table_lines[0], "0.80x")) << table_lines[0];  // int8: 1000 / 1250
  EXPECT_TRUE(HasSubstr(table_lines[1], "1.12x *")) << table_lines[1];  // int8-a8: 1400 / 1250, the pair's ratio
  EXPECT_TRUE(HasSubstr(table_lines[2], "Q6_K")) << table_lines[2];
  EXPECT_TRUE(HasSubstr(table_lines[2], "no row of this step")) << table_lines[2];

  llm::Results results("step06_quantization", "test");
  add_llama_rows(results, comparisons);
  const std::string json = results.to_json();
  EXPECT_TRUE(HasSubstr(json, "\"llama_bench_build\": \"de3ff81 (1)\""));
  EXPECT_TRUE(HasSubstr(json, "\"llama_bench\": ["));
  // File names only: no folder of the machine it ran on.
  EXPECT_TRUE(
      HasSubstr(json, "\"llama_cpp_command\": \"llama-bench -m small-Q8_0.gguf -t 1 -p 0 -n 31 -r 2 -o json\""));
  EXPECT_FALSE(HasSubstr(json, "/models/"));
  EXPECT_FALSE(HasSubstr(json, "/opt/"));
  EXPECT_EQ(llm::testing::count_occurrences(json, "\"llama_cpp_type\""), 3);  // int8, int8-a8, Q6_K alone
  EXPECT_EQ(llm::testing::count_occurrences(json, "\"ratio_vs_llama_cpp\""), 2);
  EXPECT_TRUE(HasSubstr(json, "\"llama_cpp_samples_tokens_per_s\": \"1248.000,1252.000\""));
}

}  // namespace
}  // namespace step06
