#!/usr/bin/env python3
"""Prints the markdown tables of docs/02_flash_attention.md from the executable's JSON.

    python3 step02_flash_attention/measure/results_table.py docs/results/step02_flash_attention_cpu.json

Numbers in the docs come from this output, never typed by hand.
"""
import json
import sys


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def main(path: str) -> None:
    data = json.load(open(path))
    info = data["device_info"]
    gpu = info["gpu_name"] or "none"
    print(f"device: CPU {info['cpu_model']} ({info['cpu_threads']} thread), GPU {gpu}; commit {data['commit']}\n")
    rows = data["rows"]
    for phase in ("prefill", "decode"):
        shapes = sorted({(r["heads"], r["head_dim"]) for r in rows if r.get("phase") == phase})
        for heads, d in shapes:
            print(f"**{phase}, {heads} heads, head_dim {d}, causal**\n")
            if phase == "prefill":
                print("| Sq = Sk | variant | time | TFLOP/s | speedup vs naive | scores memory | max rel err |")
                print("|---:|---|---:|---:|---:|---:|---:|")
            else:
                print("| Sk (Sq = 1) | variant | time | KV GB/s | speedup vs naive | scores memory | max rel err |")
                print("|---:|---|---:|---:|---:|---:|---:|")
            for r in rows:
                if r.get("phase") != phase or r["heads"] != heads or r["head_dim"] != d:
                    continue
                t = r["time_ms"]
                time = f"{t:.2f} ms" if t >= 1 else f"{t * 1000:.1f} us"
                rate = f"{r['tflops']:.3f}" if phase == "prefill" else f"{r['kv_gbps']:.1f}"
                print(f"| {r['seqlen_k']} | {r['device']} {r['variant']} | {time} | {rate} | {r['speedup']:.2f}x | "
                      f"{human_bytes(r['score_bytes'])} | {r['max_rel_err']:.1e} |")
            print()
    model = [r for r in rows if r.get("phase") == "model_prefill"]
    if model:
        print(f"**model prefill, {data['config'].get('model', '')} "
              f"({data['config'].get('model_config', '')}), {model[0]['prompt_tokens']}-token prompt**\n")
        # max rel err: the worse of "vs the same device's before row" and
        # "vs the CPU's before row" (the reference), on the last row's logits.
        print("| variant | attention | time | tokens/s | speedup | max rel err (logits) |")
        print("|---|---|---:|---:|---:|---:|")
        for r in model:
            print(f"| {r['device']} {r['variant']} | {r['attention']} | {r['time_ms']:.1f} ms | "
                  f"{r['tokens_per_s']:.0f} | {r['speedup']:.2f}x | {r['max_rel_err']:.1e} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/results/step02_flash_attention_cpu.json")
