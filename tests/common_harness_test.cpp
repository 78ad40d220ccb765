// The harness every step reports through: compare(), the timer statistics,
// the results JSON, and --variant parsing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "llm/errors.hpp"
#include "llm/harness/compare.hpp"
#include "llm/harness/device_info.hpp"
#include "llm/harness/json_writer.hpp"
#include "llm/harness/results.hpp"
#include "llm/harness/timer.hpp"
#include "llm/harness/variant.hpp"
#include "test_support.hpp"

namespace llm {
namespace {

using ::llm::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr Tolerance kHugeTolerance{1e30, 1e30};

// --- compare ----------------------------------------------------------------

TEST(Compare, IdenticalValuesAreOk) {
  const auto ref = testing::random_vector(100, 1);
  const CompareResult r = compare(ref, ref, tolerance_for(DType::F32));
  EXPECT_TRUE(r.ok) << r.summary();
  EXPECT_EQ(r.count, 100u);
  EXPECT_EQ(r.max_abs_err, 0.0);
  EXPECT_EQ(r.over_tolerance, 0u);
  EXPECT_TRUE(HasSubstr(r.summary(), "ok"));
}

TEST(Compare, ToleranceIsAbsolutePlusRelative) {
  // F32: |got - ref| <= 1e-5 + 1e-4 |ref|, so 0.01001 around 100.
  const std::vector<float> ref = {100.0f};
  EXPECT_TRUE(compare(std::vector<float>{100.009f}, ref, tolerance_for(DType::F32)).ok);
  EXPECT_FALSE(compare(std::vector<float>{100.011f}, ref, tolerance_for(DType::F32)).ok);
  EXPECT_FALSE(compare(std::vector<float>{99.989f}, ref, tolerance_for(DType::F32)).ok);
  // Around 0 only the absolute part counts.
  EXPECT_TRUE(compare(std::vector<float>{9e-6f}, std::vector<float>{0.0f}, tolerance_for(DType::F32)).ok);
  EXPECT_FALSE(compare(std::vector<float>{2e-5f}, std::vector<float>{0.0f}, tolerance_for(DType::F32)).ok);
  // fp16's tolerance accepts what fp32's rejects.
  EXPECT_TRUE(compare(std::vector<float>{100.5f}, ref, tolerance_for(DType::F16)).ok);
}

TEST(Compare, TolerancesLoosenFromF32ToF16ToBf16) {
  const Tolerance f32 = tolerance_for(DType::F32), f16 = tolerance_for(DType::F16), bf16 = tolerance_for(DType::BF16);
  EXPECT_LT(f32.rel_tol, f16.rel_tol);
  EXPECT_LT(f16.rel_tol, bf16.rel_tol);
  EXPECT_LT(f32.abs_tol, f16.abs_tol);
  EXPECT_LE(f16.abs_tol, bf16.abs_tol);
  EXPECT_STREQ(dtype_name(DType::F32), "fp32");
  EXPECT_STREQ(dtype_name(DType::F16), "fp16");
  EXPECT_STREQ(dtype_name(DType::BF16), "bf16");
}

TEST(Compare, CatchesNaNInGotEvenWithAHugeTolerance) {
  std::vector<float> got = testing::random_vector(50, 2);
  const std::vector<float> ref = got;
  got[17] = kNaN;
  const CompareResult r = compare(got, ref, kHugeTolerance);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.nan_or_inf, 1u);
  EXPECT_EQ(r.worst_index, 17u);
  EXPECT_TRUE(HasSubstr(r.summary(), "MISMATCH"));
}

TEST(Compare, CatchesInfInGotEvenWithAHugeTolerance) {
  std::vector<float> got = testing::random_vector(50, 3);
  const std::vector<float> ref = got;
  got[3] = kInf;
  got[40] = -kInf;
  const CompareResult r = compare(got, ref, kHugeTolerance);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.nan_or_inf, 2u);
  EXPECT_EQ(r.worst_index, 3u);  // the first non-finite value
}

TEST(Compare, AllNaNIsNotOk) {
  const std::vector<float> got(8, kNaN), ref(8, 1.0f);
  const CompareResult r = compare(got, ref, kHugeTolerance);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.nan_or_inf, 8u);
}

TEST(Compare, CountsNaNInTheReferenceToo) {
  std::vector<float> ref = testing::random_vector(10, 4);
  const std::vector<float> got = ref;
  ref[5] = kNaN;
  const CompareResult r = compare(got, ref, kHugeTolerance);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.nan_or_inf, 1u);
}

TEST(Compare, SizeMismatchIsNotOk) {
  const std::vector<float> ref = testing::random_vector(10, 5);
  const std::vector<float> got(ref.begin(), ref.end() - 1);  // a matching prefix
  const CompareResult r = compare(got, ref, kHugeTolerance);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.size_mismatch);
  EXPECT_TRUE(HasSubstr(r.summary(), "sizes differ"));
}

TEST(Compare, NothingToCompareIsNotOk) {
  EXPECT_FALSE(compare(std::vector<float>{}, std::vector<float>{}, kHugeTolerance).ok);
}

TEST(Compare, WorstIndexPointsAtThePlantedError) {
  const std::vector<float> ref = testing::random_vector(1000, 6);
  std::vector<float> got = ref;
  for (std::size_t i = 0; i < got.size(); ++i) got[i] += 1e-7f * static_cast<float>(i % 3);  // noise within tolerance
  got[613] += 0.5f;
  const CompareResult r = compare(got, ref, tolerance_for(DType::F32));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.worst_index, 613u);
  EXPECT_EQ(r.over_tolerance, 1u);
  EXPECT_NEAR(r.max_abs_err, 0.5, 1e-6);
  EXPECT_TRUE(HasSubstr(r.summary(), "worst_index=613"));
}

TEST(Compare, RelativeErrorIgnoresReferencesBelowTheAbsoluteTolerance) {
  // 1e-6 away from 1e-9: a huge relative error that means nothing.
  const CompareResult r = compare(std::vector<float>{1e-6f, 2.0f}, std::vector<float>{1e-9f, 2.0002f},
                                  tolerance_for(DType::F32));
  EXPECT_TRUE(r.ok) << r.summary();
  EXPECT_NEAR(r.max_rel_err, 1e-4, 1e-6);
}

TEST(CompareTokens, EqualSequencesAreOk) {
  const std::vector<int> ids = {1, 403, 407, 261};
  EXPECT_TRUE(compare_tokens(ids, ids).ok);
}

TEST(CompareTokens, ReportsTheFirstDivergence) {
  const std::vector<int> ref = {1, 2, 3, 4, 5, 6};
  const std::vector<int> got = {1, 2, 3, 9, 5, 9};
  const CompareResult r = compare_tokens(got, ref);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.worst_index, 3u);
  EXPECT_EQ(r.over_tolerance, 2u);
}

TEST(CompareTokens, ADifferentLengthIsNotOk) {
  const std::vector<int> ref = {1, 2, 3};
  const std::vector<int> got = {1, 2};
  const CompareResult r = compare_tokens(got, ref);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.size_mismatch);
}

TEST(NearTie, AGapWithinTwiceTheToleranceCanBeSwapped) {
  // |logit| 3: each may move 1e-2 + 1e-2 x 3 = 0.04, so gaps up to 0.08 swap.
  const Tolerance tol{1e-2, 1e-2};
  const std::vector<float> row = {3.0f, 2.95f, 2.9f, -1.0f};
  const NearTie close = near_tie(row, 0, 1, tol);
  EXPECT_TRUE(close.swappable);
  EXPECT_NEAR(close.gap, 0.05, 1e-6);
  EXPECT_NEAR(close.limit, 0.08, 1e-6);
  EXPECT_FALSE(near_tie(row, 0, 2, tol).swappable) << "0.1 apart: more than two rows within tol can swap";
  EXPECT_FALSE(near_tie(row, 0, 3, tol).swappable);
}

TEST(NearTie, ATokenOutsideTheRowOrANaNLogitIsNeverANearTie) {
  const Tolerance tol{1e-2, 1e-2};
  const std::vector<float> row = {1.0f, 1.0f, std::nanf("")};
  EXPECT_TRUE(near_tie(row, 0, 1, tol).swappable);
  EXPECT_FALSE(near_tie(row, 0, 3, tol).swappable);
  EXPECT_FALSE(near_tie(row, -1, 0, tol).swappable);
  EXPECT_FALSE(near_tie(row, 0, 2, tol).swappable);
  EXPECT_FALSE(near_tie(row, 2, 0, tol).swappable);
}

// --- timer ------------------------------------------------------------------------

TEST(TimingStats, OddCountTakesTheMiddleSample) {
  const TimingStats s = TimingStats::from_samples({5.0, 1.0, 9.0, 3.0, 4.0});
  EXPECT_EQ(s.median_ms, 4.0);
  EXPECT_EQ(s.min_ms, 1.0);
  EXPECT_EQ(s.max_ms, 9.0);
  EXPECT_EQ(s.runs, 5);
}

TEST(TimingStats, EvenCountAveragesTheTwoMiddleSamples) {
  const TimingStats s = TimingStats::from_samples({4.0, 1.0, 3.0, 2.0});
  EXPECT_EQ(s.median_ms, 2.5);
  EXPECT_EQ(s.min_ms, 1.0);
  EXPECT_EQ(s.max_ms, 4.0);
  EXPECT_EQ(s.runs, 4);
}

TEST(TimingStats, SingleSampleIsEveryStatistic) {
  const TimingStats one = TimingStats::from_samples({7.5});
  EXPECT_EQ(one.median_ms, 7.5);
  EXPECT_EQ(one.min_ms, 7.5);
  EXPECT_EQ(one.max_ms, 7.5);
  EXPECT_EQ(one.p50_ms, 7.5);
  EXPECT_EQ(one.p90_ms, 7.5);
  EXPECT_EQ(one.p99_ms, 7.5);
  EXPECT_EQ(one.runs, 1);
}

TEST(TimingStats, NoSamplesAreRejected) {
  EXPECT_THROW(TimingStats::from_samples({}), InputError);
}

// Percentiles interpolate linearly between the closest ranks (numpy's
// default): rank h = (n - 1) p / 100 into the sorted samples.
TEST(TimingStats, PercentilesOfOneToFive) {
  const TimingStats s = TimingStats::from_samples({5.0, 3.0, 1.0, 4.0, 2.0});
  EXPECT_DOUBLE_EQ(s.p50_ms, 3.0);   // h = 2: the middle sample
  EXPECT_DOUBLE_EQ(s.p90_ms, 4.6);   // h = 3.6: 4 + 0.6 (5 - 4)
  EXPECT_DOUBLE_EQ(s.p99_ms, 4.96);  // h = 3.96: 4 + 0.96 (5 - 4)
  EXPECT_EQ(s.p50_ms, s.median_ms);
}

TEST(TimingStats, PercentilesOfAnEvenCount) {
  const TimingStats s = TimingStats::from_samples({4.0, 1.0, 3.0, 2.0});
  EXPECT_DOUBLE_EQ(s.p50_ms, 2.5);   // h = 1.5: between 2 and 3, the median
  EXPECT_DOUBLE_EQ(s.p90_ms, 3.7);   // h = 2.7: 3 + 0.7 (4 - 3)
  EXPECT_DOUBLE_EQ(s.p99_ms, 3.97);  // h = 2.97
  EXPECT_DOUBLE_EQ(s.p50_ms, s.median_ms);
}

TEST(TimingStats, P99OfAHundredRunsWithOneSlowRun) {
  // 99 runs of 1 ms and one of 100 ms: h = 99 * 0.99 = 98.01, so p99 is
  // 1 + 0.01 (100 - 1) = 1.99 ms; the slow run shows in max, and in p90 not at all.
  std::vector<double> samples(99, 1.0);
  samples.push_back(100.0);
  const TimingStats s = TimingStats::from_samples(samples);
  EXPECT_DOUBLE_EQ(s.p50_ms, 1.0);
  EXPECT_DOUBLE_EQ(s.p90_ms, 1.0);
  EXPECT_NEAR(s.p99_ms, 1.99, 1e-12);
  EXPECT_EQ(s.max_ms, 100.0);
}

TEST(TimeCpu, RunsWarmupPlusTimedRuns) {
  int calls = 0;
  const TimingStats s = time_cpu([&] { ++calls; }, 2, 5);
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(s.runs, 5);
  EXPECT_GE(s.min_ms, 0.0);
  EXPECT_LE(s.min_ms, s.median_ms);
  EXPECT_LE(s.median_ms, s.max_ms);
  EXPECT_LE(s.p50_ms, s.p90_ms);
  EXPECT_LE(s.p90_ms, s.p99_ms);
  EXPECT_LE(s.p99_ms, s.max_ms);
}

// --- JSON ----------------------------------------------------------------------------

TEST(JsonWriter, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(json_escape("plain"), "\"plain\"");
  EXPECT_EQ(json_escape("say \"hi\""), R"("say \"hi\"")");
  EXPECT_EQ(json_escape("a\\b"), R"("a\\b")");
  EXPECT_EQ(json_escape("line1\nline2\r\tend"), R"("line1\nline2\r\tend")");
  EXPECT_EQ(json_escape(std::string("\x01\x1f", 2)), R"("\u0001\u001f")");
  EXPECT_EQ(json_escape("caf\xC3\xA9"), "\"caf\xC3\xA9\"");  // UTF-8 passes through
}

TEST(JsonWriter, NonFiniteNumbersBecomeNull) {
  EXPECT_EQ(json_number(std::numeric_limits<double>::quiet_NaN()), "null");
  EXPECT_EQ(json_number(std::numeric_limits<double>::infinity()), "null");
  EXPECT_EQ(json_number(-std::numeric_limits<double>::infinity()), "null");
}

TEST(JsonWriter, NumbersRoundTrip) {
  EXPECT_EQ(json_number(1.5), "1.5");
  EXPECT_EQ(json_number(-3.0), "-3");
  for (const double v : {0.1, 1.0 / 3.0, 12345.678901234, 1e-12, 6.02e23})
    EXPECT_EQ(std::stod(json_number(v)), v) << json_number(v);
}

// True when every string literal of `json` is free of raw control characters
// and the brackets balance: a cheap stand-in for a parser.
::testing::AssertionResult well_formed(const std::string& json) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char ch = json[i];
    if (in_string) {
      if (ch == '\\') ++i;
      else if (ch == '"') in_string = false;
      else if (static_cast<unsigned char>(ch) < 0x20)
        return ::testing::AssertionFailure() << "raw control character inside a string at offset " << i;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      ++depth;
    } else if (ch == '}' || ch == ']') {
      if (--depth < 0) return ::testing::AssertionFailure() << "unbalanced bracket at offset " << i;
    }
  }
  if (in_string || depth != 0) return ::testing::AssertionFailure() << "unterminated string or bracket";
  return ::testing::AssertionSuccess();
}

Results sample_results() {
  Results results("step01_kv_cache", "KV cache: \"decode\" without recomputing");
  results.set_config("model", "tiny");  // a string literal must stay a string, not become a bool
  results.set_config("tokens", 128LL);
  results.set_config("quick", true);
  results.set_config("temperature", 0.5);
  DeviceInfo info;
  info.cpu_model = "Test CPU \"9000\"";
  info.cuda_note = "built without CUDA";
  results.set_device_info(info);
  ResultRow baseline;
  baseline.device = "cpu";
  baseline.variant = "no cache";
  baseline.id = 0;
  baseline.time_ms = 12.5;
  baseline.speedup = 1.0;
  baseline.max_rel_err = 0.0;
  baseline.ok = true;
  baseline.throughput_key = "tokens_per_s";
  baseline.throughput = 80.0;
  results.add_row(baseline);
  ResultRow odd;
  odd.device = "cpu";
  odd.variant = "kv \"cache\"\nv2";
  odd.id = 1;
  odd.time_ms = 2.5;
  odd.speedup = 5.0;
  odd.max_rel_err = std::numeric_limits<double>::quiet_NaN();
  odd.ok = false;
  odd.extra["generated_tokens"] = 64LL;
  odd.extra["note"] = std::string("line\nbreak");
  results.add_row(odd);
  return results;
}

TEST(Results, JsonHasTheRequiredKeys) {
  const std::string json = sample_results().to_json();
  EXPECT_TRUE(well_formed(json)) << json;
  for (const char* key : {"\"step\": \"step01_kv_cache\"", "\"config\": {", "\"device_info\": {", "\"rows\": [",
                          "\"model\": \"tiny\"", "\"tokens\": 128", "\"quick\": true", "\"temperature\": 0.5",
                          "\"cuda_available\": false"})
    EXPECT_TRUE(HasSubstr(json, key));
  EXPECT_TRUE(HasSubstr(json, "{\"device\": \"cpu\", \"variant\": \"no cache\", \"id\": 0, \"time_ms\": 12.5, "
                              "\"speedup\": 1, \"max_rel_err\": 0, \"ok\": true, \"tokens_per_s\": 80}"));
  EXPECT_TRUE(HasSubstr(json, "\"id\": 1, \"time_ms\": 2.5, \"speedup\": 5"));
  EXPECT_TRUE(HasSubstr(json, "\"generated_tokens\": 64"));
}

TEST(Results, JsonEscapesQuotesAndNewlinesAndWritesNaNAsNull) {
  const std::string json = sample_results().to_json();
  EXPECT_TRUE(HasSubstr(json, R"("variant": "kv \"cache\"\nv2")"));
  EXPECT_TRUE(HasSubstr(json, R"("note": "line\nbreak")"));
  EXPECT_TRUE(HasSubstr(json, R"("cpu_model": "Test CPU \"9000\"")"));
  EXPECT_TRUE(HasSubstr(json, R"("title": "KV cache: \"decode\" without recomputing")"));
  EXPECT_TRUE(HasSubstr(json, "\"max_rel_err\": null"));
  EXPECT_FALSE(HasSubstr(json, "nan"));
  EXPECT_TRUE(well_formed(json));
}

TEST(Results, WriteJsonWritesToJsonAndReportsIoFailure) {
  const Results results = sample_results();
  const std::string path = testing::temp_path("results.json");
  results.write_json(path);
  std::ifstream in(path);
  const std::string written{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(written, results.to_json());
  EXPECT_THROW(results.write_json(testing::temp_path("no_such_dir") + "/sub/results.json"), InputError);
}

TEST(Results, AllOkNeedsRowsThatAreAllOk) {
  Results results("s", "t");
  EXPECT_FALSE(results.all_ok());  // nothing measured is not a pass
  ResultRow good;
  good.ok = true;
  results.add_row(good);
  EXPECT_TRUE(results.all_ok());
  results.add_row(ResultRow{});
  EXPECT_FALSE(results.all_ok());
}

TEST(Results, TableShowsEveryRowAndMarksFailures) {
  const std::string table = sample_results().format_table();
  EXPECT_TRUE(HasSubstr(table, "step01_kv_cache"));
  EXPECT_TRUE(HasSubstr(table, "no cache"));
  EXPECT_TRUE(HasSubstr(table, "12.50 ms"));
  EXPECT_TRUE(HasSubstr(table, "80.0 tok/s"));
  EXPECT_TRUE(HasSubstr(table, "5.00x"));
  EXPECT_TRUE(HasSubstr(table, "FAIL"));
}

// The line of `table` that holds `text` (empty when none does).
std::string line_with(const std::string& table, const std::string& text) {
  const std::size_t at = table.find(text);
  if (at == std::string::npos) return {};
  const std::size_t begin = table.rfind('\n', at) + 1;  // npos + 1 = 0: the first line
  return table.substr(begin, table.find('\n', at) - begin);
}

TEST(Results, NotesArePrintedUnderTheRowsAndWrittenToTheJson) {
  Results results = sample_results();
  results.add_note("speedup = time of variant 0 (no cache) / this row's time, same device");
  results.add_note("second \"note\"");
  const std::string table = results.format_table();
  const std::size_t last_row = table.find("kv \"cache\"");
  const std::size_t note = table.find("speedup = time of variant 0 (no cache) / this row's time, same device\n");
  ASSERT_NE(note, std::string::npos) << table;
  EXPECT_GT(note, last_row);                        // a caption under the rows, not in the header
  EXPECT_LT(note, table.find("second \"note\"\n"));  // in the order they were added
  const std::string json = results.to_json();
  EXPECT_TRUE(HasSubstr(json, "\"notes\": [\n    \"speedup = time of variant 0 (no cache) / this row's time, same "
                              "device\",\n    \"second \\\"note\\\"\"\n  ]"))
      << json;
  EXPECT_TRUE(well_formed(json));
  EXPECT_FALSE(HasSubstr(sample_results().to_json(), "\"notes\""));  // no notes, no key
}

// An approximation by design is neither a failure nor a plain "ok"; its own
// (weaker) check failing is still a FAIL.
TEST(Results, AnExpectedInexactRowIsMarkedApproxAndIsNotAFailure) {
  Results results("s", "t");
  ResultRow exact;
  exact.variant = "exact";
  exact.ok = true;
  results.add_row(exact);
  ResultRow pooled;
  pooled.variant = "pooled";
  pooled.max_rel_err = 0.81;
  pooled.ok = true;
  pooled.expected_inexact = true;
  results.add_row(pooled);
  EXPECT_TRUE(results.all_ok());
  std::string table = results.format_table();
  EXPECT_TRUE(line_with(table, "pooled").ends_with("  approx")) << table;
  EXPECT_TRUE(line_with(table, "exact").ends_with("  ok")) << table;
  EXPECT_TRUE(HasSubstr(table, "approx = an approximation by design"));  // the legend
  EXPECT_TRUE(HasSubstr(results.to_json(), "\"ok\": true, \"expected_inexact\": true"));
  EXPECT_FALSE(HasSubstr(sample_results().format_table(), "approx"));  // no such row, no legend

  ResultRow broken = pooled;
  broken.variant = "broken";
  broken.ok = false;  // e.g. non-finite logits
  results.add_row(broken);
  EXPECT_FALSE(results.all_ok());
  table = results.format_table();
  EXPECT_TRUE(line_with(table, "broken").ends_with("  FAIL")) << table;
}

// --- --variant -------------------------------------------------------------------

TEST(ParseVariantSelection, AllSelectsEveryId) {
  EXPECT_EQ(parse_variant_selection("all", {0, 1, 2, 90}), (std::vector<int>{0, 1, 2, 90}));
}

TEST(ParseVariantSelection, CommaSeparatedIdsInTheGivenOrder) {
  EXPECT_EQ(parse_variant_selection("0,1", {0, 1, 2}), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_variant_selection("90,0", {0, 1, 90}), (std::vector<int>{90, 0}));
  EXPECT_EQ(parse_variant_selection("2", {0, 1, 2}), (std::vector<int>{2}));
}

TEST(ParseVariantSelection, RejectsAnUnknownId) {
  try {
    parse_variant_selection("0,7", {0, 1, 2});
    FAIL() << "no InputError for id 7";
  } catch (const InputError& e) {
    EXPECT_TRUE(HasSubstr(e.what(), "7"));
    EXPECT_TRUE(HasSubstr(e.what(), "no such variant"));
  }
}

TEST(ParseVariantSelection, RejectsGarbage) {
  for (const char* text : {"abc", "1x", "0,,1", "-", "1.5", "al", "0;1"}) {
    SCOPED_TRACE(text);
    EXPECT_THROW(parse_variant_selection(text, {0, 1, 2}), InputError);
  }
}

TEST(VariantTable, VariantIdsListsTheTableInOrder) {
  using Fn = int (*)(int);
  const std::vector<Variant<Fn>> table = {
      {0, "baseline", "the reference", Backend::Cpu, [](int x) { return x; }},
      {1, "faster", "one change", Backend::Cpu, [](int x) { return x + 1; }},
      {90, "library", "a vendor library", Backend::Cuda, [](int x) { return x + 2; }},
  };
  EXPECT_EQ(variant_ids(table), (std::vector<int>{0, 1, 90}));
  EXPECT_STREQ(backend_name(table[2].backend), "cuda");
  EXPECT_STREQ(backend_name(table[0].backend), "cpu");
}

// --- device info -----------------------------------------------------------------

// Both forms of /proc/driver/nvidia/version's first line: the proprietary
// module's, and the open module's (seen on an H100), where the word after
// "Kernel Module" is "for", not the release.
TEST(DeviceInfo, NvidiaDriverReleaseIsReadFromBothModuleForms) {
  EXPECT_EQ(nvidia_driver_release("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct 16 2025"),
            "580.159.04");
  EXPECT_EQ(nvidia_driver_release(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16)"),
            "580.159.04");
  EXPECT_EQ(nvidia_driver_release("NVRM version: no module named here"), "");
  EXPECT_EQ(nvidia_driver_release("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64"), "");
}

}  // namespace
TEST(ResultsJson, ExtraTablesKeepTheDocumentWellFormed) {
  llm::Results results("step03_gqa", "test");
  llm::ResultRow row;
  row.device = "cpu";
  row.variant = "x";
  row.ok = true;
  results.add_row(row);
  results.add_table({"tables_a", {{{"k", 1LL}, {"name", std::string("v\"q")}}}});
  results.add_table({"empty", {}});
  const std::string json = results.to_json();
  EXPECT_NE(json.find("\"tables_a\": [\n    {\"k\": 1, \"name\": \"v\\\"q\"}\n  ]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"empty\": [\n  ]"), std::string::npos);
  EXPECT_EQ(std::count(json.begin(), json.end(), '{'), std::count(json.begin(), json.end(), '}'));
  EXPECT_EQ(json.substr(json.size() - 2), "}\n");
}

TEST(TimeCpu, RunsBeforeEachUntimedBeforeEveryCall) {
  int calls = 0, setups = 0;
  const TimingStats stats = time_cpu([&] { ++calls; }, /*warmup=*/2, /*runs=*/5, [&] {
    EXPECT_EQ(setups, calls);  // the setup precedes each call, never two in a row
    ++setups;
  });
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(setups, 7);
  EXPECT_EQ(stats.runs, 5);
}

}  // namespace llm
