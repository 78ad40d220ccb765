#pragma once
// Step 02's CUDA variants, declared without CUDA types so variants.cpp (plain
// C++) can list them. Defined in the .cu files of this folder, which are only
// compiled when the build has CUDA (LLM_WITH_CUDA). Every pointer in
// AttentionArgs is device memory; the work is queued on args.stream and
// every launch is checked (llm::DeviceError on failure).
#include <cstddef>

#include "step02_flash_attention/attention_problem.hpp"
#include "step02_flash_attention/kernel_image.hpp"

namespace step02::cuda {

// Variant 2 (v2_cuda_naive_attention.cu): S = QK^T/sqrt(d) for all heads in
// global memory (workspace), a softmax kernel over each row, then O = P V.
void naive_attention(const AttentionProblem& p, const AttentionArgs& args);
std::size_t naive_workspace_bytes(const AttentionProblem& p);  // n_heads * Sq * Sk floats

// Variant 3 (v3_cuda_flash1.cu): fp32, one thread per query row, K/V tiles in
// shared memory, online softmax, output renormalized every tile (FA1). Also
// the CUDA model's prefill hook (cuda_model_hooks.hpp: flash1_prefill).
void flash1_attention(const AttentionProblem& p, const AttentionArgs& args);
// nullptr when flash1_attention takes p, else why not: it is compiled for
// more head dims than the other fused kernels (down to the `tiny` preset's 8).
const char* flash1_unsupported(const AttentionProblem& p);

// Variants 4 and 5 (v4_v5_cuda_flash2_mma.cu): fp16 / bf16 inputs (args.q16, k16,
// v16), tensor-core mma.sync with fp32 accumulation, four warps per block
// each owning 16 query rows (FA2).
void flash2_fp16_attention(const AttentionProblem& p, const AttentionArgs& args);
void flash2_bf16_attention(const AttentionProblem& p, const AttentionArgs& args);
// The oldest architecture whose mma.sync each of them uses exists on (the
// variants table and the kernels' own launch check both read these):
// fp16 m16n8k8 from sm_75 (Turing), bf16 m16n8k16 from sm_80 (Ampere).
inline constexpr int kFlash2Fp16MinComputeCapability = 75;
inline constexpr int kFlash2Bf16MinComputeCapability = 80;
// What their kernels were compiled for, on the current GPU (cudaFuncGetAttributes;
// {0, 0} when the build holds no image for it). Each call of the two
// functions above checks it first: DeviceError rather than a trap.
KernelImage flash2_fp16_kernel_image();
KernelImage flash2_bf16_kernel_image();

// Variants 7 to 16 (v7_v16_cuda_flash2_tuned.cu): variant 4 plus one change
// each, cumulative. 7: K/V double-buffered with cp.async; 8: ldmatrix
// fragments; 9: 128 query rows per block (32 per warp); 10: the mask only on
// diagonal tiles, heaviest query blocks first; 11 (fp16) and 12 (bf16):
// 16-bit output, written to args.out16 instead of args.out; 13: the softmax
// in one FFMA and one MUFU.EX2 per score; 14: O rescaled only when a row's
// new max shrinks P by more than 2^8; 15 (fp16) and 16 (bf16): each thread's
// cp.async addresses computed once.
void flash2_async_copy_attention(const AttentionProblem& p, const AttentionArgs& args);
void flash2_ldmatrix_attention(const AttentionProblem& p, const AttentionArgs& args);
void flash2_128_rows_attention(const AttentionProblem& p, const AttentionArgs& args);
void flash2_causal_schedule_attention(const AttentionProblem& p, const AttentionArgs& args);
void flash2_tuned_fp16_attention(const AttentionProblem& p, const AttentionArgs& args);
void flash2_tuned_bf16_attention(const AttentionProblem& p, const AttentionArgs& args);
void flash2_fast_softmax_attention(const AttentionProblem& p, const AttentionArgs& args);
void flash2_lazy_rescale_attention(const AttentionProblem& p, const AttentionArgs& args);
void flash2_hoisted_copies_fp16_attention(const AttentionProblem& p, const AttentionArgs& args);
void flash2_hoisted_copies_bf16_attention(const AttentionProblem& p, const AttentionArgs& args);
// cp.async exists from sm_80 (Ampere): all ten need it, fp16 as well as bf16.
inline constexpr int kFlash2TunedMinComputeCapability = 80;
KernelImage flash2_tuned_kernel_image();  // as flash2_fp16_kernel_image, for all ten

// Variant 6 (v6_cuda_split_kv_decode.cu): Flash-Decoding. Each (query, head) is
// split over several blocks along the keys; each writes a partial (m, l, o)
// to the workspace and a second kernel reduces them. Reads K/V through the
// KvView (so a paged cache works too). Made for seqlen_q = 1, correct for any.
void split_kv_decode_attention(const AttentionProblem& p, const AttentionArgs& args);
std::size_t split_kv_workspace_bytes(const AttentionProblem& p);
int split_kv_splits(const AttentionProblem& p);  // how many key splits it uses for p

// Variants 4-12 are compiled for head dims 64 and 128 only (templates).
const char* fused_unsupported(const AttentionProblem& p);

}  // namespace step02::cuda
