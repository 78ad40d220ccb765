#!/usr/bin/env bash
# The GPU proof of the course in one command: on a machine with an NVIDIA GPU,
# runs everything GPU the course has and writes a report folder.
#
#   scripts/gpu_check.sh                       # build/ -> gpu-report/, minutes
#   scripts/gpu_check.sh --full                # the complete sweeps the chapters quote
#   scripts/gpu_check.sh --build-dir build-gpu --out report
#   scripts/gpu_check.sh --stages tests,steps  # a subset (see --help)
#   scripts/gpu_check.sh --dry-run             # finds the binaries, runs nothing
#   scripts/gpu_check.sh --only step05         # the binaries whose names match (a
#                                              # regex), e.g. to rerun one after a fix
#   scripts/gpu_check.sh --exercise-copy DIR   # also prove the cuda exercises' stubs
#                                              # fail, in a built student copy (stage exercises)
#   scripts/gpu_check.sh --stages profile --rungs 11,15  # profile only these of
#                                              # step 02's rungs (default 4,8,9,10,11,13,14,15)
#
# The default form is sized to finish in under 8 minutes on an H100 (a GPU
# is often lent for minutes, not hours; docs/results/gpu_decode/README.md has
# each stage's measured time); --full runs the long sweeps. Each stage
# and each command in it prints a progress line on stderr as it starts.
#
# Stages, in order (each writes <stage>_*.log / .json / .txt into the report;
# the measurements come right after the tests, so that a GPU lent for less
# time than the whole check still yields them):
#   info       nvidia-smi's view of the GPU (model, SMs, clocks, driver)
#   tests      every *_gpu_test binary, with LLM_EXPECT_GPU=1 (a test that would
#              skip fails instead: tests/test_support.hpp); a test that skips
#              is a failure here too (a GPU is visible, so a skip means a path
#              did not run)
#   exercises  the workshop's cuda exercises (docs/workshop.md), with --full
#              or --exercise-copy (their checks are gpu tests the tests stage
#              runs already): their checks pass on the maintained code, none
#              skipping, through the workshop's own runner; with --exercise-copy
#              DIR, every one of them fails under its stub with its own
#              ExerciseNotDone message. DIR is a student copy of the cuda
#              exercises alone, built (in DIR/build-gpu or DIR/build) where the
#              packages are: scripts/workshop.py make-copy --out DIR --exercises
#              ex02.2,ex02.3,ex05.3,ex06.3 --keep-prerequisite-solutions, then
#              cmake --preset hopper && cmake --build build-gpu -j in DIR
#   presets    the model on real models' dims, CUDA only: step 01's decode on
#              TinyLlama-1.1B's dims in fp32 without graphs and fusions (the
#              before row), fp16 as it runs by default and without RoPE
#              folded into the QKV product, and the tiny preset; steps 04-07
#              on TinyLlama's dims, sized to fit (--full: longer
#              generations, fp32 with graphs, bf16, the before rows chapter
#              01 quotes (norms unfolded, no programmatic dependent launch,
#              serial loads, the merge in the last split block, the column
#              split not in whole waves, the GEMVs asking L2 for the next
#              product's first weights), Llama-2-7B in fp16 where the GPU has the memory, step 02's
#              and 03's kernel tables on real attention shapes, step 02's with
#              its FlashAttention-2 ladder beside PyTorch's SDPA in the same
#              run where PyTorch with CUDA is importable, causal and not)
#   gemv       only when --stages names it (--full runs it with the presets):
#              the half GEMV's two kernels side by side, the multiply-adds on
#              the CUDA cores (the default) and on the tensor cores (--gemv):
#              the fp16 products alone (step 01's benchmark, with cuBLAS, on
#              TinyLlama's and Llama-2-7B's shapes, 1-64 rows; and a token's
#              88 TinyLlama products back to back, with and without
#              programmatic dependent launch and the GEMV's L2 prefetch, and
#              with each product asking L2 for the next one's first weights),
#              then step 01's TinyLlama decode, step 04's target pass and
#              step 07's forwards of 1-64 rows with each kernel taking up to
#              16 rows (--max-gemv-rows 16), and steps 04 and 07 again with
#              the model's default, the products of 2 rows or more on cuBLAS
#              (--max-gemv-rows 1), folded and not (--no-norm-folding)
#              (minutes)
#   flash2     only when --stages names it: the top of step 02's
#              FlashAttention-2 ladder, variants 4, 5 and 11-16, at 16 heads,
#              d = 128 and 64, 4096 and 16384 tokens, causal and not, beside
#              PyTorch's SDPA in the same run where PyTorch with CUDA imports;
#              then every rung's instructions per K/V tile, read from the
#              executable's SASS (cuobjdump -sass, scripts/sass_tile_count.py)
#              (minutes)
#   w4a16      only when --stages names it: step 06's W4A16 / W8A16 kernels,
#              one-shot and persistent, beside cuBLAS fp16 on the model's and
#              Llama-2-7B's shapes (int8, int4-g128, int4-g64; 1, 4 and 16
#              rows); then both kernels' instructions per step and per unit,
#              read from the executable's SASS (scripts/sass_w4a16_unit_count.py)
#              (minutes)
#   memcheck   compute-sanitizer memcheck: the common kernels' and the CUDA
#              model's tests, step 06's persistent kernel on short shapes
#              (--full: every gpu test binary)
#   racecheck  compute-sanitizer racecheck and synccheck over the decode
#              attention kernel tests (common, step05's paged kernels), step
#              02's FlashAttention-2 kernels and step 06's persistent W4A16
#              kernel on short shapes (--full: every step02 and step03 kernel
#              test)
#   steps      every step executable with --device all, its --quick run: the
#              CUDA rows beside the CPU's, checked against them (--full: with
#              --full, the complete sweeps the chapters quote)
#   profile    only when --stages names it: Nsight Compute (ncu) on the
#              flagship kernels at the shapes their targets name, each launch
#              with the sections the chapters quote (speed of light, occupancy,
#              launch, warp states with their stall reasons, compute and memory
#              workloads), clocks as the timed runs see them: step 02's ladder
#              rungs 4, 8-11 and 13-15 (--rungs: a list of your own) at 16
#              heads, d = 128, 4096 tokens, causal and not,
#              PyTorch's SDPA kernel on the same shapes where PyTorch with CUDA
#              imports, step 06's one-shot and persistent kernels on
#              Llama-2-7B's w1/w3 [11008, 4096] (int4-g128 and int8, 1 and 16
#              rows: the first launches of its gpu test's large shapes), and
#              the CUDA-core decode GEMV at one row on TinyLlama's shapes: the
#              fp16 model's four products of a layer (as it runs by default,
#              without the RoPE fold, and with each product asking L2 for the
#              next one's first weights), step 06's int4-g64 w1/w3 and w2. Each
#              writes profile_<name>.ncu-rep, its details page and its raw page
#              (every metric collected) as CSV, minutes in all
# Every stage's result is one line of summary.txt; the exit status is 0 only
# when every stage passed, 2 when no GPU is visible, 1 otherwise.
#
# A build made elsewhere and copied here works (CMake preset "hopper", or
# -DLLM_STATIC_CUDART=ON: the CUDA runtime is inside the binaries). It still
# needs the shared libraries `ldd build/bin/step01_kv_cache` names: cuBLAS
# (libcublas, libcublasLt: from any CUDA toolkit or the nvidia-cublas wheel of
# the same major version; put their folder in LD_LIBRARY_PATH), and the
# build machine's libfmt and libbenchmark when they came from Debian packages
# (copy them beside the binaries, into the same bin/ folder, and add it to
# LD_LIBRARY_PATH).
set -uo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=build
out_dir=gpu-report
stages="info,tests,exercises,presets,memcheck,racecheck,steps"
exercise_copy=
dry_run=0
full=0
profile_rungs=4,8,9,10,11,13,14,15
only=.

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --exercise-copy) exercise_copy=$(cd "$2" && pwd) || exit 1; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --full) full=1; shift ;;
    --rungs) profile_rungs=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
[[ $build_dir = /* ]] || build_dir=$PWD/$build_dir
bin=$build_dir/bin
# Libraries copied beside the binaries first, then the CUDA toolkit's cuBLAS.
cuda_libs=${CUDA_HOME:-/usr/local/cuda}/lib64
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[[ -d $cuda_libs ]] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$cuda_libs
# No single command may hang the check: each gets this many seconds.
command_timeout=${GPU_CHECK_TIMEOUT:-1800}
# The gpu tests that need stories260K look here (tests/model_file.hpp).
[[ -n ${LLM_MODELS_DIR:-} ]] || export LLM_MODELS_DIR=$repo_root/../shared/models

want() { [[ ",$stages," == *",$1,"* ]]; }
for stage in ${stages//,/ }; do
  case $stage in info|tests|exercises|memcheck|racecheck|steps|presets|gemv|flash2|w4a16|profile) ;;
    *) echo "gpu_check.sh: unknown stage '$stage' (info,tests,exercises,memcheck,racecheck,steps,presets,gemv,flash2,w4a16,profile)" >&2; exit 1 ;;
  esac
done

# --- what must be there --------------------------------------------------------
steps=()
for step_dir in "$repo_root"/step[0-9][0-9]_*/; do steps+=("$(basename "$step_dir")"); done
gpu_tests=()
for source in "$repo_root"/tests/*_gpu_test.cpp; do gpu_tests+=("$(basename "$source" .cpp)"); done
# --only keeps the binaries whose names match; the preset runs check it by step name.
selected() { [[ $1 =~ $only ]]; }
keep_selected() {  # keep_selected <array name>: drops the names --only does not match
  local -n names=$1
  local kept=() name
  for name in "${names[@]}"; do selected "$name" && kept+=("$name"); done
  names=("${kept[@]}")
}
keep_selected steps
keep_selected gpu_tests
if ((${#steps[@]} + ${#gpu_tests[@]} == 0)); then
  echo "gpu_check.sh: --only '$only' matches no step and no gpu test binary" >&2
  exit 1
fi
missing=()
for name in "${steps[@]}" "${gpu_tests[@]}"; do [[ -x $bin/$name ]] || missing+=("$name"); done
# The gemv stage's benchmark of the half products (run_half_products).
if (want gemv || (want presets && ((full)))) && selected step01_kv_cache && [[ ! -x $bin/step01_kv_cache_bench ]]; then
  missing+=(step01_kv_cache_bench)
fi
if ((${#missing[@]})); then
  echo "gpu_check.sh: missing in $bin: ${missing[*]}" >&2
  echo "  build first, with CUDA: cmake --preset hopper && cmake --build build-gpu -j (then --build-dir build-gpu)" >&2
  exit 1
fi
for name in "${steps[@]}" "${gpu_tests[@]}"; do
  if ! "$bin/$name" --help >/dev/null 2>&1 && ! "$bin/$name" --gtest_list_tests >/dev/null 2>&1; then
    echo "gpu_check.sh: $bin/$name does not start here (missing shared libraries?):" >&2
    ldd "$bin/$name" | grep "not found" >&2
    exit 1
  fi
done
echo "binaries: ${#steps[@]} steps and ${#gpu_tests[@]} gpu test binaries in $bin"
exercise_copy_bin=
if [[ -n $exercise_copy ]]; then
  for candidate in "$exercise_copy/build-gpu/bin" "$exercise_copy/build/bin"; do
    [[ -d $candidate ]] && { exercise_copy_bin=$candidate; break; }
  done
  if [[ ! -f $exercise_copy/exercises/selection.json || -z $exercise_copy_bin ]]; then
    echo "gpu_check.sh: --exercise-copy $exercise_copy is not a built student copy" \
         "(scripts/workshop.py make-copy, then cmake --preset hopper && cmake --build build-gpu there)" >&2
    exit 1
  fi
  echo "exercise copy: $exercise_copy (binaries in $exercise_copy_bin)"
fi

if ((dry_run)); then
  echo "dry run: stages $stages would write into $out_dir"
  for name in "${gpu_tests[@]}"; do echo "  test  $name ($("$bin/$name" --gtest_list_tests | grep -c '^  ') tests)"; done
  for name in "${steps[@]}"; do echo "  step  $name"; done
  exit 0
fi

# --- is there a GPU? -------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check.sh: no GPU visible: nvidia-smi not found (no NVIDIA driver on this machine)" >&2
  exit 2
fi
if ! gpu_list=$(nvidia-smi -L 2>&1) || [[ $gpu_list != *GPU* ]]; then
  echo "gpu_check.sh: no GPU visible: nvidia-smi -L says: $gpu_list" >&2
  exit 2
fi

# A GPU is visible: every gpu test below (and under compute-sanitizer) must
# run on it, so one that would skip for want of a device fails instead.
export LLM_EXPECT_GPU=1

mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
summary=$out_dir/summary.txt
: >"$summary"
failures=0
record() {  # record <stage> <PASS|FAIL> <what>
  printf '%-10s %-4s %s\n' "$1" "$2" "$3" | tee -a "$summary"
  [[ $2 == PASS ]] || failures=$((failures + 1))
}
# Progress on stderr: where the check is and how long it has run.
progress() { printf '[gpu_check %4d s] %s\n' "$SECONDS" "$*" >&2; }
# Free GPU memory in GiB, for the presets that need a lot.
gpu_memory_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print int($1/1024)}')

# --- info ------------------------------------------------------------------------
if want info; then
  {
    nvidia-smi
    nvidia-smi --query-gpu=name,pci.bus_id,memory.total,clocks.max.sm,clocks.max.memory,clocks.sm,power.limit,driver_version --format=csv
  } >"$out_dir/info_nvidia_smi.txt" 2>&1
  record info PASS "$(head -1 <<<"$gpu_list")"
fi

# --- tests -----------------------------------------------------------------------
# Runs one gtest binary; passes when it exits 0 and nothing was skipped.
run_gtest() {  # run_gtest <stage> <log> <binary> [args...]
  local stage=$1 log=$2; shift 2
  progress "$stage: $(basename "$1")"
  timeout "$command_timeout" "$@" >"$log" 2>&1
  local rc=$?
  local ran skipped
  ran=$(grep -oP '^\[==========\] \K[0-9]+(?= tests? from .* ran)' "$log" | tail -1)
  skipped=$(grep -oP '^\[  SKIPPED \] \K[0-9]+(?= tests?,)' "$log" | tail -1)
  if ((rc != 0)); then
    record "$stage" FAIL "$(basename "$1"): exit $rc ($(grep -c '^\[  FAILED  \]' "$log") FAILED lines; see $(basename "$log"))"
  elif [[ -n $skipped && $skipped != 0 ]]; then
    record "$stage" FAIL "$(basename "$1"): $skipped of ${ran:-?} tests skipped with a GPU visible: $(grep -A1 'SKIPPED' "$log" | grep -m1 -oP '(?<=\] ).*')"
  else
    record "$stage" PASS "$(basename "$1"): ${ran:-?} tests"
  fi
}
if want tests; then
  for name in "${gpu_tests[@]}"; do
    run_gtest tests "$out_dir/tests_$name.log" "$bin/$name" --gtest_output="xml:$out_dir/tests_$name.xml"
  done
fi

# --- the workshop's cuda exercises (CI proves the cpu ones) -----------------------
# prove_exercises <label> <workshop.py command and arguments>: one summary line.
prove_exercises() {
  local label=$1 log=$out_dir/exercises_$1.log
  shift
  progress "exercises: $label"
  if timeout "$command_timeout" "${PYTHON:-python3}" "$repo_root/scripts/workshop.py" "$@" --device cuda >"$log" 2>&1; then
    record exercises PASS "$label: $(grep -c '^ex' "$log") cuda exercises ($(tr '\n' ';' <"$log" | sed 's/;$//'))"
  else
    record exercises FAIL "$label: $(grep -m1 -E 'FAILS|PASSES|error' "$log") (see $(basename "$log"))"
  fi
}
if want exercises && ! ((full)) && [[ -z $exercise_copy ]]; then
  progress "exercises: their checks ran in the tests stage; --full or --exercise-copy runs the workshop's proof"
elif want exercises; then
  prove_exercises solutions prove-solutions --bin-dir "$bin"
  if [[ -n $exercise_copy ]]; then
    prove_exercises stubs prove-stubs --bin-dir "$exercise_copy_bin" --copy "$exercise_copy"
  fi
fi

# --- step executables (the presets first: the measurements the chapters quote) -----
run_step() {  # run_step <stage> <label> <step> [args...]
  local stage=$1 label=$2 step=$3; shift 3
  selected "$step" || return 0
  local base=$out_dir/${step}_$label
  local start=$SECONDS
  progress "$stage: $step $label $*"
  timeout "$command_timeout" "$bin/$step" "$@" --json "$base.json" >"$base.txt" 2>"$base.err"
  local rc=$?
  cat "$base.err" >>"$base.txt"
  rm -f "$base.err"
  if ((rc == 0)); then
    record "$stage" PASS "$step $label ($((SECONDS - start)) s): $*"
  else
    record "$stage" FAIL "$step $label: exit $rc: $(tail -1 "$base.txt")"
  fi
}

# The fp16 products alone (step 01's Google Benchmark, "half_product"): each
# GEMV kernel and cuBLAS on TinyLlama's and Llama-2-7B's shapes, 1-64 rows,
# and the CUDA-core GEMV without its pipelined weight loads at 1-4 rows, each
# row count the median of 15 runs from HBM; and the same filter's
# "half_product_chain": TinyLlama's 88 products of a token back to back in a
# CUDA graph, launched serially and with programmatic dependent launch, each
# as the model runs them, without the GEMV's L2 prefetch of its first
# weights, without its pipelined loads, and with each product asking L2 for
# the next one's first weights. Its JSON is Google Benchmark's.
run_half_products() {  # run_half_products <stage> <label> <benchmark filter>
  local stage=$1 label=$2 filter=$3
  selected step01_kv_cache || return 0
  local base=$out_dir/step01_kv_cache_bench_$label start=$SECONDS
  progress "$stage: step01_kv_cache_bench --benchmark_filter=$filter"
  if timeout "$command_timeout" "$bin/step01_kv_cache_bench" --benchmark_filter="$filter" \
      --benchmark_out="$base.json" --benchmark_out_format=json >"$base.txt" 2>&1; then
    record "$stage" PASS "step01_kv_cache_bench $label ($((SECONDS - start)) s)"
  else
    record "$stage" FAIL "step01_kv_cache_bench $label: $(tail -1 "$base.txt")"
  fi
}

# Step 01's cached decode (variant 1) on the CUDA model: the overhead lesson.
# Before: fp32, every kernel launched from the host, no fused launches; then
# graphs and fusions; then half-precision weights, without and with the
# norms, SwiGLU and residual adds folded into their products, without
# programmatic dependent launch (--no-pdl: each kernel starts only once the
# one before has finished), with split-KV attention's merge in its last split
# block (--merge-folding: past 64 keys, one launch a layer fewer, which
# measured slower than the merge kernel, the default), with
# RoPE and the K/V append as a kernel after the QKV product
# (--no-rope-folding: on the tiny preset five launches a token are the size
# of its 80 us target; on TinyLlama the QKV product with the fold is the
# layer's slowest product per byte in Nsight Compute), and with the GEMV's
# weight loads not pipelined (--no-gemv-pipelining; TinyLlama only: the tiny
# preset's products are one batch of loads per block, so there is nothing
# to pipeline), with the GEMVs' column split not fitted to whole waves
# (--no-gemv-wave-fit; TinyLlama only: the tiny preset's products are one
# wave either way), and with each GEMV asking L2 for the next product's
# first weights (--gemv-prefetch-next, an opt-in: it measured slower).
# Bytes per token over time per token, against the copy bandwidth measured
# in the same run, by position. The --no-norm-folding, --no-pdl,
# --no-gemv-pipelining, --merge-folding, --no-gemv-wave-fit and
# --gemv-prefetch-next rows of TinyLlama, and the tiny preset's
# --merge-folding and --gemv-prefetch-next rows, which chapter 01 already
# quotes, run with --full only: each TinyLlama row is some 15 s of the
# default form's 8 minutes.
decode_rows() {  # decode_rows <steps> <repeats> <weight dtypes with graphs and fusions> <quoted before rows: 0|1>
  local steps=$1 repeats=$2 dtypes=$3 quoted_before_rows=$4 dtype
  run_step presets tinyllama-1.1b_fp32_eager step01_kv_cache --device cuda --preset tinyllama-1.1b --variant 1 \
    --steps "$steps" --repeats "$repeats" --dtype fp32 --no-graphs --no-fusions
  for dtype in $dtypes; do
    run_step presets "tinyllama-1.1b_$dtype" step01_kv_cache --device cuda --preset tinyllama-1.1b --variant 1 \
      --steps "$steps" --repeats "$repeats" --dtype "$dtype"
  done
  if ((quoted_before_rows)); then
    run_step presets tinyllama-1.1b_fp16_unfolded step01_kv_cache --device cuda --preset tinyllama-1.1b \
      --variant 1 --steps "$steps" --repeats "$repeats" --dtype fp16 --no-norm-folding
    run_step presets tinyllama-1.1b_fp16_no_pdl step01_kv_cache --device cuda --preset tinyllama-1.1b --variant 1 \
      --steps "$steps" --repeats "$repeats" --dtype fp16 --no-pdl
    run_step presets tinyllama-1.1b_fp16_serial_loads step01_kv_cache --device cuda --preset tinyllama-1.1b \
      --variant 1 --steps "$steps" --repeats "$repeats" --dtype fp16 --no-gemv-pipelining
    run_step presets tinyllama-1.1b_fp16_merge_in_last_block step01_kv_cache --device cuda --preset tinyllama-1.1b \
      --variant 1 --steps "$steps" --repeats "$repeats" --dtype fp16 --merge-folding
    run_step presets tinyllama-1.1b_fp16_prefetch_next step01_kv_cache --device cuda --preset tinyllama-1.1b \
      --variant 1 --steps "$steps" --repeats "$repeats" --dtype fp16 --gemv-prefetch-next
    run_step presets tinyllama-1.1b_fp16_ragged_waves step01_kv_cache --device cuda --preset tinyllama-1.1b \
      --variant 1 --steps "$steps" --repeats "$repeats" --dtype fp16 --no-gemv-wave-fit
  fi
  run_step presets tinyllama-1.1b_fp16_rope_kernel step01_kv_cache --device cuda --preset tinyllama-1.1b \
    --variant 1 --steps "$steps" --repeats "$repeats" --dtype fp16 --no-rope-folding
  run_step presets tiny_fp32_eager step01_kv_cache --device cuda --preset tiny --variant 1 --steps 256 \
    --repeats 5 --no-graphs --no-fusions
  for dtype in fp32 fp16; do
    run_step presets "tiny_$dtype" step01_kv_cache --device cuda --preset tiny --variant 1 --steps 256 --repeats 5 \
      --dtype "$dtype"
  done
  run_step presets tiny_fp16_unfolded step01_kv_cache --device cuda --preset tiny --variant 1 --steps 256 \
    --repeats 5 --dtype fp16 --no-norm-folding
  run_step presets tiny_fp16_no_pdl step01_kv_cache --device cuda --preset tiny --variant 1 --steps 256 \
    --repeats 5 --dtype fp16 --no-pdl
  if ((quoted_before_rows)); then
    run_step presets tiny_fp16_merge_in_last_block step01_kv_cache --device cuda --preset tiny --variant 1 \
      --steps 256 --repeats 5 --dtype fp16 --merge-folding
    run_step presets tiny_fp16_prefetch_next step01_kv_cache --device cuda --preset tiny --variant 1 --steps 256 \
      --repeats 5 --dtype fp16 --gemv-prefetch-next
  fi
  run_step presets tiny_fp16_rope_kernel step01_kv_cache --device cuda --preset tiny --variant 1 --steps 256 \
    --repeats 5 --dtype fp16 --no-rope-folding
}
# PyTorch's SDPA beside step 02's rows, in the same run, where PyTorch with
# CUDA is importable (step02_flash_attention/measure/sdpa_beside.hpp); the
# step's JSON then holds the comparison and its targets.
python=${PYTHON:-python3}
# Whether $python has PyTorch with a CUDA device (SDPA beside step 02, its profile).
torch_with_cuda() { "$python" -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; }
sdpa_flags=()
if want presets && ((full)) && selected step02_flash_attention; then
  if torch_with_cuda; then
    sdpa_flags=(--compare-sdpa "$repo_root/step02_flash_attention/measure/sdpa_compare.py" --python "$python")
  else
    progress "presets: no PyTorch with CUDA for $python: step 02 runs without SDPA beside it"
  fi
fi
if want presets && ! ((full)); then
  decode_rows 1024 3 "fp16" 0
  run_step presets tinyllama-1.1b_fp16 step04_speculative --device cuda --preset tinyllama-1.1b --dtype fp16 \
    --steps 64 --k 4 --repeats 1
  run_step presets tinyllama-1.1b step05_paged_attention --device cuda --preset tinyllama-1.1b --steps 64
  # The two formats the chapter's GPU target names (W8A16, W4A16) beside
  # fp32 and fp16, 8 positions (each row's check runs the CPU model over
  # them). Step 07: 8 requests at one load level, from a trace seed (85)
  # whose longest output is 272 tokens: with the default seed's, one request
  # of 844 tokens set the length of every batched run and made this preset
  # the check's longest (its time: docs/results/gpu_decode/README.md); --full
  # replays 64 requests, long tail included. Its engine runs the fp16 model
  # (graphs, fusions, split-KV decode over the paged cache), as a GPU
  # server would.
  run_step presets tinyllama-1.1b step06_quantization --device cuda --preset tinyllama-1.1b --no-quality --steps 8 \
    --formats int8,int4-g64
  run_step presets tinyllama-1.1b_fp16 step07_batching --device cuda --preset tinyllama-1.1b --dtype fp16 \
    --requests 8 --seed 85 --repeats 1 --loads 1.0
fi
if want presets && ((full)); then
  decode_rows 2048 5 "fp32 fp16 bf16" 1
  # Llama-2-7B's dims in fp16 (13.5 GB of weights; the host makes 27 GB of
  # fp32 ones first, most of the minute this row takes).
  if ((gpu_memory_gib >= 40)); then
    run_step presets llama2-7b_fp16 step01_kv_cache --device cuda --preset llama2-7b --variant 1 --dtype fp16 \
      --steps 512 --repeats 3
  else
    record presets PASS "step01_kv_cache llama2-7b_fp16: not run, $gpu_memory_gib GiB of GPU memory (needs 40)"
  fi
  # Kernel tables on real models' attention shapes; the models on real dims.
  # --full everywhere: the complete sweeps, whatever the flags below leave to
  # the step (e.g. step 02's 2048-token model prefill, step 05's contexts).
  run_step presets tinyllama-1.1b step01_kv_cache --device cuda --full --preset tinyllama-1.1b
  if ((gpu_memory_gib >= 40)); then
    run_step presets llama2-7b step01_kv_cache --device cuda --full --preset llama2-7b --steps 128 --repeats 3
  else
    record presets PASS "step01_kv_cache llama2-7b: not run, $gpu_memory_gib GiB of GPU memory (needs 40: 27 GB of fp32 weights)"
  fi
  # 16 heads: Llama-2-7B's head_dim 128 with half its heads (the kernels'
  # grids have 16 x Sq/64 blocks, enough to fill 132 SMs from 512 tokens on).
  seq_lens=512,1024,2048,4096,8192,16384
  run_step presets heads16 step02_flash_attention --device cuda --full --heads 16 --head-dims 128,64 \
    --seq-lens $seq_lens --decode-lens 8192,16384,32768 "${sdpa_flags[@]}"
  run_step presets heads16_noncausal step02_flash_attention --device cuda --full --heads 16 --head-dims 128,64 \
    --no-causal --seq-lens $seq_lens --decode-lens 8192 "${sdpa_flags[@]}"
  run_step presets llama_shapes step03_gqa --device cuda --full --query-heads 32 --head-dim 128 --kv-heads 32,8,4,1 \
    --contexts 1024,4096,16384,32768
  run_step presets tinyllama-1.1b step04_speculative --device cuda --full --preset tinyllama-1.1b --k 2,4,8 --repeats 3
  # The paged kernels' overhead at Llama-3-8B's attention (the default dims),
  # contexts 1k-32k, batch 1 and 16; the model parts on TinyLlama's dims.
  run_step presets tinyllama-1.1b step05_paged_attention --device cuda --full --preset tinyllama-1.1b --steps 128
  # W8A16 / W4A16 beside cuBLAS fp16 on Llama-2-7B's layers (part 1); the
  # quantized model's decode on TinyLlama's dims (random weights: speed only).
  run_step presets tinyllama-1.1b step06_quantization --device cuda --full --preset tinyllama-1.1b --no-quality \
    --steps 128
  # The int4 rows' before row: decode on the persistent tensor-core kernel,
  # which folds nothing (part 1 of the run above times the two kernels side
  # by side, product by product).
  run_step presets tinyllama-1.1b_persistent_kernel step06_quantization --device cuda --preset tinyllama-1.1b \
    --no-quality --steps 128 --formats int4-g64 --no-int4-gemv
  # Continuous batching where decode is memory-bound (a forward of 16 rows
  # costs about what one row costs): TinyLlama's dims in fp16, a shorter trace.
  run_step presets tinyllama-1.1b_fp16 step07_batching --device cuda --full --preset tinyllama-1.1b --dtype fp16 \
    --requests 64 --repeats 1
fi

# The half GEMV's two kernels side by side (stage gemv; with --full, part of
# the presets): the products alone, then step 01's TinyLlama decode, step 04's
# target pass over k + 1 rows and step 07's forwards of 1-64 rows (part 1),
# each with the multiply-adds on the CUDA cores (the default) and on the
# tensor cores, in one run; then steps 04 and 07 once more on the CUDA cores
# with only the products of 1 row on the GEMV and those of 2 rows or more on
# cuBLAS (--max-gemv-rows 1, the default), to weigh cuBLAS's flat time over
# 2-16 rows against the GEMV's growing one, and again with cuBLAS's path
# unfolded (--no-norm-folding), to weigh what folding the norms, SwiGLU and
# adds into it saves.
if want gemv || (want presets && ((full))); then
  run_half_products gemv half_products half_product
  for kernel in cuda-cores tensor-cores; do
    run_step gemv "tinyllama-1.1b_fp16_$kernel" step01_kv_cache --device cuda --preset tinyllama-1.1b --variant 1 \
      --steps 1024 --repeats 3 --dtype fp16 --gemv "$kernel"
    # Up to 16 rows on the GEMV (the default sends 2 rows or more to cuBLAS).
    run_step gemv "tinyllama-1.1b_fp16_$kernel" step04_speculative --device cuda --preset tinyllama-1.1b \
      --dtype fp16 --gemv "$kernel" --max-gemv-rows 16 --steps 64 --k 4 --repeats 1
    run_step gemv "tinyllama-1.1b_fp16_$kernel" step07_batching --device cuda --preset tinyllama-1.1b --dtype fp16 \
      --gemv "$kernel" --max-gemv-rows 16 --requests 8 --seed 85 --repeats 1 --loads 1.0
  done
  run_step gemv tinyllama-1.1b_fp16_cublas-from-2-rows step04_speculative --device cuda --preset tinyllama-1.1b \
    --dtype fp16 --gemv cuda-cores --max-gemv-rows 1 --steps 64 --k 4 --repeats 1
  run_step gemv tinyllama-1.1b_fp16_cublas-from-2-rows step07_batching --device cuda --preset tinyllama-1.1b \
    --dtype fp16 --gemv cuda-cores --max-gemv-rows 1 --requests 8 --seed 85 --repeats 1 --loads 1.0
  # The same two with cuBLAS's path unfolded (its norms, SwiGLU and adds as
  # kernels of their own): the before row of folding them into it.
  run_step gemv tinyllama-1.1b_fp16_cublas-from-2-rows_unfolded step04_speculative --device cuda \
    --preset tinyllama-1.1b --dtype fp16 --gemv cuda-cores --max-gemv-rows 1 --no-norm-folding --steps 64 --k 4 \
    --repeats 1
  run_step gemv tinyllama-1.1b_fp16_cublas-from-2-rows_unfolded step07_batching --device cuda \
    --preset tinyllama-1.1b --dtype fp16 --gemv cuda-cores --max-gemv-rows 1 --no-norm-folding --requests 8 \
    --seed 85 --repeats 1 --loads 1.0
fi

# The top of step 02's FlashAttention-2 ladder beside SDPA (stage flash2):
# variant 11 (every scheduling rung) and 12, the instruction cuts 13-16, the
# baseline 4 and 5; then the rungs' instructions per K/V tile from the
# executable's SASS, which explain the rows before a profile is taken.
cuobjdump_tool=${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}
# count_sass <stage> <step> <script> <name>: scripts/<script> over the step
# executable's SASS, into <name>.json and <name>.txt.
count_sass() {
  local stage=$1 step=$2 script=$3 base=$out_dir/$4
  if [[ ! -x $cuobjdump_tool ]]; then
    record "$stage" FAIL "$4: cuobjdump not found (set CUOBJDUMP)"
    return
  fi
  progress "$stage: $4 of $step"
  if "$cuobjdump_tool" -sass "$bin/$step" 2>"$base.txt" |
      python3 "$repo_root/scripts/$script" - --json "$base.json" >>"$base.txt" 2>&1; then
    record "$stage" PASS "$4: $(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["rows"]))' "$base.json") kernels counted"
  else
    record "$stage" FAIL "$4: $(tail -1 "$base.txt")"
  fi
}
if want flash2 && selected step02_flash_attention; then
  flash2_sdpa=()
  if torch_with_cuda; then
    flash2_sdpa=(--compare-sdpa "$repo_root/step02_flash_attention/measure/sdpa_compare.py" --python "$python")
  else
    progress "flash2: no PyTorch with CUDA for $python: the ladder runs without SDPA beside it"
  fi
  for mask in causal no-causal; do
    run_step flash2 "ladder_top_$mask" step02_flash_attention --device cuda --heads 16 --head-dims 128,64 \
      --seq-lens 4096,16384 --decode-lens 64 --prefill-tokens 16 --variant 4,5,11,12,13,14,15,16 --repeats 5 \
      "--$mask" "${flash2_sdpa[@]}"
  done
  count_sass flash2 step02_flash_attention sass_tile_count.py step02_sass_tile_counts
fi

# Step 06's two W4A16 / W8A16 kernels beside cuBLAS fp16 (stage w4a16): the
# kernel part with the Llama-2-7B shapes (--full), 1, 4 and 16 rows, on the
# small preset (its 288-column layers take groups of 128), no quality part
# and 16 decode positions; then both kernels' instructions per step and per
# unit from the executable's SASS.
if want w4a16 && selected step06_quantization; then
  run_step w4a16 llama_shapes step06_quantization --device cuda --full --formats int8,int4-g128,int4-g64 \
    --algorithms rtn --no-quality --steps 16 --batches 1,4,16 --preset small
  count_sass w4a16 step06_quantization sass_w4a16_unit_count.py step06_sass_unit_counts
fi

# --- compute-sanitizer -------------------------------------------------------------
sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
sanitize() {  # sanitize <tool> <binary> [gtest args...]
  local tool=$1 name=$2; shift 2
  selected "$name" || return 0
  local log=$out_dir/${tool}_$name.log
  if [[ ! -x $sanitizer ]]; then
    record "$tool" FAIL "compute-sanitizer not found (set COMPUTE_SANITIZER)"
    return
  fi
  progress "$tool: $name $*"
  # Every kernel is instrumented, cuBLAS's too: racecheck's hazards inside a
  # library's own kernels (an H200 run found some in cuBLAS's nvjet GEMM, every
  # product bit-exact) are sorted out of its log afterwards by
  # scripts/racecheck_verdict.py, which judges the course's kernels alone.
  # A run with cuBLAS's kernels left out instead (--kernel-name-exclude)
  # stopped on the half layer's tests with an internal sanitizer error (a
  # hardware exception it could not handle) where memcheck found no error; an
  # earlier racecheck without the exclusion, of older kernels, had finished.
  # Which of the two changes caused it is not known. The print limit is high enough to
  # show every hazard, so that the verdict sees each one.
  local print_limit=20
  [[ $tool == racecheck ]] && print_limit=100000
  # --error-exitcode: any sanitizer finding fails the run even when the tests pass.
  timeout "$command_timeout" "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit "$print_limit" \
    "$bin/$name" "$@" >"$log" 2>&1
  local rc=$?
  local summary_line
  summary_line=$(grep -m1 -oP '(ERROR|RACECHECK) SUMMARY: \K.*' "$log" || echo "no summary")
  if ((rc == 0)); then
    record "$tool" PASS "$name: $summary_line"
  elif [[ $tool == racecheck ]] && ((rc == 86)); then
    local verdict
    verdict=$("$python" "$repo_root/scripts/racecheck_verdict.py" "$log")
    if [[ $verdict == PASS:* ]]; then
      record "$tool" PASS "$name: ${verdict#PASS: }"
    else
      record "$tool" FAIL "$name: exit $rc, ${verdict#FAIL: } (see $(basename "$log"))"
    fi
  else
    record "$tool" FAIL "$name: exit $rc, $summary_line (see $(basename "$log"))"
  fi
}
# Timing tests launch the same kernels as the checks, many times: no new code
# paths, only sanitizer time.
no_timing='-*Timing*:*Timer*'
# Step 06's persistent kernel on every format, in the tests of few launches
# (a NaN in x; a partial last row block; units spanning many row blocks):
# the awkward-shapes test's 500 launches per format stay in --full.
step06_persistent_short="*CudaQuantizedKernels.NanInX*persistent:*CudaQuantizedKernels.ManyBlocks*persistent"
step06_persistent_short+=":*CudaQuantizedKernels.ManyRowBlocksOfOneStep*persistent"
# Its int4 decode GEMV the same way. memcheck also runs the quantized model's
# folds (the GEMV's norm, SwiGLU, add and RoPE writes, graphs: whole forwards);
# racecheck and synccheck leave them out: those epilogues are the fp16 GEMV's
# kernel template, whose folds the half layer's racecheck covers, and whole
# forwards were most of step 06's racecheck time (docs/results/gpu_decode/).
step06_int4_gemv_short="*CudaQuantizedKernels.NanInX*int4_gemv:*CudaQuantizedKernels.ManyBlocks*int4_gemv"
step06_int4_gemv_short+=":*CudaQuantizedKernels.ManyRowBlocksOfOneStep*int4_gemv"
step06_model_folds="CudaQuantizedModelFolds.*"
if want memcheck; then
  if ((full)); then
    for name in "${gpu_tests[@]}"; do sanitize memcheck "$name" --gtest_filter="$no_timing"; done
  else
    # The kernels every step's CUDA model runs: decode attention, the half
    # GEMV/GEMM, the fused kernels and the graphs (the model tests replay
    # graphs and run every fusion on awkward configs).
    sanitize memcheck common_split_kv_decode_gpu_test --gtest_filter="$no_timing"
    sanitize memcheck common_half_linear_gpu_test --gtest_filter="$no_timing"
    sanitize memcheck common_cuda_model_gpu_test --gtest_filter="*Fusions*:*Graphs*:CudaModel.*$no_timing"
    # Step 06's persistent W4A16 / W8A16 kernel (segments of staged x, the
    # ring of loads, the hand-over between blocks) on its small shapes.
    sanitize memcheck step06_cuda_kernels_gpu_test \
      --gtest_filter="$step06_persistent_short:$step06_int4_gemv_short:$step06_model_folds"
  fi
fi
if want racecheck; then
  # The model's decode attention (shared-memory tiles between the warps of a
  # block): the short lengths cross every tile and split boundary; the long
  # ones add only more of the same tiles, at minutes each under racecheck.
  sanitize racecheck common_split_kv_decode_gpu_test --gtest_filter="*Short*:*Graph*:*Split.*"
  sanitize synccheck common_split_kv_decode_gpu_test --gtest_filter="*Short*:*Graph*:*Split.*"
  # The half GEMV, both kernels (x staged in shared memory, the folded norm's warp sums):
  # one shape that splits its columns and one that pads them.
  sanitize racecheck common_half_linear_gpu_test --gtest_filter="*Fusions*fp16_256x2048_*:*Fusions*bf16_96x200_*"
  sanitize synccheck common_half_linear_gpu_test --gtest_filter="*Fusions*fp16_256x2048_*:*Fusions*bf16_96x200_*"
  if ! ((full)); then
    # Step 02's FlashAttention-2 kernels (v4/v5 and the ladder: cp.async
    # double buffers, ldmatrix, one barrier per tile): 129 keys cross every
    # tile size and both buffers, with and without the mask; --full runs them all.
    flash2_short="*CudaVariantTest*cuda_flash2*len129_*:*CudaVariantTest*cuda_flash2*q129_k33*"
    sanitize racecheck step02_flash_attention_gpu_test --gtest_filter="$flash2_short"
    sanitize synccheck step02_flash_attention_gpu_test --gtest_filter="$flash2_short"
  fi
  sanitize racecheck step06_cuda_kernels_gpu_test --gtest_filter="$step06_persistent_short:$step06_int4_gemv_short"
  sanitize synccheck step06_cuda_kernels_gpu_test --gtest_filter="$step06_persistent_short:$step06_int4_gemv_short"
fi
if want racecheck && ((full)); then
  for name in step02_flash_attention_gpu_test step03_gqa_gpu_test; do
    # The kernel tests only (model tests add no new kernels).
    # Shapes up to 129 rows (tails, GQA, empty rows, every kernel and head dim);
    # the 1000-5000-key cases add only more of the same tiles, at minutes each.
    sanitize racecheck "$name" --gtest_filter="*Variant*:*Decode*$no_timing:*len1000*:*k1000*:*k5000*:*k4097*"
    sanitize synccheck "$name" --gtest_filter="*Variant*:*Decode*$no_timing:*len1000*:*k1000*:*k5000*:*k4097*"
  done
fi
if want racecheck; then
  # Step 05's paged kernels: the decode cases (every block size, GQA ratio,
  # head_dim, mixed lengths that leave partitions empty) and prefill; the
  # 33000-key case adds only more partitions of the same kind.
  sanitize racecheck step05_paged_attention_gpu_test --gtest_filter="*CudaPaged*-*33000*:*Model*"
  sanitize synccheck step05_paged_attention_gpu_test --gtest_filter="*CudaPaged*-*33000*:*Model*"
fi

# --- Nsight Compute on the flagship kernels (opt-in) ---------------------------------
ncu_tool=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
# The sections chapter 02's profile table quotes, and the memory workload for
# the W4A16 kernels' DRAM traffic; the raw page keeps every metric they collect
# (the stall reasons behind WarpStateStats, shared-memory wavefronts).
ncu_sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables)
# <name base>: what the regex is matched against, ncu's --kernel-name-base:
# "function" (the kernel's name alone) or "demangled" (with its namespace and
# template arguments, e.g. the GEMV's weight format).
profile() {  # profile <label> <name base> <kernel name regex> <launches> <command...>
  local label=$1 name_base=$2 kernels=$3 launches=$4
  shift 4
  local base=$out_dir/profile_$label
  if [[ ! -x $ncu_tool ]]; then
    record profile FAIL "$label: ncu not found (set NCU)"
    return
  fi
  progress "profile: $label"
  # --clock-control none: the boost clocks the timed runs see, not the base
  # clock ncu locks to by default; the L2 is still flushed before each launch.
  if timeout "$command_timeout" "$ncu_tool" --clock-control none --target-processes all \
      --kernel-name-base "$name_base" -k "regex:$kernels" -c "$launches" "${ncu_sections[@]}" \
      --export "$base" --force-overwrite "$@" >"$base.log" 2>&1 &&
    "$ncu_tool" --import "$base.ncu-rep" --csv --page details >"${base}_details.csv" 2>>"$base.log" &&
    "$ncu_tool" --import "$base.ncu-rep" --csv --page raw >"${base}_raw.csv" 2>>"$base.log"; then
    record profile PASS "$label: $(grep -c '^==PROF== Profiling' "$base.log") launches profiled"
  else
    record profile FAIL "$label: ncu or the program failed (see $(basename "$base.log"))"
  fi
}
if want profile; then
  sdpa_importable=0
  if selected step02_flash_attention; then
    if torch_with_cuda; then
      sdpa_importable=1
    else
      progress "profile: no PyTorch with CUDA for $python: SDPA's kernel not profiled"
    fi
  fi
  for mask in causal no-causal; do
    if selected step02_flash_attention; then
      # A rung's first launch is its check run: the grid of its timed runs,
      # on fresh inputs.
      for variant in ${profile_rungs//,/ }; do
        profile "step02_v${variant}_4096_d128_$mask" function flash2 1 "$bin/step02_flash_attention" --device cuda \
          --heads 16 --head-dims 128 --seq-lens 4096 --decode-lens 64 --prefill-tokens 16 --variant "$variant" \
          --repeats 1 "--$mask"
      done
      if ((sdpa_importable)); then
        profile "sdpa_4096_d128_$mask" function flash 1 \
          "$python" "$repo_root/step02_flash_attention/measure/sdpa_compare.py" \
          --heads 16 --head-dims 128 --seq-lens 4096 --dtypes float16 "--$mask" --runs 1
      fi
    fi
  done
  # Its large-shapes test runs [11008, 4096] first: int4-g128, then int8; per
  # row count the one-shot kernel, then the persistent one (16 rows: fp16,
  # then fp32 activations), so the first 12 launches are those two formats.
  if selected step06_cuda_kernels_gpu_test; then
    profile step06_llama_w1_int4g128_int8 function "persistent_matmul|one_shot_matmul" 12 \
      "$bin/step06_cuda_kernels_gpu_test" \
      --gtest_filter='CudaQuantizedKernelsLargeShapes.*'
  fi
  # The decode GEMVs at one row, on TinyLlama's shapes: the fp16 model's first
  # four launches are layer 0's products of its first forward (the fused QKV
  # [2560, 2048], wo [2048, 2048], the fused gate/up [11264, 2048], w2 [2048,
  # 5632]); step 06's int4 GEMV runs first in its kernel table, on w1/w3
  # [5632, 2048] and then w2 [2048, 5632], five launches each (a check run, 3
  # warm-ups, the timed run). Are they bound by the bandwidth, by the
  # instructions they issue, or by the latency of too few bytes in flight?
  # The fp16 products again without the RoPE fold (what the fold's epilogue
  # costs the QKV launch) and with each asking L2 for the next product's first
  # weights (what those requests cost the launch that makes them: its time and
  # DRAM bytes; Nsight Compute flushes the L2 between launches, so the next
  # launch's gain cannot show here).
  if selected step01_kv_cache; then
    for suffix_and_flag in ":" "_rope_kernel:--no-rope-folding" "_prefetch_next:--gemv-prefetch-next"; do
      suffix=${suffix_and_flag%%:*} flag=${suffix_and_flag#*:}
      profile "step01_tinyllama_fp16_gemv_layer0$suffix" demangled "cuda_core_gemv_kernel<.*HalfWeights" 4 \
        "$bin/step01_kv_cache" --device cuda --preset tinyllama-1.1b --variant 1 --dtype fp16 --steps 2 --repeats 1 \
        ${flag:+"$flag"}
    done
  fi
  if selected step06_quantization; then
    profile step06_tinyllama_int4g64_gemv demangled "cuda_core_gemv_kernel<.*Int4GroupWeights" 10 \
      "$bin/step06_quantization" --device cuda --preset tinyllama-1.1b --formats int4-g64 --batches 1 \
      --repeats 1 --steps 2 --no-quality
  fi
fi

# The steps' --quick runs (--full: their --full runs), CPU and CUDA rows side by side.
if want steps; then
  if ((full)); then
    for step in "${steps[@]}"; do run_step steps full "$step" --device all --full; done
  else
    for step in "${steps[@]}"; do run_step steps quick "$step" --device all --quick; done
  fi
fi

echo
echo "report: $out_dir ($failures failed)"
((failures == 0)) || exit 1
