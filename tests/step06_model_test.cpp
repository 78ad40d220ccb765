// Step 06, the whole model: quantized Linear layers behind the hook of the
// unchanged CPU model, the calibration data GPTQ/AWQ see, the int8 KV cache,
// and the step's tables on a tiny model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "llm/checkpoint.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/quality.hpp"
#include "llm/sampler.hpp"
#include "llm/token_batch.hpp"
#include "step05_paged_attention/measure/paged_generation.hpp"
#include "step05_paged_attention/paged_kv_cache.hpp"
#include "step06_quantization/measure/kernel_table.hpp"
#include "step06_quantization/measure/model_table.hpp"
#include "step06_quantization/measure/report.hpp"
#include "step06_quantization/measure/weight_formats.hpp"
#include "step06_quantization/quantized_layers.hpp"
#include "step06_dequantized_model.hpp"
#include "test_support.hpp"

namespace {

using step06::ModelQuantization;
using step06::QuantAlgorithm;
using step06::QuantFormat;

llm::ModelWeights tiny_weights(std::uint64_t seed = 7) {
  return llm::random_weights(llm::find_preset("tiny").config, seed);
}

std::optional<llm::ModelWeights> stories260k() {
  const auto path = llm::testing::model_file("stories260K.bin");
  if (!path) return std::nullopt;
  return llm::load_checkpoint(*path);
}

ModelQuantization quantization(const std::string& format, QuantAlgorithm algorithm = QuantAlgorithm::Rtn) {
  ModelQuantization q;
  q.format = QuantFormat::parse(format);
  q.algorithm = algorithm;
  return q;
}

// Logits at every position of `tokens` ([n, vocab]) through `cache`.
std::vector<float> all_logits(llm::Model& model, llm::KvCache& cache, const std::vector<int>& tokens) {
  const auto logits = model.forward(llm::TokenBatch::prefill(tokens, 0, 0), cache, llm::LogitsFor::AllRows);
  return {logits.begin(), logits.end()};
}
std::vector<float> all_logits(llm::Model& model, const std::vector<int>& tokens) {
  auto cache = model.make_cache(1, static_cast<int>(tokens.size()));
  return all_logits(model, *cache, tokens);
}

// The quantized model is exactly the fp32 model whose matrices are the
// dequantized ones: the hook changes how weights are stored and read, not
// the math. Checked for every format and both classifier choices.
TEST(Step06Model, QuantizedModelIsTheModelOfTheDequantizedWeights) {
  const llm::ModelWeights weights = tiny_weights();
  const std::vector<int> tokens = llm::testing::random_tokens(37, weights.config.vocab_size, 11);
  for (const std::string format : {"int8", "int4-g32", "int4-g64", "int4sym-g64", "nf4"}) {
    for (const bool classifier : {true, false}) {
      ModelQuantization q = quantization(format);
      q.quantize_classifier = classifier;
      const step06::QuantizedLayers layers = step06::quantize_layers(weights, q, nullptr);
      EXPECT_EQ(layers.matrices.size(), static_cast<std::size_t>(7 * weights.config.n_layers + (classifier ? 1 : 0)));
      auto quantized = step06::make_quantized_model_on("cpu", weights, layers);
      // The reference: DenseLinear over dequantize() of each site's matrix.
      const auto reference = step06::testing::cpu_model_with_dequantized(weights, layers);
      llm::testing::expect_logit_rows_close(all_logits(*quantized, tokens), all_logits(*reference, tokens),
                                            weights.config.vocab_size, format);
    }
  }
}

TEST(Step06Model, QuantizedLayersReadFewerBytes) {
  const llm::ModelWeights weights = tiny_weights();
  std::size_t fp32_bytes = 0;
  const step06::QuantizedLayers int8 = step06::quantize_layers(weights, quantization("int8"), nullptr);
  const step06::QuantizedLayers int4 = step06::quantize_layers(weights, quantization("int4-g32"), nullptr);
  for (const auto& [site, matrix] : int8.matrices) fp32_bytes += 4u * matrix.out_features * matrix.in_features;
  EXPECT_LT(int8.bytes(), fp32_bytes / 3);  // ~1 byte a weight plus a scale per row
  EXPECT_LT(int4.bytes(), int8.bytes() * 3 / 4);
}

TEST(Step06Model, CalibrationSamplesTheModelAndRecordsEveryLayer) {
  const llm::ModelWeights weights = tiny_weights();
  llm::CpuModel model(weights);
  const auto sequences = step06::sample_sequences(model, 3, 20, 5);
  ASSERT_EQ(sequences.size(), 3u);
  for (const auto& sequence : sequences) {
    ASSERT_EQ(sequence.size(), 20u);
    EXPECT_EQ(sequence.front(), 1);  // BOS
    for (int token : sequence) EXPECT_TRUE(token >= 0 && token < weights.config.vocab_size);
  }
  EXPECT_NE(sequences[0], sequences[1]);  // seeds differ per sequence
  EXPECT_EQ(step06::sample_sequences(model, 3, 20, 5), sequences);  // and are fixed
  const auto calibration = step06::record_calibration(weights, sequences);
  EXPECT_EQ(calibration->recorder.rows({0, llm::LinearRole::Query}), 60);
  EXPECT_EQ(calibration->recorder.rows({weights.config.n_layers - 1, llm::LinearRole::Down}), 60);
  EXPECT_EQ(calibration->recorder.rows({-1, llm::LinearRole::Classifier}), 60);  // every position got logits

  EXPECT_THROW(step06::sample_sequences(model, 0, 20, 5), llm::InputError);
  EXPECT_THROW(step06::sample_sequences(model, 1, weights.config.seq_len + 1, 5), llm::InputError);
}

TEST(Step06Model, GptqAndAwqNeedCalibrationData) {
  const llm::ModelWeights weights = tiny_weights();
  EXPECT_THROW(step06::quantize_layers(weights, quantization("int4-g32", QuantAlgorithm::Gptq), nullptr),
               llm::InputError);
  EXPECT_THROW(step06::quantize_layers(weights, quantization("int4-g32", QuantAlgorithm::Awq), nullptr),
               llm::InputError);
}

TEST(Step06Model, LayerTooSmallForTheGroupIsAClearError) {
  const llm::ModelWeights weights = tiny_weights();  // dim 64
  try {
    step06::quantize_layers(weights, quantization("int4-g128"), nullptr);
    FAIL() << "a 128-column group on 64-column layers must not quantize";
  } catch (const llm::InputError& error) {
    EXPECT_TRUE(llm::testing::HasSubstr(error.what(), "too small"));
  }
}

TEST(Step06Model, GptqAndAwqModelsGenerate) {
  const llm::ModelWeights weights = tiny_weights();
  llm::CpuModel fp32(weights);
  const auto calibration = step06::record_calibration(weights, step06::sample_sequences(fp32, 4, 32, 100));
  for (const QuantAlgorithm algorithm : {QuantAlgorithm::Gptq, QuantAlgorithm::Awq}) {
    const step06::QuantizedLayers layers =
        step06::quantize_layers(weights, quantization("int4-g32", algorithm), calibration.get());
    auto model = step06::make_quantized_model_on("cpu", weights, layers);
    auto cache = model->make_cache(1, 48);
    const step05::GreedyRun run = step05::greedy_in_slot(*model, *cache, 0, std::vector<int>{1}, 0, 48);
    EXPECT_FALSE(run.tokens.empty());
    for (int token : run.tokens) EXPECT_TRUE(token >= 0 && token < weights.config.vocab_size);
  }
}

// quantize_layers quantizes its pieces (a site, or an AWQ group) on every
// core and files each result under its site: every site holds what the
// algorithm gives that site (or its group) on its own, bit for bit.
TEST(Step06Model, EachSiteHoldsItsOwnQuantization) {
  const llm::ModelWeights weights = tiny_weights();
  llm::CpuModel fp32(weights);
  const auto calibration = step06::record_calibration(weights, step06::sample_sequences(fp32, 2, 16, 100));
  const auto same = [](const step06::QuantizedMatrix& a, const step06::QuantizedMatrix& b) {
    return a.out_features == b.out_features && a.in_features == b.in_features && a.packed == b.packed &&
           a.scales == b.scales && a.zeros == b.zeros && a.input_scales == b.input_scales;
  };
  for (const QuantAlgorithm algorithm : {QuantAlgorithm::Rtn, QuantAlgorithm::Gptq, QuantAlgorithm::Awq}) {
    const ModelQuantization q = quantization("int4-g32", algorithm);
    const step06::QuantizedLayers layers = step06::quantize_layers(weights, q, calibration.get());
    const std::vector<llm::LinearSite> sites = step06::linear_sites(weights.config);
    ASSERT_EQ(layers.matrices.size(), sites.size()) << step06::describe(q);
    for (const llm::LinearSite& site : sites) {
      SCOPED_TRACE(fmt::format("{}, {}", step06::describe(q), site.name()));
      const step06::LayerWeights layer = step06::layer_weights(weights, site);
      const step06::CalibrationInputs inputs{calibration->recorder.inputs(site), calibration->recorder.rows(site),
                                             layer.in_features};
      step06::QuantizedMatrix alone;
      if (algorithm == QuantAlgorithm::Rtn || site.role == llm::LinearRole::Classifier) {
        alone = step06::quantize_rtn(layer, q.format);
      } else if (algorithm == QuantAlgorithm::Gptq) {
        alone = step06::quantize_gptq(layer, q.format, inputs, q.gptq);
      } else {
        // The site's group, searched from its first site (Query for K and V, Gate for Up).
        llm::LinearSite first = site;
        if (site.role == llm::LinearRole::Key || site.role == llm::LinearRole::Value)
          first.role = llm::LinearRole::Query;
        if (site.role == llm::LinearRole::Up) first.role = llm::LinearRole::Gate;
        const std::vector<llm::LinearSite> group = step06::sites_reading_the_input_of(first);
        std::vector<step06::LayerWeights> group_layers;  // [group]
        for (const llm::LinearSite& member : group) group_layers.push_back(step06::layer_weights(weights, member));
        const step06::CalibrationInputs group_inputs{calibration->recorder.inputs(first),
                                                     calibration->recorder.rows(first), layer.in_features};
        const auto member = std::find(group.begin(), group.end(), site);
        ASSERT_NE(member, group.end());
        alone = std::move(step06::quantize_awq_group(group_layers, q.format, group_inputs, q.awq)
                              .matrices[static_cast<std::size_t>(member - group.begin())]);
      }
      EXPECT_TRUE(same(layers.matrices.at(site), alone));
    }
  }
}

// The CUDA model multiplies Q, K and V as one stacked matrix, and gate and
// up as another; a stack divides its input by one vector of AWQ scales. So
// AWQ must give each group one set of scales: stack_rows refuses matrices
// whose scales differ (the error a GPU run once met, with one alpha per matrix).
TEST(Step06Model, AwqGivesTheMatricesOfOneInputOneSetOfScales) {
  const llm::ModelWeights weights = tiny_weights();
  llm::CpuModel fp32(weights);
  const auto calibration = step06::record_calibration(weights, step06::sample_sequences(fp32, 4, 32, 100));
  for (const std::string format : {"int8", "int4-g32"}) {
    SCOPED_TRACE(format);
    const step06::QuantizedLayers layers =
        step06::quantize_layers(weights, quantization(format, QuantAlgorithm::Awq), calibration.get());
    int scaled_groups = 0;     // groups AWQ scaled (alpha > 0)
    int disagreeing_groups = 0;  // groups whose matrices, each searched alone, want different alphas
    for (int layer = 0; layer < weights.config.n_layers; ++layer)
      for (const llm::LinearRole first : {llm::LinearRole::Query, llm::LinearRole::Gate}) {
        const llm::LinearSite first_site{layer, first};
        SCOPED_TRACE(first_site.name());
        std::vector<const step06::QuantizedMatrix*> group;  // [sites that read the input]
        std::vector<double> alone_alphas;                   // [sites]: quantize_awq on each alone
        for (const llm::LinearSite& site : step06::sites_reading_the_input_of(first_site)) {
          group.push_back(&layers.matrices.at(site));
          const step06::CalibrationInputs inputs{calibration->recorder.inputs(site), calibration->recorder.rows(site),
                                                 weights.config.dim};
          alone_alphas.push_back(
              step06::quantize_awq(step06::layer_weights(weights, site), QuantFormat::parse(format), inputs).alpha);
        }
        ASSERT_GT(group.size(), 1u);
        for (const step06::QuantizedMatrix* matrix : group)
          EXPECT_EQ(matrix->input_scales, group.front()->input_scales);
        const step06::QuantizedMatrix stacked = step06::stack_rows(group);
        EXPECT_EQ(stacked.input_scales, group.front()->input_scales);
        if (!group.front()->input_scales.empty()) ++scaled_groups;
        if (std::count(alone_alphas.begin(), alone_alphas.end(), alone_alphas.front()) !=
            static_cast<std::ptrdiff_t>(alone_alphas.size()))
          ++disagreeing_groups;
      }
    EXPECT_GT(scaled_groups, 0) << "AWQ scaled no group: the test shows nothing";
    // Where the matrices of a group would each pick their own alpha, only the
    // group's search gives them one set of scales: such a group must exist.
    EXPECT_GT(disagreeing_groups, 0) << "searched alone, every group's matrices agree: the test shows nothing";
  }
}

// Greedy decoding of stories260K from BOS: int8 per channel (RTN) gives
// fp32's tokens for at least the first kInt8MatchingPrefix tokens (measured:
// the first difference is at token 61 of 128).
constexpr int kGreedyPositions = 128;
constexpr int kInt8MatchingPrefix = 48;

TEST(Step06Model, Int8GreedyTextMatchesFp32OnStories260K) {
  const auto weights = stories260k();
  if (!weights) GTEST_SKIP() << "stories260K.bin not found (set LLM_MODELS_DIR)";
  llm::CpuModel fp32(*weights);
  const step06::QuantizedLayers layers = step06::quantize_layers(*weights, quantization("int8"), nullptr);
  auto int8 = step06::make_quantized_model_on("cpu", *weights, layers);
  auto fp32_cache = fp32.make_cache(1, kGreedyPositions);
  auto int8_cache = int8->make_cache(1, kGreedyPositions);
  const std::vector<int> bos = {1};
  const auto expected = step05::greedy_in_slot(fp32, *fp32_cache, 0, bos, 0, kGreedyPositions).tokens;
  const auto got = step05::greedy_in_slot(*int8, *int8_cache, 0, bos, 0, kGreedyPositions).tokens;
  ASSERT_GE(expected.size(), static_cast<std::size_t>(kInt8MatchingPrefix));
  ASSERT_GE(got.size(), static_cast<std::size_t>(kInt8MatchingPrefix));
  for (int i = 0; i < kInt8MatchingPrefix; ++i) ASSERT_EQ(got[i], expected[i]) << "first difference at token " << i;
}

// The int8 KV cache stores each (position, KV head) as int8 with one scale:
// every value within half a step, so the next-token distributions move
// little. Checked on stories260K over its own text (measured: mean KL 2.2e-3
// nats): mean KL below 5e-3, top-1 agreement at least 97%.
TEST(Step06Model, Int8KvCacheStaysCloseToTheFp32CacheOnStories260K) {
  const auto weights = stories260k();
  if (!weights) GTEST_SKIP() << "stories260K.bin not found (set LLM_MODELS_DIR)";
  llm::CpuModel model(*weights);
  const std::vector<int> text = step06::sample_sequences(model, 1, 200, 3).front();
  const std::vector<float> fp32_logits = all_logits(model, text);
  step05::PagedKvCacheOptions options;
  options.block_size = 16;
  options.n_blocks = step05::blocks_for_sequences(1, 200, 16);
  options.element = llm::KvElement::Int8;
  auto int8_cache = step05::make_paged_kv_cache("cpu", weights->config, options);
  const std::vector<float> int8_logits = all_logits(model, *int8_cache, text);
  for (const float logit : int8_logits) ASSERT_TRUE(std::isfinite(logit));
  const llm::NextTokenAgreement agreement =
      llm::compare_next_token_distributions(fp32_logits, int8_logits, weights->config.vocab_size);
  EXPECT_LT(agreement.mean_kl, 5e-3);
  EXPECT_GE(agreement.top1_agreement, 0.97);
  // A quarter of the fp32 bytes plus one fp32 scale per head: with
  // stories260K's head_dim of 8, (8 + 4) / 32 = 0.375 of fp32's bytes (and the
  // paged cache rounds 200 positions up to 13 blocks of 16).
  const double fp32_bytes = static_cast<double>(model.make_cache(1, 208)->bytes_allocated());
  EXPECT_DOUBLE_EQ(static_cast<double>(int8_cache->bytes_allocated()), 0.375 * fp32_bytes);
}

// The step's model table on the tiny preset: every row runs, the fp32 row
// has speedup 1 and matches itself, the quality columns are finite, and the
// int8 KV rows are there. The CPU has no fp16 row, so no row has a speedup
// against one.
TEST(Step06Model, ModelTableRunsEveryVariant) {
  step06::ModelTableOptions options;
  options.formats = {QuantFormat::parse("int8"), QuantFormat::parse("int4-g32"), QuantFormat::parse("int4-g128")};
  options.prompt = {1};
  options.decode_positions = 12;
  options.repeats = 1;
  options.calibration_sequences = 2;
  options.calibration_length = 16;
  options.heldout_sequences = 2;
  options.heldout_length = 16;
  const auto rows = step06::run_model_table("preset tiny", tiny_weights(), options);
  // fp32, 3 formats x 3 algorithms, fp32 + int8 kv, int8 + int8 kv.
  ASSERT_EQ(rows.size(), 1u + 9u + 2u);
  EXPECT_EQ(rows.front().variant.name(), "fp32");
  EXPECT_DOUBLE_EQ(rows.front().speedup, 1.0);
  EXPECT_EQ(rows.front().greedy_matching_prefix, rows.front().greedy_tokens_compared);
  int skipped = 0;
  for (const auto& row : rows) {
    EXPECT_TRUE(row.ok) << row.variant.name();
    EXPECT_EQ(row.variant.dense_dtype, llm::cuda::WeightDtype::Float32) << row.variant.name();
    EXPECT_EQ(row.speedup_vs_fp16, 0.0) << row.variant.name();
    if (!row.skipped.empty()) {
      ++skipped;  // int4-g128: 64-column layers are smaller than one group
      EXPECT_TRUE(llm::testing::HasSubstr(row.skipped, "too small"));
      continue;
    }
    ASSERT_TRUE(row.agreement.has_value()) << row.variant.name();
    EXPECT_TRUE(std::isfinite(row.agreement->mean_kl) && std::isfinite(row.perplexity)) << row.variant.name();
    EXPECT_GT(row.tokens_per_s, 0.0);
  }
  EXPECT_EQ(skipped, 3);
  EXPECT_EQ(rows[rows.size() - 2].variant.name(), "fp32 + int8 kv");
  EXPECT_EQ(rows.back().variant.name(), "int8 rtn + int8 kv");
  EXPECT_DOUBLE_EQ(rows.back().kv_bytes_per_position, 0.375 * rows.front().kv_bytes_per_position);  // head_dim 8
}

// The fp16 row (CUDA only) is named by its weights' dtype and has its own id
// in the variant table; it is the fp16 baseline, not the fp32 one.
TEST(Step06Model, Fp16VariantIsNamedByItsDtype) {
  const step06::ModelVariant fp16{.dense_dtype = llm::cuda::WeightDtype::Float16};
  EXPECT_EQ(fp16.name(), "fp16");
  EXPECT_EQ(fp16.weights_name(), "fp16");
  EXPECT_EQ(fp16.id(), step06::kFp16ModelVariantId);
  EXPECT_TRUE(fp16.is_baseline(llm::cuda::WeightDtype::Float16));
  EXPECT_FALSE(fp16.is_baseline(llm::cuda::WeightDtype::Float32));
  const step06::ModelVariant fp32;
  EXPECT_EQ(fp32.name(), "fp32");
  EXPECT_EQ(fp32.id(), step06::kFp32VariantId);
  EXPECT_TRUE(fp32.is_baseline(llm::cuda::WeightDtype::Float32));
  const step06::ModelVariant int8{.weights = QuantFormat::parse("int8")};
  EXPECT_EQ(int8.id(), step06::variant_id_of(QuantFormat::parse("int8")));
  EXPECT_FALSE(int8.is_baseline(llm::cuda::WeightDtype::Float32));
}

// The report of a GPU's rows carries the speedup against fp16 (JSON key and
// printed column); a CPU row has none: no key, a dash in the column.
TEST(Step06Model, ReportCarriesTheSpeedupVsFp16WhereThereIsAnFp16Row) {
  const auto timed_row = [](const std::string& device, const step06::ModelVariant& variant, double ms_per_token,
                            double speedup, double speedup_vs_fp16) {
    step06::ModelRow row;
    row.device = device;
    row.model = "preset tiny";
    row.variant = variant;
    row.decode_ms_per_token = ms_per_token;
    row.tokens_per_s = 1e3 / ms_per_token;
    row.speedup = speedup;
    row.speedup_vs_fp16 = speedup_vs_fp16;
    row.ok = true;
    return row;
  };
  const step06::ModelVariant fp32, fp16{.dense_dtype = llm::cuda::WeightDtype::Float16},
      int8{.weights = QuantFormat::parse("int8")};
  // (device, variant, ms/token, speedup vs fp32, vs fp16): the ratios as run_model_table sets them.
  const std::vector<step06::ModelRow> rows = {
      timed_row("cpu", fp32, 4.0, 1.0, 0.0),
      timed_row("cpu", int8, 1.0, 4.0, 0.0),
      timed_row("cuda", fp32, 2.0, 1.0, 0.5),
      timed_row("cuda", fp16, 1.0, 2.0, 1.0),
      timed_row("cuda", int8, 0.8, 2.5, 1.25),
  };
  llm::Results results("step06_quantization", "test");
  step06::add_model_rows(results, rows, "speed", 0.0, 0.0);
  ASSERT_EQ(results.rows().size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const llm::ResultRow& row = results.rows()[i];
    const auto found = row.extra.find("speedup_vs_fp16");
    if (rows[i].device == "cpu") {
      EXPECT_EQ(found, row.extra.end()) << row.variant;
    } else {
      ASSERT_NE(found, row.extra.end()) << row.variant;
      EXPECT_DOUBLE_EQ(std::get<double>(found->second), rows[i].speedup_vs_fp16) << row.variant;
    }
  }
  const llm::ResultRow& fp16_row = results.rows()[3];
  EXPECT_EQ(fp16_row.id, step06::kFp16ModelVariantId);
  EXPECT_EQ(std::get<std::string>(fp16_row.extra.at("weights")), "fp16");
  EXPECT_TRUE(llm::testing::HasSubstr(results.to_json(), "\"speedup_vs_fp16\""));

  ::testing::internal::CaptureStdout();
  step06::print_speed_table(rows, 0.0, 0.0);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(llm::testing::HasSubstr(printed, "vs fp16"));
  EXPECT_TRUE(llm::testing::HasSubstr(printed, "1.25x"));  // cuda int8 against fp16
  // A CPU row: its speedup vs fp32, then a dash right-aligned in the vs fp16 column.
  std::istringstream lines(printed);
  int cpu_lines = 0;
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("cpu ")) {
      ++cpu_lines;
      EXPECT_TRUE(llm::testing::HasSubstr(line, fmt::format("x {:>8}", "-"))) << line;
    }
  EXPECT_EQ(cpu_lines, 2);
}

// The kernel table on small shapes: every quantized cell agrees with the
// product of its dequantized weights; a group larger than the layer is a
// skipped cell, not an error.
TEST(Step06Model, KernelTableChecksEveryCell) {
  step06::KernelTableOptions options;
  options.formats = {QuantFormat::parse("int8"), QuantFormat::parse("nf4"), QuantFormat::parse("int4-g128")};
  options.batches = {1, 3};
  options.repeats = 1;
  options.flush_caches = false;
  const step06::KernelTable table =
      step06::run_kernel_table({{"test", "odd", 33, 100}, {"test", "narrow", 17, 64}}, options);
  int ran = 0, skipped = 0;
  for (const auto& cell : table.cells) {
    if (!cell.skipped.empty()) {
      ++skipped;
      continue;
    }
    ++ran;
    EXPECT_TRUE(cell.check.ok) << cell.format << " " << cell.shape.matrix << " x" << cell.rows << ": "
                               << cell.check.summary();
    EXPECT_GT(cell.time_ms, 0.0);
  }
  EXPECT_EQ(skipped, 2);           // int4-g128 on 100 and 64 columns
  EXPECT_EQ(ran, 2 * 2 + 2 * 2 * 2);  // fp32 x 2 batches per shape, int8 and nf4 x 2 batches per shape
  EXPECT_GT(table.cpu_read_gbps, 0.0);
}

}  // namespace
