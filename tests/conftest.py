"""Shared test helpers: accuracy metrics, input sets, dispatch isolation, a CPU stand-in for Triton.

The helpers are handed out as fixtures (``metrics``, ``inputs``, ``triton_standin``) so test modules
need no imports from this file.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from sageattention import dispatch, ops
from sageattention.quant import PVDtype
from sageattention.reference import sage_ref

# --------------------------------------------------------------------------------------------------
# Accuracy metrics (README's accuracy protocol: cosine, relative L1, RMSE; NaN never passes)


def cosine(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double().flatten(), ref.double().flatten()
    denom = o.norm() * r.norm()
    if denom == 0:
        return 1.0 if torch.equal(o, r) else 0.0
    return float((o @ r) / denom)


def rel_l1(out: torch.Tensor, ref: torch.Tensor) -> float:
    """sum|o - r| / sum|r|."""
    o, r = out.double(), ref.double()
    return float((o - r).abs().sum() / r.abs().sum().clamp_min(1e-30))


def rmse(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).pow(2).mean().sqrt())


def max_err_ratio(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|o - r| / max|r|: a bound that scales with the data."""
    o, r = out.double(), ref.double()
    return float((o - r).abs().max() / r.abs().max().clamp_min(1e-30))


def assert_finite(x: torch.Tensor, what: str = "output") -> None:
    assert not torch.isnan(x).any(), f"NaN in {what}"
    assert not torch.isinf(x).any(), f"Inf in {what}"


def summary(out: torch.Tensor, ref: torch.Tensor) -> dict:
    assert_finite(out)
    return {
        "cos": cosine(out, ref),
        "rel_l1": rel_l1(out, ref),
        "rmse": rmse(out, ref),
        "max_err_ratio": max_err_ratio(out, ref),
    }


def fmt(stats: dict) -> str:
    return ", ".join(f"{k}={v:.6g}" for k, v in stats.items())


# Bounds for kernel outputs, by P·V precision.
#
# Against sage_ref (the same quantization simulated in float32/64 with the kernels' block sizes):
# (min cosine, max |out - ref| / max |ref|). The kernels and the reference quantize identically;
# what is left is float32 summation order inside the MMAs, the exp2 approximation, the bf16/fp16
# rounding of the output (2^-8 relative) and, now and then, one P element that rounds to the
# neighbouring FP16/FP8 value. FP16 has 10 mantissa bits, so such a flip is tiny; e4m3 has 3, so
# one flip moves that element by up to 1/16, which shows in rows with few keys (short or causal
# rows). Measured on an H200 over the GPU tests: every FP16 case within (0.99999, 0.02); FP8 max
# error up to 0.053 of max|ref| at cosine >= 0.999986. A wrong tile, mask or scale gives errors of
# order max|ref| and cannot pass.
TIGHT_BOUNDS = {PVDtype.FP16: (0.99999, 0.02), PVDtype.FP8: (0.9999, 0.07)}
# Against attention_ref (float64, exact), randn inputs: (min cosine, max relative L1), the accuracy
# the quantized kernels promise.
EXACT_BOUNDS = {PVDtype.FP16: (0.9999, 0.015), PVDtype.FP8: (0.9992, 0.04)}


def assert_tight(out, ref, pv: PVDtype, what: str = "vs sage_ref") -> dict:
    cos_min, err_max = TIGHT_BOUNDS[pv]
    stats = summary(out, ref)
    assert stats["cos"] >= cos_min and stats["max_err_ratio"] <= err_max, f"{what}: {fmt(stats)}"
    return stats


def assert_exact(out, ref, pv: PVDtype, what: str = "vs attention_ref") -> dict:
    cos_min, l1_max = EXACT_BOUNDS[pv]
    stats = summary(out, ref)
    assert stats["cos"] >= cos_min and stats["rel_l1"] <= l1_max, f"{what}: {fmt(stats)}"
    return stats


@pytest.fixture(scope="session")
def metrics():
    """Namespace of the metric helpers: cosine, rel_l1, rmse, max_err_ratio, summary, fmt, assert_finite,
    and the kernel bounds: assert_tight (vs sage_ref), assert_exact (vs attention_ref)."""
    return types.SimpleNamespace(
        assert_tight=assert_tight,
        assert_exact=assert_exact,
        cosine=cosine,
        rel_l1=rel_l1,
        rmse=rmse,
        max_err_ratio=max_err_ratio,
        summary=summary,
        fmt=fmt,
        assert_finite=assert_finite,
    )


# --------------------------------------------------------------------------------------------------
# Inputs


def make_qkv(
    b=1,
    hq=2,
    hkv=None,
    nq=16,
    nk=None,
    d=32,
    *,
    layout="HND",
    dtype=torch.bfloat16,
    device="cpu",
    kind="randn",
    seed=0,
):
    """q, k, v in the given layout. kind "outlier": K plus a per-channel bias N(0, 8^2), three V
    channels x10 and Q x2 (the accuracy protocol's outlier inputs)."""
    hkv = hq if hkv is None else hkv
    nk = nq if nk is None else nk
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    q, k, v = randn(b, hq, nq, d), randn(b, hkv, nk, d), randn(b, hkv, nk, d)
    if kind == "outlier":
        k = k + 8.0 * randn(1, 1, 1, d)
        v[..., : min(3, d)] *= 10.0
        q = q * 2.0
    elif kind != "randn":
        raise ValueError(kind)
    out = []
    for x in (q, k, v):
        x = x.to(device=device, dtype=dtype)
        if layout == "NHD":  # NHD memory, presented in NHD shape
            x = x.transpose(1, 2).contiguous()
        out.append(x)
    return tuple(out)


@pytest.fixture(scope="session")
def inputs():
    """Namespace with make_qkv(...) (see its docstring)."""
    return types.SimpleNamespace(make_qkv=make_qkv)


# --------------------------------------------------------------------------------------------------
# Dispatch isolation and GPU skipping


@pytest.fixture(autouse=True)
def _fresh_dispatch():
    """Each test starts with no cached decision, capability or warning."""
    dispatch.reset()
    yield
    dispatch.reset()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --------------------------------------------------------------------------------------------------
# A CPU stand-in for sageattention.triton


class TritonStandIn:
    """Plays sageattention.triton on the CPU with the simulated-quantization reference, and records
    each call, so the API plumbing (layouts, strides, options, LSE, custom ops, torch.compile) is
    tested without a GPU."""

    BLOCK_N = 64

    def __init__(self):
        self.calls = []

    def attention_fwd(
        self,
        q,
        k,
        v,
        *,
        is_causal,
        sm_scale,
        pv,
        smooth_k,
        attn_mask=None,
        return_lse=False,
        quant_backend="triton",
    ):
        self.calls.append(
            {"q": q, "k": k, "v": v, "is_causal": is_causal, "sm_scale": sm_scale, "pv": pv,
             "smooth_k": smooth_k, "attn_mask": attn_mask, "return_lse": return_lse,
             "quant_backend": quant_backend}
        )  # fmt: skip
        out, lse = sage_ref(
            q, k, v, is_causal=is_causal, sm_scale=sm_scale, attn_mask=attn_mask, pv=pv, smooth_k=smooth_k,
            block_m=1, block_n=self.BLOCK_N, k_residual=pv is PVDtype.FP16, return_lse=True,
        )  # fmt: skip
        o = torch.empty_like(q)  # as the kernels allocate it: NHD memory for an NHD caller
        o.copy_(out)
        return o, (lse if return_lse else None)

    def varlen_fwd(self, q, k, v, cu_q, cu_k, max_q, max_k, *, is_causal, sm_scale, pv, smooth_k):
        self.calls.append({"q": q, "cu_q": cu_q, "cu_k": cu_k, "max_q": max_q, "max_k": max_k, "pv": pv,
                           "is_causal": is_causal, "sm_scale": sm_scale, "smooth_k": smooth_k})  # fmt: skip
        out = torch.zeros_like(q)
        bq, bk = cu_q.tolist(), cu_k.tolist()
        for i in range(len(bq) - 1):
            if bq[i + 1] == bq[i] or bk[i + 1] == bk[i]:
                continue
            sq, sk, sv = (
                x.transpose(0, 1)[None]
                for x in (q[bq[i] : bq[i + 1]], k[bk[i] : bk[i + 1]], v[bk[i] : bk[i + 1]])
            )
            o = sage_ref(sq, sk, sv, is_causal=is_causal, sm_scale=sm_scale, pv=pv, smooth_k=smooth_k,
                         block_m=1, block_n=self.BLOCK_N, k_residual=pv is PVDtype.FP16)  # fmt: skip
            out[bq[i] : bq[i + 1]] = o[0].transpose(0, 1).to(q.dtype)
        return out


@pytest.fixture
def triton_standin(monkeypatch):
    """Route CPU tensors to the Triton backends: the CPU reports capability sm90 (change with
    ``standin.set_capability((8, 0))``) and sageattention.triton is the stand-in."""
    standin = TritonStandIn()
    monkeypatch.setattr(ops, "_triton", [standin, None])
    capability = {"value": (9, 0)}
    monkeypatch.setattr(dispatch, "device_capability", lambda device_type, index: capability["value"])

    def set_capability(cap):
        capability["value"] = cap
        dispatch.reset()

    standin.set_capability = set_capability
    return standin


def lse_ref(q, k, *, is_causal=False, sm_scale=None, attn_mask=None, layout="HND"):
    """Natural-log LSE [B, Hq, Nq] in float64 (a convenience over attention_ref)."""
    from sageattention.reference import attention_ref

    _, lse = attention_ref(q, k, k, tensor_layout=layout, is_causal=is_causal, sm_scale=sm_scale,
                           attn_mask=attn_mask, return_lse=True)  # fmt: skip
    return lse


@pytest.fixture(scope="session")
def refs():
    """Namespace with lse_ref(...)."""
    return types.SimpleNamespace(lse_ref=lse_ref, inf=math.inf)


# --------------------------------------------------------------------------------------------------
# Attention over chunks of the keys, merged (the LSE contract of ring attention; test_lse_merge*.py)


def _chunk(x: torch.Tensor, layout: str, start: int, stop: int) -> torch.Tensor:
    return x.narrow(2 if layout == "HND" else 1, start, stop - start)


def chunk_bounds(n: int, parts: int) -> list[int]:
    """Uneven chunk bounds 0 < ... < n (not multiples of the kernels' 64- and 128-key blocks)."""
    cuts = {2: [0.4], 3: [0.3, 0.55]}[parts]
    return [0, *(int(n * c) for c in cuts), n]


def ring(call, q, k, v, layout: str, bounds, **kw):
    """Non-causal attention of all of q over each key chunk (``call``: sageattn or a variant), merged by
    sageattention.merge_attention: (out float32, lse)."""
    from sageattention import merge_attention

    parts = [call(q, _chunk(k, layout, a, b), _chunk(v, layout, a, b), tensor_layout=layout, return_lse=True,
                  **kw) for a, b in zip(bounds[:-1], bounds[1:])]  # fmt: skip
    return merge_attention([o for o, _ in parts], [lse for _, lse in parts], layout)


def causal_blocks(call, q, k, v, layout: str, bounds, **kw):
    """Causal attention, query block j against key chunks 0..j (the last one causal: as many keys as
    queries, so top-left alignment is exact), merged per block and the blocks concatenated: (out, lse)."""
    from sageattention import merge_attention

    outs, lses = [], []
    for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        qj = _chunk(q, layout, a, b)
        parts = []
        for i in range(j + 1):
            ki, vi = (_chunk(x, layout, bounds[i], bounds[i + 1]) for x in (k, v))
            parts.append(call(qj, ki, vi, tensor_layout=layout, is_causal=i == j, return_lse=True, **kw))
        o, lse = merge_attention([o for o, _ in parts], [lse for _, lse in parts], layout)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, dim=2 if layout == "HND" else 1), torch.cat(lses, dim=-1)


@pytest.fixture(scope="session")
def chunks():
    """Namespace of bounds(n, parts), ring(call, q, k, v, layout, bounds, **kw) and causal_blocks(...)."""
    return types.SimpleNamespace(bounds=chunk_bounds, ring=ring, causal_blocks=causal_blocks)
