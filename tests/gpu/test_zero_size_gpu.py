"""Calls with nothing to compute (a batch, heads or a length of 0) on every entry point of this GPU: what
torch SDPA gives (an empty output, or zeros for queries without a key, LSE -inf), in the caller's
layout, and no kernel but the fill of those zeros."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import sageattention as sa

pytestmark = pytest.mark.gpu

# (q shape, k/v shape), HND
SHAPES = [
    ((0, 4, 64, 128), (0, 2, 64, 128)),
    ((2, 0, 64, 128), (2, 0, 64, 128)),
    ((2, 4, 0, 64), (2, 2, 113, 64)),
    ((2, 4, 17, 128), (2, 2, 0, 128)),
    ((1, 8, 1000, 72), (1, 8, 0, 72)),
]


def _only_fills(names: list[str]) -> bool:
    return all("fill" in n.lower() or "zero" in n.lower() for n in names)


@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_every_entry_point(sage_backend, mma, shapes, layout):
    (b, hq, nq, d), (_, hkv, nk, _) = shapes
    q = mma.make(b, hq, nq, d, layout, torch.float16, 0)
    k = mma.make(b, hkv, nk, d, layout, torch.float16, 1)
    v = mma.make(b, hkv, nk, d, layout, torch.float16, 2)
    if layout == "NHD":  # the caller's NHD tensors
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    out, lse = sage_backend.call(q, k, v, tensor_layout=layout, is_causal=True, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert not out.any()
    assert lse.shape == (b, hq, nq) and bool((lse == -math.inf).all())
    if nq and hq and b:  # SDPA gives the same zeros
        qh, kh, vh = (x.transpose(1, 2) if layout == "NHD" else x for x in (q, k, v))
        kh, vh = (x.repeat_interleave(hq // hkv, 1) for x in (kh, vh))
        want = F.scaled_dot_product_attention(qh, kh, vh)
        assert torch.equal(out if layout == "HND" else out.transpose(1, 2), want)
    names = mma.kernels_on_gpu(lambda: sage_backend.call(q, k, v, tensor_layout=layout))
    assert _only_fills(names), names


def test_varlen_without_keys(mma):
    q = torch.randn(30, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(0, 2, 128, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 10, 30], device="cuda", dtype=torch.int32)
    cu_k = torch.zeros(3, device="cuda", dtype=torch.int32)
    out = sa.sageattn_varlen(q, k, k, cu_q, cu_k, 20, 0)
    assert out.shape == q.shape and not out.any()
    names = mma.kernels_on_gpu(lambda: sa.sageattn_varlen(q, k, k, cu_q, cu_k, 20, 0))
    assert _only_fills(names), names


def test_gradients_without_keys():
    q = torch.randn(2, 4, 33, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, 0, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 2, 0, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    sa.sageattn(q, k, v).float().sum().backward()
    assert q.grad.shape == q.shape and not q.grad.any()
    assert k.grad.shape == k.shape and v.grad.shape == v.shape
