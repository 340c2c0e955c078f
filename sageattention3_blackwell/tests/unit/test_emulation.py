"""The CUDA kernels (quantization and attention, both MMA paths) run on the CPU through
tests/emulation/ and agree with the reference: the quantization bit for bit, the attention to float32
rounding. The emulation computes each mma.sync from the PTX ISA's register layouts, independently of
the kernels' fragment code, so an indexing mistake in a kernel fails here; whether the GPU agrees with
those layouts is what `python -m sageattn3 selftest` checks on the hardware."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch
from sage3_toolchain import CXX, build_emulation, cuda_include
from sageattn3 import reference as R
from sageattn3.core import _grouped_matmul, _smoothing_correction

pytestmark = pytest.mark.skipif(
    CXX is None or cuda_include() is None, reason="needs g++ and the CUDA headers (cuda_fp16.h)"
)

VOID_P = ctypes.c_void_p


@pytest.fixture(scope="module", params=["fp4", "f16"])
def kernels(request, tmp_path_factory):
    """The kernels built for the CPU: 'fp4' = the sm_120a code (block-scaled FP4 MMA), 'f16' = the
    sm_90a/sm_100a code (FP4 decoded to fp16)."""
    lib = ctypes.CDLL(str(build_emulation(tmp_path_factory.mktemp("emu"), request.param == "fp4")))
    assert lib.sage3_emu_fp4_mma() == (request.param == "fp4")
    return lib


def _ptr(t):
    return VOID_P(0) if t is None else VOID_P(t.data_ptr())


def _i64(*values):
    return (ctypes.c_int64 * len(values))(*values)


def _type(x):
    return 0 if x.dtype == torch.float16 else 1


def quant_rows(lib, x, mode, mean=None):
    b, h, n, d = x.shape
    n_pad = -(-n // 128) * 128
    codes = torch.full((b, h, n_pad, d // 2), 0xAA, dtype=torch.uint8)  # padding must be overwritten
    scales = torch.full((b, h, n_pad, d // 16), 0xAA, dtype=torch.uint8)
    gs = torch.zeros(b, h, n_pad // 128)
    if mode == 2:
        mean = torch.zeros(b, h, n_pad // 128, d)
    lib.sage3_emu_quant_rows(
        _ptr(x), _type(x), _i64(*x.stride()[:3]), b, h, n, n_pad, d, 128, mode,
        _ptr(mean), _ptr(codes), _ptr(scales), _ptr(gs),
    )  # fmt: skip
    return codes, scales, gs, mean


def quant_vt(lib, v):
    b, h, n, d = v.shape
    n_pad = -(-n // 128) * 128
    codes = torch.full((b, h, d, n_pad // 2), 0xAA, dtype=torch.uint8)
    scales = torch.full((b, h, d, n_pad // 16), 0xAA, dtype=torch.uint8)
    gs = torch.zeros(b, h, n_pad // 128)
    lib.sage3_emu_quant_vt(
        _ptr(v), _type(v), _i64(*v.stride()[:3]), b, h, n, n_pad, d, 128, _ptr(codes), _ptr(scales), _ptr(gs)
    )
    return codes, scales, gs


def attention(lib, q, k, v, *, is_causal=False, attn_mask=None, per_block_mean=True, sm_scale=None, out=None):
    """What core._native_forward does, with the emulated kernels; HND inputs, out any [B,H,N,D] view."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    sm_scale = sm_scale or 1 / math.sqrt(d)
    qc, qs, qg, qm = quant_rows(lib, q, 2 if per_block_mean else 0)
    k_mean = k.float().mean(dim=2).contiguous()
    kc, ks, kg, _ = quant_rows(lib, k, 1, k_mean)
    vc, vs, vg = quant_vt(lib, v)
    corr = _smoothing_correction(qm, k, k_mean) if per_block_mean else None
    kind, mask, strides = 0, None, (0, 0, 0, 0)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            kind, mask = 1, attn_mask.expand(b, hq, nq, nk).view(torch.uint8)
        else:
            kind, mask = 2, attn_mask.float().expand(b, hq, nq, nk)
        strides = mask.stride()
    out = torch.zeros_like(q) if out is None else out
    lse = torch.zeros(b, hq, nq)
    sizes = (ctypes.c_int * 8)(b, hq, hkv, nq, nk, qc.shape[2], kc.shape[2], d)
    operands = (VOID_P * 6)(*(_ptr(t) for t in (qc, qs, kc, ks, vc, vs)))
    block_scales = (VOID_P * 3)(*(_ptr(t) for t in (qg, kg, vg)))
    lib.sage3_emu_attention(
        operands, block_scales, _ptr(corr), _ptr(mask), kind, _i64(*strides), _ptr(out), _type(out),
        _i64(*out.stride()[:3]), _ptr(lse), sizes, ctypes.c_float(sm_scale * R.LOG2E), int(is_causal),
    )  # fmt: skip
    q_km = _grouped_matmul(q.float(), k_mean.unsqueeze(-1)).squeeze(-1)
    return out, lse + sm_scale * q_km


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def qkv(b, hq, hkv, nq, nk, d, dtype, seed, offset=0.0):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, hq, nq, d, generator=gen) * 2 + 1).to(dtype)
    k = (torch.randn(b, hkv, nk, d, generator=gen) + offset).to(dtype)
    v = torch.randn(b, hkv, nk, d, generator=gen).to(dtype)
    return q, k, v


@pytest.mark.parametrize("n", [1, 130])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)])
def test_quantization_bit_exact(kernels, n, d, dtype):
    q, k, v = qkv(1, 2, 2, n, n, d, dtype, seed=n, offset=3.0)
    for mode in (2, 0):
        qc, qs, qg, qm = quant_rows(kernels, q, mode)
        ref = R.quantize_q_ref(q, per_block_mean=mode == 2, q_mean=qm if mode == 2 else None)
        assert torch.equal(qc[:, :, :n], ref.codes)
        assert torch.equal(qs[:, :, :n], ref.scales.view(torch.uint8)) and torch.equal(qg, ref.block_scale)
        assert not qc[:, :, n:].any() and not qs[:, :, n:].any()  # padding rows: zero codes and scales
    k_mean = k.float().mean(dim=2).contiguous()
    kc, ks, kg, _ = quant_rows(kernels, k, 1, k_mean)
    ref = R.quantize_k_ref(k, k_mean=k_mean)
    assert torch.equal(kc[:, :, :n], ref.codes) and torch.equal(ks[:, :, :n], ref.scales.view(torch.uint8))
    assert torch.equal(kg, ref.block_scale)
    vc, vs, vg = quant_vt(kernels, v)
    ref = R.quantize_v_ref(v)
    assert torch.equal(vc, ref.codes) and torch.equal(vs, ref.scales.view(torch.uint8))
    assert torch.equal(vg, ref.block_scale)


def _check(out, lse, sim, lse_sim):
    # float32 addition order inside the MMAs, libm exp2 and the fp16/bf16 output rounding differ
    ulp = 2.0**-8 if out.dtype == torch.bfloat16 else 2.0**-10
    assert cosine(out, sim) > 0.99999
    assert (out.float() - sim).abs().max().item() <= 2 * ulp * sim.abs().max().item()
    finite = torch.isfinite(lse_sim)
    assert torch.equal(finite, torch.isfinite(lse))
    assert torch.allclose(lse[finite], lse_sim[finite], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "shape,dtype,opts",
    [
        ((1, 2, 1, 70, 140, 64), torch.bfloat16, {"is_causal": True}),
        ((1, 1, 1, 130, 300, 128), torch.float16, {}),
        ((1, 2, 2, 300, 113, 128), torch.bfloat16, {"is_causal": True, "sm_scale": 0.3}),  # Nq > Nk
        ((1, 2, 1, 17, 200, 64), torch.float16, {"is_causal": True, "per_block_mean": False}),
    ],
)
def test_attention_matches_reference(kernels, shape, dtype, opts):
    q, k, v = qkv(*shape, dtype=dtype, seed=sum(shape), offset=3.0)
    out, lse = attention(kernels, q, k, v, **opts)
    sim, lse_sim = R.sage3_ref(q, k, v, return_lse=True, **opts)
    _check(out, lse, sim, lse_sim)


def test_masks_gqa_and_strided_output(kernels):
    q, k, v = qkv(2, 4, 2, 100, 77, 64, torch.float16, seed=7)
    gen = torch.Generator().manual_seed(8)
    mask = torch.rand(2, 1, 100, 77, generator=gen) > 0.3
    mask[:, :, 5] = False  # a row with no visible key: output 0, LSE -inf
    out, lse = attention(kernels, q, k, v, attn_mask=mask)
    sim, lse_sim = R.sage3_ref(q, k, v, attn_mask=mask, return_lse=True)
    _check(out, lse, sim, lse_sim)
    assert not out[:, :, 5].any() and torch.isinf(lse[:, :, 5]).all()
    additive = torch.randn(100, 77, generator=gen).bfloat16()
    nhd = torch.zeros(2, 100, 4, 64, dtype=torch.float16)  # written through an HND view of NHD storage
    out, lse = attention(kernels, q, k, v, attn_mask=additive, per_block_mean=False, out=nhd.transpose(1, 2))
    sim, lse_sim = R.sage3_ref(q, k, v, attn_mask=additive, per_block_mean=False, return_lse=True)
    _check(out, lse, sim, lse_sim)
