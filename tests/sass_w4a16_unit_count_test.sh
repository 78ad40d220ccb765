#!/usr/bin/env bash
# scripts/sass_w4a16_unit_count.py on a small hand-written SASS listing with
# the shape the compiler gives step 06's two kernels (int8, fp16, one n-tile:
# 4 HMMA per step): a one-shot kernel of 8 unrolled steps, and a persistent
# kernel whose ring of 4 units each holds a weight request (a BSSY region
# with loads: counted) and a piece's end (a BSSY region that stores y:
# left out). A unit must count its 4 HMMA, its 3 other instructions and its
# request's 3, not the store's 3; the same one-shot kernel compiled for sm_75
# (each product two HMMA.1688) is skipped; a listing without either kernel
# must fail.
# Usage: sass_w4a16_unit_count_test.sh <repository root>
set -euo pipefail
script=$1/scripts/sass_w4a16_unit_count.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

address=0
emit() {  # emit INSTRUCTION: one line of an nvdisasm-like listing
  printf '        /*%04x*/                   %s ;\n' "$address" "$1"
  address=$((address + 16))
}
function_header() {  # function_header ARCHITECTURE NAME: a function's first lines, addresses from 0
  address=0
  echo "	code for $1"
  echo "		Function : $2"
}
# Each kernel in an unnamed namespace of its own file, inside step06::quantized_mma.
one_shot_file="_ZN6step0613quantized_mma63_GLOBAL__N__049e6b67_25_quantized_mma_one_shot_cu_5c9f39ad_4374"
persistent_file="_ZN6step0613quantized_mma60_GLOBAL__N__af4b0157_27_quantized_mma_persistent_cu_ef429048"
one_shot_int8="${one_shot_file}22one_shot_matmul_kernelILNS_11QuantSchemeE0E6__halfLi1EEEvNS0_16DeviceMatrixViewEPKT0_ibPS6_NS0_10SplitKViewE"
{
  function_header sm_90 "$one_shot_int8"
  emit "LDG.E.128 R40, [R2.64]"
  for step in $(seq 0 7); do
    for i in 1 2 3 4; do emit "HMMA.16816.F32 R8, R12, R16, R8"; done
    emit "PRMT R12, R40, 0x4140, R50"
    emit "HADD2 R12, R12, -R51"
  done
  emit "EXIT"
  function_header sm_75 "$one_shot_int8"
  for i in $(seq 1 64); do emit "HMMA.1688.F32 R8, R12, R16, R8"; done
  emit "EXIT"
  function_header sm_90 "${persistent_file}24persistent_matmul_kernelILNS_11QuantSchemeE0E6__halfLi1EEEvNS0_16DeviceMatrixViewENS0_14PersistentPlanEPKT0_iNS0_8XStagingEPS7_NS0_10SplitKViewE"
  emit "LDG.E.128 R40, [R2.64]"
  for unit in $(seq 0 3); do
    for i in 1 2 3 4; do emit "HMMA.16816.F32 R8, R12, R16, R8"; done
    emit "BSSY B2, \`(.L_x_$((10 + unit)))"
    emit "@!P0 LDG.E.EF.128 R40, [R10.64]"
    emit "BSYNC B2"
    emit "BSSY B2, \`(.L_x_$((20 + unit)))"
    emit "@P1 STG.E.U16 [R20.64], R8"
    emit "BSYNC B2"
    emit "ISETP.GE.AND P0, PT, R4, 0x1, PT"
    emit "PRMT R12, R40, 0x4140, R50"
    emit "HADD2 R12, R12, -R51"
  done
  emit "EXIT"
} >"$work/step06.sass"

python3 "$script" "$work/step06.sass" --json "$work/counts.json" >"$work/out.txt"
python3 - "$work/counts.json" <<'PY'
import json, sys
listed = json.load(open(sys.argv[1]))["rows"]
assert len(listed) == 2, listed  # the sm_75 one-shot kernel is not among them
rows = {row["kernel"]: row for row in listed}
assert set(rows) == {"one_shot", "persistent"}, rows
one_shot, persistent = rows["one_shot"], rows["persistent"]
assert one_shot["scheme"] == "int8" and one_shot["hmma_per_step"] == 4, one_shot
# From the first HMMA to the last: 8 steps of 6, less the last step's 2 after its last HMMA.
assert one_shot["instructions_per_step"] == (8 * 6 - 2) / 8, one_shot
assert persistent["ring_units"] == 4, persistent
assert persistent["instructions_per_unit"] == [10, 10], persistent
ops = persistent["opcodes_per_unit"]
assert "STG" not in ops and ops["LDG"] == 1 and ops["BSSY"] == 1 and ops["HMMA"] == 4, ops
PY

# No step 06 kernel: a message and exit 1.
echo "        /*0000*/                   EXIT ;" >"$work/empty.sass"
if python3 "$script" "$work/empty.sass" >"$work/empty.txt" 2>&1; then
  echo "sass_w4a16_unit_count.py accepted a listing without a step 06 kernel" >&2
  exit 1
fi
grep -q "no step 06 matmul kernel" "$work/empty.txt"
echo "sass_w4a16_unit_count.py: counts as expected"
