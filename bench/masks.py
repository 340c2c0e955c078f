"""Key-padding masks: speed and accuracy of sageattn with a bool key-padding mask against torch SDPA with
the same mask (each backend that takes it, and the best of them), comfy-kitchen's masked INT8 attention
when it is installed, and sageattn's Triton FP8 path (which served every mask before), in one run.

A key-padding mask keeps the first L_b keys of batch entry b ([B, 1, 1, N] bool); ``--random`` keeps
random keys instead. TOPS count every key, kept or not (4*b*h*n*n*d / time), so the implementations
compare by time. Accuracy: cosine and relative L1 against float64 attention with the mask, next to
sageattn's without a mask on the same inputs.

    python bench/masks.py [--shapes 2x16x2048 1x24x4608] [--out bench/results/masks-....json]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accuracy import metrics  # noqa: E402
from bench_attention import tops, write_results  # noqa: E402

SDPA_BACKENDS = {
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
}
#: Kept keys of batch entry b: KEEP[b % len(KEEP)] of the sequence.
KEEP = (0.9, 0.6)


def key_mask(b: int, n: int, random: bool, device) -> torch.Tensor:
    if random:
        gen = torch.Generator(device=device).manual_seed(1)
        return (torch.rand(b, n, device=device, generator=gen) < 0.75).view(b, 1, 1, n)
    lengths = torch.tensor([int(n * KEEP[i % len(KEEP)]) for i in range(b)], device=device)
    return (torch.arange(n, device=device) < lengths.view(b, 1)).view(b, 1, 1, n)


def _rounded(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """accuracy.metrics of out against ref, to 6 digits (without its NaN flag)."""
    return {key: round(val, 6) for key, val in metrics(out, ref).items() if key != "nan"}


def implementations():
    import sageattention

    impls = {
        "sageattn": lambda q, k, v, m: sageattention.sageattn(q, k, v, attn_mask=m),
        "sage-triton-fp8": lambda q, k, v, m: sageattention.sageattn_qk_int8_pv_fp8_triton(
            q, k, v, attn_mask=m
        ),
    }
    for name, backend in SDPA_BACKENDS.items():

        def run(q, k, v, m, backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

        impls[name] = run
    try:
        from comfy_kitchen import sage_attention as ck
    except ImportError as exc:
        print(f"comfy-kitchen not measured: {exc}", file=sys.stderr)
    else:
        impls["comfy-kitchen"] = lambda q, k, v, m: ck.int8_attention(q, k, v, attn_mask=m)
    return impls


def main(argv=None) -> int:
    import triton.testing

    import sageattention
    from sageattention.reference import attention_ref

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["2x16x2048", "1x24x4608"], help="BxHxN, d=128")
    ap.add_argument("--random", action="store_true", help="random kept keys instead of a prefix per entry")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time in ms")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    impls = implementations()
    rows = []
    for shape in args.shapes:
        b, h, n = (int(x) for x in shape.split("x"))
        d = 128
        gen = torch.Generator(device=dev).manual_seed(n)
        q, k, v = (torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(3))
        mask = key_mask(b, n, args.random, dev)
        row = {"b": b, "h": h, "n": n, "d": d, "mask": "random" if args.random else "prefix", "tops": {},
               "ms": {}, "accuracy": {}}  # fmt: skip
        ref = attention_ref(q, k, v, attn_mask=mask)
        for impl, fn in impls.items():
            try:
                out = fn(q, k, v, mask)
                torch.cuda.synchronize()
                ms = triton.testing.do_bench(functools.partial(fn, q, k, v, mask), warmup=25, rep=args.rep,
                                             return_mode="median")  # fmt: skip
            except RuntimeError as exc:  # a backend that refuses the mask or the shape
                print(f"{impl} {shape}: {exc}".splitlines()[0], file=sys.stderr)
                continue
            row["ms"][impl] = round(ms, 4)
            row["tops"][impl] = round(tops(b, h, n, d, False, ms), 1)
            row["accuracy"][impl] = _rounded(out, ref)
        unmasked = sageattention.sageattn(q, k, v)
        row["accuracy"]["sageattn, no mask"] = _rounded(unmasked, attention_ref(q, k, v))
        sdpa = {i: t for i, t in row["tops"].items() if i.startswith("sdpa")}
        if sdpa:
            best = max(sdpa, key=sdpa.get)
            row["best sdpa"] = best
            row["sageattn / best sdpa"] = round(row["tops"].get("sageattn", 0) / sdpa[best], 3)
        if "comfy-kitchen" in row["tops"]:
            row["sageattn / comfy-kitchen"] = round(
                row["tops"].get("sageattn", 0) / row["tops"]["comfy-kitchen"], 3
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, ref
        torch.cuda.empty_cache()
    meta = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "unit": "TOPS (4*b*h*n*n*d / time, every key counted; median of do_bench); accuracy vs float64",
        "dtype": "bfloat16",
        "keep": "prefix of KEEP[b % 2] = (0.9, 0.6) of the keys" if not args.random else "random 75%",
    }
    write_results("masks", name, meta, rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
