#!/usr/bin/env python3
"""Instructions per K/V tile in step 02's FlashAttention-2 ladder, read from its SASS.

A profile counts what a kernel executed; this counts what its main loop is
made of, per rung, without a GPU: the instructions one warp issues for one
K/V tile on the path a tile without a mask takes, by opcode. That is the
number the ladder's last rungs (13-16) cut, and it explains a profile's
"instructions executed" before the profile is taken.

Input: the SASS of the step 02 library or executable, as either disassembler
prints it (for sm_90 code, on a machine with the CUDA toolkit):
    cuobjdump -sass build/bin/step02_flash_attention > step02.sass
    nvdisasm -c v7_v16_cuda_flash2_tuned.cubin > step02.sass
    scripts/sass_tile_count.py step02.sass [--json counts.json]

How a tile is found in a kernel (flash2_tuned_kernel<Recipe, bf16, d>):
  - the loop starts at the last cp.async wait (DEPBAR.LE SB0, 0x0) before the
    first tensor-core instruction (HMMA), and ends at the first branch after
    the last HMMA (the branch back to its start);
  - the masked tile's code is left out: the compiler lays out the tiles with
    and without the mask as if/else, the second jumped over by an
    unconditional forward branch at the end of the first;
  - code behind a conditional forward branch is counted (the next tile's
    copies, the last tile's copies, variant 14's O rescale); the O rescale's
    multiplies are also reported alone (rescale_fmul: blocks of FMULs only,
    behind a conditional branch), since variant 14's vote skips them on most
    tiles;
  - each instruction counts once: variants 7-14 copy K and V in a loop whose
    trip count the compiler does not know (load_tile), laid out as an
    unrolled body and a remainder, so their copy code is counted as laid
    out, not as run.
So a count is an estimate of the path a full tile takes (within a few
dozen instructions for the copies); a profile's instructions executed is
the measurement.
"""
import argparse
import collections
import json
import re
import sys

# flash2_tuned_kernel's recipes (v7_v16_cuda_flash2_tuned.cu) -> variant ids (fp16, bf16).
RECIPE_VARIANTS = {
    "AsyncCopyRecipe": (7, None),
    "LdmatrixRecipe": (8, None),
    "Rows128Recipe": (9, None),
    "CausalScheduleRecipe": (10, None),
    "HalfOutputRecipe": (11, 12),
    "FastSoftmaxRecipe": (13, None),
    "LazyRescaleRecipe": (14, None),
    "HoistedCopiesRecipe": (15, 16),
}
KERNEL = re.compile(r"flash2_tuned_kernelI\w*?_\d+([A-Z][A-Za-z0-9]*Recipe)ELb([01])ELi(\d+)E")
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
BRANCH = re.compile(r"^(@!?U?P\w+\s+)?BRA\s+(?:`\((\.L_x_\d+)\)|(0x[0-9a-f]+))")


def open_listing(path):
    """A SASS listing to read: the file at `path`, or standard input for '-'."""
    return sys.stdin if path == "-" else open(path, encoding="utf-8", errors="replace")


def functions(lines):
    """Yields (mangled name, [(address, instruction)], {label: address})."""
    name, body, labels, pending = None, [], {}, []
    for line in lines:
        header = re.search(r"Function : (\S+)", line) or re.match(r"^\.text\.(\S+):", line)
        if header:
            if name:
                yield name, body, labels
            name, body, labels, pending = header.group(1), [], {}, []
            continue
        if name is None:
            continue
        label = LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        instruction = INSTRUCTION.match(line)
        if instruction:
            address = int(instruction.group(1), 16)
            for waiting in pending:
                labels[waiting] = address
            pending = []
            body.append((address, instruction.group(2)))
    if name:
        yield name, body, labels


def opcode(instruction):
    words = instruction.split()
    word = words[1] if words[0].startswith("@") else words[0]
    return word.split(".")[0]


def branch_target(instruction, labels):
    """(target address, conditional) of a branch, or None (not a branch, or
    a label the disassembler did not print)."""
    found = BRANCH.match(instruction)
    if not found:
        return None
    target = labels.get(found.group(2)) if found.group(2) else int(found.group(3), 16)
    return (target, bool(found.group(1))) if target is not None else None


def tile_counts(body, labels):
    hmma = [i for i, (_, ins) in enumerate(body) if opcode(ins) == "HMMA"]
    if not hmma:
        return None
    waits = [i for i in range(hmma[0]) if body[i][1].startswith("DEPBAR.LE SB0, 0x0")]
    branches = [i for i in range(hmma[-1], len(body)) if BRANCH.match(body[i][1])]
    if not waits or not branches:
        return None
    start, end = waits[-1], branches[0]
    skipped, rescale_fmul = set(), 0
    for i in range(start, end):
        target = branch_target(body[i][1], labels)
        if not target or target[0] <= body[i][0]:
            continue
        region = [j for j in range(i + 1, end + 1) if body[j][0] < target[0]]
        if target[1]:  # conditional: counted; variant 14's O rescale is a block of FMULs alone
            if len(region) >= 16 and all(opcode(body[j][1]) == "FMUL" for j in region):
                rescale_fmul += len(region)
        else:  # unconditional: the other side of an if/else (the masked tile)
            skipped.update(region)
    path = [body[i][1] for i in range(start, end + 1) if i not in skipped]
    return collections.Counter(opcode(ins) for ins in path), rescale_fmul


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sass", help="cuobjdump -sass or nvdisasm output ('-': standard input)")
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args()
    text = open_listing(args.sass)
    rows = []
    for name, body, labels in functions(text):
        kernel = KERNEL.search(name)
        if not kernel:
            continue
        recipe, bf16, head_dim = kernel.group(1), kernel.group(2) == "1", int(kernel.group(3))
        counted = tile_counts(body, labels)
        if recipe not in RECIPE_VARIANTS or counted is None:
            print(f"sass_tile_count: no main loop found in {name}", file=sys.stderr)
            continue
        counts, rescale_fmul = counted
        rows.append({"variant": RECIPE_VARIANTS[recipe][1 if bf16 else 0], "recipe": recipe,
                     "dtype": "bf16" if bf16 else "fp16", "head_dim": head_dim,
                     "instructions": sum(counts.values()), "rescale_fmul": rescale_fmul,
                     "opcodes": dict(counts.most_common())})
    if not rows:
        print("sass_tile_count: no flash2_tuned_kernel with a main loop in the input", file=sys.stderr)
        return 1
    rows.sort(key=lambda row: (row["head_dim"], row["variant"]))
    print("instructions per warp per K/V tile, unmasked path (rescale_fmul: the O rescale a vote may skip)")
    print(f"{'variant':>7} {'recipe':<22} {'dtype':<5} {'d':>4} {'instr':>6} {'rescale':>8}  top opcodes")
    for row in rows:
        top = ", ".join(f"{op} {n}" for op, n in list(row["opcodes"].items())[:8])
        print(f"{row['variant']:>7} {row['recipe']:<22} {row['dtype']:<5} {row['head_dim']:>4} "
              f"{row['instructions']:>6} {row['rescale_fmul']:>8}  {top}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"unit": "instructions per warp per K/V tile, unmasked path", "rows": rows}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
