#include "llm/harness/model_on_device.hpp"

#include "llm/cpu_model.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/errors.hpp"

namespace llm {

std::vector<std::string> selected_device_names(const DeviceSelection& devices) {
  std::vector<std::string> names;
  if (devices.cpu) names.push_back("cpu");
  if (devices.cuda) names.push_back("cuda");
  return names;
}

std::unique_ptr<Model> make_model_on(const std::string& device, const ModelWeights& weights) {
  if (device == "cpu") return std::make_unique<CpuModel>(weights);
  if (device == "cuda") return cuda::make_cuda_model(weights);
  throw InputError("no model for device '" + device + "' (cpu or cuda)");
}

}  // namespace llm
