"""The compiled fused quantization ops (csrc/fused) against the reference quantization and the Triton
quantization kernels, bit for bit (two-level K included), and the attention they feed against the
simulated-quantization reference."""

from __future__ import annotations

import importlib

import pytest
import torch

from sageattention.quant import K_RESIDUAL_MUL, LOG2E, PVDtype
from sageattention.reference import quantize_per_block_ref, quantize_v_fp8_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
try:
    importlib.import_module("sageattention._fused")
except ImportError as exc:
    pytest.skip(f"sageattention._fused is not built: {exc}", allow_module_level=True)

launch = pytest.importorskip("sageattention.triton.launch")
ops = torch.ops.sageattention


def hnd(b, h, n, d, layout, dtype):
    x = torch.randn(b, h, n, d, device="cuda", dtype=dtype) * 3
    return x if layout == "HND" else x.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("n,d", [(1, 128), (17, 64), (113, 72), (1000, 128), (4095, 40)])
def test_int8_quantization_is_bit_exact(dtype, layout, n, d):
    b, hq, hkv = 2, 4, 2
    q, k = hnd(b, hq, n, d, layout, dtype), hnd(b, hkv, n, d, layout, dtype) + 5
    d_pad = launch._d_pad(d)
    sm_scale = d**-0.5
    km = k.mean(dim=2, dtype=torch.float32)
    qq, qs, corr = ops.quant_q_per_token(q, km, sm_scale, sm_scale * LOG2E / 127, d_pad, hq // hkv, True)
    ref_q, ref_qs = quantize_per_block_ref(q.float(), 1, extra_scale=sm_scale * LOG2E)
    assert torch.equal(qq[..., :d].float(), ref_q) and not qq[..., d:].any()
    assert torch.equal(qs, ref_qs)
    ref_corr = sm_scale * (q.float() @ km.repeat_interleave(hq // hkv, dim=1).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(corr, ref_corr, rtol=1e-5, atol=1e-4)
    for block in (64, 128):
        kq, ks = ops.quant_k_per_block(k, km, block, d_pad)
        ref_k, ref_ks = quantize_per_block_ref(k.float() - km.unsqueeze(2), block)
        assert torch.equal(kq[..., :d].float(), ref_k) and torch.equal(ks, ref_ks)


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    bad = (a != b).nonzero()
    return f"{len(bad)} elements differ; first (b, h, token, channel): {bad[:6].tolist()}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("smooth", [True, False])
@pytest.mark.parametrize("n,d", [(1, 128), (17, 64), (113, 72), (1000, 128), (4095, 40)])
def test_two_level_k_is_bit_exact(dtype, layout, smooth, n, d):
    """quant_k_per_block(..., residual=True) against the Triton kernel (digits and scale, bit for bit)
    and against quantize_per_block_ref(residual=True) (which returns k1 * 254 + k2)."""
    k = hnd(2, 3, n, d, layout, dtype) + 5
    d_pad = launch._d_pad(d)
    km = k.mean(dim=2, dtype=torch.float32) if smooth else None
    kq, ks, kr = ops.quant_k_per_block(k, km, 64, d_pad, True)
    assert kq.shape == kr.shape == (2, 3, n, d_pad) and kr.dtype == torch.int8
    tq, tr, ts = launch._quantize_k(
        k, km, None, n=n, batch=2, block_n=64, d_pad=d_pad, varlen=False, residual=True
    )
    assert torch.equal(kq, tq), "first digit vs Triton: " + _first_difference(kq, tq)
    assert torch.equal(kr, tr), "second digit vs Triton: " + _first_difference(kr, tr)
    assert torch.equal(ks, ts), "scale vs Triton: " + _first_difference(ks, ts)
    kf = k.float() - km.unsqueeze(2) if smooth else k.float()
    ref_k, ref_ks = quantize_per_block_ref(kf, 64, residual=True)
    combined = kq[..., :d].float() * K_RESIDUAL_MUL + kr[..., :d].float()
    assert torch.equal(combined, ref_k), "k1 * 254 + k2 vs reference: " + _first_difference(combined, ref_k)
    assert torch.equal(ks, ref_ks), "scale vs reference: " + _first_difference(ks, ref_ks)
    assert not kq[..., d:].any() and not kr[..., d:].any(), "channels past D must be zeros"
    assert kr.abs().max() <= 127 and kq.abs().max() <= 127
    # The one-level call still returns two tensors, and the first digit is the one-level INT8 K.
    one = ops.quant_k_per_block(k, km, 64, d_pad)
    assert len(one) == 2 and torch.equal(one[0], kq)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,d", [(1, 128), (113, 64), (1000, 72)])
def test_fp8_v_is_bit_exact(dtype, n, d):
    v = hnd(2, 3, n, d, "NHD", dtype)
    vmax = torch.linalg.vector_norm(v, ord=float("inf"), dim=2, dtype=torch.float32)
    n_pad = -(-n // 16) * 16
    vt = ops.quant_v_fp8(v, vmax, launch._d_pad(d), n_pad)
    ref_v, _ = quantize_v_fp8_ref(v)
    assert torch.equal(vt[:, :, :d, :n].float().transpose(-1, -2), ref_v)
    assert not vt[:, :, d:, :n].float().any()


@pytest.mark.parametrize("pv", [PVDtype.FP16, PVDtype.FP8], ids=lambda p: p.value)
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_and_triton_quantization_give_the_same_attention(pv, causal):
    q, k, v = (hnd(2, 8, 1000, 128, "NHD", torch.bfloat16) for _ in range(3))
    args = dict(is_causal=causal, sm_scale=128**-0.5, pv=pv, smooth_k=True, return_lse=True)
    out_t, lse_t = launch.attention_fwd(q, k, v, quant_backend="triton", **args)
    out_c, lse_c = launch.attention_fwd(q, k, v, quant_backend="cuda", **args)
    assert torch.equal(out_t, out_c)
    torch.testing.assert_close(lse_t, lse_c, rtol=0, atol=1e-5)
