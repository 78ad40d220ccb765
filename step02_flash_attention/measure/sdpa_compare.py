#!/usr/bin/env python3
"""Times PyTorch's scaled_dot_product_attention on step 02's shapes.

Run it by hand where a GPU and PyTorch are present (never in CI):

    python3 step02_flash_attention/measure/sdpa_compare.py --json docs/results/step02_sdpa_<gpu>.json

or let the step run it beside its own rows, in the same run (the step's JSON
then holds both, and the targets):

    build/bin/step02_flash_attention --device cuda --compare-sdpa step02_flash_attention/measure/sdpa_compare.py

Shapes match the executable's prefill table: Q/K/V [batch 1, heads, seqlen, head_dim],
causal, fp16 and bf16, for each sequence length and head dim. The FLASH_ATTENTION
backend is requested explicitly (FlashAttention-2 inside PyTorch); where it cannot
run (old GPU, unsupported dtype) the row says so and the default backend's time is
given instead. TFLOP/s uses the executable's formula: 4 * d * heads * visible
(query, key) pairs, i.e. about half of 4*S*S*d*heads for causal attention, so
"cuda_flash2_fp16 is x% of PyTorch SDPA" is a ratio of the two TFLOP/s numbers
(or of the times) for the same row.
"""
import argparse
import json
import platform
import sys


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    if not causal:
        return seqlen_q * seqlen_k
    # Bottom-right aligned mask, as in the course: query i sees keys 0..(Sk - Sq + i).
    return sum(max(0, min(seqlen_k, seqlen_k - seqlen_q + i + 1)) for i in range(seqlen_q))


def time_ms(fn, torch, warmup: int, runs: int) -> dict:
    """Median/min/max of `runs` CUDA-event timings after `warmup` untimed runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    # Flush L2 between runs like the C++ timer (llm::cuda::time_cuda): a buffer
    # larger than any L2 (H100: 50 MB) written before every run.
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    samples = []
    for _ in range(runs):
        flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(stop))
    samples.sort()
    return {"median_ms": samples[len(samples) // 2], "min_ms": samples[0], "max_ms": samples[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="256,512,1024,2048,4096,8192,16384")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                        help="causal mask (default); --no-causal for full attention")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", default="",
                        help="write the rows to this file; '-': to stdout, the table then goes to stderr "
                             "(how the step's --compare-sdpa reads them)")
    args = parser.parse_args()
    # The table's stream: stderr when stdout carries the JSON.
    table = sys.stderr if args.json == "-" else sys.stdout

    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("PyTorch is not installed (pip install torch); nothing to compare against", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("no CUDA device visible to PyTorch; this script only makes sense on a GPU", file=sys.stderr)
        return 1

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # PyTorch < 2.3
        SDPBackend = sdpa_kernel = None

    props = torch.cuda.get_device_properties(0)
    device_info = {
        "gpu_name": props.name,
        "gpu_compute_capability": props.major * 10 + props.minor,
        "gpu_sm_count": props.multi_processor_count,
        "gpu_memory_gib": props.total_memory / 2**30,
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "python": platform.python_version(),
    }
    print(f"gpu: {props.name} (sm_{device_info['gpu_compute_capability']}), torch {torch.__version__}", file=table)
    print(f"{'dtype':<9} {'d':>4} {'S':>6} {'backend':<16} {'time':>10} {'TFLOP/s':>8}", file=table)

    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for head_dim in (int(x) for x in args.head_dims.split(",")):
            for n in (int(x) for x in args.seq_lens.split(",")):
                q, k, v = (torch.empty(1, args.heads, n, head_dim, device="cuda", dtype=dtype).uniform_(-2, 2)
                           for _ in range(3))

                def run():
                    # Sq == Sk here, so PyTorch's top-left causal mask equals the course's bottom-right one.
                    return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)

                backend, note = "default", ""
                try:
                    if sdpa_kernel is not None:
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            stats = time_ms(run, torch, 3, args.runs)
                        backend = "flash_attention"
                    else:
                        stats = time_ms(run, torch, 3, args.runs)
                except RuntimeError as error:  # flash backend unavailable for this GPU/dtype
                    note = f"flash backend unavailable: {str(error).splitlines()[0]}"
                    stats = time_ms(run, torch, 3, args.runs)
                flops = 4.0 * head_dim * args.heads * visible_pairs(n, n, args.causal)
                tflops = flops / (stats["median_ms"] * 1e-3) / 1e12
                print(f"{dtype_name:<9} {head_dim:>4} {n:>6} {backend:<16} {stats['median_ms']:>8.3f}ms {tflops:>8.2f}"
                      + (f"  ({note})" if note else ""), file=table, flush=True)
                rows.append({"device": "cuda", "variant": f"torch_sdpa_{dtype_name}", "id": 90,
                             "backend": backend, "note": note, "dtype": dtype_name, "phase": "prefill",
                             "seqlen_q": n, "seqlen_k": n, "heads": args.heads, "kv_heads": args.heads,
                             "head_dim": head_dim, "causal": args.causal, "flops": flops, "tflops": tflops,
                             "time_ms": stats["median_ms"], "time_min_ms": stats["min_ms"],
                             "time_max_ms": stats["max_ms"], "ok": True})
                del q, k, v

    document = {"step": "step02_flash_attention", "title": "PyTorch SDPA on step 02's shapes",
                "config": {"heads": args.heads, "runs": args.runs, "causal": args.causal,
                           "flops_formula": "4 * head_dim * heads * visible (query, key) pairs"},
                "device_info": device_info, "rows": rows}
    if args.json == "-":
        json.dump(document, sys.stdout, indent=2)
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
