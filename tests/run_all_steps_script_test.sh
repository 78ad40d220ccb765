#!/usr/bin/env bash
# scripts/run_all_steps.sh from a directory other than the repository root
# (a CTest entry; see tests/CMakeLists.txt):
#   1. BUILD_DIR given relative to the current directory finds the steps there;
#   2. without BUILD_DIR the script looks in the repository's build/, not in
#      the current directory's: it lists the steps when that folder holds them,
#      and otherwise says so naming that folder.
# Usage: run_all_steps_script_test.sh REPO_ROOT BUILD_DIR
set -uo pipefail

repo_root=$(cd "$1" && pwd)
build_dir=$(cd "$2" && pwd)
script="$repo_root/scripts/run_all_steps.sh"
elsewhere=$(mktemp -d)
trap 'rm -rf "$elsewhere"' EXIT
cd "$elsewhere" || exit 1
failed=0

# 1. A relative BUILD_DIR, from a directory with no build folder of its own.
relative=$(realpath --relative-to="$elsewhere" "$build_dir")
out=$(BUILD_DIR="$relative" "$script" --list 2>&1)
status=$?
if ((status != 0)) || ! grep -q "step(s) ran and passed" <<<"$out"; then
  echo "FAIL: BUILD_DIR=$relative (relative to $elsewhere): status $status"
  echo "$out"
  failed=1
fi

# 2. No BUILD_DIR: the repository's build/, whatever the current directory.
out=$(env -u BUILD_DIR "$script" --list 2>&1)
status=$?
if ((status != 0)) && ! grep -qF "$repo_root/build" <<<"$out"; then
  echo "FAIL: without BUILD_DIR the script did not look in $repo_root/build: status $status"
  echo "$out"
  failed=1
fi

((failed == 0)) && echo "ok: run_all_steps.sh works from $elsewhere"
exit $failed
