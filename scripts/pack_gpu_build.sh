#!/usr/bin/env bash
# Packs a CUDA build into one archive for a GPU machine that has a driver and
# the CUDA toolkit's libraries but no compiler and none of the course's
# development packages (a cloud GPU lent for an hour, a workshop's box).
#
#   cmake --preset hopper && cmake --build build-gpu -j    # here: sm_90, static CUDA runtime
#   scripts/pack_gpu_build.sh                              # build-gpu -> gpu-build.tar.xz
#   scripts/pack_gpu_build.sh --build-dir build-gpu --out gpu-build.tar.xz --models ../shared/models
#
# and there, in a checkout of the same commit (gpu_check.sh reads the
# repository's scripts and the steps' measure/ files beside the binaries):
#
#   mkdir -p build-gpu && tar -xJf gpu-build.tar.xz -C build-gpu
#   LLM_MODELS_DIR=$PWD/build-gpu/models scripts/gpu_check.sh --build-dir build-gpu
#
# The archive holds bin/ with what scripts/gpu_check.sh runs (every step, every
# gpu test binary, the steps' benchmarks), stripped of their host symbols (the
# GPU code and its kernel names stay: cuobjdump and Nsight Compute read them),
# and beside them the shared libraries they need that a GPU machine's base
# system may lack (ldd's answer here: fmt, Google Benchmark, cpp-httplib and
# what it links). Left out, because the GPU machine has its own and copies
# could shadow them for every program the check starts (PyTorch among them):
# the C and C++ runtimes (glibc, libstdc++, libgcc_s) and the CUDA libraries
# (the driver's libcuda, cuBLAS: gpu_check.sh adds $CUDA_HOME/lib64). The
# manifest (MANIFEST.txt) says which commit and CUDA architectures were built,
# the newest glibc and libstdc++ versions the binaries ask for, and every file.
# Needs ldd, strip and objdump (binutils, with g++) and xz (xz-utils) here.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=build-gpu
out=gpu-build.tar.xz
models_dir=

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --models) models_dir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "pack_gpu_build.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
bin=$build_dir/bin
fail() { echo "pack_gpu_build.sh: $*" >&2; exit 1; }
[[ -d $bin ]] || fail "no $bin: build first (cmake --preset hopper && cmake --build build-gpu -j)"
[[ -z $models_dir || -d $models_dir ]] || fail "--models $models_dir: not a folder"
cache=$build_dir/CMakeCache.txt
cuda_architectures=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$cache" 2>/dev/null || true)
[[ -n $cuda_architectures ]] || fail "$build_dir was configured without CUDA (no CMAKE_CUDA_ARCHITECTURES in $cache)"

# The binaries, named as gpu_check.sh names them: the steps by their folders,
# the gpu tests by their sources, and every step's benchmark that was built.
binaries=()
for step_dir in "$repo_root"/step[0-9][0-9]_*/; do binaries+=("$(basename "$step_dir")"); done
for source in "$repo_root"/tests/*_gpu_test.cpp; do binaries+=("$(basename "$source" .cpp)"); done
missing=()
for name in "${binaries[@]}"; do [[ -x $bin/$name ]] || missing+=("$name"); done
((${#missing[@]} == 0)) || fail "missing in $bin: ${missing[*]}"
for benchmark in "$bin"/step[0-9][0-9]_*_bench; do [[ -x $benchmark ]] && binaries+=("$(basename "$benchmark")"); done

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
mkdir "$staging/bin"
echo "pack_gpu_build.sh: ${#binaries[@]} binaries from $bin (CUDA architectures $cuda_architectures)" >&2
for name in "${binaries[@]}"; do
  strip --strip-all -o "$staging/bin/$name" "$bin/$name"
done

# Shared libraries: what ldd resolves here, less the runtimes the GPU machine
# brings (see the top). A library ldd cannot find would not be found there either.
is_system_or_cuda() {
  [[ $1 =~ ^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libstdc\+\+\.|libgcc_s\.) ]] ||
    [[ $1 =~ ^(libcuda\.|libcudart\.|libcublas|libcublasLt\.|libnvidia|libnvrtc\.) ]]
}
declare -A library_path=()
declare -A needed_by=()
for name in "${binaries[@]}"; do
  while read -r soname _ path _; do
    [[ -n $soname ]] || continue
    is_system_or_cuda "$soname" && continue
    [[ $path == /* ]] || fail "$name needs $soname, which ldd does not find here"
    library_path[$soname]=$path
    needed_by[$soname]="${needed_by[$soname]:-} $name"
  done < <(ldd "$bin/$name" | awk '/=>/ {print $1, $2, $3, $4}')
done
for soname in "${!library_path[@]}"; do cp -L "${library_path[$soname]}" "$staging/bin/$soname"; done

if [[ -n $models_dir ]]; then
  mkdir "$staging/models"
  cp -L "$models_dir"/* "$staging/models/"
fi

# What the binaries ask of the C and C++ runtimes they do not carry.
newest_version() {  # newest_version <symbol version prefix, e.g. GLIBCXX_>
  for name in "${binaries[@]}"; do objdump -T "$staging/bin/$name"; done |
    grep -o "($1[0-9.]*)" | tr -d '()' | sort -uV | tail -n 1
}
commit=$(git -C "$repo_root" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
{
  echo "commit: $commit"
  echo "CUDA architectures: $cuda_architectures"
  echo "needs on the GPU machine: an NVIDIA driver, cuBLAS (libcublas, libcublasLt) of the build's CUDA" \
    "major version, glibc with $(newest_version GLIBC_), libstdc++ with $(newest_version GLIBCXX_)"
  echo
  echo "libraries packed beside the binaries (and the binaries that need them):"
  for soname in $(printf '%s\n' "${!library_path[@]}" | sort); do
    echo "  $soname  <- ${library_path[$soname]}:${needed_by[$soname]}"
  done
  echo
  echo "files (bytes):"
  (cd "$staging" && find . -type f ! -name MANIFEST.txt -printf '  %P %s\n' | sort)
} >"$staging/MANIFEST.txt"

# xz -9: its 64 MiB window reaches across binaries, and the binaries share
# most of their bytes (each holds the CUDA runtime and the common kernels),
# so the archive shrinks to a fraction of what the default level gives, for
# a little more time here. XZ_OPT overrides it (CI packs with -0: it only
# checks the archive's contents).
XZ_OPT=${XZ_OPT:--9 -T0} tar -cJf "$out" -C "$staging" .
unpacked=$(du -sb "$staging" | cut -f1)
echo "pack_gpu_build.sh: $out: $(stat -c %s "$out") bytes ($unpacked unpacked; see MANIFEST.txt inside)" >&2
