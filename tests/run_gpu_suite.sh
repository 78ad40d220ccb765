#!/usr/bin/env bash
# Runs one gpu test suite (a tests/*_gpu_test binary, every case in one
# process) for CTest, and exits 77, which CTest reports as "skipped", when
# the suite passed with every case skipped: no usable GPU, so nothing ran
# (tests/test_support.hpp says when a gpu case skips and when it fails). A
# suite with any failing case exits non-zero as the binary does; one with a
# case that passed exits 0. Extra arguments go to the binary (--gtest_filter).
#   run_gpu_suite.sh BINARY [ARGS...]
set -uo pipefail
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
((status != 0)) && exit "$status"
# GoogleTest's summary when every case skipped: "[  PASSED  ] 0 tests."
grep -q '^\[  PASSED  \] 0 tests\.$' <<<"$output" && grep -q '^\[  SKIPPED \] ' <<<"$output" && exit 77
exit 0
