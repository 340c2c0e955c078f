"""Triton attention: INT8 QK^T, FP16 or FP8 P·V, FP32 accumulation, online softmax in log2.

One kernel serves every variant through constexpr switches (PV precision, causal, mask kind,
varlen, LSE). Scores arrive in the log2 domain because Q's scale carries sm_scale * log2(e), so
softmax uses exp2 directly.

FP8 P·V: P is scaled by 448 into e4m3's range before rounding (divided out at the end together
with the per-channel V scale). Hopper's FP8 MMA adds into an accumulator of about 22 mantissa
bits; `max_num_imprecise_acc=BLOCK_N` makes Triton promote to the full FP32 accumulator after
every key block (<= 128 keys).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..quant import FP8_E4M3_MAX as _FP8_MAX
from ..quant import K_RESIDUAL_MUL as _K_RESIDUAL_MUL
from ..quant import LOG2E as _LOG2E

# Triton kernels read module globals only as constexpr.
FP8_E4M3_MAX = tl.constexpr(_FP8_MAX)
LOG2E = tl.constexpr(_LOG2E)
LN2 = tl.constexpr(0.6931471805599453)
K_RESIDUAL_MUL_INT = tl.constexpr(int(_K_RESIDUAL_MUL))

MASK_NONE = tl.constexpr(0)
MASK_BOOL = tl.constexpr(1)
MASK_ADD = tl.constexpr(2)


@triton.jit
def _attn_blocks(
    acc,
    l_i,
    m_i,
    q,
    q_scale,
    k_base,
    kr_base,
    v_base,
    ks_base,
    mask_base,
    rows,
    row_ok,
    cols_d,
    lo,
    hi,
    len_k,
    stride_kn,
    stride_vn,
    stride_vd,
    stride_mm,
    stride_mn,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PV_FP8: tl.constexpr,
    EDGE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    MASK_KIND: tl.constexpr,
    K_RESIDUAL: tl.constexpr,
):
    """Online softmax over key blocks [lo, hi). EDGE: the blocks may reach past len_k or the diagonal.
    K_RESIDUAL: K is two INT8 digits (k1 at k_base, k2 at kr_base); the exact integer score is
    254 * (q . k1) + q . k2, which fits int32 (quant.K_RESIDUAL_MUL)."""
    tile_n = tl.arange(0, BLOCK_N)
    tile_m = tl.arange(0, rows.shape[0])  # rows of this program, from 0 (mask_base points at its first)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tile_n
        col_ok = cols < len_k
        # 64-bit block bases (a scalar product per block), 32-bit offsets inside the tile: tensors of
        # more than 2^31 elements stay addressable at no cost in the tile's address arithmetic.
        n64 = start_n.to(tl.int64)
        k_ptr = k_base + n64 * stride_kn + tile_n[:, None] * stride_kn + cols_d[None, :]
        if EDGE:
            k = tl.load(k_ptr, mask=col_ok[:, None], other=0)
        else:
            k = tl.load(k_ptr)
        k_scale = tl.load(ks_base + start_n // BLOCK_N)
        s_int = tl.dot(q, tl.trans(k), out_dtype=tl.int32)
        if K_RESIDUAL:
            kr_ptr = kr_base + n64 * stride_kn + tile_n[:, None] * stride_kn + cols_d[None, :]
            if EDGE:
                kr = tl.load(kr_ptr, mask=col_ok[:, None], other=0)
            else:
                kr = tl.load(kr_ptr)
            s_int = tl.dot(q, tl.trans(kr), s_int * K_RESIDUAL_MUL_INT, out_dtype=tl.int32)
        s = s_int.to(tl.float32) * (q_scale * k_scale)[:, None]
        if MASK_KIND == MASK_ADD:
            add = tl.load(
                mask_base + n64 * stride_mn + tile_m[:, None] * stride_mm + tile_n[None, :] * stride_mn,
                mask=row_ok[:, None] & col_ok[None, :],
                other=0.0,
            )
            s += add.to(tl.float32) * LOG2E
        if MASK_KIND == MASK_BOOL:
            keep = tl.load(
                mask_base + n64 * stride_mn + tile_m[:, None] * stride_mm + tile_n[None, :] * stride_mn,
                mask=row_ok[:, None] & col_ok[None, :],
                other=0,
            )
            s = tl.where(keep != 0, s, float("-inf"))
        if EDGE:
            visible = col_ok[None, :]
            if IS_CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        if PV_FP8:
            vt_ptr = v_base + n64 * stride_vn + cols_d[:, None] * stride_vd + tile_n[None, :] * stride_vn
            if EDGE:
                vt = tl.load(vt_ptr, mask=col_ok[None, :], other=0.0)
            else:
                vt = tl.load(vt_ptr)
            p8 = (p * FP8_E4M3_MAX).to(tl.float8e4nv)
            acc = tl.dot(p8, tl.trans(vt), acc, max_num_imprecise_acc=BLOCK_N)
        else:
            v_ptr = v_base + n64 * stride_vn + tile_n[:, None] * stride_vn + cols_d[None, :]
            d_ok = (cols_d < HEAD_DIM)[None, :]
            if EDGE:
                v = tl.load(v_ptr, mask=col_ok[:, None] & d_ok, other=0.0)
            elif HEAD_DIM == cols_d.shape[0]:
                v = tl.load(v_ptr)
            else:
                v = tl.load(v_ptr, mask=d_ok, other=0.0)
            acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_kernel(
    Q,
    K,
    KR,
    V,
    QS,
    KS,
    VS,
    OUT,
    LSE,
    CORR,
    MASK,
    cu_q,
    cu_k,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_qsb,
    stride_qsh,
    stride_ksb,
    stride_ksh,
    stride_vsb,
    stride_vsh,
    stride_ob,
    stride_oh,
    stride_on,
    stride_lb,
    stride_lh,
    stride_mb,
    stride_mh,
    stride_mm,
    stride_mn,
    nq,
    nk,
    kv_group,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_PAD: tl.constexpr,
    PV_FP8: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    MASK_KIND: tl.constexpr,
    VARLEN: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    LSE_CORR: tl.constexpr,
    K_RESIDUAL: tl.constexpr,
):
    pid_m, h, b = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m  # longest rows first: better tail balance
    hk = h // kv_group
    if VARLEN:
        q0 = tl.load(cu_q + b).to(tl.int64)
        len_q = tl.load(cu_q + b + 1) - q0.to(tl.int32)
        k0 = tl.load(cu_k + b).to(tl.int64)
        len_k = tl.load(cu_k + b + 1) - k0.to(tl.int32)
    else:
        q0 = 0
        len_q = nq
        k0 = 0
        len_k = nk
    start_m = pid_m * BLOCK_M
    if start_m >= len_q:
        return

    tile_m = tl.arange(0, BLOCK_M)
    rows = start_m + tile_m
    cols_d = tl.arange(0, D_PAD)
    row_ok = rows < len_q
    row0 = q0 + start_m.to(tl.int64)  # 64-bit: this program's first row in the (packed) sequence dimension
    q = tl.load(
        Q + b * stride_qb + h * stride_qh + row0 * stride_qn + tile_m[:, None] * stride_qn + cols_d[None, :],
        mask=row_ok[:, None],
        other=0,
    )
    q_scale = tl.load(QS + b * stride_qsb + h * stride_qsh + row0 + tile_m, mask=row_ok, other=0.0)

    k_base = K + b * stride_kb + hk * stride_kh + k0 * stride_kn
    kr_base = k_base
    if K_RESIDUAL:  # the second digit is laid out like the first
        kr_base = KR + b * stride_kb + hk * stride_kh + k0 * stride_kn
    v_base = V + b * stride_vb + hk * stride_vh + k0 * stride_vn
    ks_base = KS + b * stride_ksb + hk * stride_ksh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)

    # Key blocks below the diagonal and inside the sequence need no per-element masking; only the
    # last partial block (and the diagonal blocks when causal) pay for the selects.
    full_hi = len_k // BLOCK_N * BLOCK_N
    hi = len_k
    if IS_CAUSAL:
        full_hi = tl.minimum(full_hi, start_m // BLOCK_N * BLOCK_N)
        hi = tl.minimum(len_k, start_m + BLOCK_M)
    mask_base = MASK
    if MASK_KIND != MASK_NONE:
        mask_base = MASK + b * stride_mb + h * stride_mh + start_m.to(tl.int64) * stride_mm
    # fmt: off
    acc, l_i, m_i = _attn_blocks(
        acc, l_i, m_i, q, q_scale, k_base, kr_base, v_base, ks_base, mask_base, rows, row_ok, cols_d,
        0, full_hi, len_k,
        stride_kn, stride_vn, stride_vd, stride_mm, stride_mn,
        HEAD_DIM, BLOCK_N, PV_FP8, False, False, MASK_KIND, K_RESIDUAL,
    )
    acc, l_i, m_i = _attn_blocks(
        acc, l_i, m_i, q, q_scale, k_base, kr_base, v_base, ks_base, mask_base, rows, row_ok, cols_d,
        full_hi, hi, len_k,
        stride_kn, stride_vn, stride_vd, stride_mm, stride_mn,
        HEAD_DIM, BLOCK_N, PV_FP8, True, IS_CAUSAL, MASK_KIND, K_RESIDUAL,
    )
    # fmt: on

    denom = l_i
    if PV_FP8:
        denom = l_i * FP8_E4M3_MAX
    denom = tl.where(denom > 0, denom, 1.0)
    out = acc / denom[:, None]
    if PV_FP8:
        v_scale = tl.load(VS + b * stride_vsb + hk * stride_vsh + cols_d, mask=cols_d < HEAD_DIM, other=0.0)
        out = out * v_scale[None, :]
    o_base = OUT + b * stride_ob + h * stride_oh + row0 * stride_on
    tl.store(
        o_base + tile_m[:, None] * stride_on + cols_d[None, :],
        out.to(OUT.dtype.element_ty),
        mask=row_ok[:, None] & (cols_d < HEAD_DIM)[None, :],
    )
    if RETURN_LSE:
        lse = (m_i + tl.math.log2(l_i)) * LN2
        l_off = b * stride_lb + h * stride_lh + start_m + tile_m
        if LSE_CORR:
            lse += tl.load(CORR + l_off, mask=row_ok, other=0.0)
        tl.store(LSE + l_off, lse, mask=row_ok)
