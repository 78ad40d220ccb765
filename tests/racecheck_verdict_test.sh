#!/usr/bin/env bash
# scripts/racecheck_verdict.py on racecheck logs: a real one from an H200 run
# (20 hazards, every one inside cuBLAS's nvjet GEMM, all tests passed: PASS),
# and hand-written ones for what must fail: a hazard with one access in a
# course kernel (also one whose template arguments name a library), the
# sanitizer's own internal error, a failed test, a crash without a failed
# test, a run without gtest's PASSED line or without its summary, a summary
# counting more hazards than the log shows, a hazard with one access shown.
# Usage: racecheck_verdict_test.sh <repository root>
set -euo pipefail
root=$1
script=$root/scripts/racecheck_verdict.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# expect <PASS|FAIL> <text the verdict must contain> <log>
expect() {
  local want=$1 text=$2 log=$3 got rc=0
  got=$(python3 "$script" "$log") || rc=$?
  local want_rc=0
  [[ $want == FAIL ]] && want_rc=1
  if [[ $got != "$want: "* || $got != *"$text"* || $rc != "$want_rc" ]]; then
    echo "FAILED on $(basename "$log"): want $want (exit $want_rc) with '$text', got exit $rc: $got" >&2
    failures=$((failures + 1))
  fi
}

gtest_ok() {
  echo "[ RUN      ] Shapes/HalfGemvFusions.Case/fp16"
  echo "[       OK ] Shapes/HalfGemvFusions.Case/fp16 (12 ms)"
  echo "[  PASSED  ] 1 test."
}
library_hazard() {
  echo "========= Error: Race reported between Read access at nvjet_sm90_hss_64x8_64x16_2x4_h_bz_TNT+0xb00"
  echo "=========     and Write access at nvjet_sm90_hss_64x8_64x16_2x4_h_bz_TNT+0x2840 [64 hazards]"
  echo "========= "
}

expect PASS "20 inside library kernels" \
  "$root/docs/results/gpu_decode/h200_int4_gemv_check/racecheck_common_half_linear_gpu_test.log"

{ echo "========= COMPUTE-SANITIZER"; gtest_ok
  echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"; } >"$work/clean.log"
expect PASS "0 hazards" "$work/clean.log"

# The older location form ("at 0x.. in kernel"), a warning, still a library kernel.
{ echo "========= COMPUTE-SANITIZER"
  echo "========= Warning: Race reported between Write access at 0x1a0 in cublasLt::splitKreduce_kernel"
  echo "=========     and Read access at 0x2c0 in cublasLt::splitKreduce_kernel [4 hazards]"
  gtest_ok
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)"; } >"$work/old_form.log"
expect PASS "1 inside library kernels" "$work/old_form.log"

# cuBLAS's xmma kernels start with the architecture.
{ echo "========= COMPUTE-SANITIZER"
  echo "========= Error: Race reported between Read access at sm90_xmma_gemm_f16f16_f32_tn_n_tilesize64x64x64+0x40"
  echo "=========     and Write access at sm90_xmma_gemm_f16f16_f32_tn_n_tilesize64x64x64+0x80 [8 hazards]"
  gtest_ok
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; } >"$work/xmma.log"
expect PASS "1 inside library kernels" "$work/xmma.log"

# A course kernel whose template argument names a library is still the course's.
{ echo "========= COMPUTE-SANITIZER"
  echo "========= Error: Race reported between Read access at void llm::cuda::product<nvjet_like>(float *)+0x40"
  echo "=========     and Write access at void llm::cuda::product<nvjet_like>(float *)+0x80 [2 hazards]"
  gtest_ok
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; } >"$work/template.log"
expect FAIL "in the course's kernels: void llm::cuda::product<nvjet_like>(float *)" "$work/template.log"

{ echo "========= COMPUTE-SANITIZER"; library_hazard
  echo "========= Error: Race reported between Write access at void llm::gemv<(int)2>(float *)+0x120"
  echo "=========     and Read access at nvjet_sm90_hss_64x8_64x16_2x4_h_bz_TNT+0x40 [2 hazards]"
  gtest_ok
  echo "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)"; } >"$work/course.log"
expect FAIL "1 hazard(s) in the course's kernels: void llm::gemv<(int)2>(float *)" \
  "$work/course.log"

{ echo "========= COMPUTE-SANITIZER"
  echo "========= Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception."
  echo "[  FAILED  ] Shapes/HalfGemvFusions.Case/fp16 (3571 ms)"
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; } >"$work/internal.log"
expect FAIL "the sanitizer failed itself" "$work/internal.log"

{ echo "========= COMPUTE-SANITIZER"; library_hazard
  echo "[  FAILED  ] Shapes/HalfGemvFusions.Case/fp16 (12 ms)"
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; } >"$work/failed_test.log"
expect FAIL "failed under racecheck" "$work/failed_test.log"

# A crash gtest never reports as a failed test.
{ echo "========= COMPUTE-SANITIZER"; library_hazard; echo "[ RUN      ] Shapes/HalfGemvFusions.Case/fp16"
  echo "========= Program hit cudaErrorIllegalAddress (error 700) due to \"an illegal memory access\" on CUDA API call"
  echo "========= Target application returned an error"
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; } >"$work/crash.log"
expect FAIL "the program failed under racecheck" "$work/crash.log"

{ echo "========= COMPUTE-SANITIZER"; library_hazard; echo "[ RUN      ] Shapes/HalfGemvFusions.Case/fp16"
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; } >"$work/no_passed_line.log"
expect FAIL "no gtest [  PASSED  ] line" "$work/no_passed_line.log"

# A hazard whose second access is not on a line of its own: judged by neither.
{ echo "========= COMPUTE-SANITIZER"
  echo "========= Error: Race reported between Read access at nvjet_a+0x10 and Write access at void k()+0x20"
  gtest_ok
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; } >"$work/one_access.log"
expect FAIL "without both of their accesses" "$work/one_access.log"

{ echo "========= COMPUTE-SANITIZER"; library_hazard; echo "[ RUN      ] Shapes/HalfGemvFusions.Case/fp16"; } \
  >"$work/unfinished.log"
expect FAIL "no RACECHECK SUMMARY" "$work/unfinished.log"

{ echo "========= COMPUTE-SANITIZER"; library_hazard; gtest_ok
  echo "========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)"; } >"$work/hidden.log"
expect FAIL "the summary counts 3 hazards, the log shows 1" "$work/hidden.log"

rc=0
python3 "$script" "$work/no_such.log" >/dev/null 2>&1 || rc=$?
if ((rc != 2)); then
  echo "FAILED: an unreadable log should exit 2, got $rc" >&2
  failures=$((failures + 1))
fi

((failures == 0)) || exit 1
echo "racecheck_verdict.py: every verdict as expected"
