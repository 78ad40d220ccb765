#pragma once
// The one checker: compare(got, ref) measures how far a result is from the
// reference and never exits, so a table can show a failing row beside the rest.
#include <cstddef>
#include <span>
#include <string>

namespace llm {

// Tolerances per data type, in one place. An element passes when
//   |got - ref| <= abs_tol + rel_tol * |ref|.
// fp32: products and sums in a different order (Eigen vs loops, cuBLAS vs CPU,
//       tiled vs whole-row softmax) differ by a few ulps per add; over the depth
//       of a model that stays far below 1e-4 relative.
// fp16: 10-bit mantissa (rel. step ~1e-3); with fp32 accumulation errors stay
//       around 1e-3..1e-2 of the value.
// bf16: 7-bit mantissa (rel. step ~8e-3).
// int8 / int4 (quantized weights): not element-wise comparable; steps judge
//       them by KL divergence and top-1 agreement instead.
enum class DType { F32, F16, BF16 };

struct Tolerance {
  double abs_tol;
  double rel_tol;
};
Tolerance tolerance_for(DType dtype);
// End-to-end logits of a whole model (every layer's rounding compounds, and
// logits are O(1..10)): fp32 within 1e-4 absolute + 1e-4 relative; fp16 and
// bf16 weights within 2e-2 and 1e-1 (absolute and relative).
Tolerance model_logits_tolerance(DType dtype);
// Two computations of one model's logits that round the same values alike
// but add them in another order: a row alone and the same row in a batch on
// the GPU (cuBLAS picks its kernel by the row count; the half model's
// products leave its GEMV past --max-gemv-rows, 1 by default), or the CUDA
// half model and the CPU model rounding its products' inputs the same way.
// In fp32 the sums' order moves logits far less than fp32's 1e-4. With
// fp16/bf16 products each such last-bit difference may move an input's
// rounding to the half type by one step (2^-11 of the value for fp16, 2^-8
// for bf16), and through the layers these add up to far more than fp32's
// order does (measured: docs/results/gpu_decode/README.md): half of
// model_logits_tolerance's half rows, fp16 1e-2 and bf16 5e-2 (absolute and
// relative).
Tolerance same_rounding_logits_tolerance(DType dtype);
const char* dtype_name(DType dtype);

struct CompareResult {
  std::size_t count = 0;           // elements compared
  double max_abs_err = 0.0;        // max |got - ref|
  double max_rel_err = 0.0;        // max |got - ref| / max |ref| (norm-relative; inf with NaN)
  std::size_t worst_index = 0;     // index of the element furthest over tolerance
  std::size_t over_tolerance = 0;  // elements outside abs_tol + rel_tol * |ref|
  std::size_t nan_or_inf = 0;      // non-finite values in got (or in ref)
  bool size_mismatch = false;
  bool ok = false;                 // sizes equal, nothing over tolerance, no NaN/Inf

  std::string summary() const;     // one line for logs and test failures
};

CompareResult compare(std::span<const float> got, std::span<const float> ref, Tolerance tol);
// Exact comparison of token sequences (greedy generation must agree exactly).
CompareResult compare_tokens(std::span<const int> got, std::span<const int> ref);

// Whether two greedy choices from one logits row can both be honest: `row`
// [vocab] is one computation of the row, whose greedy token is `chosen`;
// another computation of the same row, within `tol` of this one (e.g. the
// same row in a forward of other rows, same_rounding_logits_tolerance),
// chose `other`. Each logit may move by up to its tolerance, in opposite
// directions, so that can happen only when
//   row[chosen] - row[other] <= 2 (abs_tol + rel_tol x the larger |logit|).
// A token outside the row is never a near-tie.
struct NearTie {
  bool swappable = false;  // the gap is within what two rows within `tol` can swap
  double chosen_logit = 0.0, other_logit = 0.0;
  double gap = 0.0;        // chosen_logit - other_logit
  double limit = 0.0;      // the largest gap two rows within `tol` can swap
};
NearTie near_tie(std::span<const float> row, int chosen, int other, Tolerance tol);

}  // namespace llm
