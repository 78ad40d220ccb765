#pragma once
// The one tensor-core product every tensor-core kernel of the course uses
// (step 02's FlashAttention-2 kernels, step 06's quantized products, the
// half-precision GEMV of half_linear.cu): mma.sync on a 16 x 8 x 16 tile,
// 16-bit inputs, fp32 accumulators. CUDA translation units only.
//
// The fragment layouts (PTX ISA, "mma.m16n8k16"), for lane = 4 g + t
// (g = lane / 4 in 0..7, t = lane % 4 in 0..3), each register holding two
// 16-bit values (the first of the pair in the low half):
//   A (16 x 16, row-major)  a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//                           a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col")       b0 = B[2t, 2t+1][g]       b1 = B[2t+8, 2t+9][g]
//   D (16 x 8, fp32)        d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// Each element of D is its own dot product over the 16 k: a column of D
// does not depend on what the other columns of B hold.
//
// sm_75 (T4) has no m16n8k16 for fp16 but has m16n8k8: one k16 product is
// two k8 products on the two halves of the A and B registers (the same
// layouts). bf16 needs sm_80: below that the bf16 form traps, and every host
// that launches a kernel using it checks first that the kernel was compiled
// for sm_80 or later.
#include <cuda_runtime.h>

#include <cstdint>

namespace llm::cuda::device {

// D = A B + D on one 16 x 8 x 16 tile; A and B are fp16 (kBf16 false) or
// bf16 (true) bit patterns, D fp32.
template <bool kBf16>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                            std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  if constexpr (kBf16) {
    __trap();  // never launched: the host checks the kernel was compiled for sm_80+
  } else {
    // k = 0..7: A registers 0 and 1 (columns 2t, 2t+1 of rows g, g+8), B register 0.
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    // k = 8..15: A registers 2 and 3, B register 1.
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
  }
#else
  // Host pass, or a GPU older than sm_75: the kernel is never launched there.
  (void)d; (void)a; (void)b0; (void)b1;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif
}

// 32-bit word w (0..3) of a 16-byte vector: two 16-bit values, the lower
// address in the low half. w is a compile-time constant after unrolling, so
// this is a register, not a load.
__device__ __forceinline__ std::uint32_t word_of(const uint4& vector, int w) {
  return w == 0 ? vector.x : w == 1 ? vector.y : w == 2 ? vector.z : vector.w;
}

}  // namespace llm::cuda::device
