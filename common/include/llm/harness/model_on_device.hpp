#pragma once
// The model a step measures, on each device --device selected.
#include <memory>
#include <string>
#include <vector>

#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/harness/cli.hpp"
#include "llm/harness/compare.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"

namespace llm {

// The selected devices by name, in the order every step runs and prints
// them: "cpu", then "cuda".
std::vector<std::string> selected_device_names(const DeviceSelection& devices);

// The baseline model of `device` ("cpu": CpuModel; "cuda": the CUDA model,
// DeviceError when CUDA is not built or no device is usable).
// `cuda` says how the CUDA model runs (--dtype, --no-graphs); the CPU model
// ignores it.
std::unique_ptr<Model> make_model_on(const std::string& device, const ModelWeights& weights,
                                     const cuda::CudaRunOptions& cuda = {});

// The CUDA run options a step's command line asked for.
cuda::CudaRunOptions cuda_run_options(const CommonOptions& options);

// The tolerances' element type (compare.hpp) of a CUDA weight type.
DType compare_dtype(cuda::WeightDtype dtype);

}  // namespace llm
