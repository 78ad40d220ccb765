#!/usr/bin/env bash
# Runs the fuzz targets of a sanitize build, one after the other, each for a
# bounded time from its seed corpus (fuzz/corpus/<target>/) into a scratch
# corpus under the build folder; exits 1 at the first target that finds a
# crash, a leak, undefined behaviour, an escaped exception or an oversized
# allocation (its input is saved as BUILD_DIR/fuzz/artifacts/<target>-crash-*).
#   fuzz/run.sh [--build-dir DIR] [--seconds N] [TARGET...]
# Defaults: build-sanitize, 30 s, all four targets. Extra libFuzzer flags go in
# $FUZZ_FLAGS (e.g. FUZZ_FLAGS=-runs=10000000 with --seconds 0 for no limit).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=build-sanitize
seconds=30
targets=()
while (($#)); do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=(fuzz_checkpoint fuzz_tokenizer_load fuzz_tokenizer_encode fuzz_command_line)

for target in "${targets[@]}"; do
  binary=$build_dir/bin/$target
  [[ -x $binary ]] || { echo "fuzz/run.sh: $binary not built (cmake --preset sanitize && cmake --build build-sanitize)" >&2; exit 1; }
  corpus=$build_dir/fuzz/corpus/$target
  artifacts=$build_dir/fuzz/artifacts
  mkdir -p "$corpus" "$artifacts"
  # -timeout is wall-clock: on a loaded machine a 3 ms input was once stalled
  # for over a minute, so it is generous; a real hang still fails the run.
  flags=(-rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=120 -print_final_stats=1
         "-artifact_prefix=$artifacts/$target-")
  ((seconds > 0)) && flags+=("-max_total_time=$seconds")
  [[ -f fuzz/$target.dict ]] && flags+=("-dict=fuzz/$target.dict")
  # The command-line target prints every refusal, as the steps do: keep the
  # terminal for libFuzzer's own lines (crash reports still come through).
  [[ $target == fuzz_command_line ]] && flags+=(-close_fd_mask=3)
  log=$build_dir/fuzz/$target.log
  echo "== $target (${seconds} s; log $log)"
  start=$(date +%s)
  # shellcheck disable=SC2086  # FUZZ_FLAGS is a list of flags
  if ! "$binary" "${flags[@]}" ${FUZZ_FLAGS:-} "$corpus" "fuzz/corpus/$target" >"$log" 2>&1; then
    grep -E "ERROR|SUMMARY|DEDUP_TOKEN|Test unit written" "$log" | head -20 >&2 || true
    echo "fuzz/run.sh: $target found a problem after $(( $(date +%s) - start )) s; see $log" >&2
    exit 1
  fi
  grep -E "^Done|stat::number_of_executed_units|stat::peak_rss_mb" "$log" || true
  grep -E "^#[0-9]+" "$log" | tail -1
done
