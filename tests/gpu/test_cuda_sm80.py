"""The sm80-family CUDA attention kernel (csrc/sm80, op sageattention::qk_int8_sv_f16_attn) against
the simulated-quantization reference (tightly) and float64 attention (loosely).

Inputs are made with the compiled fused quantization ops, exactly as the kernel will be fed:
Q INT8 per token, K minus its mean INT8 per block of 64 keys, V FP16. The kernel runs on every arch
>= 8.0, so an H100/H200 exercises it too.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from sageattention.quant import LOG2E, PVDtype
from sageattention.reference import attention_ref, sage_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
for _module in ("sageattention._qattn_sm80", "sageattention._fused"):
    try:
        importlib.import_module(_module)
    except ImportError as exc:
        pytest.skip(f"{_module} is not built: {exc}", allow_module_level=True)

from sageattention import cuda_ops  # noqa: E402  (registers the fake implementations)

ops = torch.ops.sageattention
KEY_BLOCK = 64  # the kernel's key step and K's quantization block


def make(b, h, n, d, layout, dtype, seed, scale=1.0):
    """A [B, H, N, D] view; NHD memory when layout == "NHD"."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (b, h, n, d) if layout == "HND" else (b, n, h, d)
    x = torch.randn(shape, device="cuda", generator=gen) * scale
    x = x.to(dtype)
    return x if layout == "HND" else x.transpose(1, 2)


def run_kernel(q, k, v, *, causal, return_lse=False, pv_accum="fp32", smooth_k=True, out_nhd=None):
    """Quantize HND views with the fused ops and run the kernel: (out, lse or None)."""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[-1]
    d_pad = 64 if d <= 64 else 128
    sm_scale = d**-0.5
    km = k.mean(dim=2, dtype=torch.float32) if smooth_k else None
    with_corr = return_lse and smooth_k
    qq, qs, corr = ops.quant_q_per_token(q, km, sm_scale, sm_scale * LOG2E / 127, d_pad, hq // hkv, with_corr)
    kq, ks = ops.quant_k_per_block(k, km, KEY_BLOCK, d_pad)
    vh = v if v.dtype == torch.float16 else v.to(torch.float16)
    if out_nhd is None:
        out_nhd = q.stride(1) < q.stride(2)
    out, lse = ops.qk_int8_sv_f16_attn(
        qq, kq, vh, qs, ks, corr if with_corr else None, causal, return_lse, q.dtype, out_nhd, pv_accum
    )
    return out, (lse if return_lse else None)


def reference(q, k, v, *, causal, return_lse=False):
    return sage_ref(
        q, k, v, is_causal=causal, sm_scale=q.shape[-1] ** -0.5, pv=PVDtype.FP16, smooth_k=True, block_m=1,
        block_n=KEY_BLOCK, return_lse=return_lse,
    )  # fmt: skip


def poison_allocator(*shapes_dtypes):
    """Hand NaN-filled blocks of these sizes back to the caching allocator, so the kernel's
    torch.empty outputs most likely start as NaN: a row or channel it forgets to write shows."""
    blocks = [torch.full(shape, math.nan, dtype=dtype, device="cuda") for shape, dtype in shapes_dtypes]
    del blocks


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [1, 17, 113, 1000, 4095])
@pytest.mark.parametrize("d", [64, 128])
def test_matches_sage_ref(metrics, layout, causal, n, d):
    b, hq, hkv = 2, 8, 2  # GQA: 4 query heads per KV head
    dtype = torch.bfloat16 if n % 2 else torch.float16
    q, k, v = (make(b, h, n, d, layout, dtype, seed) for h, seed in ((hq, 1), (hkv, 2), (hkv, 3)))
    k = k + 2.0  # a common offset that smooth-K removes
    poison_allocator(((b, hq, n, d), dtype), ((b, hq, n), torch.float32))
    out, lse = run_kernel(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and out.stride() == torch.empty_like(q).stride()
    metrics.assert_finite(out)
    ref, ref_lse = reference(q, k, v, causal=causal, return_lse=True)
    metrics.assert_tight(out, ref, PVDtype.FP16)
    metrics.assert_finite(lse, "lse")
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=2e-4)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("nq,nk", [(100, 300), (300, 100), (129, 64), (64, 129)])
def test_different_query_and_key_lengths(metrics, causal, nq, nk):
    q = make(1, 4, nq, 128, "HND", torch.float16, 4)
    k, v = make(1, 4, nk, 128, "HND", torch.float16, 5), make(1, 4, nk, 128, "HND", torch.float16, 6)
    out, lse = run_kernel(q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = reference(q, k, v, causal=causal, return_lse=True)
    metrics.assert_tight(out, ref, PVDtype.FP16)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=2e-4)


@pytest.mark.parametrize("d", [40, 72, 96])
def test_head_dims_below_the_tile(metrics, d):
    q, k, v = (make(1, 4, 333, d, "NHD", torch.bfloat16, s) for s in (7, 8, 9))
    poison_allocator(((1, 4, 333, d), torch.bfloat16))
    out, _ = run_kernel(q, k, v, causal=True)
    metrics.assert_finite(out)
    metrics.assert_tight(out, reference(q, k, v, causal=True), PVDtype.FP16)


@pytest.mark.parametrize("kv_group", [1, 8])
def test_gqa_groups(metrics, kv_group):
    q = make(1, 8, 500, 64, "HND", torch.float16, 10)
    hkv = 8 // kv_group
    k, v = make(1, hkv, 500, 64, "HND", torch.float16, 11), make(1, hkv, 500, 64, "HND", torch.float16, 12)
    out, _ = run_kernel(q, k, v, causal=False)
    metrics.assert_tight(out, reference(q, k, v, causal=False), PVDtype.FP16)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_against_float64(metrics, causal):
    """The accuracy promised to users (DESIGN.md protocol, b=1 h=8 n=4096 d=128, randn)."""
    q, k, v = (make(1, 8, 4096, 128, "NHD", torch.bfloat16, s) for s in (13, 14, 15))
    out, lse = run_kernel(q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = attention_ref(q, k, v, is_causal=causal, return_lse=True)
    metrics.assert_exact(out, ref, PVDtype.FP16)
    # The first causal rows see one key: their LSE is one INT8 score, off by up to 0.032 (H100); a masking
    # or scaling bug moves an LSE by O(1).
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=5e-2)


@pytest.mark.parametrize("d", [64, 128])
def test_fp16_accumulation_variant(metrics, d):
    q, k, v = (make(2, 4, 1000, d, "HND", torch.float16, s) for s in (16, 17, 18))
    out, _ = run_kernel(q, k, v, causal=True, pv_accum="fp16+fp32")
    metrics.assert_tight(out, reference(q, k, v, causal=True), PVDtype.FP16)


def test_without_smoothing_and_without_lse(metrics):
    q, k, v = (make(1, 2, 200, 64, "HND", torch.float16, s) for s in (19, 20, 21))
    out, lse = run_kernel(q, k, v, causal=False, smooth_k=False)
    assert lse is None
    ref = sage_ref(q, k, v, pv=PVDtype.FP16, smooth_k=False, block_m=1, block_n=KEY_BLOCK)
    metrics.assert_tight(out, ref, PVDtype.FP16)


def test_out_layout_follows_out_nhd():
    q, k, v = (make(1, 2, 70, 64, "HND", torch.float16, s) for s in (22, 23, 24))
    a, _ = run_kernel(q, k, v, causal=False, out_nhd=False)
    c, _ = run_kernel(q, k, v, causal=False, out_nhd=True)
    assert a.is_contiguous() and c.transpose(1, 2).is_contiguous()
    assert torch.equal(a, c)


def test_rejects_a_key_scale_per_other_block():
    q, k, v = (make(1, 2, 200, 64, "HND", torch.float16, s) for s in (25, 26, 27))
    km = k.mean(dim=2, dtype=torch.float32)
    qq, qs, _ = ops.quant_q_per_token(q, km, 0.125, 0.125 * LOG2E / 127, 64, 1, False)
    kq, ks = ops.quant_k_per_block(k, km, 128, 64)
    with pytest.raises(RuntimeError, match="k_scale"):
        ops.qk_int8_sv_f16_attn(qq, kq, v, qs, ks, None, False, False, torch.float16, False, "fp32")
    kq, ks = ops.quant_k_per_block(k, km, 64, 64)
    with pytest.raises(RuntimeError, match="pv_accum"):
        ops.qk_int8_sv_f16_attn(qq, kq, v, qs, ks, None, False, False, torch.float16, False, "fp8")


def test_fake_implementation_matches():
    assert cuda_ops.registered(), cuda_ops.unavailable_reason()
    q, k, v = (make(1, 4, 130, 64, "NHD", torch.bfloat16, s) for s in (28, 29, 30))
    km = k.mean(dim=2, dtype=torch.float32)
    qq, qs, corr = ops.quant_q_per_token(q, km, 0.125, 0.125 * LOG2E / 127, 64, 1, True)
    kq, ks = ops.quant_k_per_block(k, km, KEY_BLOCK, 64)
    args = (qq, kq, v.to(torch.float16), qs, ks, corr, True, True, torch.bfloat16, True, "fp32")
    checks = ("test_schema", "test_faketensor")
    torch.library.opcheck(ops.qk_int8_sv_f16_attn.default, args, test_utils=checks)
