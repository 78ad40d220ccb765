#!/usr/bin/env bash
# scripts/sass_tile_count.py on a small hand-written SASS listing with the
# shape the compiler gives a ladder kernel: a prologue wait, the loop's wait,
# a tile with and without the mask as if/else, a warp vote and the O rescale
# it can skip, the branch back. The path counted must leave out the masked
# side (2 instructions) and count the rescale's 16 FMULs, also alone; a
# listing without a ladder kernel must fail.
# Usage: sass_tile_count_test.sh <repository root>
set -euo pipefail
script=$1/scripts/sass_tile_count.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

{
  echo "	code for sm_90"
  echo "		Function : _ZN6step024cuda12_GLOBAL__N_119flash2_tuned_kernelINS1_17LazyRescaleRecipeELb0ELi64EEEvPKtS5_S5_PfPtiiiiifb"
  echo "        /*0000*/                   LDC R1, c[0x0][0x28] ;"
  echo "        /*0010*/                   DEPBAR.LE SB0, 0x0 ;"
  echo "        /*0020*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;"
  echo ".L_x_1:"
  echo "        /*0030*/                   DEPBAR.LE SB0, 0x0 ;"
  echo "        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;"
  echo "        /*0050*/                   LDGSTS.E.BYPASS.128 [R2], [R4.64] ;"
  echo "        /*0060*/                   LDSM.16.M88.4 R8, [R3] ;"
  echo "        /*0070*/                   HMMA.16816.F32 R12, R8, R10, RZ ;"
  echo "        /*0080*/               @P0 BRA \`(.L_x_2) ;"
  echo "        /*0090*/                   FMUL R12, R12, R20 ;"
  echo "        /*00a0*/                   BRA \`(.L_x_3) ;"
  echo ".L_x_2:"
  echo "        /*00b0*/                   FSEL R12, R12, -INF , P1 ;"
  echo "        /*00c0*/                   FMUL R12, R12, R20 ;"
  echo ".L_x_3:"
  echo "        /*00d0*/                   MUFU.EX2 R12, R12 ;"
  echo "        /*00e0*/                   VOTE.ANY P0, P2 ;"
  echo "        /*00f0*/              @!P0 BRA \`(.L_x_4) ;"
  for i in $(seq 0 15); do printf '        /*%04x*/                   FMUL R%d, R%d, R21 ;\n' $((0x100 + 16 * i)) $((30 + i)) $((30 + i)); done
  echo ".L_x_4:"
  echo "        /*0200*/                   HMMA.16816.F32 R24, R12, R14, R24 ;"
  echo "        /*0210*/               @P3 BRA \`(.L_x_1) ;"
  echo "        /*0220*/                   EXIT ;"
} >"$work/ladder.sass"

python3 "$script" "$work/ladder.sass" --json "$work/counts.json" >"$work/out.txt"
python3 - "$work/counts.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert len(rows) == 1, rows
row = rows[0]
want = {"variant": 14, "recipe": "LazyRescaleRecipe", "dtype": "fp16", "head_dim": 64,
        "instructions": 29, "rescale_fmul": 16}
for key, value in want.items():
    assert row[key] == value, f"{key}: {row[key]} (want {value})"
assert row["opcodes"]["FMUL"] == 17 and "FSEL" not in row["opcodes"], row["opcodes"]
assert row["opcodes"]["BRA"] == 4 and row["opcodes"]["HMMA"] == 2, row["opcodes"]
PY

# No ladder kernel: a message and exit 1.
echo "        /*0000*/                   EXIT ;" >"$work/empty.sass"
if python3 "$script" "$work/empty.sass" >"$work/empty.txt" 2>&1; then
  echo "sass_tile_count.py accepted a listing without a ladder kernel" >&2
  exit 1
fi
grep -q "no flash2_tuned_kernel" "$work/empty.txt"
echo "sass_tile_count.py: counts as expected"
