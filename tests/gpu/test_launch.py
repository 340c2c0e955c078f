"""Kernel-level checks of the Triton launchers against the simulated-quantization reference.

Tight: the kernels must do what `sage_ref` does (same quantization, same blocking); the
remaining differences are float32 rounding order inside the MMA, exp2/division approximations,
and the rare FP16/FP8 rounding flip of a P element that those cause.
"""

from __future__ import annotations

import pytest
import torch

from sageattention.quant import PVDtype, default_sm_scale
from sageattention.reference import sage_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

launch = pytest.importorskip("sageattention.triton.launch")

PVS = [PVDtype.FP16]
if torch.cuda.get_device_capability() >= (8, 9):
    PVS.append(PVDtype.FP8)


# FP8 P has 3 mantissa bits: where an exp2 approximation moves one P element across a rounding
# boundary, that element changes by up to 1/16; with few keys per row that shows in the output.
TIGHT = {PVDtype.FP16: (0.99999, 0.02), PVDtype.FP8: (0.9999, 0.07)}


def close(out, ref, pv, cos_min=None):
    tight_cos, err_max = TIGHT[pv]
    cos_min = tight_cos if cos_min is None else cos_min
    o, r = out.double().flatten(), ref.double().flatten()
    assert not torch.isnan(o).any(), "NaN in output"
    cos = torch.nn.functional.cosine_similarity(o, r, dim=0).item()
    err = ((o - r).abs().max() / r.abs().max().clamp_min(1e-6)).item()
    assert cos >= cos_min and err <= err_max, f"cos={cos:.7f} max_err/max_ref={err:.2e}"


def rand(*shape, layout="HND"):
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    return x if layout == "HND" else x.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
@pytest.mark.parametrize(
    "nq,nk", [(1, 1), (17, 17), (113, 113), (1000, 1000), (4095, 4095), (1, 999), (300, 77)]
)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_matches_simulation(pv, nq, nk, layout, causal):
    b, hq, hkv, d = 2, 8, 2, 128
    q, k, v = (
        rand(b, hq, nq, d, layout=layout),
        rand(b, hkv, nk, d, layout=layout),
        rand(b, hkv, nk, d, layout=layout),
    )
    k = k + 3  # a shared offset smoothing must remove
    out, lse = launch.attention_fwd(
        q, k, v, is_causal=causal, sm_scale=default_sm_scale(d), pv=pv, smooth_k=True, return_lse=True
    )
    ref, ref_lse = sage_ref(q, k, v, is_causal=causal, return_lse=True, **launch.reference_options(pv, d))
    assert out.stride() == q.stride()
    close(out, ref, pv)
    # an INT8 rounding flip (km differs in its last bit) moves a short causal row by ~2e-3
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-4)


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
@pytest.mark.parametrize("d", [32, 40, 64, 72, 96, 128])
def test_head_dims(pv, d):
    q, k, v = rand(1, 4, 333, d), rand(1, 4, 333, d), rand(1, 4, 333, d)
    out, _ = launch.attention_fwd(
        q, k, v, is_causal=False, sm_scale=default_sm_scale(d), pv=pv, smooth_k=True
    )
    close(out, sage_ref(q, k, v, **launch.reference_options(pv, d)), pv)


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_masks(pv, kind):
    q, k, v = rand(2, 4, 200, 64), rand(2, 4, 150, 64), rand(2, 4, 150, 64)
    if kind == "bool":
        mask = torch.rand(2, 1, 200, 150, device="cuda") > 0.3
        mask[:, :, 5] = False  # a row that sees nothing: output 0, like SDPA
    else:
        mask = torch.randn(1, 4, 200, 150, device="cuda", dtype=torch.bfloat16)
    out, _ = launch.attention_fwd(
        q, k, v, is_causal=False, sm_scale=0.125, pv=pv, smooth_k=True, attn_mask=mask
    )
    ref = sage_ref(q, k, v, sm_scale=0.125, attn_mask=mask, **launch.reference_options(pv, 64))
    close(out, ref, pv)
    if kind == "bool":
        assert out[:, :, 5].abs().max() == 0


@pytest.mark.parametrize("pv", PVS, ids=lambda p: p.value)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_smooths_per_sequence(pv, causal):
    lens_q, lens_k = [1, 130, 17, 400], [1, 130, 90, 401]
    hq, hkv, d = 4, 2, 128
    q, k, v = (
        torch.randn(sum(lens), h, d, device="cuda", dtype=torch.float16)
        for lens, h in ((lens_q, hq), (lens_k, hkv), (lens_k, hkv))
    )
    k += torch.repeat_interleave(
        torch.randn(len(lens_k), 1, d, device="cuda") * 5, torch.tensor(lens_k, device="cuda"), dim=0
    ).half()
    cu = [torch.tensor([0] + lens, device="cuda").cumsum(0).int() for lens in (lens_q, lens_k)]
    out = launch.varlen_fwd(
        q,
        k,
        v,
        cu[0],
        cu[1],
        max(lens_q),
        max(lens_k),
        is_causal=causal,
        sm_scale=default_sm_scale(d),
        pv=pv,
        smooth_k=True,
    )
    for i in range(len(lens_q)):
        sq, sk = slice(int(cu[0][i]), int(cu[0][i + 1])), slice(int(cu[1][i]), int(cu[1][i + 1]))
        ref = sage_ref(
            q[sq].unsqueeze(0),
            k[sk].unsqueeze(0),
            v[sk].unsqueeze(0),
            tensor_layout="NHD",
            is_causal=causal,
            **launch.reference_options(pv, d),
        )
        close(out[sq].unsqueeze(0), ref, pv, cos_min=0.9999)


def test_deterministic():
    q, k, v = rand(1, 8, 1000, 128), rand(1, 8, 1000, 128), rand(1, 8, 1000, 128)
    pv = PVS[-1]
    a = launch.attention_fwd(q, k, v, is_causal=True, sm_scale=0.1, pv=pv, smooth_k=True)[0]
    b = launch.attention_fwd(q, k, v, is_causal=True, sm_scale=0.1, pv=pv, smooth_k=True)[0]
    assert torch.equal(a, b)
