#!/usr/bin/env bash
# Runs the fuzz targets of a sanitize build, each for a bounded time from its
# seed corpus (fuzz/corpus/<target>/) into a scratch corpus under the build
# folder, and exits 1 if any target found a crash, a leak, undefined
# behaviour, an escaped exception or an oversized allocation (the input is
# saved as BUILD_DIR/fuzz/artifacts/<target>-crash-*, the report is printed).
#   fuzz/run.sh [--build-dir DIR] [--seconds N] [--jobs J] [TARGET...]
# Defaults: build-sanitize, 30 s, one target at a time, every target.
# --jobs 2 runs two targets at once (each is single-threaded). Extra libFuzzer
# flags go in $FUZZ_FLAGS (FUZZ_FLAGS=-runs=10000000 --seconds 0: no time limit).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-sanitize
seconds=30
jobs=1
targets=()
while (($#)); do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
# No target named: every fuzz/fuzz_*.cpp (as fuzz/CMakeLists.txt builds them).
if ((${#targets[@]} == 0)); then
  for source in fuzz/fuzz_*.cpp; do targets+=("$(basename "$source" .cpp)"); done
fi

artifacts=$build_dir/fuzz/artifacts
mkdir -p "$artifacts"
for target in "${targets[@]}"; do
  [[ -x $build_dir/bin/$target ]] || {
    echo "fuzz/run.sh: $build_dir/bin/$target not built (cmake --preset sanitize && cmake --build build-sanitize)" >&2
    exit 1
  }
done

run_target() {
  local target=$1
  local corpus=$build_dir/fuzz/corpus/$target
  mkdir -p "$corpus"
  # -timeout is wall-clock: on a loaded machine a 3 ms input was once stalled
  # for over a minute, so it is generous; a real hang still fails the run.
  local flags=(-rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=120 -print_final_stats=1
               "-artifact_prefix=$artifacts/$target-")
  ((seconds > 0)) && flags+=("-max_total_time=$seconds")
  [[ -f fuzz/$target.dict ]] && flags+=("-dict=fuzz/$target.dict")
  # The command-line target prints every refusal, as the steps do: keep the
  # log for libFuzzer's own lines (crash reports still come through).
  [[ $target == fuzz_command_line ]] && flags+=(-close_fd_mask=3)
  local rc=0
  # shellcheck disable=SC2086  # FUZZ_FLAGS is a list of flags
  "$build_dir/bin/$target" "${flags[@]}" ${FUZZ_FLAGS:-} "$corpus" "fuzz/corpus/$target" \
      >"$build_dir/fuzz/$target.log" 2>&1 || rc=$?
  echo "$rc" >"$build_dir/fuzz/$target.rc"
}

start=$(date +%s)
for target in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  echo "== $target: ${seconds} s (log $build_dir/fuzz/$target.log)"
  run_target "$target" &
done
wait

failed=0
for target in "${targets[@]}"; do
  log=$build_dir/fuzz/$target.log
  rc=$(cat "$build_dir/fuzz/$target.rc" 2>/dev/null || echo missing)
  if [[ $rc == 0 ]]; then
    echo "$target: ok, $(grep -E '^#[0-9]+' "$log" | tail -1)"
  else
    failed=1
    echo "$target: FAILED (exit $rc); from $log:" >&2
    grep -E "ERROR|SUMMARY|DEDUP_TOKEN|Test unit written|^ +#[0-9]+ " "$log" | head -30 >&2 || true
  fi
done
echo "fuzz/run.sh: ${#targets[@]} targets in $(( $(date +%s) - start )) s"
exit $failed
