#!/usr/bin/env bash
# The official OpenAI client library against step 07's server: installs the
# library (the exact version scripts/openai_client/package-lock.json pins)
# into the build folder, starts `step07_batching --serve` with stories260K on
# a free loopback port, runs scripts/openai_client/check.mjs against it, and
# stops the server.
#
#   scripts/openai_client_check.sh                     # build/bin/step07_batching
#   scripts/openai_client_check.sh --build-dir build-cpu
#
# Needs node and npm (Debian: apt-get install nodejs npm), the npm registry
# (once: the library is kept in BUILD_DIR/openai-client) and the model files
# (stories260K.bin, tok512.bin in $LLM_MODELS_DIR, else ../shared/models beside
# the project, as the tests find them). Exit status: the check's (0: every
# call behaved), 77 when node, npm or the models are missing, 1 when the
# server does not start.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=build

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "openai_client_check.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
[[ $build_dir = /* ]] || build_dir=$PWD/$build_dir
server=$build_dir/bin/step07_batching
models_dir=${LLM_MODELS_DIR:-$repo_root/../shared/models}

skip() { echo "openai_client_check.sh: skipped: $1" >&2; exit 77; }
command -v node >/dev/null 2>&1 || skip "no node on PATH (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null 2>&1 || skip "no npm on PATH (Debian: apt-get install npm)"
for model_file in stories260K.bin tok512.bin; do
  [[ -f $models_dir/$model_file ]] || skip "no $model_file in $models_dir (set LLM_MODELS_DIR)"
done
if [[ ! -x $server ]]; then
  echo "openai_client_check.sh: no $server: build step07_batching first" >&2
  exit 1
fi

# The library goes into the build folder, never the source tree: the package
# files and the script are copied there, and node resolves "openai" from the
# script's folder. npm ci installs what the lock file says, and only reinstalls
# when the lock file changed.
client_dir=$build_dir/openai-client
mkdir -p "$client_dir"
cp "$repo_root"/scripts/openai_client/{package.json,package-lock.json,check.mjs} "$client_dir"/
if ! cmp -s "$client_dir/package-lock.json" "$client_dir/node_modules/.package-lock.json.installed" 2>/dev/null; then
  npm ci --prefix "$client_dir" --no-audit --no-fund --loglevel=error
  cp "$client_dir/package-lock.json" "$client_dir/node_modules/.package-lock.json.installed"
fi

# The server, on a port the kernel picks (--serve 0); it prints the port in
# its first line. Its output goes to a log, shown when anything fails.
server_log=$client_dir/server.log
server_pid=
stop_server() {
  [[ -n $server_pid ]] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
}
on_exit() {
  local status=$?
  stop_server
  if ((status != 0 && status != 77)) && [[ -s $server_log ]]; then
    echo "--- the server's output ($server_log):" >&2
    cat "$server_log" >&2
  fi
  exit "$status"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$server" --serve 0 --model "$models_dir/stories260K.bin" --tokenizer "$models_dir/tok512.bin" >"$server_log" 2>&1 &
server_pid=$!
# Loading stories260K takes milliseconds; 20 s is for a slow, busy machine.
port=
for _ in $(seq 200); do
  port=$(sed -n 's|^serving .* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$server_log")
  [[ -n $port ]] && break
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "openai_client_check.sh: the server exited before it listened" >&2
    exit 1
  fi
  sleep 0.1
done
if [[ -z $port ]]; then
  echo "openai_client_check.sh: the server did not listen within 20 s" >&2
  exit 1
fi

node "$client_dir/check.mjs" "http://127.0.0.1:$port"
