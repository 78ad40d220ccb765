#!/usr/bin/env bash
# Every CTest name, and every case name of a gpu suite, must be short and the
# same on every build (a CTest entry; see tests/CMakeLists.txt). GoogleTest prints a test parameter it has no
# printer for as its raw bytes ("72-byte object <10-9E 53-CE ...>"), heap
# addresses included, and test discovery puts that text into the name: a name
# that changes with every build cannot be selected with -R, compared between
# runs or quoted in an issue. A PrintTo beside the parameter's type fixes it.
# Usage: stable_test_names_test.sh CTEST_COMMAND BUILD_DIR
set -uo pipefail

names=$("$1" --test-dir "$2" -N) || { echo "FAIL: ctest -N failed"; exit 1; }
# A gpu suite is one CTest entry (tests/CMakeLists.txt): its cases' names come
# from the binary, as --gtest_filter selects them.
for suite in "$2"/bin/*_gpu_test; do
  [[ -x $suite ]] || continue
  cases=$("$suite" --gtest_list_tests) || { echo "FAIL: $suite --gtest_list_tests failed"; exit 1; }
  names+=$'\n'$(sed 's/^/  Test #0: /' <<<"$cases")
done
count=$(grep -c '^ *Test *#' <<<"$names")
unstable=$(grep -E -- '-byte object|0x[0-9a-fA-F]{6,}' <<<"$names")
if [[ -n $unstable ]]; then
  echo "FAIL: $(wc -l <<<"$unstable") of $count test names print a parameter's raw bytes or an address:"
  head -5 <<<"$unstable"
  exit 1
fi
echo "all $count test names are stable"
