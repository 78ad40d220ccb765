#!/usr/bin/env bash
# Runs every step executable that has been built, in teaching order, and
# prints each step's results table. Arguments are passed to every step
# (e.g. --quick, --full, --device cpu). With RESULTS_DIR set, each step also
# writes its JSON there as <step>.json.
#
# Works from any current directory: the build folder is the repository's
# build/ unless BUILD_DIR names another (a relative BUILD_DIR is taken from the
# current directory, as any path typed on the command line).
#
#   scripts/run_all_steps.sh                 # default runs: each step a few seconds, under 1 GB
#   scripts/run_all_steps.sh --quick         # seconds per step (what CI runs)
#   scripts/run_all_steps.sh --full          # the complete sweeps the docs quote (minutes, up to ~5 GiB)
#   BUILD_DIR=build-release scripts/run_all_steps.sh
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${BUILD_DIR:-$repo_root/build}
# Absolute from here on, so every message names the folder it looked in.
if [[ -d "$build_dir" ]]; then
  build_dir=$(cd "$build_dir" && pwd)
else
  echo "no build folder $build_dir (build first: cmake -S $repo_root -B $build_dir && cmake --build $build_dir -j;" \
    "or set BUILD_DIR)" >&2
  exit 1
fi
shopt -s nullglob
ran=0
failed=()
# A step is a folder stepNN_name whose executable has the same name.
for step_dir in "$repo_root"/step[0-9][0-9]_*/; do
  name=$(basename "$step_dir")
  exe="$build_dir/bin/$name"
  if [[ ! -x "$exe" ]]; then
    echo "missing executable $exe (build first: cmake --build $build_dir -j)" >&2
    failed+=("$name")
    continue
  fi
  echo
  echo "################ $name $* ################"
  json_args=()
  if [[ -n "${RESULTS_DIR:-}" ]]; then
    mkdir -p "$RESULTS_DIR"
    json_args=(--json "$RESULTS_DIR/$name.json")
  fi
  if "$exe" "$@" "${json_args[@]}"; then
    ran=$((ran + 1))
  else
    failed+=("$name")
  fi
done

if ((ran == 0 && ${#failed[@]} == 0)); then
  echo "no step executables found in $build_dir/bin (build first: cmake --build $build_dir -j)" >&2
  exit 1
fi
echo
if ((${#failed[@]})); then
  echo "steps that failed: ${failed[*]}" >&2
  exit 1
fi
echo "all $ran step(s) ran and passed their checks"
