#!/usr/bin/env python3
"""Plots step 07's JSON (step07_batching --json FILE) as PNG files.

    scripts/plot_step07.py step07.json --out plots/

One figure per device for each table the file holds:
  rate_sweep       latency vs throughput: p50 and p99 TTFT (and TPOT) against
                   achieved output tokens/s, one line per policy
  timeline         sequences in the batch over time, one panel per policy,
                   with the largest batch (config "max_batch") as a line
  batch_scaling    time per token and tokens/s against decode rows per
                   forward (log-2 axis), the roofline's prediction dashed
  chunked_prefill  p99 ITL and TPOT (and TTFT) against the prefill chunk
                   size; chunk 0 (chunking off) as a dashed level
A table the file lacks is skipped with a message; rows missing a key or
holding null (the JSON's NaN) are left out, never filled in. Needs Python 3
and matplotlib (Debian: python3-matplotlib); no other package.

Exit status: 0 when at least one figure was written, 1 for a missing or
malformed file or nothing to plot, 2 for a bad command line.
"""
import argparse
import json
import math
import os
import sys
from collections import OrderedDict

PROGRAM = "plot_step07.py"


def fail(message):
    sys.exit(f"{PROGRAM}: {message}")


def import_pyplot():
    """matplotlib with the Agg backend (files only, no display).

    Debian's python3-matplotlib lives in /usr/bin/python3's packages; when
    another python3 comes first on PATH (a pyenv shim, a virtualenv) and lacks
    it, the script runs itself again with Debian's (once).
    """
    try:
        import matplotlib
    except ImportError:
        debian_python = "/usr/bin/python3"
        retried = os.environ.get("PLOT_STEP07_RETRIED") == "1"
        if (not retried and os.path.exists(debian_python)
                and os.path.realpath(sys.executable) != os.path.realpath(debian_python)):
            os.environ["PLOT_STEP07_RETRIED"] = "1"
            os.execv(debian_python, [debian_python, os.path.abspath(__file__), *sys.argv[1:]])
        fail(f"matplotlib is not installed for {sys.executable} "
             "(Debian: apt-get install python3-matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def log_scale(ax, axis, base=10):
    """A log axis whose ticks read as plain numbers (1, 2, 5, 10, 20, ...),
    not only powers of the base."""
    from matplotlib import ticker
    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log", base=base)
    if base == 10:
        target.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(ticker.NullFormatter())


# --- Reading the JSON ---------------------------------------------------------


def load_results(path):
    """The results object (common/src/harness/results.cpp's layout), or exit 1."""
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except FileNotFoundError:
        fail(f"no such file: {path}")
    except (OSError, UnicodeDecodeError) as error:
        fail(f"cannot read {path}: {error}")
    except json.JSONDecodeError as error:
        fail(f"{path} is not valid JSON: {error}")
    if not isinstance(data, dict) or "step" not in data:
        fail(f"{path} is not a step's results JSON (expected an object with \"step\", \"config\", \"rows\")")
    if data.get("step") != "step07_batching":
        print(f"note: {path} comes from step {data.get('step')!r}, not step07_batching; plotting what matches")
    return data


def number(value):
    """A finite float, or None (null, text, NaN, a missing key)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def table_rows(data, name, required):
    """Rows of JSON table `name` that hold every key of `required`
    (numbers finite), or None with a message when the table is absent."""
    table = data.get(name)
    if table is None:
        print(f"skipping {name}: no table \"{name}\" in this file")
        return None
    if not isinstance(table, list):
        print(f"skipping {name}: \"{name}\" is not a list of rows")
        return None
    rows, dropped = [], 0
    for row in table:
        if not isinstance(row, dict) or any(key not in row for key in required):
            dropped += 1
            continue
        rows.append(row)
    if dropped:
        print(f"{name}: left out {dropped} row(s) without the keys {', '.join(required)}")
    if not rows:
        print(f"skipping {name}: no usable rows")
        return None
    return rows


def group_by(rows, key):
    """OrderedDict key value -> rows, in the order values first appear."""
    groups = OrderedDict()
    for row in rows:
        groups.setdefault(str(row[key]), []).append(row)
    return groups


def device_title(data, device):
    """'cpu: AMD EPYC (1 thread)' or 'cuda: NVIDIA H100 80GB HBM3', plus the model."""
    info = data.get("device_info") or {}
    if device == "cuda":
        name = info.get("gpu_name") or "GPU"
    elif device == "cpu":
        threads = info.get("cpu_threads")
        name = info.get("cpu_model") or "CPU"
        if isinstance(threads, int):
            name += f" ({threads} thread{'' if threads == 1 else 's'})"
    else:
        name = device
    model = (data.get("config") or {}).get("model")
    return f"{device}: {name}" + (f", {model}" if model else "")


def points(rows, x_key, y_key):
    """(xs, ys) of the rows where both are finite numbers, sorted by x."""
    pairs = sorted((number(r.get(x_key)), number(r.get(y_key))) for r in rows
                   if number(r.get(x_key)) is not None and number(r.get(y_key)) is not None)
    return [x for x, _ in pairs], [y for _, y in pairs]


def save(plt, figure, out_dir, name):
    path = os.path.join(out_dir, name)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    print(f"wrote {path}")
    return path


def file_part(text):
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


# --- (a) latency vs throughput -------------------------------------------------

RATE_SWEEP_KEYS = ("device", "policy", "rate_per_s", "ttft_p50_ms", "ttft_p99_ms")


def plot_rate_sweep(plt, data, out_dir, x_key):
    rows = table_rows(data, "rate_sweep", RATE_SWEEP_KEYS + (x_key,))
    if rows is None:
        return []
    written = []
    x_label = {"output_tokens_per_s": "achieved output tokens/s",
               "requests_per_s": "achieved requests/s"}.get(x_key, x_key)
    for device, device_rows in group_by(rows, "device").items():
        has_tpot = any(number(r.get("tpot_p99_ms")) is not None for r in device_rows)
        figure, axes = plt.subplots(1, 2 if has_tpot else 1, figsize=(13 if has_tpot else 7, 5), squeeze=False)
        panels = [("TTFT", "ttft", axes[0][0])] + ([("TPOT", "tpot", axes[0][1])] if has_tpot else [])
        for label, prefix, ax in panels:
            for index, (policy, policy_rows) in enumerate(group_by(device_rows, "policy").items()):
                color = f"C{index}"
                # Sorted by offered rate: the line walks from light to heavy load.
                ordered = sorted(policy_rows, key=lambda r: number(r.get("rate_per_s")) or 0.0)
                for percentile, style in (("p99", "-"), ("p50", "--")):
                    kept = [r for r in ordered if number(r.get(x_key)) is not None
                            and number(r.get(f"{prefix}_{percentile}_ms")) is not None]
                    xs = [number(r[x_key]) for r in kept]
                    ys = [number(r[f"{prefix}_{percentile}_ms"]) for r in kept]
                    if not xs:
                        continue
                    ax.plot(xs, ys, style, marker="o", color=color, label=f"{policy} {percentile}")
                    # Loads the policy did not keep up with: hollow red rings.
                    behind = [(x, y) for r, x, y in zip(kept, xs, ys) if r.get("keeps_up") is False]
                    if behind:
                        ax.scatter(*zip(*behind), s=110, facecolors="none", edgecolors="red", zorder=3)
            ax.set_xlabel(x_label)
            ax.set_ylabel(f"{label} (ms)")
            log_scale(ax, "y")
            ax.set_title(f"{label} p99 (solid) and p50 (dashed)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        figure.suptitle(f"latency vs throughput, {device_title(data, device)}\n"
                        "red rings: offered load the policy did not keep up with")
        figure.tight_layout()
        written.append(save(plt, figure, out_dir, f"rate_sweep_{file_part(device)}.png"))
    return written


# --- (b) batch occupancy over time ---------------------------------------------

TIMELINE_KEYS = ("device", "policy", "start_ms", "end_ms", "sequences")


def step_series(rows, key):
    """x, y for a post-step plot: each iteration holds its value from its
    start to the next recorded start (the table is thinned: gaps between
    recorded iterations take the last value), the last one to its end."""
    ordered = sorted((r for r in rows if number(r.get("start_ms")) is not None
                      and number(r.get(key)) is not None), key=lambda r: number(r["start_ms"]))
    if not ordered:
        return [], []
    xs = [number(r["start_ms"]) for r in ordered]
    ys = [number(r[key]) for r in ordered]
    end = number(ordered[-1].get("end_ms"))
    xs.append(end if end is not None else xs[-1])
    ys.append(ys[-1])
    return xs, ys


def plot_timeline(plt, data, out_dir):
    rows = table_rows(data, "timeline", TIMELINE_KEYS)
    if rows is None:
        return []
    max_batch = number((data.get("config") or {}).get("max_batch"))
    written = []
    for device, device_rows in group_by(rows, "device").items():
        policies = group_by(device_rows, "policy")
        figure, axes = plt.subplots(len(policies), 1, figsize=(11, 2.4 * len(policies) + 1), squeeze=False)
        for index, (policy, policy_rows) in enumerate(policies.items()):
            ax = axes[index][0]
            xs, ys = step_series(policy_rows, "sequences")
            ax.fill_between(xs, ys, step="post", alpha=0.35, color=f"C{index}")
            ax.step(xs, ys, where="post", color=f"C{index}", linewidth=0.8, label="sequences in the batch")
            wx, wy = step_series(policy_rows, "waiting")
            if wx:
                ax.step(wx, wy, where="post", color="gray", linewidth=0.8, linestyle=":", label="waiting")
            if max_batch is not None:
                ax.axhline(max_batch, color="black", linestyle="--", linewidth=1, label=f"max batch {max_batch:g}")
            ax.set_title(policy, loc="left", fontsize=10)
            ax.set_ylabel("sequences")
            ax.set_ylim(bottom=0)
            ax.yaxis.get_major_locator().set_params(integer=True)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8, loc="upper right")
        axes[-1][0].set_xlabel("time since the run's start (ms)")
        figure.suptitle(f"batch occupancy per iteration, {device_title(data, device)}")
        figure.tight_layout()
        written.append(save(plt, figure, out_dir, f"timeline_{file_part(device)}.png"))
    return written


# --- (c) batch scaling -----------------------------------------------------------

BATCH_SCALING_KEYS = ("device", "rows", "ms_per_token", "tokens_per_s")


def plot_batch_scaling(plt, data, out_dir):
    rows = table_rows(data, "batch_scaling", BATCH_SCALING_KEYS)
    if rows is None:
        return []
    written = []
    for device, device_rows in group_by(rows, "device").items():
        figure, (time_ax, rate_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
        xs, ys = points(device_rows, "rows", "ms_per_token")
        time_ax.plot(xs, ys, marker="o", label="measured")
        px, py = points(device_rows, "rows", "predicted_ms_per_token")
        if px:
            time_ax.plot(px, py, "--", marker=".", color="gray", label="roofline: max(bytes/BW, FLOPs/peak) / n")
        time_ax.set_ylabel("time per token (ms) = forward / n")
        log_scale(time_ax, "y")
        xs, ys = points(device_rows, "rows", "tokens_per_s")
        rate_ax.plot(xs, ys, marker="o", color="C1", label="measured")
        if px:
            rate_ax.plot(px, [1000.0 / y for y in py], "--", marker=".", color="gray", label="roofline")
        rate_ax.set_ylabel("tokens/s")
        for ax in (time_ax, rate_ax):
            log_scale(ax, "x", base=2)
            ax.set_xticks(xs)
            ax.set_xlabel("decode rows per forward (sequences in the batch)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        context = device_rows[0].get("context")
        figure.suptitle(f"one forward of n decode rows, {context} positions cached each: {device_title(data, device)}")
        figure.tight_layout()
        written.append(save(plt, figure, out_dir, f"batch_scaling_{file_part(device)}.png"))
    return written


# --- (d) chunked prefill ----------------------------------------------------------

CHUNKED_KEYS = ("device", "chunk_tokens")


def plot_chunked_prefill(plt, data, out_dir):
    rows = table_rows(data, "chunked_prefill", CHUNKED_KEYS)
    if rows is None:
        return []
    written = []
    for device, device_rows in group_by(rows, "device").items():
        chunked = [r for r in device_rows if (number(r.get("chunk_tokens")) or 0) > 0]
        off = [r for r in device_rows if number(r.get("chunk_tokens")) == 0]
        has_ttft = any(number(r.get("ttft_p99_ms")) is not None for r in device_rows)
        figure, axes = plt.subplots(1, 2 if has_ttft else 1, figsize=(12 if has_ttft else 7, 4.8), squeeze=False)
        panels = [(axes[0][0], (("itl_p99_ms", "ITL p99"), ("tpot_p99_ms", "TPOT p99")))]
        if has_ttft:
            panels.append((axes[0][1], (("ttft_p99_ms", "TTFT p99"),)))
        for ax, series in panels:
            for index, (key, label) in enumerate(series):
                color = f"C{index}"
                xs, ys = points(chunked, "chunk_tokens", key)
                if xs:
                    ax.plot(xs, ys, marker="o", color=color, label=label)
                # Chunking off has no chunk size: its level, across the axis.
                levels = [number(r.get(key)) for r in off if number(r.get(key)) is not None]
                if levels:
                    ax.axhline(levels[0], color=color, linestyle="--", linewidth=1, label=f"{label}, chunking off")
            chunk_sizes = sorted({number(r["chunk_tokens"]) for r in chunked})
            if chunk_sizes:
                log_scale(ax, "x", base=2)
                ax.set_xticks(chunk_sizes)
            ax.set_xlabel("prefill chunk (rows per forward)")
            ax.set_ylabel("ms")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        figure.suptitle(f"chunked prefill: tail latency vs chunk size, {device_title(data, device)}")
        figure.tight_layout()
        written.append(save(plt, figure, out_dir, f"chunked_prefill_{file_part(device)}.png"))
    return written


# --- main ---------------------------------------------------------------------------


def main(argv):
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("json", help="the JSON of step07_batching --json FILE")
    parser.add_argument("--out", default="plots", help="folder for the PNG files (created; default: plots)")
    parser.add_argument("--x", choices=("output_tokens_per_s", "requests_per_s"), default="output_tokens_per_s",
                        help="rate_sweep's x axis: achieved output tokens/s (default) or requests/s")
    args = parser.parse_args(argv)

    data = load_results(args.json)
    plt = import_pyplot()
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as error:
        fail(f"cannot create {args.out}: {error}")
    written = []
    written += plot_rate_sweep(plt, data, args.out, args.x)
    written += plot_timeline(plt, data, args.out)
    written += plot_batch_scaling(plt, data, args.out)
    written += plot_chunked_prefill(plt, data, args.out)
    if not written:
        fail(f"nothing to plot in {args.json}: none of rate_sweep, timeline, batch_scaling, chunked_prefill")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
