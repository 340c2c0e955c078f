"""Sweep the Triton attention kernel's launch settings (block_m, num_warps, num_stages) and the
two-level K switch, per PV precision and causality. Prints, per setting, the full call's TOPS, the
kernel alone (inputs quantized once outside the timed region) and the quantization's share, so
`launch._launch_config` and `launch.K_RESIDUAL` are set from measurements.

    python bench/sweep_triton.py --lengths 4096 16384 --pv fp8 --causal yes
    python bench/sweep_triton.py --pv fp16 --k-residual on off --warps 4 --stages 3
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_attention import IMPLS, tops  # noqa: E402


def stats(k, v):
    """The passes before quantization: K's mean and, for FP8 P·V, V's amax per channel."""
    km = k.mean(dim=2, dtype=torch.float32)
    vmax = None if v is None else torch.linalg.vector_norm(v, ord=float("inf"), dim=2, dtype=torch.float32)
    return km, vmax


def sdpa_runners() -> dict:
    return {name: IMPLS[name]() for name in ("sdpa-flash", "sdpa-cudnn")}


def main(argv=None) -> int:
    import triton.testing

    from sageattention.quant import PVDtype
    from sageattention.triton import launch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128])
    ap.add_argument("--pv", nargs="+", default=["fp8", "fp16"], choices=[p.value for p in PVDtype])
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--block-m", type=int, nargs="+", default=[128])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--k-residual", nargs="+", default=["default"], choices=["default", "on", "off"])
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time in ms")
    ap.add_argument("--sdpa", action="store_true", help="also time torch SDPA's flash and cuDNN backends")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="JSON lines of every cell")
    args = ap.parse_args(argv)
    b, h = 4, 32
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    default_residual = dict(launch.K_RESIDUAL)
    original_config = launch._launch_config
    rows = []

    def bench(fn):
        fn()
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=25, rep=args.rep, return_mode="median")

    for d, pv_name, causal, n in itertools.product(args.head_dims, args.pv, causals, args.lengths):
        pv = PVDtype(pv_name)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        sm_scale = d**-0.5
        where = f"d={d} {pv.value} causal={int(causal)} n={n}"
        if args.sdpa:
            for backend, fn in sdpa_runners().items():
                ms = bench(functools.partial(fn, q, k, v, causal))
                rows.append({"d": d, "causal": causal, "n": n, "impl": backend, "full_ms": ms,
                             "full_tops": tops(b, h, n, d, causal, ms)})  # fmt: skip
                print(f"{where} {backend}: {tops(b, h, n, d, causal, ms):.0f} TOPS", flush=True)
        for res, bm, w, st in itertools.product(args.k_residual, args.block_m, args.warps, args.stages):
            launch.K_RESIDUAL[pv] = default_residual[pv] if res == "default" else res == "on"
            config = {"block_m": bm, "num_warps": w, "num_stages": st}
            launch._launch_config = lambda *a, config=config: config
            name = f"res={int(launch.K_RESIDUAL[pv])} m{bm} w{w} s{st}"
            try:
                km = k.mean(dim=2, dtype=torch.float32)
                vmax = torch.linalg.vector_norm(v, ord=float("inf"), dim=2, dtype=torch.float32)
                if pv is not PVDtype.FP8:
                    vmax = None
                common = dict(nq=n, nk=n, batch=b, pv=pv, return_lse=False, varlen=False)
                quantize = functools.partial(
                    launch.quantize, q, k, v, km, vmax, None, None, sm_scale=sm_scale, quant_backend="triton",
                    **common,
                )  # fmt: skip
                x = quantize()
                attend = functools.partial(
                    launch.attend, x, q, None, None, is_causal=causal, attn_mask=None, **common
                )
                full = functools.partial(
                    launch.attention_fwd, q, k, v, is_causal=causal, sm_scale=sm_scale, pv=pv, smooth_k=True
                )
                ms_full, ms_kernel, ms_quant = bench(full), bench(attend), bench(quantize)
                ms_stats = bench(functools.partial(stats, k, v if pv is PVDtype.FP8 else None))
                row = {
                    "d": d, "pv": pv.value, "causal": causal, "n": n, "k_residual": launch.K_RESIDUAL[pv],
                    **config, "full_ms": ms_full, "kernel_ms": ms_kernel, "quant_ms": ms_quant,
                    "stats_ms": ms_stats,
                    "full_tops": tops(b, h, n, d, causal, ms_full),
                    "kernel_tops": tops(b, h, n, d, causal, ms_kernel),
                }  # fmt: skip
                rows.append(row)
                share = 100 * (1 - ms_kernel / ms_full)
                print(
                    f"{where} {name}: full {row['full_tops']:.0f} TOPS kernel {row['kernel_tops']:.0f} TOPS "
                    f"(quantization {share:.0f}%: stats {1e3 * ms_stats:.0f} us, "
                    f"quant kernels {1e3 * ms_quant:.0f} us)",
                    flush=True,
                )
            except Exception as exc:  # noqa: BLE001 - a setting that fails to compile is reported, not fatal
                print(f"{where} {name}: ERR {type(exc).__name__}: {exc}"[:300])
        launch._launch_config = original_config
        launch.K_RESIDUAL.update(default_residual)
        del q, k, v
        torch.cuda.empty_cache()
    if args.out:
        args.out.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
