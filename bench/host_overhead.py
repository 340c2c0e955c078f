"""What a call costs the host against what it costs the GPU, per entry point.

For each shape and entry point (sageattn, F.scaled_dot_product_attention through example/sdpa_monkeypatch,
torch SDPA itself): the host's time to issue one call (a run of calls issued back to back, no sync
inside, on a GPU kept busy), the GPU's time per call (CUDA events around the same run) and one call on
its own, synchronized (as example/measure.time_ms times it). Where the host's time exceeds the GPU's,
eager callers wait on Python, not on the kernels.

    python bench/host_overhead.py [--calls 50] [--out results.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from example import sdpa_monkeypatch as smp  # noqa: E402
from example.measure import time_ms  # noqa: E402
from sageattention import sageattn  # noqa: E402

SHAPES = [(1, 24, 4608, 128), (4, 32, 1024, 128), (1, 8, 256, 64), (2, 32, 128, 128)]


def measure(fn, calls: int) -> dict:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    # Keep the GPU busy first (about 20 ms of spinning), so that the host's issue time is its own and
    # the calls queue up behind the spin: the events then time the GPU's work alone.
    torch.cuda._sleep(40_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls
    end.record()
    torch.cuda.synchronize()
    gpu = start.elapsed_time(end) / 1e3 / calls
    single_ms = time_ms(fn, torch.device("cuda"), warmup=0, reps=10)
    return {"host us": host * 1e6, "gpu us": gpu * 1e6, "single us": single_ms * 1e3}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for b, h, n, d in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        entries = {
            "sageattn": functools.partial(sageattn, q, k, v, tensor_layout="HND"),
            "torch SDPA": functools.partial(F.scaled_dot_product_attention, q, k, v),
        }
        with smp.patched(warn=False):
            entries["SDPA patched"] = functools.partial(F.scaled_dot_product_attention, q, k, v)
            for name, fn in entries.items():
                row = {"shape": f"b={b} h={h} n={n} d={d}", "entry": name, **measure(fn, args.calls)}
                rows.append(row)
                print(
                    f"{row['shape']:<22} {name:<13} host {row['host us']:8.1f} us"
                    f"  gpu {row['gpu us']:8.1f} us  single {row['single us']:8.1f} us",
                    flush=True,
                )
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
