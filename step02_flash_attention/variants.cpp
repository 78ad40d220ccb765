#include "step02_flash_attention/variants.hpp"

#include <fmt/format.h>

#include "llm/errors.hpp"
#include "step02_flash_attention/cpu_attention.hpp"
#include "step02_flash_attention/cuda_attention.hpp"

namespace step02 {
namespace {

// A CUDA row's function, or nullptr in a build without CUDA (the row still
// shows in --list and says why it does not run).
#if defined(LLM_WITH_CUDA)
#define STEP02_CUDA(fn) (fn)
#else
#define STEP02_CUDA(fn) nullptr
#endif

std::size_t no_bytes(const AttentionProblem&) { return 0; }

// A row of the FlashAttention-2 ladder (variants 7-16): 16-bit inputs, sm_80+
// (cp.async), head dims 64 and 128, no workspace.
AttentionKernel tuned(AttentionFn run, llm::DType dtype, bool writes_16bit_output) {
  return {run,     dtype,   cuda::kFlash2TunedMinComputeCapability,  false, nullptr, &no_bytes,
          STEP02_CUDA(&cuda::fused_unsupported), STEP02_CUDA(&cuda::flash2_tuned_kernel_image), writes_16bit_output};
}
AttentionKernel tuned_fp16(AttentionFn run) { return tuned(run, llm::DType::F16, false); }

}  // namespace

const std::vector<AttentionVariant>& variants() {
  using llm::Backend;
  using llm::DType;
  static const std::vector<AttentionVariant> table = {
      {0, "cpu_naive", "materialize S = QK^T/sqrt(d) [Sq x Sk], mask, softmax, P V (Eigen products)", Backend::Cpu,
       {&cpu::naive_attention, DType::F32, 0, false, nullptr, &cpu::naive_score_bytes, nullptr}},
      {1, "cpu_flash", "tiles of Br x Bc, online softmax (running max/sum, rescale); S never stored", Backend::Cpu,
       {&cpu::flash_attention, DType::F32, 0, false, nullptr, &cpu::flash_score_bytes, nullptr}},
      {2, "cuda_naive", "S and P for all heads in global memory; scores, softmax, P V kernels", Backend::Cuda,
       {STEP02_CUDA(&cuda::naive_attention), DType::F32, 0, false, STEP02_CUDA(&cuda::naive_workspace_bytes),
        STEP02_CUDA(&cuda::naive_workspace_bytes), nullptr}},
      {3, "cuda_flash1", "FA1: K/V tiles in shared memory, online softmax, thread per query row, fp32",
       Backend::Cuda,
       {STEP02_CUDA(&cuda::flash1_attention), DType::F32, 0, false, nullptr, &no_bytes,
        STEP02_CUDA(&cuda::flash1_unsupported)}},
      {4, "cuda_flash2_fp16", "FA2: 4 warps x 16 query rows, mma.sync tensor cores, fp16 in, fp32 accumulate",
       Backend::Cuda,
       {STEP02_CUDA(&cuda::flash2_fp16_attention), DType::F16, cuda::kFlash2Fp16MinComputeCapability, false, nullptr,
        &no_bytes, STEP02_CUDA(&cuda::fused_unsupported), STEP02_CUDA(&cuda::flash2_fp16_kernel_image)}},
      {5, "cuda_flash2_bf16", "FA2 in bf16 (range of fp32, 8-bit mantissa); needs sm_80+", Backend::Cuda,
       {STEP02_CUDA(&cuda::flash2_bf16_attention), DType::BF16, cuda::kFlash2Bf16MinComputeCapability, false, nullptr,
        &no_bytes, STEP02_CUDA(&cuda::fused_unsupported), STEP02_CUDA(&cuda::flash2_bf16_kernel_image)}},
      {6, "cuda_split_kv_decode", "Flash-Decoding: keys split over blocks, partial (m, l, o) reduced", Backend::Cuda,
       {STEP02_CUDA(&cuda::split_kv_decode_attention), DType::F32, 0, true,
        STEP02_CUDA(&cuda::split_kv_workspace_bytes), STEP02_CUDA(&cuda::split_kv_workspace_bytes),
        STEP02_CUDA(&cuda::fused_unsupported)}},
      // The FlashAttention-2 ladder: each row is the row before it plus one change.
      {7, "cuda_flash2_async", "variant 4 + K/V tiles double-buffered with cp.async (tile j+1 loads during tile j)",
       Backend::Cuda, tuned_fp16(STEP02_CUDA(&cuda::flash2_async_copy_attention))},
      {8, "cuda_flash2_ldmatrix", "+ Q/K fragments by ldmatrix, V by ldmatrix.trans (no hand-packed V)",
       Backend::Cuda, tuned_fp16(STEP02_CUDA(&cuda::flash2_ldmatrix_attention))},
      {9, "cuda_flash2_128rows", "+ 128 query rows per block, 32 per warp: each K/V fragment feeds two mma",
       Backend::Cuda, tuned_fp16(STEP02_CUDA(&cuda::flash2_128_rows_attention))},
      {10, "cuda_flash2_causal", "+ mask only the tiles on the diagonal; heaviest query blocks first",
       Backend::Cuda, tuned_fp16(STEP02_CUDA(&cuda::flash2_causal_schedule_attention))},
      {11, "cuda_flash2_tuned_fp16", "+ fp16 output (what the next product reads): the scheduling rungs' end",
       Backend::Cuda, tuned(STEP02_CUDA(&cuda::flash2_tuned_fp16_attention), DType::F16, true)},
      {12, "cuda_flash2_tuned_bf16", "variant 11 in bf16: bf16 in, bf16 out", Backend::Cuda,
       tuned(STEP02_CUDA(&cuda::flash2_tuned_bf16_attention), DType::BF16, true)},
      // Three more rungs on variant 11, found by counting its instructions.
      {13, "cuda_flash2_fast_softmax", "+ per score one FFMA (scale folded in) and one MUFU.EX2 (no exp2f fix-up)",
       Backend::Cuda, tuned(STEP02_CUDA(&cuda::flash2_fast_softmax_attention), DType::F16, true)},
      {14, "cuda_flash2_lazy_rescale", "+ O rescaled only when a row's new max shrinks P by more than 2^8",
       Backend::Cuda, tuned(STEP02_CUDA(&cuda::flash2_lazy_rescale_attention), DType::F16, true)},
      {15, "cuda_flash2_hoisted_copies_fp16", "+ cp.async addresses computed once per thread: the ladder's last rung",
       Backend::Cuda, tuned(STEP02_CUDA(&cuda::flash2_hoisted_copies_fp16_attention), DType::F16, true)},
      {16, "cuda_flash2_hoisted_copies_bf16", "variant 15 in bf16: bf16 in, bf16 out", Backend::Cuda,
       tuned(STEP02_CUDA(&cuda::flash2_hoisted_copies_bf16_attention), DType::BF16, true)},
  };
  return table;
}

const AttentionVariant& find_variant(int id) {
  for (const auto& v : variants())
    if (v.id == id) return v;
  throw llm::InputError(fmt::format("step 02 has no variant {}", id));
}

int naive_id_for(llm::Backend backend) { return backend == llm::Backend::Cuda ? 2 : 0; }

}  // namespace step02
