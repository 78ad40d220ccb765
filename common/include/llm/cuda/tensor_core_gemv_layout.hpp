#pragma once
// Where the tensor-core GEMV (HalfGemvKernel::TensorCores, common/cuda/
// half_linear.cu) finds each mma operand, as plain integer functions: the
// kernel calls them (constexpr functions are device functions too in this
// build: --expt-relaxed-constexpr), and a CPU test (tests/
// common_tensor_core_gemv_layout_test.cpp) runs every lane's part of one
// step through the PTX ISA's fragment definition to check that the product
// comes out right. No CUDA types: any C++ file may include it.
//
// The idea. mma.m16n8k16 wants lane (g, t) (lane = 4 g + t) to hold columns
// 2t, 2t+1, 2t+8, 2t+9 of a 16-column tile (common/cuda/mma_fragments.cuh).
// The kernel instead loads 16 contiguous bytes (8 halves) per lane, the way
// a memory-bound kernel wants to load, and tells the mma those are its
// columns: a dot product does not care in which order its columns come, as
// long as the weights (A) and x (B) agree on it. Per step of 64 columns:
//   - lane (g, t) loads vector h (0, 1) of weight rows g and g + 8 and of x
//     row g: columns vector_first_column(t, h) .. + 7;
//   - mma j (0..3) takes vector mma_vector(j), 32-bit words mma_low_word(j)
//     (A registers 0 and 1, B register 0: "columns 2t, 2t+1") and
//     mma_low_word(j) + 1 (A registers 2 and 3, B register 1: "2t+8, 2t+9").
// Over the four mmas each of the step's 64 columns is used once.
namespace llm::cuda::tensor_core_gemv {

inline constexpr int kStepColumns = 64;     // one step of a warp: 4 mmas of k = 16
inline constexpr int kHalvesPerVector = 8;  // one 16-byte load
inline constexpr int kMmasPerStep = kStepColumns / 16;

// The first of the 8 columns (within a step) that lane t's vector h holds,
// for a weight row and an x row alike.
constexpr int vector_first_column(int t, int h) { return h * (kStepColumns / 2) + t * kHalvesPerVector; }

// Which of the lane's two vectors mma j of a step reads ...
constexpr int mma_vector(int j) { return j / 2; }
// ... and its first 32-bit word there (two halves, the lower column in the
// low half); the mma's second register pair is the next word.
constexpr int mma_low_word(int j) { return 2 * (j % 2); }

// Accumulator i (0..3) of lane (g, t) after the mmas of an n-tile: the
// output (of the warp's 16) and the row (of the n-tile's 8) it belongs to.
constexpr int accumulator_output(int g, int i) { return g + 8 * (i / 2); }
constexpr int accumulator_row(int t, int i) { return 2 * t + i % 2; }

}  // namespace llm::cuda::tensor_core_gemv
