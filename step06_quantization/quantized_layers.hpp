#pragma once
// A whole model quantized: one QuantizedMatrix per Linear site, computed once
// (with calibration data for GPTQ/AWQ) and then handed to the CPU or CUDA
// model through their Linear factories, so both run the same codes.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "llm/linear.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"
#include "step06_quantization/cuda_quantized_kernels.hpp"  // CudaQuantizedModelOptions
#include "step06_quantization/linear_input_recorder.hpp"
#include "step06_quantization/quant_algorithms.hpp"

namespace step06 {

struct ModelQuantization {
  QuantFormat format;
  QuantAlgorithm algorithm = QuantAlgorithm::Rtn;
  // The classifier is the largest matrix of a small-vocabulary-heavy model
  // (stories15M: 9.2M of its 15M weights): quantized by default (RTN: it has
  // no calibration story of its own), kept fp32 when false.
  bool quantize_classifier = true;
  GptqOptions gptq;
  AwqOptions awq;
};
std::string describe(const ModelQuantization& quantization);  // "int4-g64 gptq"

// Every Linear site of a model of `config`: per layer wq, wk, wv, wo, w1, w3,
// w2, then the classifier.
std::vector<llm::LinearSite> linear_sites(const llm::ModelConfig& config);
// The sites that read the same input as `site`, `site` first: Q, K and V
// for the Query site (the attention norm's output), gate and up for the Gate
// site (the FFN norm's), else `site` alone. The CUDA model multiplies each
// such group as one stacked matrix; AWQ gives a group one set of input scales.
std::vector<llm::LinearSite> sites_reading_the_input_of(const llm::LinearSite& site);
// The fp32 matrix of `site` in `weights` ([out_features, in_features]), with its shape.
LayerWeights layer_weights(const llm::ModelWeights& weights, const llm::LinearSite& site);

// Calibration data: token sequences sampled from the fp32 model itself
// (temperature 1, fixed seeds), and the inputs every Linear saw while the
// model ran them (teacher-forced, one prefill per sequence).
struct Calibration {
  std::vector<std::vector<int>> sequences;  // [n_sequences][length] token ids, BOS first
  LinearInputRecorder recorder;             // per site: [rows, in_features]
};

// Samples `n_sequences` sequences of `length` positions from `model` (seeded:
// sequence i uses seed + i), BOS first.
std::vector<std::vector<int>> sample_sequences(llm::Model& model, int n_sequences, int length, std::uint64_t seed);

// Runs the fp32 CPU model over `sequences` with a recording factory.
std::unique_ptr<Calibration> record_calibration(const llm::ModelWeights& weights,
                                                std::vector<std::vector<int>> sequences);

// Every Linear site of the model quantized. `calibration` is required for
// GPTQ and AWQ (InputError when null), unused by RTN.
struct QuantizedLayers {
  ModelQuantization quantization;
  std::map<llm::LinearSite, QuantizedMatrix> matrices;  // the sites not kept in fp32
  std::size_t bytes() const;  // quantized matrices only
};
QuantizedLayers quantize_layers(const llm::ModelWeights& weights, const ModelQuantization& quantization,
                                const Calibration* calibration);

// A Linear factory for CpuModel: the site's QuantizedMatrix when `layers`
// has one, else fp32 (DenseLinear). `layers` must outlive the model.
llm::LinearFactory quantized_linear_factory(const QuantizedLayers& layers);

// The model on `device` ("cpu" or "cuda") with the quantized layers, the
// unchanged forward of common/; `cuda` says how the CUDA model runs (the CPU
// model ignores it). CUDA: DeviceError when not built or no GPU.
std::unique_ptr<llm::Model> make_quantized_model_on(const std::string& device, const llm::ModelWeights& weights,
                                                    const QuantizedLayers& layers,
                                                    const CudaQuantizedModelOptions& cuda = {});

}  // namespace step06
