#pragma once
// The model a step measures, on each device --device selected.
#include <memory>
#include <string>
#include <vector>

#include "llm/harness/cli.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"

namespace llm {

// The selected devices by name, in the order every step runs and prints
// them: "cpu", then "cuda".
std::vector<std::string> selected_device_names(const DeviceSelection& devices);

// The baseline model of `device` ("cpu": CpuModel; "cuda": the CUDA model,
// DeviceError when CUDA is not built or no device is usable).
std::unique_ptr<Model> make_model_on(const std::string& device, const ModelWeights& weights);

}  // namespace llm
