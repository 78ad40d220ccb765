// CudaProblem for CUDA builds: uploads one problem's inputs in fp32, fp16 and
// bf16, runs a variant into a NaN-poisoned output, and times it with CUDA
// events (llm::cuda::time_cuda flushes the L2 before each run). And the CUDA
// model with step 02's FlashAttention in its attention hook.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>
#include <tuple>
#include <vector>

// Two files are called cuda_attention.hpp: common/cuda's (the model's hook,
// CudaAttentionKernels) and this folder's (the variants). Step headers are
// included with their folder's name (step02_flash_attention/...), so the two
// never meet: cuda_model.hpp (common/cuda, a public include directory of
// llm_common in CUDA builds) gets the hook from its own folder. Likewise the
// namespaces: inside namespace step02, cuda:: is step02::cuda, so the model's
// types are always spelled llm::cuda::...
#include "cuda_model.hpp"  // common/cuda: CudaModel, CudaModelOptions, CudaAttentionKernels
#include "llm/cuda/cuda_check.hpp"
#include "llm/cuda/cuda_runtime_api.hpp"
#include "llm/cuda/cuda_timer.hpp"
#include "llm/cuda/device_buffer.hpp"
#include "llm/errors.hpp"
#include "step02_flash_attention/cuda_attention.hpp"  // the variants: flash1_unsupported
#include "step02_flash_attention/cuda_model_hooks.hpp"  // flash1_prefill and its workspace function
#include "step02_flash_attention/half_precision.hpp"
#include "step02_flash_attention/measure/cuda_runner.hpp"

namespace step02 {

using llm::cuda::DeviceBuffer;

struct CudaProblem::Impl {
  AttentionProblem p;
  DeviceBuffer<float> q, k, v;               // [Sq, q_row], [Sk, kv_row] x 2, fp32
  DeviceBuffer<std::uint16_t> q16, k16, v16;  // the same in fp16 bits
  DeviceBuffer<std::uint16_t> qbf, kbf, vbf;  // the same in bf16 bits
  DeviceBuffer<std::int32_t> block_table;     // [1] = {0}: K/V are one block
  DeviceBuffer<float> out;                    // [Sq, q_row] fp32
  DeviceBuffer<std::uint16_t> out16;          // [Sq, q_row] fp16 or bf16 bits (16-bit-output variants)
  DeviceBuffer<unsigned char> workspace;      // grown to the largest variant's need

  AttentionArgs args_for(const AttentionVariant& variant) {
    AttentionArgs a;
    a.q = q.data();
    a.kv = contiguous_kv_view(k.data(), v.data(), p.seqlen_k, p.kv_row(), block_table.data());
    if (variant.fn.dtype == llm::DType::F16) {
      a.q16 = q16.data();
      a.k16 = k16.data();
      a.v16 = v16.data();
    } else if (variant.fn.dtype == llm::DType::BF16) {
      a.q16 = qbf.data();
      a.k16 = kbf.data();
      a.v16 = vbf.data();
    }
    if (variant.fn.writes_16bit_output) a.out16 = out16.data();
    else a.out = out.data();
    if (variant.fn.workspace_bytes) {
      workspace.ensure(variant.fn.workspace_bytes(p));
      a.workspace = workspace.data();
    }
    return a;
  }
};

CudaProblem::CudaProblem(const AttentionProblem& p, std::span<const float> q, std::span<const float> k,
                         std::span<const float> v)
    : impl_(std::make_unique<Impl>()) {
  p.validate();
  if (q.size() != p.q_elements() || k.size() != p.kv_elements() || v.size() != p.kv_elements())
    throw llm::InputError("CudaProblem: Q/K/V sizes do not match the problem");
  Impl& m = *impl_;
  m.p = p;
  m.q = DeviceBuffer<float>(q);
  m.k = DeviceBuffer<float>(k);
  m.v = DeviceBuffer<float>(v);
  const std::vector<float> qh(q.begin(), q.end()), kh(k.begin(), k.end()), vh(v.begin(), v.end());
  for (const auto dtype : {llm::DType::F16, llm::DType::BF16}) {
    const auto qb = to_16bit(qh, dtype), kb = to_16bit(kh, dtype), vb = to_16bit(vh, dtype);
    auto [dq, dk, dv] = dtype == llm::DType::F16 ? std::tie(m.q16, m.k16, m.v16) : std::tie(m.qbf, m.kbf, m.vbf);
    dq = DeviceBuffer<std::uint16_t>(std::span<const std::uint16_t>(qb));
    dk = DeviceBuffer<std::uint16_t>(std::span<const std::uint16_t>(kb));
    dv = DeviceBuffer<std::uint16_t>(std::span<const std::uint16_t>(vb));
  }
  const std::int32_t zero = 0;
  m.block_table = DeviceBuffer<std::int32_t>(std::span<const std::int32_t>(&zero, 1));
  m.out = DeviceBuffer<float>(p.q_elements());
  m.out16 = DeviceBuffer<std::uint16_t>(p.q_elements());
}

CudaProblem::~CudaProblem() = default;

std::string CudaProblem::skip_reason(const AttentionVariant& v) const {
  if (v.backend != llm::Backend::Cuda) return "not a CUDA variant";
  if (!v.fn.run) return "not in this build";
  if (v.fn.min_compute_capability > 0) {
    // The kernel's own architecture decides, not the card's alone (kernel_image.hpp).
    const KernelImage image = v.fn.kernel_image ? v.fn.kernel_image() : KernelImage{};
    const std::string why =
        tensor_core_unavailable(fmt::format("{} tensor-core mma", llm::dtype_name(v.fn.dtype)),
                                v.fn.min_compute_capability, image, llm::cuda::compute_capability());
    if (!why.empty()) return why;
  }
  if (v.fn.unsupported)
    if (const char* why = v.fn.unsupported(impl_->p)) return why;
  if (v.fn.workspace_bytes) {
    std::size_t free_bytes = 0, total_bytes = 0;
    LLM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const std::size_t need = v.fn.workspace_bytes(impl_->p);
    // Leave a tenth for the L2 flush buffer and the runtime.
    if (need > impl_->workspace.size() && need - impl_->workspace.size() > free_bytes / 10 * 9)
      return fmt::format("needs {:.1f} GiB of workspace, {:.1f} GiB free", need / 1073741824.0,
                         free_bytes / 1073741824.0);
  }
  return "";
}

std::vector<float> CudaProblem::run_once(const AttentionVariant& v) {
  Impl& m = *impl_;
  // 0xFF bytes are a NaN in fp32, fp16 and bf16 alike: a row the kernel does
  // not write fails the check.
  LLM_CUDA_CHECK(cudaMemset(m.out.data(), 0xFF, m.out.bytes()));
  LLM_CUDA_CHECK(cudaMemset(m.out16.data(), 0xFF, m.out16.bytes()));
  const AttentionArgs args = m.args_for(v);
  v.fn.run(m.p, args);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());  // faults inside the kernel surface here
  std::vector<float> host(m.p.q_elements());
  if (!v.fn.writes_16bit_output) {
    m.out.download(std::span<float>(host));
    return host;
  }
  // A 16-bit output comes back as the floats its bits stand for.
  std::vector<std::uint16_t> bits(m.p.q_elements());
  m.out16.download(std::span<std::uint16_t>(bits));
  for (std::size_t i = 0; i < bits.size(); ++i)
    host[i] = v.fn.dtype == llm::DType::BF16 ? bf16_bits_to_float(bits[i]) : half_bits_to_float(bits[i]);
  return host;
}

llm::TimingStats CudaProblem::time(const AttentionVariant& v, int warmup, int runs) {
  Impl& m = *impl_;
  const AttentionArgs args = m.args_for(v);
  return llm::cuda::time_cuda([&] { v.fn.run(m.p, args); }, warmup, runs, /*flush_l2=*/true);
}

std::unique_ptr<llm::Model> make_cuda_model(const llm::ModelWeights& weights, CudaModelPrefill prefill) {
  llm::cuda::CudaModelOptions options;  // dense cuBLAS products, the default attention kernels
  if (prefill == CudaModelPrefill::Flash1) {
    // Refuse a head the FA1 kernel is not compiled for now, with the list of
    // those it is, rather than after gigabytes of weights went to the GPU.
    const llm::ModelConfig& c = weights.config;
    const AttentionProblem heads{c.n_heads, c.n_kv_heads, c.head_dim(), 1, 1, true};
    if (const char* why = cuda::flash1_unsupported(heads))
      throw llm::InputError(fmt::format("step02 flash prefill (head_dim {}): {}", c.head_dim(), why));
    // Only the prefill changes. The workspace function matters as much as the
    // kernel: the model sizes its attention workspace by asking it, so the
    // O(N^2) score buffer of the default is never allocated.
    options.attention.prefill = &cuda::flash1_prefill;
    options.attention.prefill_workspace = &cuda::flash1_prefill_workspace_floats;
    // decode / decode_workspace stay the model's default,
    // llm::cuda::kernels::split_kv_decode_attention: variant 6's idea grown up
    // (every decode query of the batch in one launch, one block per KV head
    // for its query heads, fp32 and int8 rows).
  }
  const llm::cuda::DeviceStatus status = llm::cuda::device_status();
  if (!status.usable) throw llm::DeviceError("cannot run the CUDA model: " + status.reason);
  return std::make_unique<llm::cuda::CudaModel>(weights, options);
}

}  // namespace step02
