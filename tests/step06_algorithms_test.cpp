// Step 06 (quantization), the algorithms: GPTQ and AWQ against round to
// nearest on the real layers of stories260K, calibrated on the inputs those
// layers saw while the fp32 model sampled a few stories; on synthetic layers,
// what each algorithm must do in the cases it exists for (an outlier input
// channel for AWQ; a diagonal Hessian, where GPTQ has nothing to spread and
// must equal RTN) and where it could break (a singular Hessian, bad inputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/linear.hpp"
#include "llm/token_batch.hpp"
#include "llm/weights.hpp"
#include "step06_quantization/linear_input_recorder.hpp"
#include "step06_quantization/quant_algorithms.hpp"
#include "step06_quantization/quant_format.hpp"
#include "test_support.hpp"

namespace step06 {
namespace {

using llm::LinearRole;
using llm::LinearSite;
using llm::testing::HasSubstr;

// A layer's weights and the calibration rows it saw, owned.
struct RecordedLayer {
  LinearSite site;
  std::vector<float> weight;  // [out_features, in_features]
  int out_features = 0;
  int in_features = 0;
  std::vector<float> rows;           // [n_rows, in_features] the calibration rows
  std::vector<float> held_out_rows;  // [held-out rows, in_features] other stories' rows, never calibrated on

  LayerWeights layer() const { return {weight, out_features, in_features}; }
  CalibrationInputs calibration() const { return as_inputs(rows); }
  CalibrationInputs held_out() const { return as_inputs(held_out_rows); }
  CalibrationInputs as_inputs(const std::vector<float>& values) const {
    return {values, static_cast<int>(values.size() / static_cast<std::size_t>(in_features)), in_features};
  }
};

// The fp32 weights of `site` with their shape.
RecordedLayer weights_of(const llm::ModelWeights& weights, const LinearSite& site) {
  const llm::ModelConfig& config = weights.config;
  const llm::LayerWeights& layer = weights.layers[static_cast<std::size_t>(site.layer)];
  const int q_dim = config.n_heads * config.head_dim();
  switch (site.role) {
    case LinearRole::Query: return {site, layer.wq, q_dim, config.dim};
    case LinearRole::Key: return {site, layer.wk, config.kv_dim(), config.dim};
    case LinearRole::Value: return {site, layer.wv, config.kv_dim(), config.dim};
    case LinearRole::Output: return {site, layer.wo, config.dim, q_dim};
    case LinearRole::Gate: return {site, layer.w1, config.hidden_dim, config.dim};
    case LinearRole::Up: return {site, layer.w3, config.hidden_dim, config.dim};
    case LinearRole::Down: return {site, layer.w2, config.dim, config.hidden_dim};
    case LinearRole::Classifier: break;
  }
  return {site, weights.classifier_matrix(), config.vocab_size, config.dim};
}

// stories260K's layers with the inputs they saw while the fp32 model sampled
// stories of kLength tokens from BOS (temperature 1, seeded): the activations
// of real text, not of random token ids. kStories stories calibrate; the rows
// of kHeldOutStories more check that what GPTQ fits carries over to text it
// has not seen.
class Stories260K : public ::testing::Test {
 protected:
  static constexpr int kStories = 4;
  static constexpr int kHeldOutStories = 2;
  static constexpr int kLength = 64;

  static void SetUpTestSuite() {
    const auto path = llm::testing::model_file("stories260K.bin");
    if (!path) return;
    const llm::ModelWeights weights = llm::load_checkpoint(*path);
    LinearInputRecorder recorder;
    llm::CpuModelOptions options;
    options.linear_factory = recorder.wrap(llm::dense_linear_factory());
    llm::CpuModel model(weights, options);
    std::mt19937 rng(260);
    const auto sample_stories = [&](int stories) {
      for (int story = 0; story < stories; ++story) {
        auto cache = model.make_cache(1, kLength);
        int token = 1;  // BOS
        for (int position = 0; position < kLength; ++position) {
          const std::span<const float> logits = model.forward(llm::TokenBatch::single(token, position, 0), *cache);
          const float largest = *std::max_element(logits.begin(), logits.end());
          std::vector<double> probability(logits.size());  // [vocab] unnormalised softmax
          for (std::size_t i = 0; i < logits.size(); ++i) probability[i] = std::exp(logits[i] - largest);
          token = std::discrete_distribution<int>(probability.begin(), probability.end())(rng);
        }
      }
    };
    layers_ = new std::map<LinearSite, RecordedLayer>();
    sample_stories(kStories);
    for (const LinearSite& site : recorder.sites()) {
      if (site.role == LinearRole::Classifier) continue;
      RecordedLayer recorded = weights_of(weights, site);
      const std::span<const float> rows = recorder.inputs(site);
      recorded.rows.assign(rows.begin(), rows.end());
      layers_->emplace(site, std::move(recorded));
    }
    recorder.clear();
    sample_stories(kHeldOutStories);
    for (auto& [site, recorded] : *layers_) {
      const std::span<const float> rows = recorder.inputs(site);
      recorded.held_out_rows.assign(rows.begin(), rows.end());
    }
    n_layers_ = weights.config.n_layers;
  }
  static void TearDownTestSuite() {
    delete layers_;
    layers_ = nullptr;
  }
  void SetUp() override {
    if (layers_ == nullptr) GTEST_SKIP() << "model file stories260K.bin not found (set LLM_MODELS_DIR); skipping";
  }

  // The layers the tests quantize: both ends of the model, every role.
  static std::vector<LinearSite> sites() {
    const int last = n_layers_ - 1;
    return {{0, LinearRole::Query},  {0, LinearRole::Gate},     {last / 2, LinearRole::Output},
            {last, LinearRole::Value}, {last, LinearRole::Down}, {last, LinearRole::Up}};
  }
  static const RecordedLayer& recorded(const LinearSite& site) { return layers_->at(site); }

  static inline std::map<LinearSite, RecordedLayer>* layers_ = nullptr;
  static inline int n_layers_ = 0;
};

TEST_F(Stories260K, CalibrationRowsAreEveryForwardRow) {
  for (const LinearSite& site : sites()) {
    const CalibrationInputs calibration = recorded(site).calibration();
    EXPECT_EQ(calibration.n_rows, kStories * kLength) << site.name();
    EXPECT_EQ(calibration.in_features, recorded(site).in_features) << site.name();
    EXPECT_EQ(recorded(site).held_out().n_rows, kHeldOutStories * kLength) << site.name();
  }
}

// GPTQ spreads each rounding error where the calibration inputs cancel it:
// its output error on those rows is below RTN's on every layer and format
// (int8 too, whose RTN error is already small), in order and in act order.
TEST_F(Stories260K, GptqOutputErrorIsBelowRtn) {
  for (const LinearSite& site : sites()) {
    const RecordedLayer& layer = recorded(site);
    for (const std::string name : {"int4-g32", "int4sym-g32", "nf4-g32", "int4-g64", "int8"}) {
      SCOPED_TRACE(site.name() + " " + name);
      const QuantFormat format = QuantFormat::parse(name);
      const QuantizedMatrix rtn_matrix = quantize_rtn(layer.layer(), format);
      const QuantizedMatrix gptq_matrix = quantize_gptq(layer.layer(), format, layer.calibration());
      const double rtn = layer_output_error(layer.layer(), rtn_matrix, layer.calibration());
      const double gptq = layer_output_error(layer.layer(), gptq_matrix, layer.calibration());
      GptqOptions act_order;
      act_order.act_order = true;
      const double gptq_act_order = layer_output_error(
          layer.layer(), quantize_gptq(layer.layer(), format, layer.calibration(), act_order), layer.calibration());
      // On the held-out stories' rows.
      const double rtn_held_out = layer_output_error(layer.layer(), rtn_matrix, layer.held_out());
      const double gptq_held_out = layer_output_error(layer.layer(), gptq_matrix, layer.held_out());
      std::cout << "  " << site.name() << " " << name << ": output MSE rtn " << rtn << ", gptq " << gptq << " ("
                << gptq / rtn << " of rtn), gptq act-order " << gptq_act_order << " (" << gptq_act_order / rtn
                << "); held out: gptq " << gptq_held_out / rtn_held_out << " of rtn\n";
      EXPECT_GT(rtn, 0.0);
      EXPECT_LT(gptq, rtn);
      EXPECT_LT(gptq_act_order, rtn);
      EXPECT_LT(gptq_held_out, rtn_held_out);
    }
  }
}

// AWQ's grid holds alpha = 0 (plain RTN), so it never does worse than RTN;
// the matrix it returns is the one whose error it reports.
TEST_F(Stories260K, AwqNeverLosesToRtnAndReportsItsMatrixError) {
  for (const LinearSite& site : sites()) {
    const RecordedLayer& layer = recorded(site);
    for (const std::string name : {"int4-g32", "int4sym-g32", "nf4-g32", "int8"}) {
      SCOPED_TRACE(site.name() + " " + name);
      const QuantFormat format = QuantFormat::parse(name);
      const AwqResult awq = quantize_awq(layer.layer(), format, layer.calibration());
      const double rtn = layer_output_error(layer.layer(), quantize_rtn(layer.layer(), format), layer.calibration());
      std::cout << "  " << site.name() << " " << name << ": output MSE rtn " << rtn << ", awq " << awq.output_error
                << " (" << awq.output_error / rtn << " of rtn, alpha " << awq.alpha << ")\n";
      // AWQ sums the same squares in another order (through X^T X): equal up to double rounding.
      EXPECT_NEAR(awq.output_error_unscaled, rtn, 1e-9 * rtn);
      EXPECT_LE(awq.output_error, awq.output_error_unscaled);
      EXPECT_NEAR(layer_output_error(layer.layer(), awq.matrix, layer.calibration()), awq.output_error,
                  1e-9 * awq.output_error);
      EXPECT_GE(awq.alpha, 0.0);
      EXPECT_LT(awq.alpha, 1.0);
      EXPECT_EQ(awq.matrix.format, format);
      if (awq.alpha == 0.0) {
        EXPECT_TRUE(awq.matrix.input_scales.empty());
        EXPECT_EQ(awq.output_error, awq.output_error_unscaled);
      } else {
        ASSERT_EQ(awq.matrix.input_scales.size(), static_cast<std::size_t>(layer.in_features));
        for (float scale : awq.matrix.input_scales) EXPECT_TRUE(std::isfinite(scale) && scale > 0.0f) << scale;
        EXPECT_LT(awq.output_error, awq.output_error_unscaled);  // a larger alpha wins only when strictly better
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Synthetic layers.

// Random weights [out, in] and inputs [rows, in], uniform in [-1, 1].
struct SyntheticLayer {
  std::vector<float> weight;  // [out_features, in_features]
  std::vector<float> rows;    // [n_rows, in_features]
  int out_features = 0;
  int in_features = 0;
  int n_rows = 0;

  SyntheticLayer(int out, int in, int n, std::uint64_t seed)
      : weight(llm::testing::random_vector(static_cast<std::size_t>(out) * in, seed)),
        rows(llm::testing::random_vector(static_cast<std::size_t>(n) * in, seed + 1)),
        out_features(out),
        in_features(in),
        n_rows(n) {}
  LayerWeights layer() const { return {weight, out_features, in_features}; }
  CalibrationInputs calibration() const { return {rows, n_rows, in_features}; }
  float& input(int row, int column) { return rows[static_cast<std::size_t>(row) * in_features + column]; }
};

// One input channel with activations 50x the others: its weights' rounding
// errors dominate the output, and AWQ scales that channel up.
TEST(AwqSynthetic, OutlierInputChannelGetsScaledUpAndBeatsRtn) {
  for (const std::string name : {"int4-g32", "int4sym-g64", "nf4-g32", "int8"}) {
    SCOPED_TRACE(name);
    const int outlier = 13;
    SyntheticLayer synthetic(48, 128, 256, 31);
    for (int row = 0; row < synthetic.n_rows; ++row) synthetic.input(row, outlier) *= 50.0f;
    const AwqResult awq = quantize_awq(synthetic.layer(), QuantFormat::parse(name), synthetic.calibration());
    std::cout << "  outlier channel, " << name << ": rtn " << awq.output_error_unscaled << ", awq " << awq.output_error
              << " (alpha " << awq.alpha << ")\n";
    EXPECT_GT(awq.alpha, 0.0);
    EXPECT_LT(awq.output_error, 0.8 * awq.output_error_unscaled);
    ASSERT_EQ(awq.matrix.input_scales.size(), 128u);
    const auto largest = std::max_element(awq.matrix.input_scales.begin(), awq.matrix.input_scales.end());
    EXPECT_EQ(largest - awq.matrix.input_scales.begin(), outlier);
    // Normalised: the geometric mean of the extreme scales is 1.
    const auto smallest = std::min_element(awq.matrix.input_scales.begin(), awq.matrix.input_scales.end());
    EXPECT_NEAR(std::sqrt(*largest * *smallest), 1.0f, 1e-5f);
  }
}

// Inputs with the same magnitude everywhere give every channel the same
// scale: with nothing to gain, alpha 0 (plain RTN, no input scales) is kept,
// unless a scale grid point is strictly better.
TEST(AwqSynthetic, UniformActivationsChangeNothingAndZeroInputsStayFinite) {
  SyntheticLayer synthetic(16, 64, 32, 41);
  std::fill(synthetic.rows.begin(), synthetic.rows.end(), 0.5f);
  const QuantFormat format = QuantFormat::parse("int4-g32");
  const AwqResult awq = quantize_awq(synthetic.layer(), format, synthetic.calibration());
  // Every s_j is the same number, normalised to 1: the same matrix as RTN at every alpha.
  EXPECT_EQ(awq.alpha, 0.0);
  EXPECT_TRUE(awq.matrix.input_scales.empty());
  EXPECT_EQ(unpack_codes(awq.matrix), unpack_codes(quantize_rtn(synthetic.layer(), format)));

  // A channel that is always 0 gets the floor scale, not 0 (no division by zero).
  SyntheticLayer dead(16, 64, 32, 43);
  for (int row = 0; row < dead.n_rows; ++row) dead.input(row, 5) = 0.0f;
  for (int row = 0; row < dead.n_rows; ++row) dead.input(row, 9) *= 30.0f;  // something to gain from scaling
  const AwqResult with_dead = quantize_awq(dead.layer(), format, dead.calibration());
  ASSERT_GT(with_dead.alpha, 0.0);
  for (float scale : with_dead.matrix.input_scales) EXPECT_TRUE(std::isfinite(scale) && scale > 0.0f);
  for (float value : dequantize(with_dead.matrix)) ASSERT_TRUE(std::isfinite(value));
}

// Two matrices that read the same input share one alpha and so one vector
// of input scales; the group's error is the mean over their stacked outputs:
// layer_output_error of each matrix, weighted by its rows. A group of one is
// quantize_awq.
TEST(AwqSynthetic, AGroupSharesOneAlphaChosenOnItsStackedOutputs) {
  const QuantFormat format = QuantFormat::parse("int4-g32");
  SyntheticLayer first(40, 96, 200, 61);
  for (int row = 0; row < first.n_rows; ++row) first.input(row, 7) *= 40.0f;  // something to gain from scaling
  SyntheticLayer second(24, 96, 200, 67);  // its weights; the calibration rows are the first's
  const CalibrationInputs shared_input = first.calibration();
  const std::vector<LayerWeights> group = {first.layer(), second.layer()};
  const AwqGroupResult scaled = quantize_awq_group(group, format, shared_input);
  ASSERT_EQ(scaled.matrices.size(), 2u);
  EXPECT_GT(scaled.alpha, 0.0);
  ASSERT_EQ(scaled.matrices[0].input_scales.size(), 96u);
  EXPECT_EQ(scaled.matrices[0].input_scales, scaled.matrices[1].input_scales);
  EXPECT_LE(scaled.output_error, scaled.output_error_unscaled);
  const double stacked_error =
      (layer_output_error(first.layer(), scaled.matrices[0], shared_input) * first.out_features +
       layer_output_error(second.layer(), scaled.matrices[1], shared_input) * second.out_features) /
      (first.out_features + second.out_features);
  EXPECT_NEAR(scaled.output_error, stacked_error, 1e-6 * stacked_error);

  // At alpha 0 the group is plain RTN: its error from layer_output_error
  // directly, not through the Gram matrix the search uses.
  const double rtn_error =
      (layer_output_error(first.layer(), quantize_rtn(first.layer(), format), shared_input) * first.out_features +
       layer_output_error(second.layer(), quantize_rtn(second.layer(), format), shared_input) *
           second.out_features) /
      (first.out_features + second.out_features);
  EXPECT_NEAR(scaled.output_error_unscaled, rtn_error, 1e-6 * rtn_error);

  // A group of one is quantize_awq: the same alpha, codes and scales.
  const AwqResult alone = quantize_awq(first.layer(), format, shared_input);
  const AwqGroupResult group_of_one =
      quantize_awq_group(std::vector<LayerWeights>{first.layer()}, format, shared_input);
  EXPECT_EQ(group_of_one.alpha, alone.alpha);
  EXPECT_EQ(group_of_one.output_error, alone.output_error);
  EXPECT_EQ(unpack_codes(group_of_one.matrices[0]), unpack_codes(alone.matrix));
  EXPECT_EQ(group_of_one.matrices[0].input_scales, alone.matrix.input_scales);

  EXPECT_THROW(quantize_awq_group(std::vector<LayerWeights>{}, format, shared_input), llm::InputError);
  SyntheticLayer narrower(8, 64, 200, 71);  // 64 inputs against 96-column calibration rows
  EXPECT_THROW(quantize_awq_group(std::vector<LayerWeights>{first.layer(), narrower.layer()}, format, shared_input),
               llm::InputError);
}

// A diagonal Hessian (each calibration row has one non-zero input) couples no
// columns: U is diagonal, no error is spread, and GPTQ must give RTN's codes
// and parameters exactly, in order and in act order.
TEST(GptqSynthetic, DiagonalHessianGivesRtnExactly) {
  for (const std::string name : {"int4-g32", "int4sym-g32", "nf4-g32", "int8"}) {
    SCOPED_TRACE(name);
    const QuantFormat format = QuantFormat::parse(name);
    SyntheticLayer synthetic(24, 100, 100, 51);
    std::fill(synthetic.rows.begin(), synthetic.rows.end(), 0.0f);
    for (int column = 0; column < 100; ++column) synthetic.input(column, column) = 0.1f * (1 + column % 7);
    const QuantizedMatrix rtn = quantize_rtn(synthetic.layer(), format);
    for (bool act_order : {false, true}) {
      GptqOptions options;
      options.act_order = act_order;
      const QuantizedMatrix gptq = quantize_gptq(synthetic.layer(), format, synthetic.calibration(), options);
      EXPECT_EQ(unpack_codes(gptq), unpack_codes(rtn)) << "act_order " << act_order;
      EXPECT_EQ(gptq.scales, rtn.scales);
      EXPECT_EQ(gptq.zeros, rtn.zeros);
    }
  }
}

// Lazy batches change when errors are applied, not the arithmetic: any block
// size gives the codes of one block over the whole row (every error applied
// at once), with groups that divide the block, straddle it (96) or hold the
// whole row (int8).
TEST(GptqSynthetic, BlockSizeDoesNotChangeTheResult) {
  const int in = 256;
  SyntheticLayer synthetic(20, in, 512, 61);
  // Correlated inputs: every row also carries a shared random direction.
  const std::vector<float> direction = llm::testing::random_vector(in, 62);
  for (int row = 0; row < synthetic.n_rows; ++row)
    for (int column = 0; column < in; ++column)
      synthetic.input(row, column) += 2.0f * synthetic.input(row, 0) * direction[static_cast<std::size_t>(column)];
  for (const std::string name : {"int4-g32", "int4-g96", "nf4-g64", "int8"}) {
    for (bool act_order : {false, true}) {
      SCOPED_TRACE(name + (act_order ? " act_order" : ""));
      const QuantFormat format = QuantFormat::parse(name);
      GptqOptions options;
      options.act_order = act_order;
      options.block_columns = in;
      const std::vector<int> one_block =
          unpack_codes(quantize_gptq(synthetic.layer(), format, synthetic.calibration(), options));
      for (int block : {1, 40, 64, 128}) {
        options.block_columns = block;
        EXPECT_EQ(unpack_codes(quantize_gptq(synthetic.layer(), format, synthetic.calibration(), options)), one_block)
            << "block_columns " << block;
      }
    }
  }
}

// Fewer calibration rows than inputs (a singular X^T X) and an input that is
// always 0: dampening and the dead-input rule keep every weight finite, and
// the dead input's weights become exactly 0 (they cannot affect the output).
TEST(GptqSynthetic, RankDeficientCalibrationGivesFiniteWeights) {
  for (const std::string name : {"int4-g32", "nf4-g32", "int8"}) {
    for (bool act_order : {false, true}) {
      SCOPED_TRACE(name + (act_order ? " act_order" : ""));
      const QuantFormat format = QuantFormat::parse(name);
      GptqOptions options;
      options.act_order = act_order;
      SyntheticLayer few_rows(16, 96, 8, 71);  // 8 rows, 96 inputs: rank 8
      const QuantizedMatrix from_few = quantize_gptq(few_rows.layer(), format, few_rows.calibration(), options);
      for (float value : dequantize(from_few)) ASSERT_TRUE(std::isfinite(value));
      EXPECT_LT(layer_output_error(few_rows.layer(), from_few, few_rows.calibration()),
                layer_output_error(few_rows.layer(), quantize_rtn(few_rows.layer(), format), few_rows.calibration()));

      SyntheticLayer dead_input(16, 96, 200, 73);
      for (int row = 0; row < dead_input.n_rows; ++row) dead_input.input(row, 40) = 0.0f;
      const QuantizedMatrix from_dead = quantize_gptq(dead_input.layer(), format, dead_input.calibration(), options);
      const std::vector<float> weight = dequantize(from_dead);  // [16, 96]
      for (float value : weight) ASSERT_TRUE(std::isfinite(value));
      for (int row = 0; row < 16; ++row) EXPECT_EQ(weight[static_cast<std::size_t>(row) * 96 + 40], 0.0f);

      SyntheticLayer all_zero(16, 96, 10, 75);
      std::fill(all_zero.rows.begin(), all_zero.rows.end(), 0.0f);
      for (float value : dequantize(quantize_gptq(all_zero.layer(), format, all_zero.calibration(), options)))
        ASSERT_EQ(value, 0.0f);
    }
  }
}

TEST(GptqSynthetic, LastGroupShorterThanTheOthers) {
  // 100 inputs in groups of 32: the fourth group has 4 columns.
  SyntheticLayer synthetic(8, 100, 300, 81);
  const QuantFormat format = QuantFormat::parse("int4-g32");
  const QuantizedMatrix gptq = quantize_gptq(synthetic.layer(), format, synthetic.calibration());
  EXPECT_EQ(gptq.groups_per_row, 4);
  EXPECT_EQ(gptq.padded_in, 128);
  EXPECT_LT(layer_output_error(synthetic.layer(), gptq, synthetic.calibration()),
            layer_output_error(synthetic.layer(), quantize_rtn(synthetic.layer(), format), synthetic.calibration()));
}

TEST(QuantAlgorithmsInputs, CalibrationThatDoesNotFitThrows) {
  SyntheticLayer synthetic(8, 64, 16, 91);
  const LayerWeights layer = synthetic.layer();
  const QuantFormat format = QuantFormat::parse("int4-g32");
  const auto message_of = [&](const CalibrationInputs& calibration) -> std::string {
    std::string gptq_message;
    try {
      quantize_gptq(layer, format, calibration);
      ADD_FAILURE() << "GPTQ accepted the calibration";
    } catch (const llm::InputError& error) {
      gptq_message = error.what();
    }
    try {
      quantize_awq(layer, format, calibration);
      ADD_FAILURE() << "AWQ accepted the calibration";
    } catch (const llm::InputError& error) {
      EXPECT_TRUE(HasSubstr(error.what(), "AWQ"));
    }
    EXPECT_TRUE(HasSubstr(gptq_message, "GPTQ"));
    return gptq_message;
  };
  const std::vector<float> rows_of_32 = llm::testing::random_vector(16 * 32, 92);
  EXPECT_TRUE(HasSubstr(message_of({rows_of_32, 16, 32}), "calibration rows have 32 features"));
  EXPECT_TRUE(HasSubstr(message_of({std::span<const float>(), 0, 64}), "no calibration rows"));
  EXPECT_TRUE(HasSubstr(message_of({std::span<const float>(synthetic.rows).first(100), 16, 64}), "not 16 rows of 64"));
  std::vector<float> with_nan = synthetic.rows;
  with_nan[3 * 64 + 7] = NAN;
  EXPECT_TRUE(HasSubstr(message_of({with_nan, 16, 64}), "row 3 column 7"));

  // The layer itself: too narrow for the group, or weights of the wrong size.
  EXPECT_THROW(quantize_gptq({std::span<const float>(synthetic.weight).first(8 * 16), 8, 16}, format,
                             {std::span<const float>(synthetic.rows).first(16 * 16), 16, 16}),
               llm::InputError);
  EXPECT_THROW(quantize_gptq({std::span<const float>(synthetic.weight).first(100), 8, 64}, format,
                             synthetic.calibration()),
               llm::InputError);
  GptqOptions no_blocks;
  no_blocks.block_columns = 0;
  EXPECT_THROW(quantize_gptq(layer, format, synthetic.calibration(), no_blocks), llm::InputError);
  AwqOptions no_grid;
  no_grid.grid_points = 0;
  EXPECT_THROW(quantize_awq(layer, format, synthetic.calibration(), no_grid), llm::InputError);
}

TEST(QuantAlgorithmsInputs, AlgorithmNames) {
  EXPECT_EQ(algorithm_name(QuantAlgorithm::Rtn), "rtn");
  EXPECT_EQ(algorithm_name(QuantAlgorithm::Gptq), "gptq");
  EXPECT_EQ(algorithm_name(QuantAlgorithm::Awq), "awq");
}

}  // namespace
}  // namespace step06
