#!/usr/bin/env bash
# Runs a step executable on bad input (a CTest entry; see tests/CMakeLists.txt)
# and passes when it exits with status 1, the status the README documents for
# bad input, and its output (stdout and stderr) contains every expected text,
# each --expect-once text exactly once (a phrase that must not be doubled).
#
#   expect_bad_input.sh [--expect TEXT]... [--expect-once TEXT]... -- COMMAND [ARGS...]
#
# An argument @models/NAME stands for the file NAME in the real-models folder:
# $LLM_MODELS_DIR, else $LLM_DEFAULT_MODELS_DIR (set by CTest). When that file
# is absent the test is skipped (status 77, CTest's SKIP_RETURN_CODE).
set -uo pipefail

expected=()
expected_once=()
while (($#)) && [[ $1 != -- ]]; do
  case $1 in
    --expect) expected+=("$2") ;;
    --expect-once) expected_once+=("$2") ;;
    *) echo "expect_bad_input.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
shift  # --

models=${LLM_MODELS_DIR:-${LLM_DEFAULT_MODELS_DIR:-}}
command=()
for word in "$@"; do
  if [[ $word == @models/* ]]; then
    path="$models/${word#@models/}"
    if [[ ! -f $path ]]; then
      echo "model file $path not found (set LLM_MODELS_DIR); skipping"
      exit 77
    fi
    word=$path
  fi
  command+=("$word")
done

out=$("${command[@]}" 2>&1)
status=$?
echo "$out"
failed=0
if ((status != 1)); then
  echo "FAIL: exit status $status, expected 1"
  failed=1
fi
for text in "${expected[@]}"; do
  if ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: the output does not say: $text"
    failed=1
  fi
done
for text in "${expected_once[@]}"; do
  count=$(grep -oF -- "$text" <<<"$out" | wc -l)
  if ((count != 1)); then
    echo "FAIL: the output says \"$text\" $count times, expected once"
    failed=1
  fi
done
exit $failed
