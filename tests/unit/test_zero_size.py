"""Calls with nothing to compute (a batch, heads or a length of 0) give what torch SDPA gives: an empty
output, or zeros for queries that have no key (LSE -inf), in the caller's layout, without reaching a
backend, and with (zero) gradients under autograd."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import sageattention as sa
from sageattention import dispatch

# (q shape, k/v shape), HND
SHAPES = [
    ((0, 4, 8, 16), (0, 2, 8, 16)),  # no batch
    ((2, 0, 8, 16), (2, 0, 8, 16)),  # no heads
    ((1, 0, 5, 16), (1, 2, 5, 16)),  # no q heads
    ((2, 4, 0, 16), (2, 2, 8, 16)),  # no queries
    ((2, 4, 8, 16), (2, 2, 0, 16)),  # no keys: zeros, LSE -inf
    ((2, 4, 0, 16), (2, 4, 0, 16)),  # neither
]


@pytest.fixture(autouse=True)
def _no_backend(monkeypatch):
    """Any backend call fails the test: nothing may be launched for such calls."""

    def refuse(*args, **kwargs):
        raise AssertionError("a backend was called for a call with nothing to compute")

    for name, backend in list(dispatch.BACKENDS.items()):
        refusing = dataclasses.replace(backend, dense=refuse, varlen=refuse)
        monkeypatch.setitem(dispatch.BACKENDS, name, refusing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sa.SageAttentionFallbackWarning)
        yield


def _tensors(q_shape, kv_shape, layout, dtype=torch.float16, grad=False):
    q, k, v = (torch.randn(s, dtype=dtype) for s in (q_shape, kv_shape, kv_shape))
    if layout == "NHD":
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    return [x.requires_grad_(grad) for x in (q, k, v)]


def _sdpa(q, k, v, layout, is_causal):
    if layout == "NHD":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    groups = q.shape[1] // k.shape[1] if k.shape[1] else 1
    k, v = (x.float().repeat_interleave(groups, 1) for x in (k, v))
    out = F.scaled_dot_product_attention(q.float(), k, v, is_causal=is_causal)
    return out.transpose(1, 2) if layout == "NHD" else out


@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_dense_matches_sdpa(shapes, layout, is_causal):
    q, k, v = _tensors(*shapes, layout)
    out, lse = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=is_causal, return_lse=True)
    want = _sdpa(q, k, v, layout, is_causal)
    assert out.shape == want.shape == q.shape
    assert out.dtype == q.dtype and out.is_contiguous()
    torch.testing.assert_close(out.float(), want, rtol=0, atol=0)
    b, hq, nq = q.shape[:3] if layout == "HND" else (q.shape[0], q.shape[2], q.shape[1])
    assert lse.shape == (b, hq, nq) and lse.dtype == torch.float32
    assert bool((lse == -math.inf).all())
    assert sa.sageattn(q, k, v, tensor_layout=layout).shape == q.shape  # the plain call too


@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_dense_gradients_are_zero(shapes, layout):
    q, k, v = _tensors(*shapes, layout, dtype=torch.bfloat16, grad=True)
    out = sa.sageattn(q, k, v, tensor_layout=layout)
    assert out.requires_grad
    (out * 3.0).sum().backward()
    for x in (q, k, v):
        assert x.grad is not None and x.grad.shape == x.shape
        assert not x.grad.any()


def test_mask_with_no_keys():
    q, k, v = _tensors((2, 4, 8, 16), (2, 4, 0, 16), "HND")
    mask = torch.ones(2, 1, 8, 0, dtype=torch.bool)
    out = sa.sageattn(q, k, v, attn_mask=mask)
    assert out.shape == q.shape and not out.any()


def test_varlen_without_tokens():
    no_seq = torch.tensor([0, 0, 0], dtype=torch.int32)
    some = torch.tensor([0, 4, 10], dtype=torch.int32)
    q, k = torch.randn(0, 4, 16, dtype=torch.half), torch.randn(10, 2, 16, dtype=torch.half)
    assert sa.sageattn_varlen(q, k, k, no_seq, some, 0, 6).shape == (0, 4, 16)
    q, k = torch.randn(10, 4, 16, dtype=torch.half), torch.randn(0, 2, 16, dtype=torch.half)
    out = sa.sageattn_varlen(q, k, k, some, no_seq, 6, 0)
    assert out.shape == (10, 4, 16) and out.is_contiguous() and not out.any()
    with pytest.raises(ValueError, match=r"max_seqlen_q must be at least 1 \(the input has 10 tokens\)"):
        sa.sageattn_varlen(q, k, k, some, no_seq, 0, 0)


def test_kv_without_heads_is_refused():
    q, k, v = _tensors((1, 4, 5, 16), (1, 0, 5, 16), "HND")
    with pytest.raises(ValueError, match=r"^k and v have no heads while q has 4"):
        sa.sageattn(q, k, v)
