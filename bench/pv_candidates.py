"""Which P·V encoding could give FP16-P·V accuracy on sm90 (issue: accuracy at FP8 speed): the candidates
simulated, in float32 steps, against float64 attention on the accuracy protocol's inputs.

Every candidate shares the sm90 kernel's Q·K (sageattention.reference.quantize_qk_ref: INT8 Q per
token, INT8 K per block of 128 keys, K smoothed) and its online softmax over 128-key blocks (P =
2^(s - running max), the row sum of the rounded P as the divisor). Only P and V's encoding differ:

    fp8          448 P in e4m3, V in e4m3 per channel (amax / 448): the kernel today
    fp8-vmean    the same, V minus its mean over the keys per channel (added back to the output)
    u8s8         255 P rounded to uint8, V in int8 per channel (amax / 127): u8 x s8 wgmma
    u8s8-vmean   the same with V minus its mean
    u8s8-rowmax  u8s8 with P scaled per row and block by 255 / the block's largest P of that row (the
                 per-block INT32 product needs a float32 rescale anyway, which can carry it)
    fp8-p2       P as two e4m3 terms (hi + lo residual), V in e4m3: two FP8 products
    p-exact      P in float32, V in e4m3: what V's encoding alone costs
    v-exact      448 P in e4m3, V exact: what P's encoding alone costs
    fp16         P and V in float16 (the Triton FP16 P·V path)
    exact        P and V exact: what the INT8 Q·K alone costs
    ...-ktoken   the same with K in INT8 per token instead of per 128-key block (one scale per score
                 column, a second multiply per score)

Runs on the GPU when there is one, else on the CPU (the inputs are the protocol's in distribution:
b=1 h=8 n=4096 d=128 bf16, randn, and outlier: K plus a per-channel bias N(0, 8^2), four V channels
x10, Q x2).

    python bench/pv_candidates.py [--n 4096] [--out bench/results/pv-candidates-<date>.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accuracy import metrics  # noqa: E402

from sageattention.quant import FP8_E4M3_MAX, INT8_MAX, LOG2E  # noqa: E402
from sageattention.reference import attention_ref, quantize_qk_ref, quantize_v_fp8_ref  # noqa: E402

BLOCK_N = 128
U8_MAX = 255.0


def inputs(kind: str, n: int, device, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(1, 8, n, 128, device=device, generator=gen) for _ in range(3))
    if kind == "outlier":
        k = k + 8.0 * torch.randn(128, device=device, generator=gen)
        v[..., :4] *= 10.0
        q = q * 2.0
    return tuple(x.to(torch.bfloat16) for x in (q, k, v))


def _e4m3(x):
    return x.to(torch.float8_e4m3fn).float()


def encode_v(v: torch.Tensor, how: str):
    """(the values the product sees, per-channel scale [B, H, 1, D], mean added back or None)."""
    v = v.float()
    mean = None
    if how.endswith("-vmean"):
        mean = v.mean(dim=2, keepdim=True)
        v = v - mean
    amax = v.abs().amax(dim=2, keepdim=True).clamp_min(1e-30)
    if how.startswith("u8s8"):
        return torch.round(v * (INT8_MAX / amax)).clamp(-INT8_MAX, INT8_MAX), amax / INT8_MAX, mean
    if how in ("fp8", "fp8-vmean", "fp8-p2", "p-exact"):  # the library's V quantization, bit for bit
        v8, scale = quantize_v_fp8_ref(v)
        return v8, scale.unsqueeze(2), mean
    if how == "fp16":
        return v.half().float(), torch.ones_like(amax), mean
    return v, torch.ones_like(amax), mean  # v-exact, exact


def encode_p(p: torch.Tensor, how: str):
    """(the P the product sees, in units of P times the returned scale, a number or per row [.., 1])."""
    if how == "u8s8-rowmax":
        scale = U8_MAX / p.amax(dim=-1, keepdim=True).clamp_min(1e-30)
        return torch.round(p * scale), scale
    if how.startswith("u8s8"):
        return torch.round(p * U8_MAX), U8_MAX
    if how in ("fp8", "fp8-vmean", "v-exact"):
        return _e4m3(p * FP8_E4M3_MAX), FP8_E4M3_MAX
    if how == "fp8-p2":
        hi = _e4m3(p * FP8_E4M3_MAX)
        lo = _e4m3((p * FP8_E4M3_MAX - hi) * 16.0) / 16.0  # the residual, scaled into e4m3's range
        return hi + lo, FP8_E4M3_MAX
    if how == "fp16":
        return p.half().float(), 1.0
    return p, 1.0  # p-exact, exact


CANDIDATES = ("fp8", "fp8-vmean", "u8s8", "u8s8-vmean", "u8s8-rowmax", "fp8-p2", "p-exact", "v-exact", "fp16",
              "exact", "fp8-ktoken", "u8s8-rowmax-ktoken", "exact-ktoken")  # fmt: skip


def simulate(q, k, v, how: str) -> torch.Tensor:
    """The sm90 kernel's computation with P and V encoded so (float32 steps)."""
    b, h, n, d = q.shape
    k_block = 1 if how.endswith("-ktoken") else BLOCK_N
    how = how.removesuffix("-ktoken")
    qk = quantize_qk_ref(q, k, sm_scale=d**-0.5, block_m=1, block_n=k_block, smooth_k=True)
    k_scale = qk.k_scale.repeat_interleave(k_block, dim=-1)  # per key
    v_q, v_scale, v_mean = encode_v(v, how)
    m = torch.full((b, h, n), -math.inf, device=q.device)
    l_sum = torch.zeros((b, h, n), device=q.device)
    acc = torch.zeros((b, h, n, d), device=q.device)
    q8, k8 = qk.q.double(), qk.k.double()
    for blk in range(-(-k.shape[2] // BLOCK_N)):
        start = blk * BLOCK_N
        stop = min(start + BLOCK_N, k.shape[2])
        s_int = (q8 @ k8[:, :, start:stop].transpose(-1, -2)).float()  # exact integer dot products
        s = s_int * (qk.q_scale.unsqueeze(-1) * k_scale[:, :, None, start:stop])
        m_new = torch.maximum(m, s.amax(dim=-1))
        p = torch.exp2(s - m_new.unsqueeze(-1))
        alpha = torch.exp2(m - m_new)
        p_q, p_scale = encode_p(p, how)
        l_sum = l_sum * alpha + (p_q / p_scale).sum(dim=-1)
        acc = acc * alpha.unsqueeze(-1) + (p_q @ v_q[:, :, start:stop]) / p_scale
        m = m_new
    out = acc / l_sum.unsqueeze(-1) * v_scale
    return out if v_mean is None else out + v_mean


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--out", type=pathlib.Path)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for kind in ("randn", "outlier"):
        q, k, v = inputs(kind, args.n, device)
        ref = attention_ref(q.double(), k.double(), v.double()).float()
        for how in CANDIDATES:
            got = metrics(simulate(q, k, v, how), ref)
            rows.append({"inputs": kind, "candidate": how, "cos": round(got["cos"], 6),
                         "rel_l1": round(got["rel_l1"], 6)})  # fmt: skip
            print(f"{kind:8s} {how:18s} cos {got['cos']:.6f}  rel L1 {got['rel_l1']:.5f}", flush=True)
    report = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "date": datetime.date.today().isoformat(),
        "shape": {"b": 1, "h": 8, "n": args.n, "d": 128, "dtype": "bfloat16", "causal": False},
        "how": "simulated in float32 steps (bench/pv_candidates.py); Q·K as the sm90 kernel's; log2(e) "
        f"{LOG2E:.6f} folded into the scores' scale",
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
