"""The reference arithmetic of sageattn3 (NVFP4 format, smoothing, two-level P, attention)."""

from __future__ import annotations

import math

import pytest
import torch
from sageattn3 import reference as R


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize(
    "value,expected",
    [
        (0.0, 0.0), (0.2, 0.0), (0.25, 0.0), (0.26, 0.5), (0.5, 0.5), (0.74, 0.5), (0.75, 1.0),
        (1.25, 1.0), (1.26, 1.5), (1.75, 2.0), (2.5, 2.0), (2.51, 3.0), (3.5, 4.0), (4.9, 4.0),
        (5.0, 4.0), (5.01, 6.0), (6.0, 6.0), (100.0, 6.0), (-0.75, -1.0), (-5.0, -4.0), (-7.0, -6.0),
    ],
)  # fmt: skip
def test_e2m1_rounding_table(value, expected):
    code = R.e2m1_round_ref(torch.tensor([value]))
    assert R.e2m1_decode_ref(code).item() == expected


def test_e2m1_negative_tiny_keeps_sign():
    code = R.e2m1_round_ref(torch.tensor([-0.1, 0.1]))
    assert code.tolist() == [8, 0]


def test_fp4_round_trip_of_representable_values():
    vals = torch.tensor(R.E2M1_VALUES)
    x = torch.cat([vals, -vals]).reshape(1, 16) * 3.0  # amax 18 -> scale 3 exactly
    codes, scales = R.fp4_quantize_ref(x)
    assert scales.float().item() == 3.0
    assert torch.equal(R.fp4_dequantize_ref(codes, scales), x)


def test_packing_low_nibble_first():
    x = torch.zeros(16)
    x[0], x[1] = 6.0, -0.5  # codes 7 and 9
    codes, _ = R.fp4_quantize_ref(x)
    assert codes.dtype == torch.uint8 and codes.shape == (8,)
    assert codes[0].item() == 0x97
    assert torch.equal(R.fp4_unpack_ref(codes)[:2], torch.tensor([7, 9], dtype=torch.uint8))


def test_e4m3_rounding_matches_exponent_arithmetic():
    # Every E4M3 value, every midpoint between neighbours, and a dense grid.
    all_vals = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (all_vals[1:] + all_vals[:-1]) / 2
    grid = torch.cat([all_vals, mids, torch.linspace(0, 600, 50001), torch.tensor([1e-9, 2.0**-10, 3e-3])])
    assert torch.equal(R.e4m3_round_ref(grid).float(), R.e4m3_round_bits_ref(grid))
    # Ties to even: 17 lies between 16 and 18 -> 16; 2^-10 between 0 and 2^-9 -> 0.
    assert R.e4m3_round_ref(torch.tensor([17.0, 19.0, 2.0**-10, 500.0])).float().tolist() == [
        16.0,
        20.0,
        0.0,
        448.0,
    ]


def test_scale_rounding_zero_group_and_saturation():
    x = torch.zeros(2, 16)
    x[1, 0] = 7.0  # scale 7/6 -> E4M3 1.125 (RNE), code 7/1.125 = 6.2 -> saturates at 6
    codes, scales = R.fp4_quantize_ref(x)
    assert scales.float().flatten().tolist() == [0.0, 1.125]
    assert torch.equal(R.fp4_dequantize_ref(codes, scales)[0], torch.zeros(16))
    assert R.fp4_dequantize_ref(codes, scales)[1, 0].item() == 6.75
    big = torch.full((16,), 1e5)  # single level: scale saturates at 448, codes at 6
    codes, scales = R.fp4_quantize_ref(big)
    assert scales.float().item() == 448.0 and R.fp4_dequantize_ref(codes, scales)[0].item() == 2688.0


def test_two_level_block_scale_keeps_group_scales_in_range():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 128, generator=gen) * 1e4
    g = R.block_scale_ref(x.abs().amax(dim=-1))
    codes, scales = R.fp4_quantize_ref(x, g.unsqueeze(-1))
    assert scales.float().max().item() <= 448.0
    back = R.fp4_dequantize_ref(codes, scales, g.unsqueeze(-1))
    assert cosine(back, x) > 0.99


def test_two_level_p_quantization():
    gen = torch.Generator().manual_seed(1)
    p = torch.rand(8, 128, generator=gen) ** 4
    p[3] = 0.0  # a fully masked row
    vals, gp = R.quantize_p_ref(p)
    back = vals * gp.unsqueeze(-1)
    assert torch.equal(back[3], torch.zeros(128)) and gp[3].item() == 0.0
    # The row max lands on the top code with scale 448, so it comes back to within one float32 ulp.
    rows = [0, 1, 2, 4, 5, 6, 7]
    assert torch.allclose(back[rows].amax(dim=-1), p[rows].amax(dim=-1), rtol=2e-7, atol=0)
    assert (vals[rows].amax(dim=-1) == 6 * 448).all()
    assert cosine(back, p) > 0.99


def test_smoothing_keeps_scores_up_to_a_row_constant():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 1, 300, 64, generator=gen, dtype=torch.float64) + 3.0
    k = (
        torch.randn(1, 1, 200, 64, generator=gen, dtype=torch.float64)
        + torch.randn(64, generator=gen).double() * 8
    )
    q_mean, qs = R.smooth_q_ref(q)
    k_mean = k.mean(dim=2, keepdim=True)
    ks = k - k_mean
    rows = q_mean.double().repeat_interleave(128, dim=2)[:, :, :300]
    smoothed = qs.double() @ ks.transpose(-1, -2) + rows @ ks.transpose(-1, -2)
    exact = q @ k.transpose(-1, -2) - q @ k_mean.transpose(-1, -2)
    assert torch.allclose(smoothed, exact, atol=1e-4)  # qs is float32: ~1e-7 relative
    assert torch.allclose(torch.softmax(smoothed, -1), torch.softmax(q @ k.transpose(-1, -2), -1), atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_sage3_ref_close_to_float64(causal, d):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 257, d, generator=gen) for _ in range(3))
    out, lse = R.sage3_ref(q, k, v, is_causal=causal, return_lse=True)
    exact, lse_exact = R.attention_ref(q, k, v, is_causal=causal, return_lse=True)
    cos = cosine(out, exact)
    print(f"sage3_ref vs float64 (1x2x257x{d}, causal={causal}): cosine {cos:.5f}")
    assert cos > 0.975
    assert (lse.double() - lse_exact).abs().max() < 0.3


def test_per_block_mean_helps_with_offset_q():
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 1, 256, 64, generator=gen) + 4 * torch.randn(64, generator=gen)
    k, v = (torch.randn(1, 1, 256, 64, generator=gen) for _ in range(2))
    exact = R.attention_ref(q, k, v)
    with_mean = cosine(R.sage3_ref(q, k, v, per_block_mean=True), exact)
    without = cosine(R.sage3_ref(q, k, v, per_block_mean=False), exact)
    assert with_mean > without


def test_sage3_ref_gqa_layout_and_masks():
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 50, 64, generator=gen)
    k, v = (torch.randn(1, 2, 40, 64, generator=gen) for _ in range(2))
    hnd = R.sage3_ref(q, k, v)
    nhd = R.sage3_ref(*(t.transpose(1, 2) for t in (q, k, v)), tensor_layout="NHD")
    assert torch.equal(nhd.transpose(1, 2), hnd)
    assert cosine(hnd, R.attention_ref(q, k, v)) > 0.97
    mask = torch.rand(50, 40, generator=gen) > 0.3
    mask[7] = False  # a row with no visible key
    out, lse = R.sage3_ref(q, k, v, attn_mask=mask, return_lse=True)
    assert torch.equal(out[:, :, 7], torch.zeros_like(out[:, :, 7])) and math.isinf(lse[0, 0, 7].item())
    ok = torch.ones(50, dtype=torch.bool)
    ok[7] = False
    assert cosine(out[:, :, ok], R.attention_ref(q, k, v, attn_mask=mask)[:, :, ok]) > 0.97
    additive = torch.randn(50, 40, generator=gen)
    assert (
        cosine(R.sage3_ref(q, k, v, attn_mask=additive), R.attention_ref(q, k, v, attn_mask=additive)) > 0.97
    )


def test_padding_and_awkward_lengths():
    gen = torch.Generator().manual_seed(6)
    for n in (1, 17, 113):
        q, k, v = (torch.randn(1, 1, n, 64, generator=gen) for _ in range(3))
        out = R.sage3_ref(q, k, v, is_causal=True)
        assert out.shape == (1, 1, n, 64) and not torch.isnan(out).any()
        vq = R.quantize_v_ref(v)
        assert vq.codes.shape == (1, 1, 64, 64) and vq.scales.shape == (1, 1, 64, 8)
