"""The torch SDPA fallback, as sageattn runs it on the CPU: same results as SDPA, SageAttention's
semantics where they go beyond SDPA (mask together with is_causal, LSE, dead rows), one warning."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sageattention as sa
from sageattention import ops
from sageattention.reference import attention_ref

FallbackWarning = sa.SageAttentionFallbackWarning


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        yield


def _sdpa(q, k, v, layout, **kw):
    """torch SDPA called directly, in the caller's layout, GQA by repeating KV heads."""
    if layout == "NHD":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), **kw
    )
    return out.transpose(1, 2) if layout == "NHD" else out


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,nq,nk", [(4, 4, 33, 33), (8, 2, 17, 40), (4, 1, 40, 17)])
def test_matches_sdpa(inputs, layout, causal, dtype, hq, hkv, nq, nk):
    q, k, v = inputs.make_qkv(2, hq, hkv, nq, nk, 32, layout=layout, dtype=dtype)
    out = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=causal)
    assert out.dtype == dtype and out.shape == q.shape and out.is_contiguous()  # the caller's layout
    torch.testing.assert_close(out, _sdpa(q, k, v, layout, is_causal=causal), rtol=1e-2, atol=1e-3)


def test_sm_scale_is_passed(inputs):
    q, k, v = inputs.make_qkv(1, 2, 2, 9, 9, 16)
    out = sa.sageattn(q, k, v, sm_scale=0.05)
    torch.testing.assert_close(out, _sdpa(q, k, v, "HND", scale=0.05))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_masks(inputs, metrics, causal, kind):
    """A mask is applied as SDPA applies it; with is_causal too, both apply (SDPA would refuse)."""
    q, k, v = inputs.make_qkv(2, 4, 2, 24, 30, 16, layout="NHD")
    gen = torch.Generator().manual_seed(5)
    if kind == "bool":
        mask = torch.rand(2, 1, 24, 30, generator=gen) > 0.4
        mask[..., 0] = True
    else:
        mask = torch.randn(1, 4, 24, 30, generator=gen)
    out, lse = sa.sageattn(q, k, v, tensor_layout="NHD", is_causal=causal, attn_mask=mask, return_lse=True)
    ref, ref_lse = attention_ref(
        q, k, v, tensor_layout="NHD", is_causal=causal, attn_mask=mask, return_lse=True
    )
    assert metrics.cosine(out, ref) >= 0.9999
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-4)


@pytest.mark.parametrize("shape", [(24, 1), (1, 30), (2, 1, 1, 30), (1, 4, 24, 1)])
def test_broadcast_masks_with_causal(inputs, metrics, shape):
    q, k, v = inputs.make_qkv(2, 4, 2, 24, 30, 16)
    bias = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    for mask in (bias, bias > -0.5):
        out, lse = sa.sageattn(q, k, v, attn_mask=mask, is_causal=True, return_lse=True)
        ref, ref_lse = attention_ref(q, k, v, attn_mask=mask, is_causal=True, return_lse=True)
        alive = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), alive)
        assert metrics.cosine(out, ref) >= 0.9999
        torch.testing.assert_close(lse.double()[alive], ref_lse[alive], rtol=0, atol=1e-4)


def test_fully_masked_rows_give_zero_and_minus_inf(inputs):
    q, k, v = inputs.make_qkv(1, 2, 2, 6, 7, 16)
    mask = torch.ones(6, 7, dtype=torch.bool)
    mask[1] = False
    additive = torch.zeros(6, 7).masked_fill(~mask, -math.inf)
    for m in (mask, additive):
        out, lse = sa.sageattn(q, k, v, attn_mask=m, return_lse=True)
        assert torch.all(out[:, :, 1] == 0) and torch.isfinite(out).all()
        assert torch.all(lse[:, :, 1] == -math.inf) and torch.isfinite(lse[:, :, [0, 2, 3, 4, 5]]).all()


def test_mask_and_causal_can_kill_a_row(inputs):
    """Row 0 sees only key 0 under is_causal; masking key 0 leaves it nothing."""
    q, k, v = inputs.make_qkv(1, 2, 2, 5, 5, 16)
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[:, 0] = False
    out, lse = sa.sageattn(q, k, v, attn_mask=mask, is_causal=True, return_lse=True)
    assert torch.all(out[:, :, 0] == 0) and torch.all(lse[:, :, 0] == -math.inf)
    ref = attention_ref(q, k, v, attn_mask=mask, is_causal=True)
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(16, 16), (5, 20), (20, 5)])
def test_lse(inputs, causal, nq, nk):
    q, k, v = inputs.make_qkv(2, 4, 2, nq, nk, 16, dtype=torch.float16)
    out, lse = sa.sageattn(q, k, v, is_causal=causal, return_lse=True)
    _, ref = attention_ref(q, k, v, is_causal=causal, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, nq)
    torch.testing.assert_close(lse.double(), ref, rtol=0, atol=1e-4)


def test_lse_in_several_blocks(inputs, monkeypatch):
    q, k, v = inputs.make_qkv(1, 2, 2, 37, 11, 16)
    _, whole = sa.sageattn(q, k, v, is_causal=True, return_lse=True)
    monkeypatch.setattr(ops, "_LSE_BLOCK_ELEMENTS", 2 * 2 * 11 * 5)  # 5 query rows a block
    mask = torch.ones(37, 11, dtype=torch.bool)
    _, blocked = sa.sageattn(q, k, v, is_causal=True, return_lse=True, attn_mask=mask)
    torch.testing.assert_close(blocked, whole)


def test_gqa_without_enable_gqa(inputs, monkeypatch):
    """Older torch has no enable_gqa: the KV heads are repeated instead, with the same result."""
    q, k, v = inputs.make_qkv(1, 8, 2, 9, 9, 16)
    with_gqa = sa.sageattn(q, k, v)
    monkeypatch.setattr(ops, "_SDPA_HAS_GQA", False)
    torch.testing.assert_close(sa.sageattn(q, k, v), with_gqa)


def test_non_contiguous_inputs(inputs):
    q, k, v = inputs.make_qkv(1, 4, 4, 20, 20, 16)
    qkv = torch.cat([q, k, v], dim=-1)  # packed projections: views with a unit last stride
    qs, ks, vs = qkv[..., :16], qkv[..., 16:32], qkv[..., 32:]
    assert not qs.is_contiguous()
    torch.testing.assert_close(sa.sageattn(qs, ks, vs, is_causal=True), sa.sageattn(q, k, v, is_causal=True))


def test_warns_once_per_reason(inputs):
    q, k, v = inputs.make_qkv(1, 2, 2, 8, 8, 16)
    q2, k2, v2 = inputs.make_qkv(1, 4, 4, 12, 12, 32, layout="NHD")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sa.sageattn(q, k, v)
        sa.sageattn(q, k, v, is_causal=True)
        sa.sageattn(q2, k2, v2, tensor_layout="NHD", return_lse=True)
    fallback = [w for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(fallback) == 1, [str(w.message) for w in fallback]
    message = str(fallback[0].message)
    assert "torch scaled_dot_product_attention" in message and "device cpu is not a CUDA GPU" in message
    assert fallback[0].filename == __file__  # points at the caller's line


def test_big_head_dim_is_a_second_reason(inputs, triton_standin):
    """On a (pretend) sm90 GPU, head_dim > 128 falls back with its own warning, once."""
    q, k, v = inputs.make_qkv(1, 2, 2, 8, 8, 192)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = sa.sageattn(q, k, v)
        sa.sageattn(q, k, v)
    assert triton_standin.calls == []
    fallback = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(fallback) == 1 and "head_dim > 128" in fallback[0], fallback
    torch.testing.assert_close(out, _sdpa(q, k, v, "HND"))


def _varlen_ref(q, k, v, cq, ck, causal):
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(len(cq) - 1):
        sq, sk, sv = (
            x.transpose(0, 1)[None]
            for x in (q[cq[i] : cq[i + 1]], k[ck[i] : ck[i + 1]], v[ck[i] : ck[i + 1]])
        )
        out[cq[i] : cq[i + 1]] = attention_ref(sq, sk, sv, is_causal=causal)[0].transpose(0, 1)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_varlen(metrics, causal):
    lens_q, lens_k = [5, 1, 17, 9], [5, 3, 17, 30]
    cq = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    ck = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(sum(lens_q), 4, 16, generator=gen).half()
    k = torch.randn(sum(lens_k), 2, 16, generator=gen).half()
    v = torch.randn(sum(lens_k), 2, 16, generator=gen).half()
    out = sa.sageattn_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), is_causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    ref = _varlen_ref(q, k, v, cq.tolist(), ck.tolist(), causal)
    assert metrics.cosine(out, ref) >= 0.9999
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=2e-3)


def test_varlen_empty_query_sequence():
    cq = torch.tensor([0, 0, 4], dtype=torch.int32)
    ck = torch.tensor([0, 3, 6], dtype=torch.int32)
    q, k, v = torch.randn(4, 2, 8).half(), torch.randn(6, 2, 8).half(), torch.randn(6, 2, 8).half()
    out = sa.sageattn_varlen(q, k, v, cq, ck, 4, 3)
    ref = _varlen_ref(q, k, v, cq.tolist(), ck.tolist(), False)
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=2e-3)


@settings(
    max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    b=st.integers(1, 2),
    kv_heads=st.integers(1, 3),
    groups=st.sampled_from([1, 2, 4]),
    nq=st.integers(1, 40),
    nk=st.integers(1, 40),
    d=st.sampled_from([1, 8, 24, 64, 72, 128]),
    layout=st.sampled_from(["HND", "NHD"]),
    causal=st.booleans(),
    lse=st.booleans(),
    dtype=st.sampled_from([torch.float16, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_property_fallback_matches_reference(inputs, metrics, b, kv_heads, groups, nq, nk, d, layout, causal,
                                             lse, dtype, seed):  # fmt: skip
    q, k, v = inputs.make_qkv(
        b, kv_heads * groups, kv_heads, nq, nk, d, layout=layout, dtype=dtype, seed=seed
    )
    result = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=causal, return_lse=lse)
    out = result[0] if lse else result
    ref, ref_lse = attention_ref(q, k, v, tensor_layout=layout, is_causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype
    metrics.assert_finite(out)
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    if lse:
        assert result[1].shape == (b, kv_heads * groups, nq)
        torch.testing.assert_close(result[1].double(), ref_lse, rtol=0, atol=1e-4)
