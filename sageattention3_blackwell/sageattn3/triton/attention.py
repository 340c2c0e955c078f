"""NVFP4 attention for GPUs without FP4 tensor cores (sm80, sm89, sm90), in Triton.

Each FP4 tile is decoded in registers to ``value * group_scale``, which is exact in float16
(at most 6 significant bits, magnitudes in [2^-10, 2688]), and multiplied with fp16 MMAs
accumulating in float32; the float32 block scales are applied to the float32 results. So the
kernel computes the arithmetic of `sageattn3.reference.sage3_ref` up to the order of float32
additions inside an MMA and the hardware exp2 (an approximation to ~2 ulp).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reference import LOG2E, Q_BLOCK
from .nvfp4 import FP4_E4M3_RANGE, div_rn, e4m3_decode, group_values, quantize_groups, unpack_codes

#: Query rows per block of Q's mean and block scale, as a constant the kernels can read.
Q_ROWS = tl.constexpr(Q_BLOCK)

MASK_NONE = 0
MASK_BOOL = 1
MASK_ADD = 2


@triton.jit
def _decode_tile(CODES, SCALES, row_off, R: tl.constexpr, C: tl.constexpr):
    """Rows ``row_off`` ([R] int64 row indices) of an NVFP4 matrix with C columns -> fp16 [R, C]."""
    packed = tl.load(CODES + row_off[:, None] * (C // 2) + tl.arange(0, C // 2)[None, :])
    sf = e4m3_decode(tl.load(SCALES + row_off[:, None] * (C // 16) + tl.arange(0, C // 16)[None, :]))
    return group_values(unpack_codes(packed, R, C), sf, R, C).to(tl.float16)


@triton.jit
def _attn_kernel(
    QC, QS, QG, KC, KS, KG, VC, VS, VG, CORR, MASK, OUT, LSE,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_ob, stride_oh, stride_on,
    NQ, NK, NQ_PAD, NK_PAD, HQ, KV_GROUP, qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    MASK_KIND: tl.constexpr,
    HAS_CORR: tl.constexpr,
    RETURN_LSE: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HQ
    h = bh % HQ
    bh_kv = (b * (HQ // KV_GROUP) + h // KV_GROUP).to(tl.int64)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q_blocks = NQ_PAD // Q_ROWS

    # Q tile (exact fp16 group values) and its per-row block scale.
    q16 = _decode_tile(QC, QS, bh.to(tl.int64) * NQ_PAD + rows, BLOCK_M, HEAD_DIM)
    gq = tl.load(QG + bh.to(tl.int64) * q_blocks + rows // Q_ROWS)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)

    n_end = NK
    if IS_CAUSAL:
        n_end = tl.minimum(NK, (start_m + 1) * BLOCK_M)
    for start_n in range(0, n_end, BLOCK_N):
        blk = start_n // BLOCK_N
        cols = start_n + tl.arange(0, BLOCK_N)
        k16 = _decode_tile(KC, KS, bh_kv * NK_PAD + cols, BLOCK_N, HEAD_DIM)
        dot = tl.dot(q16, tl.trans(k16))
        gk = tl.load(KG + bh_kv * (NK_PAD // BLOCK_N) + blk)
        s = dot * (gq * gk)[:, None]
        if HAS_CORR:
            q_blk = (start_m * BLOCK_M) // Q_ROWS
            corr = tl.load(CORR + (bh.to(tl.int64) * q_blocks + q_blk) * NK + cols, mask=cols < NK, other=0.0)
            s = s + corr[None, :]
        s = s * qk_scale
        visible = (cols < NK)[None, :] & (rows < NQ)[:, None]
        if MASK_KIND != 0:
            mptr = MASK + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
            mptr = mptr + rows[:, None].to(tl.int64) * stride_mm + cols[None, :].to(tl.int64) * stride_mn
            mval = tl.load(mptr, mask=visible, other=0)
            if MASK_KIND == 1:
                visible = visible & (mval != 0)
            else:
                s = s + mval.to(tl.float32) * 1.4426950408889634
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)

        # Two-level P: a float32 scale per row, then NVFP4 per 16 keys.
        gp = div_rn(tl.max(p, axis=1), FP4_E4M3_RANGE)
        p_codes, p_sf = quantize_groups(p, gp[:, None], BLOCK_M, BLOCK_N)
        p16 = group_values(p_codes, p_sf, BLOCK_M, BLOCK_N).to(tl.float16)
        v_off = bh_kv * HEAD_DIM + tl.arange(0, HEAD_DIM)
        vt_codes = tl.load(
            VC + v_off[:, None] * (NK_PAD // 2) + blk * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)[None, :]
        )
        vt_sf = tl.load(
            VS
            + v_off[:, None] * (NK_PAD // 16)
            + blk * (BLOCK_N // 16)
            + tl.arange(0, BLOCK_N // 16)[None, :]
        )
        vt16 = group_values(unpack_codes(vt_codes, HEAD_DIM, BLOCK_N), e4m3_decode(vt_sf), HEAD_DIM, BLOCK_N)
        pv = tl.dot(p16, tl.trans(vt16.to(tl.float16)))
        gv = tl.load(VG + bh_kv * (NK_PAD // BLOCK_N) + blk)
        acc = acc * alpha[:, None] + pv * (gp * gv)[:, None]
        m_i = m_new

    out = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)
    optr = OUT + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    optr = optr + rows[:, None].to(tl.int64) * stride_on + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(optr, out.to(OUT.dtype.element_ty), mask=(rows < NQ)[:, None])
    if RETURN_LSE:
        lse = tl.where(l_i > 0, (m_i + tl.math.log2(l_i)) / 1.4426950408889634, float("-inf"))
        tl.store(LSE + bh.to(tl.int64) * NQ + rows, lse, mask=rows < NQ)


def attention_fp4(
    qq, kq, vq, *, nq: int, nk: int, corr, attn_mask, is_causal: bool, sm_scale: float, out: torch.Tensor,
    return_lse: bool, block_n: int,
):  # fmt: skip
    """Launch the attention kernel on quantized HND operands (tuples from `quant`).
    ``out`` is an HND view [B, Hq, Nq, D] to write into. Returns the LSE (float32, log2-free,
    without the K-mean term) or None."""
    q_codes, q_scales, q_gs, _ = qq
    k_codes, k_scales, k_gs, _ = kq
    v_codes, v_scales, v_gs = vq
    b, hq, nq_pad, half_d = q_codes.shape
    d = half_d * 2
    hkv = k_codes.shape[1]
    lse = torch.empty((b, hq, nq), device=out.device, dtype=torch.float32) if return_lse else q_gs
    mask_kind, mask, mstrides = MASK_NONE, q_gs, (0, 0, 0, 0)
    if attn_mask is not None:
        mask4 = attn_mask.expand(b, hq, nq, nk)  # broadcast dimensions get stride 0
        if attn_mask.dtype == torch.bool:
            mask_kind, mask = MASK_BOOL, mask4.view(torch.uint8)
        else:
            mask_kind, mask = MASK_ADD, mask4
        mstrides = mask.stride()
    # sm90: 128 query rows, 8 warps (wgmma); older GPUs: 64 rows, 4 warps (register budget of mma.sync).
    hopper = out.device.type != "cuda" or torch.cuda.get_device_capability(out.device)[0] >= 9
    block_m, warps = (128, 8) if hopper else (64, 4)
    grid = (triton.cdiv(nq, block_m), b * hq)
    _attn_kernel[grid](
        q_codes, q_scales, q_gs, k_codes, k_scales, k_gs, v_codes, v_scales, v_gs,
        corr if corr is not None else q_gs, mask, out, lse,
        *mstrides, out.stride(0), out.stride(1), out.stride(2),
        nq, nk, nq_pad, k_codes.shape[2], hq, hq // hkv, sm_scale * LOG2E,
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, IS_CAUSAL=is_causal, MASK_KIND=mask_kind,
        HAS_CORR=corr is not None, RETURN_LSE=return_lse, num_warps=warps, num_stages=2,
    )  # fmt: skip
    return lse if return_lse else None
