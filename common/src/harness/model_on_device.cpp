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

std::unique_ptr<Model> make_model_on(const std::string& device, const ModelWeights& weights,
                                     const cuda::CudaRunOptions& cuda) {
  if (device == "cpu") return std::make_unique<CpuModel>(weights);
  if (device == "cuda") return cuda::make_cuda_model(weights, cuda);
  throw InputError("no model for device '" + device + "' (cpu or cuda)");
}

cuda::CudaRunOptions cuda_run_options(const CommonOptions& options) {
  cuda::CudaRunOptions run;
  run.dtype = cuda::parse_weight_dtype(options.dtype);
  run.gemv = cuda::parse_half_gemv_kernel(options.gemv);
  run.max_gemv_rows = options.max_gemv_rows;
  run.gemv_prefetch = !options.no_gemv_prefetch;
  run.gemv_pipelining = !options.no_gemv_pipelining;
  run.gemv_wave_fit = !options.no_gemv_wave_fit;
  run.gemv_prefetch_next = options.gemv_prefetch_next;
  run.graphs = !options.no_graphs;
  run.fusions = !options.no_fusions;
  run.fold_norms = !options.no_norm_folding;
  run.fold_merge = options.merge_folding;
  run.fold_rope = !options.no_rope_folding;
  run.programmatic_launches = !options.no_pdl;
  return run;
}

DType compare_dtype(cuda::WeightDtype dtype) {
  switch (dtype) {
    case cuda::WeightDtype::Float16: return DType::F16;
    case cuda::WeightDtype::BFloat16: return DType::BF16;
    case cuda::WeightDtype::Float32: break;
  }
  return DType::F32;
}

namespace cuda {

std::string to_string(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::Float32: return "fp32";
    case WeightDtype::Float16: return "fp16";
    case WeightDtype::BFloat16: return "bf16";
  }
  return "unknown";
}

WeightDtype parse_weight_dtype(const std::string& name) {
  for (WeightDtype dtype : {WeightDtype::Float32, WeightDtype::Float16, WeightDtype::BFloat16})
    if (name == to_string(dtype)) return dtype;
  throw InputError("unknown weight dtype '" + name + "' (fp32, fp16 or bf16)");
}

std::string to_string(HalfGemvKernel kernel) {
  return kernel == HalfGemvKernel::TensorCores ? "tensor-cores" : "cuda-cores";
}

HalfGemvKernel parse_half_gemv_kernel(const std::string& name) {
  for (HalfGemvKernel kernel : {HalfGemvKernel::CudaCores, HalfGemvKernel::TensorCores})
    if (name == to_string(kernel)) return kernel;
  throw InputError("unknown GEMV kernel '" + name + "' (cuda-cores or tensor-cores)");
}

}  // namespace cuda

}  // namespace llm
