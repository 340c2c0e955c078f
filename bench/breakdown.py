"""Where the GPU time of one call goes, kernel by kernel (torch.profiler), for implementations of
bench_attention.py at given shapes:

    python bench/breakdown.py cuda-sm90 sageattn --shapes 4x32x1024 4x32x4096 1x24x4608 --out b.json

Each shape is BxHxN (d=128 unless --d, bf16, non-causal unless --causal). After warm-up, --rep calls
run under the profiler; the table lists each kernel's mean GPU microseconds per call, the number of
kernel launches per call, and the sum. The gap between that sum and the call's wall time on the GPU
(launch gaps, host overhead) is what fewer launches can win back.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import torch
from bench_attention import IMPLS
from torch.profiler import ProfilerActivity, profile


def _short(name: str, width: int = 72) -> str:
    name = name.replace("void ", "")
    return name if len(name) <= width else name[: width - 1] + "…"


def breakdown(fn, q, k, v, causal: bool, rep: int) -> dict:
    for _ in range(3):
        fn(q, k, v, causal)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rep):
            fn(q, k, v, causal)
        torch.cuda.synchronize()
    per_kernel = defaultdict(float)
    count = 0
    first, last = None, None
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        per_kernel[ev.name] += getattr(ev, "device_time_total", None) or ev.cuda_time_total
        count += 1
        start, end = ev.time_range.start, ev.time_range.end
        first = start if first is None else min(first, start)
        last = end if last is None else max(last, end)
    kernels = {name: us / rep for name, us in sorted(per_kernel.items(), key=lambda kv: -kv[1])}
    span = (last - first) / rep if first is not None else 0.0
    total = sum(kernels.values())
    return {"kernels": kernels, "launches_per_call": count / rep, "sum_us": total, "span_us": span}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("impls", nargs="+", choices=sorted(IMPLS))
    ap.add_argument("--shapes", nargs="+", default=["4x32x1024", "4x32x4096", "1x24x4608"])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--out", help="write the breakdown as JSON here")
    args = ap.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for shape in args.shapes:
        b, h, n = (int(x) for x in shape.split("x"))
        shp = (b, h, n, args.d)
        q, k, v = (torch.randn(shp, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        for impl in args.impls:
            r = breakdown(IMPLS[impl](), q, k, v, args.causal, args.rep)
            r.update(impl=impl, b=b, h=h, n=n, d=args.d, causal=args.causal)
            results.append(r)
            head = f"{impl} b={b} h={h} n={n} d={args.d} causal={args.causal}"
            launches, total, span = r["launches_per_call"], r["sum_us"], r["span_us"]
            calls = f"{launches:.0f} launches, kernels {total:.1f} us, span {span:.1f} us"
            print(f"\n{head}: {calls}")
            for name, us in r["kernels"].items():
                print(f"  {us:9.1f} us  {_short(name)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
