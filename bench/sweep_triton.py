"""Sweep the Triton attention kernel's launch settings (num_warps, num_stages) per PV precision and
causality; prints TOPS per setting so `launch._launch_config` can be set from measurements.

    python bench/sweep_triton.py --lengths 4096 16384
"""

from __future__ import annotations

import argparse
import functools
import itertools
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_attention import tops  # noqa: E402


def main(argv=None) -> int:
    import triton.testing

    from sageattention.quant import PVDtype
    from sageattention.triton import launch

    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4])
    args = ap.parse_args(argv)
    b, h = 4, 32
    for d, pv, causal in itertools.product(args.head_dims, PVDtype, (False, True)):
        for n in args.lengths:
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            cells = []
            for w, st in itertools.product(args.warps, args.stages):
                launch._launch_config = lambda *a, w=w, st=st: {"num_warps": w, "num_stages": st}
                try:
                    call = functools.partial(
                        launch.attention_fwd,
                        q,
                        k,
                        v,
                        is_causal=causal,
                        sm_scale=d**-0.5,
                        pv=pv,
                        smooth_k=True,
                    )
                    ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
                    cells.append(f"w{w}s{st}={tops(b, h, n, d, causal, ms):.0f}")
                except Exception as exc:  # noqa: BLE001 - a setting that fails to compile is reported, not fatal
                    cells.append(f"w{w}s{st}=ERR({type(exc).__name__})")
            print(f"d={d} {pv.value} causal={int(causal)} n={n}: " + " ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
