"""The public API on a GPU, through the Triton kernels: accuracy (README's accuracy protocol), awkward shapes,
layouts, GQA, head dims, LSE, masks, strided inputs, every element written, dispatch on this GPU.

Every output is held to two bounds (tests/conftest.py gives them and says why): tight against
``sage_ref`` (the same quantization, simulated), and the accuracy promise against ``attention_ref``
(float64, exact): FP16 P·V cos >= 0.9999 and relative L1 <= 0.015, FP8 cos >= 0.9992 and relative
L1 <= 0.04, for randn and outlier inputs.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import sageattention as sa
from sageattention.quant import PVDtype, default_sm_scale
from sageattention.reference import attention_ref, sage_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
kernels = pytest.importorskip("sageattention.triton")

CAPABILITY = torch.cuda.get_device_capability()
PVS = [PVDtype.FP16] + ([PVDtype.FP8] if CAPABILITY >= (8, 9) else [])
VARIANT = {PVDtype.FP16: sa.sageattn_qk_int8_pv_fp16_triton, PVDtype.FP8: sa.sageattn_qk_int8_pv_fp8_triton}


def simulated(q, k, v, pv, **kw):
    return sage_ref(q, k, v, **kernels.reference_options(pv, q.shape[-1]), **kw)


def cuda_qkv(inputs, *args, **kw):
    return inputs.make_qkv(*args, device="cuda", **kw)


# --------------------------------------------------------------------------------------------------
# Accuracy protocol: b=1, h=8, n=4096, d=128


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
@pytest.mark.parametrize("causal", [False, True])
def test_protocol_randn(inputs, metrics, pv, causal):
    q, k, v = cuda_qkv(inputs, 1, 8, 8, 4096, 4096, 128, seed=1)
    out = VARIANT[pv](q, k, v, is_causal=causal)
    assert out.dtype == q.dtype and out.shape == q.shape
    metrics.assert_tight(out, simulated(q, k, v, pv, is_causal=causal), pv, "vs sage_ref")
    exact = attention_ref(q, k, v, is_causal=causal)
    metrics.assert_exact(out, exact, pv, "vs attention_ref")
    print(f"\nrandn {pv.value} causal={causal}: {metrics.fmt(metrics.summary(out, exact))}")


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
@pytest.mark.parametrize("causal", [False, True])
def test_protocol_outliers(inputs, metrics, pv, causal):
    """The hard input set, held to the same accuracy promise as randn inputs."""
    q, k, v = cuda_qkv(inputs, 1, 8, 8, 4096, 4096, 128, kind="outlier", seed=2)
    out = VARIANT[pv](q, k, v, is_causal=causal)
    metrics.assert_tight(out, simulated(q, k, v, pv, is_causal=causal), pv, "vs sage_ref")
    stats = metrics.assert_exact(out, attention_ref(q, k, v, is_causal=causal), pv, "vs attention_ref")
    print(f"\noutlier {pv.value} causal={causal}: {metrics.fmt(stats)}")


def test_sageattn_picks_a_quantized_backend_without_warning(inputs):
    q, k, v = cuda_qkv(inputs, 1, 8, 8, 256, 256, 128)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sa.SageAttentionFallbackWarning)
        out = sa.sageattn(q, k, v)
    from sageattention import dispatch

    assert dispatch.explain(q.device)["backend"] != "sdpa"
    assert out.shape == q.shape


# --------------------------------------------------------------------------------------------------
# Awkward shapes: lengths x layouts x GQA (8 q heads, 2 kv heads) x causal x q_len != kv_len

LENGTHS = [
    (1, 1),
    (17, 17),
    (113, 113),
    (1000, 1000),
    (4095, 4095),
    (1, 1000),
    (113, 4095),
    (1000, 17),
    (4095, 113),
]


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
@pytest.mark.parametrize("nq,nk", LENGTHS, ids=lambda x: str(x))
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True])
def test_awkward_shapes(inputs, metrics, pv, nq, nk, layout, causal):
    q, k, v = cuda_qkv(inputs, 2, 8, 2, nq, nk, 128, layout=layout, seed=nq + nk)
    out, lse = VARIANT[pv](q, k, v, tensor_layout=layout, is_causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride() == q.stride()
    ref, ref_lse = simulated(q, k, v, pv, tensor_layout=layout, is_causal=causal, return_lse=True)
    metrics.assert_tight(out, ref, pv, f"{layout} {nq}x{nk}")
    # LSE: one INT8 rounding flip (the K mean differs in its last bit) moves a short row by ~2e-3
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-4)
    exact, exact_lse = attention_ref(q, k, v, tensor_layout=layout, is_causal=causal, return_lse=True)
    torch.testing.assert_close(lse.double(), exact_lse, atol=5e-2, rtol=0)


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
@pytest.mark.parametrize("d", [40, 64, 72, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(inputs, metrics, pv, d, causal):
    q, k, v = cuda_qkv(inputs, 1, 8, 2, 777, 901, d, layout="NHD", seed=d)
    out = VARIANT[pv](q, k, v, tensor_layout="NHD", is_causal=causal)
    ref = simulated(q, k, v, pv, tensor_layout="NHD", is_causal=causal)
    metrics.assert_tight(out, ref, pv, f"d={d}")
    # default sm_scale is that of the caller's head dim, not the padded one
    out2 = VARIANT[pv](q, k, v, tensor_layout="NHD", is_causal=causal, sm_scale=default_sm_scale(d))
    assert torch.equal(out, out2)


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
def test_head_dim_above_128_falls_back_in_sageattn_only(inputs, metrics, pv):
    q, k, v = cuda_qkv(inputs, 1, 2, 2, 64, 64, 160)
    with pytest.warns(sa.SageAttentionFallbackWarning, match="head_dim > 128"):
        out = sa.sageattn(q, k, v)
    assert metrics.cosine(out, attention_ref(q, k, v)) >= 0.9999
    with pytest.raises(ValueError, match="head_dim=160"):
        VARIANT[pv](q, k, v)


# --------------------------------------------------------------------------------------------------
# Masks and LSE


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
@pytest.mark.parametrize("kind", ["bool", "additive_fp32", "additive_bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_masks(inputs, metrics, pv, kind, causal):
    q, k, v = cuda_qkv(inputs, 2, 8, 2, 300, 257, 64, seed=7)
    gen = torch.Generator(device="cuda").manual_seed(3)
    if kind == "bool":
        mask = torch.rand(2, 1, 300, 257, device="cuda", generator=gen) > 0.3
        mask[:, :, 11] = False  # a row with no visible key
    else:
        mask = torch.randn(1, 8, 300, 257, device="cuda", generator=gen) * 2
        mask[..., 11, :] = -math.inf
        mask = mask.to(torch.float32 if kind == "additive_fp32" else torch.bfloat16)
    out, lse = VARIANT[pv](q, k, v, attn_mask=mask, is_causal=causal, return_lse=True)
    ref, ref_lse = simulated(q, k, v, pv, attn_mask=mask, is_causal=causal, return_lse=True)
    metrics.assert_tight(out, ref, pv, kind)
    assert torch.all(out[:, :, 11] == 0), "a row with no visible key must give 0"
    assert torch.all(lse[:, :, 11] == -math.inf)
    alive = torch.ones(300, dtype=torch.bool, device="cuda")
    alive[11] = False
    torch.testing.assert_close(lse[:, :, alive], ref_lse[:, :, alive], atol=1e-2, rtol=1e-4)
    exact = attention_ref(q, k, v, attn_mask=mask, is_causal=causal)
    metrics.assert_exact(out, exact, pv, "vs attention_ref")


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
def test_lse_matches_exact_and_merges(inputs, metrics, pv):
    """LSE lets two halves of the keys be merged into the full result (the ring-attention use)."""
    q, k, v = cuda_qkv(inputs, 1, 8, 8, 512, 1024, 128, seed=9)
    full, lse = VARIANT[pv](q, k, v, return_lse=True)
    _, exact_lse = attention_ref(q, k, v, return_lse=True)
    torch.testing.assert_close(lse.double(), exact_lse, atol=5e-2, rtol=0)
    o1, l1 = VARIANT[pv](q, k[:, :, :512], v[:, :, :512], return_lse=True)
    o2, l2 = VARIANT[pv](q, k[:, :, 512:], v[:, :, 512:], return_lse=True)
    m = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - m).unsqueeze(-1), torch.exp(l2 - m).unsqueeze(-1)
    merged = (o1.float() * w1 + o2.float() * w2) / (w1 + w2)
    # each half is quantized on its own (its own K mean, V scales): judge the merge against exact
    metrics.assert_exact(merged, attention_ref(q, k, v), pv, "merged halves")
    metrics.assert_exact(full, attention_ref(q, k, v), pv, "whole")


# --------------------------------------------------------------------------------------------------
# Strides, every element written, no NaN


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
def test_strided_inputs_give_the_same_result(inputs, pv):
    """q, k, v as views into one packed projection [B, N, 3, H, D] (last dim contiguous)."""
    b, n, h, d = 2, 333, 8, 64
    qkv = torch.randn(b, n, 3, h, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(dim=2)
    assert not q.is_contiguous() and q.stride(-1) == 1
    out = VARIANT[pv](q, k, v, tensor_layout="NHD", is_causal=True)
    dense = VARIANT[pv](q.contiguous(), k.contiguous(), v.contiguous(), tensor_layout="NHD", is_causal=True)
    assert torch.equal(out, dense)


def _poison_allocator(nbytes: int) -> None:
    """Leave NaN bytes in the caching allocator's free blocks, so an output element the kernel fails to
    write shows up as NaN (0xFF bytes are NaN in fp16 and bf16)."""
    junk = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    junk.fill_(0xFF)
    del junk


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
@pytest.mark.parametrize("nq,nk", [(1, 1), (129, 65), (1000, 3000), (4095, 17)])
def test_every_element_written(inputs, metrics, pv, nq, nk):
    q, k, v = cuda_qkv(inputs, 1, 8, 2, nq, nk, 72, layout="NHD", seed=5)
    for _ in range(3):
        _poison_allocator(q.numel() * q.element_size())
        out, lse = VARIANT[pv](q, k, v, tensor_layout="NHD", is_causal=True, return_lse=True)
        metrics.assert_finite(out)
        metrics.assert_finite(lse, "lse")


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
def test_large_values_do_not_overflow(inputs, metrics, pv):
    q, k, v = cuda_qkv(inputs, 1, 4, 4, 500, 500, 128, seed=11)
    q, k, v = q * 30, k * 30, v * 1000  # scaled scores in the hundreds; |v| up to ~5e3 (fp16 holds 65504)
    out = VARIANT[pv](q, k, v, is_causal=True)
    metrics.assert_finite(out)
    metrics.assert_tight(out, simulated(q, k, v, pv, is_causal=True), pv, "large values")
