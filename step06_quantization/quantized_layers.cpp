#include "step06_quantization/quantized_layers.hpp"

#include <fmt/format.h>

#include <set>
#include <stdexcept>

#include "llm/cpu_model.hpp"
#include "llm/errors.hpp"
#include "llm/harness/model_on_device.hpp"
#include "llm/parallel_for.hpp"
#include "llm/sampler.hpp"
#include "llm/token_batch.hpp"
#include "step06_quantization/cpu_quantized_linear.hpp"
#include "step06_quantization/cuda_quantized_kernels.hpp"

namespace step06 {

std::string describe(const ModelQuantization& quantization) {
  return fmt::format("{} {}{}", quantization.format.name(), algorithm_name(quantization.algorithm),
                     quantization.quantize_classifier ? "" : " (classifier fp32)");
}

std::vector<std::vector<int>> sample_sequences(llm::Model& model, int n_sequences, int length, std::uint64_t seed) {
  const llm::ModelConfig& config = model.config();
  if (n_sequences < 1 || length < 2 || length > config.seq_len)
    throw llm::InputError(fmt::format("calibration: {} sequences of {} positions (the context is {})", n_sequences,
                                      length, config.seq_len));
  constexpr int kBos = 1;  // llama2.c's BOS id: every sequence starts as a prompt would
  std::vector<std::vector<int>> sequences;
  for (int s = 0; s < n_sequences; ++s) {
    // Temperature 1, no top-p: the model's own distribution, so calibration
    // activations look like the ones the model meets when it generates.
    llm::Sampler sampler(config.vocab_size, 1.0f, 1.0f, seed + static_cast<std::uint64_t>(s));
    auto cache = model.make_cache(1, length);
    std::vector<int> tokens = {kBos};  // [length]
    while (static_cast<int>(tokens.size()) < length) {
      const int position = static_cast<int>(tokens.size()) - 1;
      const std::span<const float> logits =
          model.forward(llm::TokenBatch::single(tokens.back(), position, 0), *cache);
      tokens.push_back(sampler.sample(logits));
    }
    sequences.push_back(std::move(tokens));
  }
  return sequences;
}

std::unique_ptr<Calibration> record_calibration(const llm::ModelWeights& weights,
                                                std::vector<std::vector<int>> sequences) {
  auto calibration = std::make_unique<Calibration>();
  calibration->sequences = std::move(sequences);
  llm::CpuModelOptions options;
  options.linear_factory = calibration->recorder.wrap(llm::dense_linear_factory());
  llm::CpuModel model(weights, options);
  for (const std::vector<int>& sequence : calibration->sequences) {
    auto cache = model.make_cache(1, static_cast<int>(sequence.size()));
    // Every row gets logits so the classifier records every position too.
    model.forward(llm::TokenBatch::prefill(sequence, 0, 0), *cache, llm::LogitsFor::AllRows);
  }
  return calibration;
}

std::size_t QuantizedLayers::bytes() const {
  std::size_t total = 0;
  for (const auto& [site, matrix] : matrices) total += matrix.bytes();
  return total;
}

LayerWeights layer_weights(const llm::ModelWeights& weights, const llm::LinearSite& site) {
  const llm::ModelConfig& c = weights.config;
  const int q_width = c.n_heads * c.head_dim();
  if (site.role == llm::LinearRole::Classifier) return {weights.classifier_matrix(), c.vocab_size, c.dim};
  const llm::LayerWeights& layer = weights.layers.at(static_cast<std::size_t>(site.layer));
  switch (site.role) {
    case llm::LinearRole::Query: return {layer.wq, q_width, c.dim};
    case llm::LinearRole::Key: return {layer.wk, c.kv_dim(), c.dim};
    case llm::LinearRole::Value: return {layer.wv, c.kv_dim(), c.dim};
    case llm::LinearRole::Output: return {layer.wo, c.dim, q_width};
    case llm::LinearRole::Gate: return {layer.w1, c.hidden_dim, c.dim};
    case llm::LinearRole::Up: return {layer.w3, c.hidden_dim, c.dim};
    case llm::LinearRole::Down: return {layer.w2, c.dim, c.hidden_dim};
    case llm::LinearRole::Classifier: break;
  }
  throw llm::InputError("quantize: unknown layer role");
}

std::vector<llm::LinearSite> linear_sites(const llm::ModelConfig& config) {
  using llm::LinearRole;
  std::vector<llm::LinearSite> sites;
  for (int layer = 0; layer < config.n_layers; ++layer)
    for (LinearRole role : {LinearRole::Query, LinearRole::Key, LinearRole::Value, LinearRole::Output,
                            LinearRole::Gate, LinearRole::Up, LinearRole::Down})
      sites.push_back({layer, role});
  sites.push_back({-1, LinearRole::Classifier});
  return sites;
}

std::vector<llm::LinearSite> sites_reading_the_input_of(const llm::LinearSite& site) {
  using llm::LinearRole;
  switch (site.role) {
    case LinearRole::Query: return {site, {site.layer, LinearRole::Key}, {site.layer, LinearRole::Value}};
    case LinearRole::Gate: return {site, {site.layer, LinearRole::Up}};
    default: return {site};
  }
}

QuantizedLayers quantize_layers(const llm::ModelWeights& weights, const ModelQuantization& quantization,
                                const Calibration* calibration) {
  const bool needs_calibration = quantization.algorithm != QuantAlgorithm::Rtn;
  if (needs_calibration && calibration == nullptr)
    throw llm::InputError(fmt::format("{} needs calibration data", algorithm_name(quantization.algorithm)));

  // The work, in linear_sites order: one piece per site, or per AWQ group
  // (the sites that read one input get one set of input scales; linear_sites
  // lists a group's first site first). [pieces][sites of the piece]
  std::vector<std::vector<llm::LinearSite>> pieces;
  std::set<llm::LinearSite> planned;
  for (const llm::LinearSite& site : linear_sites(weights.config)) {
    if (planned.contains(site)) continue;  // quantized with its group
    const bool is_classifier = site.role == llm::LinearRole::Classifier;
    if (is_classifier && !quantization.quantize_classifier) continue;
    const bool awq_group = quantization.algorithm == QuantAlgorithm::Awq && !is_classifier;
    std::vector<llm::LinearSite> piece = awq_group ? sites_reading_the_input_of(site) : std::vector{site};
    for (const llm::LinearSite& member : piece)
      if (!planned.insert(member).second)
        throw std::logic_error(fmt::format("quantize_layers: {} was quantized before its group ({} first)",
                                          member.name(), site.name()));
    pieces.push_back(std::move(piece));
  }

  // Each piece reads only the weights and the calibration rows, and writes
  // only its own matrices, so the pieces run on every core (a GPU preset's
  // billion weights are long work for one thread) and the codes are the
  // same on any number of threads. GPTQ and AWQ pieces each hold a layer's
  // worth of double-precision work arrays meanwhile (GPTQ's [in, in]
  // Hessian), one per running thread. [pieces][sites of the piece]
  std::vector<std::vector<QuantizedMatrix>> quantized(pieces.size());
  llm::parallel_for(pieces.size(), [&](std::size_t index) {
    const std::vector<llm::LinearSite>& piece = pieces[index];
    const llm::LinearSite& site = piece.front();
    const LayerWeights layer = layer_weights(weights, site);
    // The classifier is rounded to nearest under every algorithm: its inputs
    // are the final norm's, and calibrating a vocab-sized matrix buys little.
    if (!needs_calibration || site.role == llm::LinearRole::Classifier) {
      quantized[index].push_back(quantize_rtn(layer, quantization.format));
      return;
    }
    const CalibrationInputs inputs{calibration->recorder.inputs(site), calibration->recorder.rows(site),
                                   layer.in_features};
    if (inputs.n_rows == 0) throw llm::InputError(fmt::format("calibration recorded no rows for {}", site.name()));
    if (quantization.algorithm == QuantAlgorithm::Gptq) {
      quantized[index].push_back(quantize_gptq(layer, quantization.format, inputs, quantization.gptq));
      return;
    }
    // AWQ: the group's recorded rows are the same rows (the model hands each
    // of its sites the same normed x), so the first site's serve them all.
    std::vector<LayerWeights> group_layers;  // [sites of the piece]
    for (const llm::LinearSite& member : piece) group_layers.push_back(layer_weights(weights, member));
    quantized[index] = quantize_awq_group(group_layers, quantization.format, inputs, quantization.awq).matrices;
  });

  QuantizedLayers layers;
  layers.quantization = quantization;
  for (std::size_t index = 0; index < pieces.size(); ++index)
    for (std::size_t member = 0; member < pieces[index].size(); ++member)
      layers.matrices.emplace(pieces[index][member], std::move(quantized[index][member]));
  return layers;
}

llm::LinearFactory quantized_linear_factory(const QuantizedLayers& layers) {
  return [&layers](const std::vector<float>& weight, int out_features, int in_features,
                   const llm::LinearSite& site) -> std::unique_ptr<llm::Linear> {
    const auto found = layers.matrices.find(site);
    if (found == layers.matrices.end()) return std::make_unique<llm::DenseLinear>(weight, out_features, in_features);
    if (found->second.out_features != out_features || found->second.in_features != in_features)
      throw llm::InputError(fmt::format("{}: the quantized matrix is [{}, {}], the model's [{}, {}]", site.name(),
                                        found->second.out_features, found->second.in_features, out_features,
                                        in_features));
    return std::make_unique<QuantizedLinear>(found->second);
  };
}

std::unique_ptr<llm::Model> make_quantized_model_on(const std::string& device, const llm::ModelWeights& weights,
                                                    const QuantizedLayers& layers,
                                                    const CudaQuantizedModelOptions& cuda) {
  if (device == "cuda") return make_cuda_quantized_model(weights, layers, cuda);
  if (device != "cpu") throw llm::InputError(fmt::format("unknown device '{}'", device));
  llm::CpuModelOptions options;
  options.linear_factory = quantized_linear_factory(layers);
  return std::make_unique<llm::CpuModel>(weights, options);
}

}  // namespace step06
