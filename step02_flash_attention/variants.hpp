#pragma once
// Step 02's variant table (llm.c dev/cuda style): every implementation once,
// with its id, name and one line of what changed. The executable (--list,
// --variant), the tests and the benchmark all read this table.
//
//   id  name                 device  what changed
//    0  cpu_naive            CPU     materialize S = QK^T/sqrt(d), mask, softmax, P V (Eigen products)
//    1  cpu_flash            CPU     tiled Br x Bc, online softmax (running max/sum, rescaling); no S
//    2  cuda_naive           CUDA    S and P in global memory: three kernels
//    3  cuda_flash1          CUDA    FA1 style: K/V tiles in shared memory, online softmax, fp32
//    4  cuda_flash2_fp16     CUDA    FA2 style: warps split queries, tensor-core mma, fp16 in / fp32 accumulate
//    5  cuda_flash2_bf16     CUDA    the same in bf16 (sm_80+, and a build compiled for sm_80+)
//    6  cuda_split_kv_decode CUDA    Flash-Decoding: one query, the cache split across blocks, partials reduced
//    7  cuda_flash2_async      CUDA  variant 4 + K/V tiles double-buffered with cp.async (sm_80+, as 8-16)
//    8  cuda_flash2_ldmatrix   CUDA  + fragments by ldmatrix / ldmatrix.trans
//    9  cuda_flash2_128rows    CUDA  + 128 query rows per block, 32 per warp
//   10  cuda_flash2_causal     CUDA  + the mask on diagonal tiles only, heaviest query blocks first
//   11  cuda_flash2_tuned_fp16 CUDA  + fp16 output
//   12  cuda_flash2_tuned_bf16 CUDA  the same in bf16
//   13  cuda_flash2_fast_softmax        CUDA  + one FFMA and one MUFU.EX2 per score
//   14  cuda_flash2_lazy_rescale        CUDA  + O rescaled only when a row's new max shrinks P by more than 2^8
//   15  cuda_flash2_hoisted_copies_fp16 CUDA  + cp.async addresses computed once per thread
//   16  cuda_flash2_hoisted_copies_bf16 CUDA  the same in bf16
//
// Speedups are against the same device's naive row (0 on the CPU, 2 on CUDA).
#include <cstddef>
#include <vector>

#include "llm/harness/compare.hpp"
#include "llm/harness/variant.hpp"
#include "step02_flash_attention/attention_problem.hpp"
#include "step02_flash_attention/kernel_image.hpp"

namespace step02 {

using AttentionFn = void (*)(const AttentionProblem& p, const AttentionArgs& args);
using BytesFn = std::size_t (*)(const AttentionProblem& p);
// nullptr when the variant handles the problem, else why not (head_dim, ...).
using UnsupportedFn = const char* (*)(const AttentionProblem& p);
// The compiled kernel's architecture on the current GPU (kernel_image.hpp).
using KernelImageFn = KernelImage (*)();

struct AttentionKernel {
  AttentionFn run = nullptr;        // nullptr: not in this build (a CUDA row of a CPU-only build)
  llm::DType dtype = llm::DType::F32;  // precision of Q/K/V it reads (accumulation is fp32 everywhere)
  int min_compute_capability = 0;   // CUDA rows: oldest GPU it runs on (75 = T4, 80 = A100, 90 = H100)
  bool for_decode = false;          // made for one query per sequence (the prefill table leaves it out)
  BytesFn workspace_bytes = nullptr;  // scratch the caller allocates and passes as args.workspace (none if null)
  BytesFn score_bytes = nullptr;      // memory outside registers/shared memory holding scores or softmax stats
  UnsupportedFn unsupported = nullptr;
  // Rows with a min_compute_capability (a tensor-core mma): what the build's
  // kernel was compiled for, which decides whether the row runs on this GPU
  // (tensor_core_unavailable), not the card's compute capability alone.
  KernelImageFn kernel_image = nullptr;
  // The output is written in `dtype` to args.out16 (fp16/bf16 bits), not as
  // fp32 to args.out: what a model's next product reads.
  bool writes_16bit_output = false;
};

using AttentionVariant = llm::Variant<AttentionKernel>;

const std::vector<AttentionVariant>& variants();
const AttentionVariant& find_variant(int id);  // throws InputError for an unknown id
// The baseline a row's speedup is measured against: 0 for CPU rows, 2 for CUDA rows.
int naive_id_for(llm::Backend backend);

}  // namespace step02
