"""The SDPA patch of sageattention.integrations.sdpa, measured: which calls it gives sageattn, and the
time of a Flux-sized attention call (b=1, h=24, n=4608, d=128) with and without it.

The patch itself is part of the package (nothing here is needed to use it):

    from sageattention.integrations.sdpa import install, patched
    patch = install()   # every F.scaled_dot_product_attention call of the process, where sageattn can
    print(patch.calls)  # how many calls went where, and why

or, for a script left as it is: ``python -m sageattention run script.py``.

Run as a script, this checks a few calls against the original function (where each went, cosine) and
times the attention calls both ways, back to back as a model issues them (ms per call).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as `python example/sdpa_monkeypatch.py`: make `example` importable
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from example.measure import cosine, default_device, describe, format_table, per_call_ms  # noqa: E402
from sageattention.integrations.sdpa import SAGE, patched  # noqa: E402

__all__ = ["SAGE", "check_calls", "main", "time_call"]


def check_calls(device: torch.device, n: int = 256) -> list[dict]:
    """A few calls, each through the patch and through the original: where it went, and the cosine."""
    original = F.scaled_dot_product_attention
    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    q, k, v = randn(2, 8, n, 64), randn(2, 8, n, 64), randn(2, 8, n, 64)
    kv2 = randn(2, 2, n, 64), randn(2, 2, n, 64)
    keep = torch.rand(2, 1, n, n, generator=gen).to(device) > 0.2
    cases = {
        "plain": ((q, k, v), {}),
        "causal": ((q, k, v), {"is_causal": True}),
        "GQA (enable_gqa)": ((q, *kv2), {"enable_gqa": True}),
        "bool mask": ((q, k, v), {"attn_mask": keep}),
        "additive mask": ((q, k, v), {"attn_mask": torch.where(keep, 0.0, -1e4).to(q.dtype)}),
        "scale=0.05": ((q, k, v), {"scale": 0.05}),
        "float32": ((q.float(), k.float(), v.float()), {}),
        "dropout_p=0.1 (seeded)": ((q, k, v), {"dropout_p": 0.1}),
        "head_dim 256": ((randn(1, 2, n, 256), randn(1, 2, n, 256), randn(1, 2, n, 256)), {}),
    }
    rows = []
    with patched(warn=False) as patch:
        for name, (args, kwargs) in cases.items():
            before = Counter(patch.calls)
            torch.manual_seed(1)
            out = F.scaled_dot_product_attention(*args, **kwargs)
            torch.manual_seed(1)
            ref = original(*args, **kwargs)
            went = next(iter((patch.calls - before).keys()))
            rows.append({"call": name, "went to": went, "cos vs original": cosine(out, ref)})
    return rows


def time_call(device: torch.device, b=1, h=24, n=4608, d=128, reps=10) -> dict:
    """Attention calls of this shape, back to back: the original against the patch (ms per call,
    speedup, cosine)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=gen).to(device, torch.bfloat16) for _ in range(3))
    original = F.scaled_dot_product_attention
    ref = original(q, k, v)
    sdpa_ms = per_call_ms(lambda: original(q, k, v), device, reps=reps)
    with patched(warn=False):
        out = F.scaled_dot_product_attention(q, k, v)
        sage_ms = per_call_ms(lambda: F.scaled_dot_product_attention(q, k, v), device, reps=reps)
    return {
        "shape": f"b={b} h={h} n={n} d={d}",
        "sdpa ms": sdpa_ms,
        "patched ms": sage_ms,
        "speedup": sdpa_ms / sage_ms,
        "cos": cosine(out, ref),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n", type=int, default=None, help="sequence length of the timed calls (4608 on a GPU)"
    )
    args = parser.parse_args(argv)
    device = default_device()
    print(f"device: {describe(device)}")
    if device.type != "cuda":
        print("no CUDA GPU: every call goes to the original function (sageattn would only run SDPA here)")
    print(format_table(check_calls(device), ["call", "went to", "cos vs original"]))
    n = args.n or (4608 if device.type == "cuda" else 256)
    row = time_call(device, n=n, h=24 if device.type == "cuda" else 2)
    print(format_table([row], ["shape", "sdpa ms", "patched ms", "speedup", "cos"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
