"""Where the gradient error of a training call comes from: the backward fed four pairs of (O, LSE).

The high-precision backward recomputes P from q, k and the saved LSE and takes D = rowsum(dO * O) from the
saved output, both the quantized forward's. This feeds the default backward (and each backward of the
table that serves the call) the kernel's O and LSE, float64 attention's (rounded as the forward rounds
them: O to the input dtype, the LSE to float32), and each mixed, and reports the cosine and relative L1
of dQ, dK and dV against float64 autograd, with the kernel's O and LSE against float64's. The inputs are
the accuracy protocol's (tests/gpu/conftest.py protocol_inputs: b=1 h=8 n=4096 d=128 bf16 NHD, randn and
outlier), dO randn.

    python bench/backward_accuracy.py [--out backward-accuracy.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import sageattention as sa
from sageattention import autograd
from sageattention.cuda_sm90 import half_exp2_tiles
from sageattention.quant import PVDtype
from sageattention.reference import attention_ref, sage_ref

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
from conftest import protocol_inputs  # noqa: E402  (the accuracy protocol's inputs)


def stats(got, ref) -> dict:
    g, r = got.double().flatten(), ref.double().flatten()
    cos = float(g @ r / (g.norm() * r.norm()).clamp_min(1e-300))
    return {"cos": round(cos, 7), "rel_l1": round(float((g - r).abs().sum() / r.abs().sum()), 6)}


def case(kind: str, causal: bool, groups: int) -> dict:
    q, k, v = protocol_inputs(kind, 0)  # HND views of NHD memory
    if groups > 1:
        k, v = k[:, ::groups].contiguous(), v[:, ::groups].contiguous()
    gen = torch.Generator(device="cuda").manual_seed(50)
    do = torch.randn(q.shape, device="cuda", generator=gen).to(q.dtype)
    scale = q.shape[-1] ** -0.5
    with torch.no_grad():
        out_k, lse_k = sa.sageattn(q, k, v, is_causal=causal, return_lse=True)
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    out_x, lse_x = attention_ref(qd, kd, vd, is_causal=causal, return_lse=True)
    ref = torch.autograd.grad((out_x * do.double()).sum(), (qd, kd, vd))
    out_x, lse_x = out_x.detach().to(q.dtype), lse_x.detach().float()
    row = {
        "kind": kind,
        "causal": causal,
        "groups": groups,
        "forward_out_vs_float64": stats(out_k, out_x),
        "forward_lse_max_abs_err": float((lse_k - lse_x).abs().max()),
    }
    feeds = {
        "kernel O, kernel LSE (training)": (out_k, lse_k),
        "exact O, exact LSE": (out_x, lse_x),
        "kernel O, exact LSE": (out_k, lse_x),
        "exact O, kernel LSE": (out_x, lse_k),
    }
    for rowsum in ("rounded", "exact"):  # the emulated forward (the kernel's row sum is "rounded")
        o, lse = sage_ref(q, k, v, is_causal=causal, pv=PVDtype.FP8, block_m=1, block_n=128, rowsum=rowsum,
                          half_exp2_tiles=half_exp2_tiles(q.shape[-1]), return_lse=True)  # fmt: skip
        feeds[f"sage_ref O, LSE (rowsum {rowsum})"] = (o.to(q.dtype), lse.float())
        row[f"sage_ref_{rowsum}_out_vs_float64"] = stats(o, out_x)
        row[f"sage_ref_{rowsum}_lse_max_abs_err"] = float((lse - lse_x).abs().max())
    grads = {}
    for impl in ("default", "triton", "int8", "cudnn"):
        if impl != "default" and autograd.backward_for(q, k, is_causal=causal) == impl:
            continue
        try:
            order = autograd.backward_order(None if impl == "default" else impl)
            with order:
                name = autograd.backward_for(q, k, is_causal=causal)
                for feed, (o, lse) in feeds.items():
                    got = autograd._dense_backward(do, q, k, v, o, lse, None, None, causal, scale)
                    grads[f"{impl} ({name}): {feed}"] = {
                        f"d{t}": stats(g, r) for t, g, r in zip("qkv", got, ref)
                    }
        except RuntimeError as exc:  # a backward that cannot serve the call
            grads[f"{impl}: n/a"] = str(exc)[:120]
    row["backward"] = grads
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for kind in ("randn", "outlier"):
        for causal in (False, True):
            for groups in (1, 4):
                row = case(kind, causal, groups)
                rows.append(row)
                print(f"{kind} causal={causal} groups={groups}: O {row['forward_out_vs_float64']}, "
                      f"LSE max err {row['forward_lse_max_abs_err']:.4f}", flush=True)  # fmt: skip
                for feed, g in row["backward"].items():
                    if isinstance(g, dict):
                        print(f"   {feed:<58}" + "  ".join(f"{t} {s['cos']:.6f}" for t, s in g.items()))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
