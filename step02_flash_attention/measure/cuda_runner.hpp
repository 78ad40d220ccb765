#pragma once
// Running the CUDA variants from plain C++ (main.cpp, bench.cpp, tests):
// device copies of one problem's inputs, a NaN-poisoned output, the check
// run and the CUDA-event timing; and the CUDA model with step 02's attention
// plugged in. No CUDA types here; cuda_runner.cpp defines it in CUDA builds,
// cuda_runner_unavailable.cpp (every call throws llm::DeviceError "built
// without CUDA") otherwise.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llm/harness/timer.hpp"
#include "llm/model.hpp"
#include "llm/weights.hpp"
#include "step02_flash_attention/attention_problem.hpp"
#include "step02_flash_attention/variants.hpp"

namespace step02 {

class CudaProblem {
 public:
  // Uploads Q, K, V (host, fp32: q [Sq, q_row], k/v [Sk, kv_row]) as fp32 and
  // as fp16 and bf16 bits, and allocates the output. Throws llm::DeviceError.
  CudaProblem(const AttentionProblem& p, std::span<const float> q, std::span<const float> k,
              std::span<const float> v);
  ~CudaProblem();
  CudaProblem(const CudaProblem&) = delete;
  CudaProblem& operator=(const CudaProblem&) = delete;

  // "" when the variant can run here, else why not: not in this build, a CPU
  // row, GPU too old or kernel compiled too old (bf16 needs sm_80 on both:
  // kernel_image.hpp), head_dim, not enough memory.
  std::string skip_reason(const AttentionVariant& v) const;
  // Fills the output with NaN, runs the variant once, returns the output
  // [Sq, q_row] (a row the kernel forgot stays NaN and fails the check).
  std::vector<float> run_once(const AttentionVariant& v);
  // CUDA-event timing with an L2 flush before each run (llm::cuda::time_cuda).
  llm::TimingStats time(const AttentionVariant& v, int warmup, int runs);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Which attention a CUDA model's prefill runs (decode keeps the model's
// default kernel either way).
enum class CudaModelPrefill {
  Baseline,  // llm::cuda::kernels::prefill_attention: every score in a global
             // workspace, [n_new, n_heads, n_past + n_new] floats
  Flash1,    // step02::cuda::flash1_prefill: variant 3's FA1 kernel, no workspace
};

// A llm::cuda::CudaModel (weights uploaded) whose attention hook runs
// `prefill`. Its forward returns host logits after waiting for the GPU, so a
// host stopwatch around forward() times the whole prefill. Throws
// llm::InputError when the model's head_dim is one the FA1 kernel is not
// compiled for (checked before anything is uploaded), llm::DeviceError when no
// GPU is usable or in a build without CUDA.
std::unique_ptr<llm::Model> make_cuda_model(const llm::ModelWeights& weights, CudaModelPrefill prefill);

}  // namespace step02
