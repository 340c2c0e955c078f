"""The LSE contract of ring attention, on the CPU (sageattn runs torch SDPA there, with the LSE).

Attention over chunks of the keys and values, each call with ``return_lse=True``, merged as
``lse = logsumexp_i lse_i`` and ``out = sum_i exp(lse_i - lse) * out_i``, is the attention over all of
them: output and LSE of the merge against the unchunked call and against float64, 2 and 3 chunks of
uneven lengths, HND and NHD, MHA and GQA, non-causal (any query length) and causal (a block of queries
against every earlier key chunk, non-causal, and its own chunk, causal: top-left alignment is exact there
because the diagonal chunk has as many keys as the block has queries). Gradients flow through the merge
(through each chunk's LSE too) and match float64 autograd.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import sageattention as sa
from sageattention.reference import attention_ref

#: |merged - unchunked| of the output: each chunk's output is rounded to the input dtype before the
#: merge (half an ulp: 2^-11 of fp16, 2^-8 of bf16, relative), the unchunked output once.
OUT_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
#: The LSE is float32 throughout (scores in float32 from the same inputs): only summation order differs.
LSE_ATOL = 1e-5


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sa.SageAttentionFallbackWarning)
        yield


def _inputs(layout, dtype, hq, hkv, nq, nk, d=32, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)

    def make(h, n):
        shape = (2, h, n, d) if layout == "HND" else (2, n, h, d)
        x = torch.randn(shape, generator=gen).to(dtype)
        return x.requires_grad_() if requires_grad else x

    return make(hq, nq), make(hkv, nk), make(hkv, nk)


def _check(out, lse, full_out, full_lse, ref_out, ref_lse, dtype):
    assert out.shape == full_out.shape and lse.shape == full_lse.shape
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse, full_lse, atol=LSE_ATOL, rtol=0)
    torch.testing.assert_close(lse.double(), ref_lse, atol=LSE_ATOL, rtol=0)
    tol = OUT_TOL[dtype]
    torch.testing.assert_close(out, full_out.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(out.double(), ref_out, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("hkv", [4, 1], ids=["mha", "gqa"])
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_key_chunks_merge_to_the_full_call(chunks, layout, parts, hkv, dtype):
    q, k, v = _inputs(layout, dtype, 4, hkv, nq=37, nk=90, seed=parts)
    full_out, full_lse = sa.sageattn(q, k, v, tensor_layout=layout, return_lse=True)
    ref_out, ref_lse = attention_ref(q, k, v, tensor_layout=layout, return_lse=True)
    out, lse = chunks.ring(sa.sageattn, q, k, v, layout, chunks.bounds(90, parts))
    _check(out, lse, full_out, full_lse, ref_out, ref_lse, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("hkv", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_causal_blocks_merge_to_the_full_call(chunks, layout, parts, hkv, dtype):
    q, k, v = _inputs(layout, dtype, 4, hkv, nq=70, nk=70, seed=10 + parts)
    full_out, full_lse = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=True, return_lse=True)
    ref_out, ref_lse = attention_ref(q, k, v, tensor_layout=layout, is_causal=True, return_lse=True)
    out, lse = chunks.causal_blocks(sa.sageattn, q, k, v, layout, chunks.bounds(70, parts))
    _check(out, lse, full_out, full_lse, ref_out, ref_lse, dtype)


def test_merge_with_the_flash_attention_keywords(chunks):
    """The call ring engines make: NHD, return_lse, causal= and softmax_scale= by keyword."""
    q, k, v = _inputs("NHD", torch.float16, 4, 2, nq=40, nk=40, seed=7)
    scale = 0.2
    common = {"tensor_layout": "NHD", "is_causal": True, "sm_scale": scale, "return_lse": True}
    full_out, full_lse = sa.sageattn(q, k, v, **common)
    ref_out, ref_lse = attention_ref(q, k, v, **common)

    def flash_keywords(q, k, v, *, is_causal, **kw):
        return sa.sageattn(q, k, v, causal=is_causal, softmax_scale=scale, **kw)

    out, lse = chunks.causal_blocks(flash_keywords, q, k, v, "NHD", chunks.bounds(40, 2))
    _check(out, lse, full_out, full_lse, ref_out, ref_lse, torch.float16)


def test_merge_attention_checks_and_rows_without_keys():
    o = torch.ones(1, 2, 3, 4)
    dead = torch.full((1, 2, 3), -math.inf)
    out, lse = sa.merge_attention([o, 2 * o], [dead, dead])
    assert not out.isnan().any() and not out.any() and bool((lse == -math.inf).all())
    out, lse = sa.merge_attention([o, 2 * o], [dead, torch.zeros(1, 2, 3)])
    assert torch.equal(out, 2 * o) and not lse.any()
    with pytest.raises(ValueError, match="one LSE per output"):
        sa.merge_attention([o], [])
    with pytest.raises(ValueError, match="tensor_layout='BHND'"):
        sa.merge_attention([o], [dead], "BHND")


def _ref_grads(q, k, v, dout, dlse, layout, causal):
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    out, lse = attention_ref(qd, kd, vd, tensor_layout=layout, is_causal=causal, return_lse=True)
    loss = (out * dout.double()).sum() + (lse * dlse.double()).sum()
    return (out, lse), torch.autograd.grad(loss, (qd, kd, vd))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_gradients_through_the_merge(chunks, layout, causal):
    """dQ, dK, dV of a loss on the merged output and LSE, through each chunk's output and LSE, against
    float64 autograd of the unchunked attention (and the unchunked call's own gradients)."""
    q, k, v = _inputs(layout, torch.float16, 4, 2, nq=48, nk=48, seed=21 + causal, requires_grad=True)
    gen = torch.Generator().manual_seed(5)
    bounds = chunks.bounds(48, 3)
    out, lse = (chunks.causal_blocks if causal else chunks.ring)(sa.sageattn, q, k, v, layout, bounds)
    dout = torch.randn(out.shape, generator=gen)
    dlse = torch.randn(lse.shape, generator=gen)
    torch.autograd.backward((out, lse), (dout, dlse))
    got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    full_out, full_lse = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=causal, return_lse=True)
    torch.autograd.backward((full_out, full_lse), (dout.to(full_out.dtype), dlse))
    full = [x.grad for x in (q, k, v)]
    (ref_out, ref_lse), ref = _ref_grads(q, k, v, dout, dlse, layout, causal)
    torch.testing.assert_close(lse.double(), ref_lse, atol=LSE_ATOL, rtol=0)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-3, rtol=2e-3)
    for name, g, f, r in zip("qkv", got, full, ref):
        assert g.dtype == torch.float16 and torch.isfinite(g).all(), name
        scale = r.abs().max().item()
        torch.testing.assert_close(g.double(), r, atol=5e-3 * scale, rtol=0, msg=f"d{name} vs float64")
        torch.testing.assert_close(g, f, atol=5e-3 * scale, rtol=0, msg=f"d{name} vs the unchunked call")
