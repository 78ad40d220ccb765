#!/usr/bin/env python3
"""Instructions per unit of work in step 06's W4A16 / W8A16 kernels, read from their SASS.

Both kernels (step06_quantization/quantized_mma_one_shot.cu and
quantized_mma_persistent.cu) multiply one
"step" of a warp's 16-row tile at a time: 64 bytes of each row's codes, 8
tensor-core instructions (HMMA) per n-tile of 8 tokens for the 4-bit
schemes, 4 for int8. A profile counts what a whole launch executed; this
counts what one step costs in each kernel, without a GPU:
  - one_shot_matmul_kernel unrolls its 8 steps: the instructions from its
    first HMMA to its last, divided by 8 (its weights' loads come before the
    first HMMA, so they are not in it);
  - persistent_matmul_kernel unrolls its ring of units (one step of one
    tile): the instructions from one unit's first HMMA to the next unit's,
    on the path of a unit that ends no piece of a row block's K range. The
    code that ends a piece (write_output_tile, hand_over_partials) is left
    out: the regions between a BSSY and its BSYNC that store to global
    memory and hold no HMMA. The next unit's weight request is in (it is
    issued every unit), and so is the cursor's bookkeeping.
The first unit's window holds the ring's loop head, and the last has no next
unit to end it, so the persistent count is reported for the units between.
Code for sm_75 is skipped: there each m16n8k16 product is two HMMA.1688
(mma_fragments.cuh): the counts are of sm_80+ code (HMMA.16816).

Input: the SASS of the step 06 library or executable, as either disassembler
prints it (for sm_90 code, on a machine with the CUDA toolkit):
    cuobjdump -sass build/bin/step06_quantization > step06.sass
    nvdisasm -c quantized_mma_persistent.cubin > step06.sass
    scripts/sass_w4a16_unit_count.py step06.sass [--json counts.json]
    cuobjdump -sass build/bin/step06_quantization | scripts/sass_w4a16_unit_count.py -
"""
import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_tile_count import functions, opcode, open_listing  # noqa: E402  (the same SASS reader as step 02's counts)

SCHEMES = {"0": "int8", "1": "int4 asymmetric", "2": "int4 symmetric", "3": "nf4"}
KERNEL = re.compile(r"(one_shot|persistent)_matmul_kernelILNS_11QuantSchemeE(\d)E(6__half|f)Li(\d)E")
REGION_START = re.compile(r"\bBSSY\s+(B\d+)")
REGION_END = re.compile(r"\bBSYNC\s+(B\d+)")
GLOBAL_WRITES = {"STG", "ATOMG", "RED"}


def piece_end_code(instructions):
    """Indices of the code that ends a piece: BSSY..BSYNC regions that write global memory and hold no HMMA."""
    left_out, open_regions = set(), []
    for index, instruction in enumerate(instructions):
        start = REGION_START.search(instruction)
        if start:
            open_regions.append((start.group(1), index))
            continue
        end = REGION_END.search(instruction)
        if not end:
            continue
        for depth in range(len(open_regions) - 1, -1, -1):
            if open_regions[depth][0] == end.group(1):
                _, first = open_regions.pop(depth)
                ops = [opcode(text) for text in instructions[first:index + 1]]
                if GLOBAL_WRITES.intersection(ops) and "HMMA" not in ops:
                    left_out.update(range(first, index + 1))
                break
    return left_out


def count(name, body):
    """One row for a kernel, or None when `name` is not one of the two."""
    kernel = KERNEL.search(name)
    if not kernel:
        return None
    which, scheme, activations, n_tiles = kernel.group(1), SCHEMES[kernel.group(2)], kernel.group(3), int(kernel.group(4))
    instructions = [text for _, text in body]
    hmma = [i for i, text in enumerate(instructions) if opcode(text) == "HMMA"]
    if not any(".16816." in instructions[i] for i in hmma):
        return None  # sm_75 code (HMMA.1688), in a binary built for several architectures
    per_step = (4 if scheme == "int8" else 8) * n_tiles
    row = {"kernel": which, "scheme": scheme, "activations": "fp16" if activations == "6__half" else "fp32",
           "n_tiles": n_tiles, "hmma_per_step": per_step}
    if which == "one_shot":
        if len(hmma) != 8 * per_step:
            raise SystemExit(f"{name}: {len(hmma)} HMMA, expected 8 steps of {per_step}")
        span = instructions[hmma[0]:hmma[-1] + 1]
        row["instructions_per_step"] = round(len(span) / 8, 2)
        row["opcodes_per_step"] = {op: round(n / 8, 2) for op, n in collections.Counter(map(opcode, span)).most_common()}
        return row
    if len(hmma) % per_step or len(hmma) // per_step < 4:
        raise SystemExit(f"{name}: {len(hmma)} HMMA, not a ring of at least 4 units of {per_step}")
    left_out = piece_end_code(instructions)
    starts = hmma[::per_step]
    units = [[i for i in range(a, b) if i not in left_out] for a, b in zip(starts[1:-1], starts[2:])]
    opcodes = collections.Counter(opcode(instructions[i]) for unit in units for i in unit)
    row["ring_units"] = len(starts)
    row["instructions_per_unit"] = [len(unit) for unit in units]
    row["opcodes_per_unit"] = {op: round(n / len(units), 2) for op, n in opcodes.most_common()}
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sass", help="cuobjdump -sass or nvdisasm -c output (- for standard input)")
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args()
    rows = [row for name, body, _ in functions(open_listing(args.sass)) if (row := count(name, body))]
    if not rows:
        raise SystemExit(f"{args.sass}: no step 06 matmul kernel found")
    rows.sort(key=lambda r: (r["scheme"], r["activations"], r["n_tiles"], r["kernel"]))
    print(f"{'scheme':16} {'act.':5} {'tokens':>6}  {'one-shot / step':>15}  {'persistent / unit':>17}")
    for key in sorted({(r["scheme"], r["activations"], r["n_tiles"]) for r in rows}):
        pair = {r["kernel"]: r for r in rows if (r["scheme"], r["activations"], r["n_tiles"]) == key}
        step = pair.get("one_shot", {}).get("instructions_per_step")
        one_shot = f"{step:.1f}" if step is not None else ""
        units = pair.get("persistent", {}).get("instructions_per_unit", [])
        persistent = f"{sum(units) / len(units):.1f}" if units else ""
        tokens = "1-8" if key[2] == 1 else "9-16"
        print(f"{key[0]:16} {key[1]:5} {tokens:>6}  {one_shot:>15}  {persistent:>17}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"unit": "instructions one warp issues per step (one-shot) or per unit (persistent)",
                       "rows": rows}, out, indent=1)
            out.write("\n")


if __name__ == "__main__":
    main()
