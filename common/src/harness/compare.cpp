#include "llm/harness/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace llm {

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::F32: return {1e-5, 1e-4};
    case DType::F16: return {1e-3, 1e-2};
    case DType::BF16: return {4e-3, 3e-2};
  }
  return {0.0, 0.0};
}

Tolerance model_logits_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F32: return {1e-4, 1e-4};
    case DType::F16: return {2e-2, 2e-2};
    // bf16's rounding step (2^-8) is 8x fp16's: a whole model with bf16
    // weights moved random-weight presets' logits past 5e-2 on the GPU (the
    // CUDA model's half-precision test measures it against the same model
    // with the weights rounded on the host, which is tight).
    case DType::BF16: return {1e-1, 1e-1};
  }
  return {0.0, 0.0};
}

Tolerance same_rounding_logits_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F32: return model_logits_tolerance(DType::F32);
    case DType::F16: return {1e-2, 1e-2};
    case DType::BF16: return {5e-2, 5e-2};
  }
  return {0.0, 0.0};
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "fp32";
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
  }
  return "?";
}

CompareResult compare(std::span<const float> got, std::span<const float> ref, Tolerance tol) {
  CompareResult r;
  r.size_mismatch = got.size() != ref.size();
  r.count = std::min(got.size(), ref.size());
  double worst_excess = -1.0;
  double max_ref = 0.0;
  for (std::size_t i = 0; i < r.count; ++i) {
    const double g = got[i], e = ref[i];
    if (!std::isfinite(g) || !std::isfinite(e)) {
      // A NaN compares false with everything: count it explicitly, or it
      // would slip through every "err > tol" test.
      if (r.nan_or_inf == 0) r.worst_index = i;
      ++r.nan_or_inf;
      worst_excess = INFINITY;
      continue;
    }
    const double abs_err = std::fabs(g - e);
    r.max_abs_err = std::max(r.max_abs_err, abs_err);
    max_ref = std::max(max_ref, std::fabs(e));
    const double allowed = tol.abs_tol + tol.rel_tol * std::fabs(e);
    if (abs_err > allowed) ++r.over_tolerance;
    if (r.nan_or_inf == 0 && abs_err - allowed > worst_excess) {
      worst_excess = abs_err - allowed;
      r.worst_index = i;
    }
  }
  // Relative to the largest reference value (an infinity-norm relative
  // error): element-wise relative errors of values near zero are noise.
  r.max_rel_err = r.nan_or_inf ? INFINITY : r.max_abs_err / std::max(max_ref, 1e-30);
  r.ok = !r.size_mismatch && r.count > 0 && r.over_tolerance == 0 && r.nan_or_inf == 0;
  return r;
}

CompareResult compare_tokens(std::span<const int> got, std::span<const int> ref) {
  CompareResult r;
  r.size_mismatch = got.size() != ref.size();
  r.count = std::min(got.size(), ref.size());
  bool first = true;
  for (std::size_t i = 0; i < r.count; ++i) {
    if (got[i] != ref[i]) {
      if (first) r.worst_index = i;  // the first divergence is what matters
      first = false;
      ++r.over_tolerance;
    }
  }
  r.max_abs_err = static_cast<double>(r.over_tolerance);
  r.ok = !r.size_mismatch && r.over_tolerance == 0;
  return r;
}

NearTie near_tie(std::span<const float> row, int chosen, int other, Tolerance tol) {
  NearTie tie;
  const auto inside = [&row](int id) { return id >= 0 && static_cast<std::size_t>(id) < row.size(); };
  if (!inside(chosen) || !inside(other)) return tie;
  tie.chosen_logit = row[static_cast<std::size_t>(chosen)];
  tie.other_logit = row[static_cast<std::size_t>(other)];
  tie.gap = tie.chosen_logit - tie.other_logit;
  tie.limit = 2.0 * (tol.abs_tol + tol.rel_tol * std::max(std::fabs(tie.chosen_logit), std::fabs(tie.other_logit)));
  tie.swappable = tie.gap <= tie.limit;  // false for NaN
  return tie;
}

std::string CompareResult::summary() const {
  return fmt::format("{} | n={} max_abs={:.3e} max_rel={:.3e} over_tol={} nan/inf={} worst_index={}{}",
                     ok ? "ok" : "MISMATCH", count, max_abs_err, max_rel_err, over_tolerance, nan_or_inf,
                     worst_index, size_mismatch ? " (sizes differ)" : "");
}

}  // namespace llm
