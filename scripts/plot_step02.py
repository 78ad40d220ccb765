#!/usr/bin/env python3
"""Plots step 02's prefill TFLOP/s against the sequence length, beside PyTorch SDPA.

    scripts/plot_step02.py STEP02.json [...] SDPA.json [...] --out FIGURE.png

Takes any number of JSON files written by `step02_flash_attention --json` (with
--compare-sdpa, PyTorch's rows come in its table "sdpa") and by
`step02_flash_attention/measure/sdpa_compare.py --json`, keeps their CUDA prefill
rows, and draws one panel per (causal or not, head_dim) found: TFLOP/s (log axis)
against Sq = Sk (log-2 axis), one line per variant. The 16-bit variants are drawn
in fp16 only (bf16 is within a few percent of it in every recorded file). Rows
missing a key or holding null are left out, never filled in.

docs/02_flash_attention.md, section 8.2, shows the figure made from the 16-head
H100 files of docs/results/. Needs matplotlib (Debian: python3-matplotlib).

Exit status: 0 when the figure was written, 1 for an unreadable file or nothing to
plot, 2 for a bad command line.
"""
import argparse
import json
import sys

PROGRAM = "plot_step02.py"

# variant name in the JSON -> label in the legend, in drawing order
VARIANTS = {
    "cuda_naive": "cuda_naive (fp32, S in global memory)",
    "cuda_flash1": "cuda_flash1 (fp32, FA1)",
    "cuda_flash2_fp16": "cuda_flash2_fp16 (tensor cores, FA2)",
    "cuda_flash2_tuned_fp16": "cuda_flash2_tuned_fp16 (the FA2 ladder's last rung)",
    "torch_sdpa_float16": "PyTorch SDPA fp16 (FlashAttention-2)",
}


def fail(message):
    sys.exit(f"{PROGRAM}: {message}")


def prefill_points(paths):
    """{(causal, head_dim): {variant: [(seqlen, tflops), ...]}} from the files' rows."""
    panels = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as file:
                document = json.load(file)
            rows = list(document["rows"])
            # A step run with --compare-sdpa: PyTorch's side of its "sdpa" table.
            for line in document.get("sdpa", []):
                rows.append({"device": "cuda", "phase": "prefill", "variant": "torch_sdpa_" + {
                    "fp16": "float16", "bf16": "bfloat16"}.get(line.get("dtype"), "?"), "causal": line.get("causal"),
                    "head_dim": line.get("head_dim"), "seqlen_q": line.get("seqlen"),
                    "tflops": line.get("torch_tflops")})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            fail(f"cannot read the rows of {path}: {error}")
        for row in rows:
            if row.get("device") != "cuda" or row.get("phase") != "prefill":
                continue
            if row.get("variant") not in VARIANTS:
                continue
            values = [row.get(key) for key in ("causal", "head_dim", "seqlen_q", "tflops")]
            if any(value is None for value in values):
                continue
            causal, head_dim, seqlen, tflops = values
            series = panels.setdefault((bool(causal), int(head_dim)), {})
            series.setdefault(row["variant"], []).append((int(seqlen), float(tflops)))
    return panels


def draw(panels, out):
    try:
        import matplotlib
    except ImportError:
        fail(f"matplotlib is not installed for {sys.executable} (Debian: apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(panels, key=lambda key: (not key[0], -key[1]))  # causal first, larger head_dim first
    columns = min(2, len(keys))
    rows = (len(keys) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 4.4 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        causal, head_dim = key
        for variant, label in VARIANTS.items():
            points = sorted(panels[key].get(variant, []))
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        lengths = sorted({p[0] for points in panels[key].values() for p in points})
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(length) for length in lengths])  # plain numbers, not powers of 2
        ax.set_yscale("log")
        ax.set_xlabel("Sq = Sk (tokens)")
        ax.set_ylabel("TFLOP/s (useful work)")
        ax.set_title(f"prefill, {'causal' if causal else 'not causal'}, head_dim {head_dim}")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    # One legend for all panels, below them, so that it hides no line.
    handles, labels = axes.flat[0].get_legend_handles_labels()
    # Two columns of entries where the panels are wide enough, one under a
    # single panel; the panels leave room for as many lines as it takes.
    legend_columns = 2 if columns > 1 else 1
    legend_lines = -(-len(labels) // legend_columns)
    figure.legend(handles, labels, loc="lower center", ncol=legend_columns, frameon=False)
    figure.tight_layout(rect=(0, min(0.4, (0.015 + 0.05 * legend_lines) / rows), 1, 1))
    figure.savefig(out, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="JSON files of step02_flash_attention and sdpa_compare.py")
    parser.add_argument("--out", required=True, help="the PNG file to write")
    options = parser.parse_args()
    panels = prefill_points(options.files)
    if not panels:
        fail("no CUDA prefill rows of a known variant in " + ", ".join(options.files))
    draw(panels, options.out)
    print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
