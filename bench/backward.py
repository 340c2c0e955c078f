"""Forward + backward and backward-only speed of sageattn against torch SDPA's cuDNN and flash backends.

    python bench/backward.py --out bench/results/backward-H200-<date>.json
    python bench/backward.py --n 4096 --sweep int8 # also try tile settings of the INT8 Triton backward

bf16, b=4 h=32 d=128, n in {4096, 16384}, causal and not (the issue's protocol). Every row is the
median of triton.testing.do_bench, in one run, so the ratios hold on a noisy machine:

- ``sageattn``: the full training call, quantized forward (LSE saved) + the default backward;
  ``sageattn [<backward>]``: the same with one backward of sageattention.autograd's table forced
  (triton, int8 (the quantized one), flash, cudnn where they can serve the call);
- ``sdpa cudnn`` / ``sdpa flash``: F.scaled_dot_product_attention under that backend, forward + backward.

TOPS: the forward counts 4*b*h*n*n*d FLOPs (halved for causal), the backward 2.5 times that, forward +
backward 3.5 times. ``bwd`` columns time ``torch.autograd.grad`` of an output already computed
(retain_graph), i.e. the backward alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[1]))

import sageattention as sa  # noqa: E402
from sageattention import autograd  # noqa: E402

BWD_FLOP_RATIO = 2.5


def flops_fwd(b, h, n, d, causal):
    return 4 * b * h * n * n * d / (2 if causal else 1)


def bench(fn, grads=()):
    import triton.testing  # noqa: PLC0415

    return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=list(grads), return_mode="median")


def _sdpa_backend(name):
    from torch.nn.attention import SDPBackend  # noqa: PLC0415

    return {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[name]


def measure(b, h, n, d, causal, dtype=torch.bfloat16) -> list[dict]:
    from torch.nn.attention import sdpa_kernel  # noqa: PLC0415

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    fwd = flops_fwd(b, h, n, d, causal)
    rows = []

    def row(name, call):
        try:
            with_grad = lambda: torch.autograd.backward(call(), dout)  # noqa: E731
            ms_all = bench(with_grad, (q, k, v))
            out = call()
            ms_bwd = bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
            with torch.no_grad():
                ms_fwd = bench(call)
        except (RuntimeError, ValueError) as exc:  # a backend that cannot take the call
            rows.append(
                {"impl": name, "n": n, "causal": causal, "error": f"{type(exc).__name__}: {exc}"[:300]}
            )
            return
        rows.append(
            {
                "impl": name,
                "n": n,
                "causal": causal,
                "ms_fwd": ms_fwd,
                "ms_bwd": ms_bwd,
                "ms_fwd_bwd": ms_all,
                "tops_fwd": fwd / ms_fwd * 1e-9,
                "tops_bwd": BWD_FLOP_RATIO * fwd / ms_bwd * 1e-9,
                "tops_fwd_bwd": (1 + BWD_FLOP_RATIO) * fwd / ms_all * 1e-9,
            }
        )

    row("sageattn", lambda: sa.sageattn(q, k, v, is_causal=causal))
    for impl in ("triton", "int8", "flash", "cudnn"):
        if autograd.BACKWARDS[impl].cannot_run(autograd._request(q, k, None, None, causal, False)) is None:
            with autograd.backward_order(impl):
                row(f"sageattn [{impl}]", lambda: sa.sageattn(q, k, v, is_causal=causal))
    for backend in ("cudnn", "flash"):

        def sdpa(backend=backend):
            with sdpa_kernel(_sdpa_backend(backend)):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        row(f"sdpa {backend}", sdpa)
    return rows


SWEEP = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages) of the dK/dV and dQ kernels
    "dkdv": [(64, 64, 4, 2), (64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 8, 3), (128, 64, 8, 2)],
    "dq": [(64, 64, 4, 2), (128, 64, 8, 2), (128, 32, 4, 3), (64, 128, 8, 2)],
}


def sweep(b, h, n, d, causal, quant=False) -> list[dict]:
    """Backward-only time of the Triton backward (INT8 when ``quant``) for each tile setting (one kernel
    varied at a time)."""
    from sageattention.triton import backward  # noqa: PLC0415

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (
        torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)
    )
    out, lse = sa.sageattn(q, k, v, is_causal=causal, return_lse=True)
    base = backward.block_config(d, quant)
    key = (backward._d_pad(d, quant), quant)
    rows = []
    for kernel, configs in SWEEP.items():
        for config in configs:
            backward.CONFIG_OVERRIDES[key] = {**base, kernel: config}
            try:
                ms = bench(
                    lambda: backward.attention_bwd(
                        dout, q, k, v, out, lse, is_causal=causal, sm_scale=d**-0.5, quant=quant
                    )
                )
                rows.append({"quant": quant, "kernel": kernel, "config": config, "n": n, "causal": causal,
                             "ms_bwd": ms})  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - an out-of-resources tile is a result, not a failure
                rows.append({"quant": quant, "kernel": kernel, "config": config, "n": n, "causal": causal,
                             "error": str(exc)[:200]})  # fmt: skip
            finally:
                backward.CONFIG_OVERRIDES.pop(key, None)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, help="JSON path (default bench/results/backward-<gpu>-<date>.json)"
    )
    parser.add_argument("--n", type=int, nargs="*", default=[4096, 16384])
    parser.add_argument("--b", type=int, default=4)
    parser.add_argument("--h", type=int, default=32)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--sweep", nargs="*", choices=("triton", "int8"), default=None,
                        help="also time tile settings of these Triton backwards (default both)")  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/backward.py needs a CUDA GPU", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    out = args.out or Path("bench/results") / f"backward-{name.replace(' ', '_')}-{date}.json"
    rows, sweeps = [], []
    for n in args.n:
        for causal in (False, True):
            rows += measure(args.b, args.h, n, args.d, causal)
            for impl in () if args.sweep is None else args.sweep or ("triton", "int8"):
                sweeps += sweep(args.b, args.h, n, args.d, causal, quant=impl == "int8")
            for r in rows[-7:]:
                if "error" in r:
                    print(f"n={n} causal={causal} {r['impl']}: {r['error']}")
                else:
                    print(
                        f"n={n:6d} causal={causal!s:5} {r['impl']:20s} fwd+bwd {r['tops_fwd_bwd']:6.1f} TOPS "
                        f"({r['ms_fwd_bwd']:.3f} ms)  bwd {r['tops_bwd']:6.1f} TOPS ({r['ms_bwd']:.3f} ms)  "
                        f"fwd {r['tops_fwd']:6.1f}"
                    )
    for r in rows:  # the ratio: forward + backward against cuDNN's, same n and causality
        ref = next(
            (
                x
                for x in rows
                if x["impl"] == "sdpa cudnn"
                and x["n"] == r["n"]
                and x["causal"] == r["causal"]
                and "error" not in x
            ),
            None,
        )
        if ref is not None and "error" not in r:
            r["fwd_bwd_vs_cudnn"] = ref["ms_fwd_bwd"] / r["ms_fwd_bwd"]
    report = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": date,
        "shape": {"b": args.b, "h": args.h, "d": args.d, "dtype": "bfloat16"},
        "flops": (
            f"fwd 4*b*h*n*n*d (halved for causal); bwd {BWD_FLOP_RATIO}x fwd; "
            f"fwd+bwd {1 + BWD_FLOP_RATIO}x fwd"
        ),
        "default_backward": autograd.default_order(torch.cuda.get_device_capability()),
        "rows": rows,
        "sweep": sweeps,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
