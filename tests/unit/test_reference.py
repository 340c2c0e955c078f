"""The references themselves: attention_ref against torch SDPA (float64), sage_ref against attention_ref.

Everything else is judged against these two, so they are checked first, on the CPU.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sageattention.quant import PVDtype
from sageattention.reference import attention_ref, sage_ref

F64 = torch.float64


def _sdpa64(q, k, v, **kw):
    """torch SDPA in float64 on HND tensors, GQA by repeating KV heads."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)


@pytest.mark.parametrize(
    "nq,nk,hq,hkv", [(16, 16, 2, 2), (7, 19, 4, 2), (19, 7, 4, 1), (1, 33, 2, 2), (33, 1, 2, 2)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_ref_matches_sdpa(inputs, nq, nk, hq, hkv, causal):
    """Plain, causal (top-left, also when q_len != kv_len) and grouped-query attention."""
    q, k, v = inputs.make_qkv(2, hq, hkv, nq, nk, 24, dtype=F64)
    out = attention_ref(q, k, v, is_causal=causal)
    torch.testing.assert_close(out, _sdpa64(q, k, v, is_causal=causal), rtol=1e-10, atol=1e-10)


def test_attention_ref_sm_scale(inputs):
    q, k, v = inputs.make_qkv(1, 2, 2, 9, 11, 16, dtype=F64)
    out = attention_ref(q, k, v, sm_scale=0.37)
    torch.testing.assert_close(out, _sdpa64(q, k, v, scale=0.37), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "mask_shape", [(9, 11), (1, 9, 11), (1, 1, 9, 11), (2, 1, 9, 11), (2, 4, 9, 11), (1, 11)]
)
def test_attention_ref_bool_mask(inputs, mask_shape):
    q, k, v = inputs.make_qkv(2, 4, 2, 9, 11, 16, dtype=F64)
    mask = torch.rand(mask_shape, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0] = True  # keep every row alive: SDPA reference semantics for dead rows are tested below
    torch.testing.assert_close(
        attention_ref(q, k, v, attn_mask=mask), _sdpa64(q, k, v, attn_mask=mask), rtol=1e-10, atol=1e-10
    )


def test_attention_ref_additive_mask(inputs):
    q, k, v = inputs.make_qkv(2, 4, 4, 9, 11, 16, dtype=F64)
    bias = torch.randn(1, 4, 9, 11, dtype=F64)
    torch.testing.assert_close(
        attention_ref(q, k, v, attn_mask=bias), _sdpa64(q, k, v, attn_mask=bias), rtol=1e-10, atol=1e-10
    )


def test_attention_ref_nhd_layout(inputs):
    q, k, v = inputs.make_qkv(2, 4, 2, 9, 11, 16, dtype=F64, layout="NHD")
    out = attention_ref(q, k, v, tensor_layout="NHD", is_causal=True)
    expect = _sdpa64(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, expect, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_ref_lse(inputs, causal):
    q, k, v = inputs.make_qkv(1, 2, 1, 13, 17, 16, dtype=F64)
    _, lse = attention_ref(q, k, v, is_causal=causal, sm_scale=0.3, return_lse=True)
    s = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) * 0.3
    if causal:
        s = s.masked_fill(~torch.ones(13, 17, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(lse, torch.logsumexp(s, dim=-1), rtol=1e-12, atol=1e-12)


def test_attention_ref_fully_masked_row_is_zero_with_lse_minus_inf(inputs):
    q, k, v = inputs.make_qkv(1, 2, 2, 5, 6, 8, dtype=F64)
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[2] = False
    out, lse = attention_ref(q, k, v, attn_mask=mask, return_lse=True)
    assert torch.all(out[:, :, 2] == 0)
    assert torch.all(lse[:, :, 2] == -math.inf)
    assert torch.isfinite(out).all()
    # SDPA (torch >= 2.5) agrees on the zero rows
    torch.testing.assert_close(out, _sdpa64(q, k, v, attn_mask=mask), rtol=1e-10, atol=1e-10)


# (pv, kind) -> (min cosine, max relative L1). randn: the bounds the GPU kernels are held to against
# attention_ref; outlier: looser, the hard input set is reported more than judged.
SAGE_REF_BOUNDS = {
    (PVDtype.FP16, "randn"): (0.9999, 0.015),
    (PVDtype.FP8, "randn"): (0.9992, 0.04),
    (PVDtype.FP16, "outlier"): (0.999, 0.03),
    (PVDtype.FP8, "outlier"): (0.998, 0.06),
}


@pytest.mark.parametrize("pv", [PVDtype.FP16, PVDtype.FP8], ids=lambda p: p.value)
@pytest.mark.parametrize("kind", ["randn", "outlier"])
@pytest.mark.parametrize("causal", [False, True])
def test_sage_ref_close_to_exact(inputs, metrics, pv, kind, causal):
    """The simulated quantization stays within the accuracy the kernels are held to."""
    cos_min, l1_max = SAGE_REF_BOUNDS[pv, kind]
    q, k, v = inputs.make_qkv(1, 2, 2, 256, 256, 64, kind=kind, dtype=torch.float16)
    out = sage_ref(q, k, v, is_causal=causal, pv=pv)
    ref = attention_ref(q, k, v, is_causal=causal)
    stats = metrics.summary(out, ref)
    assert stats["cos"] >= cos_min and stats["rel_l1"] <= l1_max, metrics.fmt(stats)


@pytest.mark.parametrize("pv", [PVDtype.FP16, PVDtype.FP8], ids=lambda p: p.value)
def test_rounded_rowsum_weights_add_up_to_one(inputs, metrics, pv):
    """rowsum="rounded" divides by the sum of the rounded P that multiplies V: with every value row of
    V equal, each output row is that row (up to V's own quantization and float32 sums), while the
    exact row sum leaves the rounding's bias in; both stay within the accuracy bounds, and their LSEs
    agree to the rounding of P."""
    q, k, _ = inputs.make_qkv(1, 2, 2, 96, 200, 64, kind="randn", dtype=torch.float16)
    v = torch.full((1, 2, 200, 64), 0.75, dtype=torch.float16)
    ref = attention_ref(q, k, v)
    for rowsum, tol in (("rounded", 1e-6), ("exact", None)):
        out, lse = sage_ref(q, k, v, pv=pv, rowsum=rowsum, return_lse=True)
        err = (out.double() - ref).abs().max().item()
        if tol is not None:
            assert err <= tol * 0.75, f"rowsum={rowsum}: max error {err}"
        else:
            assert err > 1e-6, "the exact row sum should not normalize the rounded P exactly"
        _, ref_lse = attention_ref(q, k, v, return_lse=True)
        torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=0.05)
    with pytest.raises(ValueError, match="rowsum"):
        sage_ref(q, k, v, rowsum="fp8")


def test_key_parts_merge_like_separate_halves(inputs):
    """A row whose keys are split in parts (key_parts, the sm_90a kernel's split tiles) gives what
    attention over each part alone gives, merged by the parts' LSEs: checked with FP16 P·V and no
    smoothing, where a part's result is sage_ref of its keys alone (K blocks and V do not depend on the
    other keys). Rows of one part keep the unsplit result bit for bit."""
    q, k, v = inputs.make_qkv(1, 2, 2, 40, 300, 64, kind="randn", dtype=torch.float16)
    opts = {"pv": PVDtype.FP16, "block_m": 1, "block_n": 64, "smooth_k": False, "return_lse": True}
    whole, whole_lse = sage_ref(q, k, v, **opts)
    parts = torch.ones(1, 2, 40, dtype=torch.int64)
    parts[:, 1, 10:] = 2  # head 1, rows 10..39: blocks [0, 2) and [2, 5), keys [0, 128) and [128, 300)
    out, lse = sage_ref(q, k, v, key_parts=parts, **opts)
    assert torch.equal(out[:, 0], whole[:, 0]) and torch.equal(out[:, 1, :10], whole[:, 1, :10])
    assert torch.equal(lse[:, 0], whole_lse[:, 0])
    a, a_lse = sage_ref(q, k[:, :, :128], v[:, :, :128], **opts)
    b, b_lse = sage_ref(q, k[:, :, 128:], v[:, :, 128:], **opts)
    merged_lse = torch.logaddexp(a_lse, b_lse)
    merged = a * (a_lse - merged_lse).exp().unsqueeze(-1) + b * (b_lse - merged_lse).exp().unsqueeze(-1)
    torch.testing.assert_close(out[:, 1, 10:], merged[:, 1, 10:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse[:, 1, 10:], merged_lse[:, 1, 10:], rtol=1e-6, atol=1e-6)
    assert not torch.equal(out[:, 1, 10:], whole[:, 1, 10:])  # P rounds against each part's own max


@pytest.mark.parametrize("kind", ["randn", "outlier"])
def test_key_parts_stay_within_the_fp8_bounds(inputs, metrics, kind):
    """Split in 3 or 5 parts, FP8 P·V keeps the accuracy the kernels are held to."""
    cos_min, l1_max = SAGE_REF_BOUNDS[PVDtype.FP8, kind]
    q, k, v = inputs.make_qkv(1, 2, 2, 64, 640, 64, kind=kind, dtype=torch.float16)
    parts = torch.tensor([3, 5]).reshape(1, 2, 1)
    out = sage_ref(q, k, v, pv=PVDtype.FP8, block_n=128, rowsum="rounded", key_parts=parts)
    stats = metrics.summary(out, attention_ref(q, k, v))
    assert stats["cos"] >= cos_min and stats["rel_l1"] <= l1_max, metrics.fmt(stats)


def test_sage_ref_lse_close_to_exact(inputs):
    q, k, v = inputs.make_qkv(1, 2, 1, 100, 130, 64, kind="outlier", dtype=torch.bfloat16)
    _, lse = sage_ref(q, k, v, is_causal=True, return_lse=True)
    _, ref = attention_ref(q, k, v, is_causal=True, return_lse=True)
    torch.testing.assert_close(lse.double(), ref, rtol=0, atol=0.05)


def test_smoothing_k_does_not_change_the_rows(inputs, metrics):
    """Adding one vector to every key shifts each score row by a constant: softmax is unchanged (exactly,
    in attention_ref), the smoothed quantization sees the same K (sage_ref), and the LSE moves by
    sm_scale * q . bias (sage_ref corrects for the mean it removed)."""
    q, k, v = inputs.make_qkv(1, 2, 2, 64, 96, 32, dtype=torch.float32)
    bias = 5.0 * torch.randn(1, 2, 1, 32, generator=torch.Generator().manual_seed(3))
    k_shifted = k + bias  # float32 on purpose: sage_ref below sees the same input
    exact_shifted = attention_ref(q, k.double() + bias.double(), v)
    torch.testing.assert_close(exact_shifted, attention_ref(q, k, v), rtol=1e-9, atol=1e-9)

    out, lse = sage_ref(q, k, v, return_lse=True)
    out_shifted, lse_shifted = sage_ref(q, k_shifted, v, return_lse=True)
    assert metrics.cosine(out_shifted, out) >= 0.99999
    shift = (q @ bias.transpose(-1, -2)).squeeze(-1) / math.sqrt(32)
    torch.testing.assert_close(lse_shifted - lse, shift, rtol=0, atol=1e-3)


def test_smoothing_k_helps_with_a_channel_offset(inputs, metrics):
    q, k, v = inputs.make_qkv(1, 2, 2, 128, 128, 64, kind="outlier", dtype=torch.float16)
    ref = attention_ref(q, k, v)
    smooth = metrics.cosine(sage_ref(q, k, v, smooth_k=True), ref)
    plain = metrics.cosine(sage_ref(q, k, v, smooth_k=False), ref)
    assert smooth > plain, (smooth, plain)


def test_sage_ref_gqa_and_layout(inputs, metrics):
    q, k, v = inputs.make_qkv(2, 8, 2, 40, 50, 32, layout="NHD", dtype=torch.bfloat16)
    out = sage_ref(q, k, v, tensor_layout="NHD", is_causal=True)
    ref = attention_ref(q, k, v, tensor_layout="NHD", is_causal=True)
    assert out.shape == q.shape
    assert metrics.cosine(out, ref) >= 0.9999


def test_two_level_k_digits_and_error():
    """Two INT8 digits: both within +-127, the integer k1 * 254 + k2 reconstructs K with an error of
    at most half a step of the second digit (plus float32 rounding), and the scale folds the 254."""
    from sageattention.quant import INT8_MAX, K_RESIDUAL_MUL
    from sageattention.reference import quantize_per_block_ref

    x = torch.randn(2, 3, 200, 64, generator=torch.Generator().manual_seed(5)) * 3
    one, s1 = quantize_per_block_ref(x, 64)
    two, s2 = quantize_per_block_ref(x, 64, residual=True)
    k2 = two - one * K_RESIDUAL_MUL  # the first digit is the one-level quantization
    assert k2.abs().max() <= INT8_MAX and one.abs().max() <= INT8_MAX
    torch.testing.assert_close(s2 * K_RESIDUAL_MUL, s1, rtol=1e-6, atol=0)
    steps = s1.repeat_interleave(64, dim=-1)[..., :200, None]
    err_one = ((one * steps - x).abs() / steps).max()
    err_two = ((two * s2.repeat_interleave(64, dim=-1)[..., :200, None] - x).abs() / steps).max()
    assert err_one <= 0.5 + 1e-4
    assert err_two <= 0.5 / K_RESIDUAL_MUL + 1e-4, err_two


def test_two_level_k_meets_the_fp16_promise_on_outliers(inputs, metrics):
    """Why the FP16 P·V kernels read K as two digits: with one, the outlier set misses the FP16
    promise (cosine >= 0.9999, relative L1 <= 0.015); with two, it meets it."""
    q, k, v = inputs.make_qkv(1, 2, 2, 1024, 1024, 128, kind="outlier", dtype=torch.bfloat16, seed=4)
    ref = attention_ref(q, k, v)
    one = metrics.summary(sage_ref(q, k, v, block_m=1, block_n=64), ref)
    two = metrics.summary(sage_ref(q, k, v, block_m=1, block_n=64, k_residual=True), ref)
    assert two["rel_l1"] < 0.8 * one["rel_l1"], (one, two)
    assert two["cos"] >= 0.9999 and two["rel_l1"] <= 0.015, metrics.fmt(two)


def test_exp2_h2_ref_stays_within_its_bounds():
    """The sm_90a kernel's float16 exp2 (exp2_h2) as simulated: within 0.8% of 2^x where e4m3 keeps a
    value (x >= -10), at most 2^-10 below it (rounded to e4m3's 0, as 2^x is), and 448 P = 448 at a
    row's maximum (x = log2 448), where float16 rounds x up and e4m3 saturates."""
    from sageattention.reference import exp2_h2_ref  # noqa: PLC0415

    x = torch.linspace(-40.0, math.log2(448.0), 100_001)
    got, exact = exp2_h2_ref(x), torch.exp2(x)
    kept = x >= -10
    assert ((got[kept] / exact[kept]) - 1).abs().max() <= 0.008
    assert got[~kept].max() <= 2.0**-10
    assert not got[~kept].to(torch.float8_e4m3fn).float().any()
    at_max = exp2_h2_ref(torch.tensor([math.log2(448.0)])).to(torch.float8_e4m3fn).float()
    assert at_max.item() == 448.0


def test_half_exp2_tiles_move_only_whole_unmasked_blocks(inputs, metrics):
    """sage_ref's half_exp2_tiles (the sm_90a kernel's float16 exp2 for keys 56-63 and 88-95 of each
    128-key block): it changes the output of a non-causal call, keeps it within the FP8 bounds, and
    changes nothing where the kernel takes every block with a mask (causal) or where no block is
    whole (Nk < 128)."""
    from sageattention import cuda_sm90  # noqa: PLC0415

    tiles = cuda_sm90.half_exp2_tiles(128)
    cos_min, l1_max = SAGE_REF_BOUNDS[PVDtype.FP8, "randn"]
    q, k, v = inputs.make_qkv(1, 2, 2, 64, 300, 128, dtype=torch.float16)
    opts = {"pv": PVDtype.FP8, "block_m": 1, "block_n": 128, "rowsum": "rounded"}
    plain, half = sage_ref(q, k, v, **opts), sage_ref(q, k, v, half_exp2_tiles=tiles, **opts)
    assert not torch.equal(plain, half)
    stats = metrics.summary(half, attention_ref(q, k, v))
    assert stats["cos"] >= cos_min and stats["rel_l1"] <= l1_max, metrics.fmt(stats)
    assert metrics.cosine(half, plain) >= 0.9999
    causal = {"is_causal": True, **opts}
    assert torch.equal(sage_ref(q, k, v, **causal), sage_ref(q, k, v, half_exp2_tiles=tiles, **causal))
    short = [t[:, :, :100] for t in (k, v)]
    assert torch.equal(sage_ref(q, *short, **opts), sage_ref(q, *short, half_exp2_tiles=tiles, **opts))
    assert cuda_sm90.half_exp2_tiles(64) == 0


def test_half_exp2_constants_are_the_kernels():
    """exp2_h2_ref's bias and polynomial, and cuda_sm90's column tiles, are those of
    csrc/sm90/attn_int8_fp8.cu (exp2_h2, kH2ExpTiles)."""
    from pathlib import Path  # noqa: PLC0415

    from sageattention import cuda_sm90  # noqa: PLC0415
    from sageattention.reference import H2_EXP2_BIAS, H2_EXP2_POLY_BITS  # noqa: PLC0415

    source = (Path(__file__).resolve().parents[2] / "csrc" / "sm90" / "attn_int8_fp8.cu").read_text()
    assert f"constexpr float kH2ExpBias = {H2_EXP2_BIAS}f;" in source
    c0, c1, c2 = (f"0x{b:04X}{b:04X}u" for b in H2_EXP2_POLY_BITS)
    assert f'"r"(f), "r"({c2}), "r"({c1})' in source and f'"r"(q), "r"(f), "r"({c0})' in source
    assert f"D == 128 && !kCausal ? 0x{cuda_sm90.HALF_EXP2_TILES_D128:04x}u : 0u" in source
