"""Triton backward of attention, FlashAttention-2 style, in the inputs' precision with FP32 accumulation.

The forward is SageAttention's quantized one; its output O and its LSE are what the backward is
given. P is recomputed from Q and K in BF16/FP16 (the inputs' dtype) with FP32 scores and the saved
LSE, and the gradients follow the usual recurrences:

    D_i  = rowsum(dO_i * O_i) - dlse_i
    P_ij = exp(scale * q_i . k_j + mask_ij - lse_i)
    dV   = P^T dO                 dP = dO V^T
    dS   = P * (dP - D)           (the LSE's own gradient is the "- dlse" folded into D)
    dQ   = scale * dS K           dK = scale * dS^T Q

Three kernels: ``_delta_kernel`` (D and the LSE in the log2 domain, one pass over O and dO),
``_dkdv_kernel`` (one program per block of keys of a KV head: it walks every query head of the group
and every query block, so dK and dV of grouped-query attention are summed in registers, no atomics)
and ``_dq_kernel`` (one program per block of queries, walking the keys). Both recompute P; that costs
one more Q·K product than an atomic-add dQ would, and keeps the result deterministic and free of an
FP32 dQ buffer. Without a saved LSE (the packed-sequence forward returns none) ``_lse_kernel``
computes it first, in the same precision as the rest. The dK/dV kernel computes S, P and dS transposed
(the keys as rows), so that P^T dO and dS^T Q take its register tiles as they are.

``quant`` (the quantized backward): ``_quant_kernel`` first makes INT8 Q and K per token (K smoothed,
the LSE shifted to match), each row-major and transposed so that every INT8 product's operands are
K-major; the same kernels then compute S, dQ = dS K and dK = dS^T Q in INT8 (dS quantized per row in
the tile, the other operand's per-token scales folded in), dP and dV in 16 bits.

``centered`` is not part of this backward: it makes K minus its mean and the LSE to match for torch's
flash and cuDNN backward kernels (``autograd._centered``), one pass over K and one over Q.

Inputs are [B, H, N, D] views with a unit last stride (any other strides), or packed [1, H, T, D]
views with ``cu_seqlens`` (varlen: every per-token tensor gets a batch stride of 0 and the sequence's
first token is added to the row). Causal masking is aligned at the top-left corner (query i sees keys
j <= i of its own sequence); a bool mask (True = attend) or an additive one is read through
broadcast strides. Rows with no visible key have an LSE of -inf: their P is 0 and so are their
gradients.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ..quant import INT8_MAX as _INT8_MAX
from ..quant import LOG2E as _LOG2E

LOG2E = tl.constexpr(_LOG2E)
INT8_MAX = tl.constexpr(_INT8_MAX)
MASK_NONE = tl.constexpr(0)
MASK_BOOL = tl.constexpr(1)
MASK_ADD = tl.constexpr(2)

#: Rows per program of the D / LSE pass, and of the INT8 pass of the quantized backward.
DELTA_BLOCK = 64
QUANT_BLOCK = 64


def _d_pad(head_dim: int, quant: bool = False) -> int:
    # tl.dot needs every side >= 16 (32 for INT8) and power-of-two tiles; columns past head_dim are masked.
    return max(32 if quant else 16, triton.next_power_of_2(head_dim))


def block_config(head_dim: int, quant: bool = False) -> dict:
    """Tile sizes of the two gradient kernels by head dim (first settings, to be tuned by
    bench/backward.py --sweep on the target GPU). dK/dV keep a [BLOCK_N, D] FP32 pair of accumulators
    per program and dQ one [BLOCK_M, D]: at D = 128, 64 x 128 of each is what fits 8 warps' registers
    without spilling; at D <= 64 the key tile doubles."""
    if _d_pad(head_dim) <= 64:
        return {"dkdv": (64, 128, 4, 3), "dq": (128, 64, 4, 3)}  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    return {"dkdv": (64, 64, 4, 2), "dq": (64, 64, 4, 2)}


#: Overrides of block_config, by padded head dim and quantization ({(d_pad, quant): {"dkdv": (...),
#: "dq": (...)}}), for sweeps.
CONFIG_OVERRIDES: dict = {}


@triton.jit
def _seq_bounds(cu_q, cu_k, b, NQ, NK, VARLEN: tl.constexpr):
    """(first query row, query count, first key row, key count) of sequence b."""
    if VARLEN:
        q0 = tl.load(cu_q + b)
        k0 = tl.load(cu_k + b)
        return q0, tl.load(cu_q + b + 1) - q0, k0, tl.load(cu_k + b + 1) - k0
    return 0, NQ, 0, NK


@triton.jit
def _qk(q, k, q_scale, k_scale, qk_scale, QUANT: tl.constexpr):
    """Scaled scores q . k in the log2 domain: of the inputs, or of their INT8 forms with per-token scales."""
    if QUANT:
        return tl.dot(q, tl.trans(k)).to(tl.float32) * (q_scale * qk_scale)[:, None] * k_scale[None, :]
    return tl.dot(q, tl.trans(k)) * qk_scale


@triton.jit
def _scores(s, mask_ptr, query, key, visible, IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr):
    """The scores s (log2 domain) masked: -inf where a key is not visible. ``query``, ``key``: the
    positions of s's rows and columns, broadcast to its shape ([M, 1] and [1, N], or [1, M] and [N, 1]
    for the transposed scores of the dK/dV kernel); ``visible``: where both are in bounds."""
    if IS_CAUSAL:
        visible = visible & (key <= query)
    if MASK_KIND == MASK_BOOL:
        visible = visible & (tl.load(mask_ptr, mask=visible, other=0) != 0)
    if MASK_KIND == MASK_ADD:
        s = s + tl.load(mask_ptr, mask=visible, other=0.0).to(tl.float32) * LOG2E
    return tl.where(visible, s, float("-inf"))


@triton.jit
def _delta_kernel(
    OUT, DO, LSE, DLSE, DELTA, LSE2, cu_q,
    s_ob, s_oh, s_on, s_dob, s_doh, s_don, s_lb, s_lh, s_dlb, s_dlh,
    NQ, H,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, D_PAD: tl.constexpr, VARLEN: tl.constexpr,
    HAS_LSE: tl.constexpr, HAS_DLSE: tl.constexpr,
):  # fmt: skip
    """DELTA = rowsum(dO * O) - dlse and LSE2 = lse * log2(e) (+inf for an empty row, so that its P
    comes out 0), both float32 [B, H, N] contiguous ([1, H, T] packed)."""
    pid, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q0, len_q, _, _ = _seq_bounds(cu_q, cu_q, b, NQ, NQ, VARLEN)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < len_q
    cols_d = tl.arange(0, D_PAD)
    ok = row_ok[:, None] & (cols_d < HEAD_DIM)[None, :]
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    r = q0 + rows
    o = tl.load(OUT + b64 * s_ob + h64 * s_oh + r[:, None] * s_on + cols_d[None, :], mask=ok, other=0.0)
    do = tl.load(DO + b64 * s_dob + h64 * s_doh + r[:, None] * s_don + cols_d[None, :], mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + b64 * s_dlb + h64 * s_dlh + r, mask=row_ok, other=0.0)
    if VARLEN:
        out_base = h64 * NQ + r
    else:
        out_base = (b64 * H + h64) * NQ + r
    tl.store(DELTA + out_base, delta, mask=row_ok)
    if HAS_LSE:
        lse = tl.load(LSE + b64 * s_lb + h64 * s_lh + r, mask=row_ok, other=0.0)
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
        tl.store(LSE2 + out_base, lse2, mask=row_ok)


@triton.jit
def _round_int8(x):
    """x (within +-127) to the nearest integer, halves away from zero, as INT8."""
    return tl.where(x >= 0, x + 0.5, x - 0.5).to(tl.int8)


@triton.jit
def _quant_kernel(
    X, KMEAN, LSE2, XQ, XT, SCALE, s_xb, s_xh, s_xn, N, H, GROUP, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, D_PAD: tl.constexpr, CENTER: tl.constexpr,
    SHIFT: tl.constexpr,
):  # fmt: skip
    """INT8 per token of X [B, H, N, D] ([1, H, T, D] packed) for the quantized backward: XQ [B, H, N, D_PAD]
    and its transpose XT [B, H, D_PAD, N] (columns past HEAD_DIM zero), SCALE [B, H, N] = amax / 127.
    CENTER (K): X minus KMEAN [B, H // GROUP, D] first, K's smoothing. SHIFT (Q): LSE2 [B, H, N] (log2
    domain, in place) minus qk_scale * x . kmean of x's KV head, the LSE of the scores against smoothed K."""
    pid, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < N
    cols_d = tl.arange(0, D_PAD)
    d_ok = cols_d < HEAD_DIM
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    x = tl.load(X + b64 * s_xb + h64 * s_xh + rows[:, None] * s_xn + cols_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)  # fmt: skip
    kmean = tl.load(KMEAN + (b64 * (H // GROUP) + h64 // GROUP) * HEAD_DIM + cols_d, mask=d_ok, other=0.0)
    if CENTER:
        x -= kmean[None, :]
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, INT8_MAX / amax, 0.0)
    xq = _round_int8(x * inv[:, None])
    bh = b64 * H + h64
    tl.store(XQ + (bh * N + rows)[:, None] * D_PAD + cols_d[None, :], xq, mask=row_ok[:, None])
    tl.store(XT + bh * D_PAD * N + cols_d[None, :] * N + rows[:, None], xq, mask=row_ok[:, None])
    tl.store(SCALE + bh * N + rows, amax / INT8_MAX, mask=row_ok)
    if SHIFT:
        lse2 = tl.load(LSE2 + bh * N + rows, mask=row_ok, other=0.0)
        tl.store(LSE2 + bh * N + rows, lse2 - qk_scale * tl.sum(x * kmean[None, :], axis=1), mask=row_ok)


@triton.jit
def _quant_rows(ds, scale):
    """dS (dQ's [M, N]) or dS^T (dK's [N, M]) times the per-token scales of the operand it multiplies,
    along its columns (folded in: the product sums over those tokens), in INT8 with one scale per row:
    (int8, the rows' scales)."""
    x = ds * scale[None, :]
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, INT8_MAX / amax, 0.0)
    return _round_int8(x * inv[:, None]), amax / INT8_MAX


@triton.jit
def _lse_kernel(
    Q, K, MASK, LSE2, QS, KS, cu_q, cu_k,
    s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_mb, s_mh, s_mm, s_mn, s_ksb, s_ksh,
    NQ, NK, H, GROUP, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, VARLEN: tl.constexpr, QUANT: tl.constexpr,
):  # fmt: skip
    """LSE2 (log2 domain, +inf for an empty row) where the forward saved no LSE (of the INT8 scores,
    against smoothed K, when QUANT)."""
    pid, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q0, len_q, k0, len_k = _seq_bounds(cu_q, cu_k, b, NQ, NK, VARLEN)
    start_m = pid * BLOCK_M
    if start_m >= len_q:
        return
    rows = start_m + tl.arange(0, BLOCK_M)
    row_ok = rows < len_q
    cols_d = tl.arange(0, D_PAD)
    d_ok = cols_d < HEAD_DIM
    b64, h64, hk64 = b.to(tl.int64), h.to(tl.int64), (h // GROUP).to(tl.int64)
    q = tl.load(Q + b64 * s_qb + h64 * s_qh + (q0 + rows)[:, None] * s_qn + cols_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
    if VARLEN:
        out_base = h64 * NQ + q0 + rows
    else:
        out_base = (b64 * H + h64) * NQ + rows
    q_scale = tl.load(QS + out_base, mask=row_ok, other=0.0) if QUANT else 1.0
    k_base = K + b64 * s_kb + hk64 * s_kh
    ks_base = KS + b64 * s_ksb + hk64 * s_ksh + k0
    m_base = MASK + b64 * s_mb + h64 * s_mh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    hi = len_k
    if IS_CAUSAL:
        hi = tl.minimum(len_k, start_m + BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < len_k
        k = tl.load(
            k_base + (k0 + cols)[:, None] * s_kn + cols_d[None, :],
            mask=col_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        k_scale = tl.load(ks_base + cols, mask=col_ok, other=0.0) if QUANT else 1.0
        mask_ptr = m_base + rows[:, None] * s_mm + cols[None, :] * s_mn
        s = _scores(_qk(q, k, q_scale, k_scale, qk_scale, QUANT), mask_ptr, rows[:, None], cols[None, :],
                    row_ok[:, None] & col_ok[None, :], IS_CAUSAL, MASK_KIND)  # fmt: skip
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), axis=1)
        m_i = m_new
    lse2 = tl.where(l_i > 0, m_i + tl.log2(l_i), float("inf"))
    tl.store(LSE2 + out_base, lse2, mask=row_ok)


@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, LSE2, DELTA, MASK, DK, DV, QT, QS, KS, cu_q, cu_k,
    s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_dob, s_doh, s_don,
    s_dkb, s_dkh, s_dkn, s_dvb, s_dvh, s_dvn, s_mb, s_mh, s_mm, s_mn, s_qtb, s_qth, s_qtd, s_ksb, s_ksh,
    NQ, NK, H, GROUP, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, VARLEN: tl.constexpr, QUANT: tl.constexpr,
):  # fmt: skip
    """dK and dV of one block of BLOCK_N keys of KV head hk, summed over the GROUP query heads that
    read it (grouped-query attention) and every query block that sees it.

    QUANT: Q and K are their INT8 forms (K smoothed) with per-token scales QS and KS, and QT is Q's
    INT8 transpose; S is recomputed in INT8 and dK = dS^T Q in INT8 too (dS with Q's scales folded in,
    one scale per key), dV = P^T dO and dP = dO V^T stay in 16 bits."""
    pid, hk, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q0, len_q, k0, len_k = _seq_bounds(cu_q, cu_k, b, NQ, NK, VARLEN)
    start_n = pid * BLOCK_N
    if start_n >= len_k:
        return
    cols = start_n + tl.arange(0, BLOCK_N)
    col_ok = cols < len_k
    cols_d = tl.arange(0, D_PAD)
    d_ok = cols_d < HEAD_DIM
    kv_ok = col_ok[:, None] & d_ok[None, :]
    b64, hk64 = b.to(tl.int64), hk.to(tl.int64)
    k = tl.load(
        K + b64 * s_kb + hk64 * s_kh + (k0 + cols)[:, None] * s_kn + cols_d[None, :], mask=kv_ok, other=0.0
    )
    v = tl.load(
        V + b64 * s_vb + hk64 * s_vh + (k0 + cols)[:, None] * s_vn + cols_d[None, :], mask=kv_ok, other=0.0
    )
    k_scale = tl.load(KS + b64 * s_ksb + hk64 * s_ksh + k0 + cols, mask=col_ok, other=0.0) if QUANT else 1.0
    dk = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    dv = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    # Top-left causal: the first query that sees key start_n is query start_n.
    lo = 0
    if IS_CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
    tile_m = tl.arange(0, BLOCK_M)
    for g in range(0, GROUP):
        h64 = hk64 * GROUP + g
        q_base = Q + b64 * s_qb + h64 * s_qh
        qt_base = QT + b64 * s_qtb + h64 * s_qth
        do_base = DO + b64 * s_dob + h64 * s_doh
        if VARLEN:
            stat_base = h64 * NQ + q0
        else:
            stat_base = (b64 * H + h64) * NQ
        m_base = MASK + b64 * s_mb + h64 * s_mh
        for start_m in range(lo, len_q, BLOCK_M):
            rows = start_m + tile_m
            row_ok = rows < len_q
            qd_ok = row_ok[:, None] & d_ok[None, :]
            q = tl.load(q_base + (q0 + rows)[:, None] * s_qn + cols_d[None, :], mask=qd_ok, other=0.0)
            do = tl.load(do_base + (q0 + rows)[:, None] * s_don + cols_d[None, :], mask=qd_ok, other=0.0)
            lse2 = tl.load(LSE2 + stat_base + rows, mask=row_ok, other=float("inf"))
            delta = tl.load(DELTA + stat_base + rows, mask=row_ok, other=0.0)
            q_scale = tl.load(QS + stat_base + rows, mask=row_ok, other=0.0) if QUANT else 1.0
            # Transposed: the keys are the rows of S^T, P^T and dS^T, so that P^T dO and dS^T Q take
            # them from registers as they are, and dS^T's INT8 scale is one per row (per key).
            mask_ptr = m_base + rows[None, :] * s_mm + cols[:, None] * s_mn
            s_t = _qk(k, q, k_scale, q_scale, qk_scale, QUANT)
            in_bounds = col_ok[:, None] & row_ok[None, :]
            s_t = _scores(s_t, mask_ptr, rows[None, :], cols[:, None], in_bounds, IS_CAUSAL, MASK_KIND)
            p_t = tl.exp2(s_t - lse2[None, :])
            dv += tl.dot(p_t.to(do.dtype), do)
            dp_t = tl.dot(v, tl.trans(do))
            ds_t = p_t * (dp_t - delta[None, :])
            if QUANT:
                qt = tl.load(qt_base + cols_d[:, None] * s_qtd + (q0 + rows)[None, :], mask=row_ok[None, :],
                             other=0)  # fmt: skip
                ds8, ds_scale = _quant_rows(ds_t, q_scale)
                dk += tl.dot(ds8, tl.trans(qt)).to(tl.float32) * ds_scale[:, None]
            else:
                dk += tl.dot(ds_t.to(q.dtype), q)
    dk *= sm_scale
    tl.store(DK + b64 * s_dkb + hk64 * s_dkh + (k0 + cols)[:, None] * s_dkn + cols_d[None, :],
             dk.to(DK.dtype.element_ty), mask=kv_ok)  # fmt: skip
    tl.store(DV + b64 * s_dvb + hk64 * s_dvh + (k0 + cols)[:, None] * s_dvn + cols_d[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_ok)  # fmt: skip


@triton.jit
def _dq_kernel(
    Q, K, V, DO, LSE2, DELTA, MASK, DQ, KMEAN, DLSE, KT, QS, KS, cu_q, cu_k,
    s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_dob, s_doh, s_don,
    s_dqb, s_dqh, s_dqn, s_mb, s_mh, s_mm, s_mn, s_ktb, s_kth, s_ktd, s_ksb, s_ksh,
    NQ, NK, H, GROUP, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, VARLEN: tl.constexpr, HAS_DLSE: tl.constexpr,
    QUANT: tl.constexpr,
):  # fmt: skip
    """dQ of one block of BLOCK_M queries of head h, over every key it sees.

    dQ_i = sum_j dS_ij (k_j - c) for any vector c, as sum_j dS_ij = 0: with c the keys' mean (KMEAN,
    [B, Hkv, D] float32), K's common part (large for outlier inputs: a per-channel bias) drops out of the
    sum, and with it the error that the quantized forward's O and LSE leave in sum_j dS_ij. With the LSE's
    gradient, sum_j dS_ij is dlse_i instead of 0 (DLSE, in the statistics' layout), added back exactly.

    QUANT: Q and K are their INT8 forms (K smoothed: k_j - c already) with per-token scales QS and KS,
    and KT is K's INT8 transpose; S is recomputed in INT8 and dQ = dS K in INT8 too (dS with K's scales
    folded in, one scale per query), dP = dO V^T in 16 bits."""
    pid, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q0, len_q, k0, len_k = _seq_bounds(cu_q, cu_k, b, NQ, NK, VARLEN)
    start_m = pid * BLOCK_M
    if start_m >= len_q:
        return
    rows = start_m + tl.arange(0, BLOCK_M)
    row_ok = rows < len_q
    cols_d = tl.arange(0, D_PAD)
    d_ok = cols_d < HEAD_DIM
    qd_ok = row_ok[:, None] & d_ok[None, :]
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    hk64 = (h // GROUP).to(tl.int64)
    q = tl.load(
        Q + b64 * s_qb + h64 * s_qh + (q0 + rows)[:, None] * s_qn + cols_d[None, :], mask=qd_ok, other=0.0
    )
    do = tl.load(DO + b64 * s_dob + h64 * s_doh + (q0 + rows)[:, None] * s_don + cols_d[None, :], mask=qd_ok,
                 other=0.0)  # fmt: skip
    if VARLEN:
        stat_base = h64 * NQ + q0
    else:
        stat_base = (b64 * H + h64) * NQ
    lse2 = tl.load(LSE2 + stat_base + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + stat_base + rows, mask=row_ok, other=0.0)
    q_scale = tl.load(QS + stat_base + rows, mask=row_ok, other=0.0) if QUANT else 1.0
    k_base = K + b64 * s_kb + hk64 * s_kh
    kt_base = KT + b64 * s_ktb + hk64 * s_kth
    ks_base = KS + b64 * s_ksb + hk64 * s_ksh + k0
    v_base = V + b64 * s_vb + hk64 * s_vh
    m_base = MASK + b64 * s_mb + h64 * s_mh
    dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    ds_sum = tl.zeros([BLOCK_M], tl.float32)
    hi = len_k
    if IS_CAUSAL:
        hi = tl.minimum(len_k, start_m + BLOCK_M)
    tile_n = tl.arange(0, BLOCK_N)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tile_n
        col_ok = cols < len_k
        kv_ok = col_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + (k0 + cols)[:, None] * s_kn + cols_d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_base + (k0 + cols)[:, None] * s_vn + cols_d[None, :], mask=kv_ok, other=0.0)
        k_scale = tl.load(ks_base + cols, mask=col_ok, other=0.0) if QUANT else 1.0
        mask_ptr = m_base + rows[:, None] * s_mm + cols[None, :] * s_mn
        s = _scores(_qk(q, k, q_scale, k_scale, qk_scale, QUANT), mask_ptr, rows[:, None], cols[None, :],
                    row_ok[:, None] & col_ok[None, :], IS_CAUSAL, MASK_KIND)  # fmt: skip
        p = tl.exp2(s - lse2[:, None])
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        if QUANT:
            kt = tl.load(kt_base + cols_d[:, None] * s_ktd + (k0 + cols)[None, :], mask=col_ok[None, :],
                         other=0)  # fmt: skip
            ds8, ds_scale = _quant_rows(ds, k_scale)
            dq += tl.dot(ds8, tl.trans(kt)).to(tl.float32) * ds_scale[:, None]
        else:
            dq += tl.dot(ds.to(k.dtype), k)
            ds_sum += tl.sum(ds, 1)
    if VARLEN:
        km_base = KMEAN + hk64 * HEAD_DIM
    else:
        km_base = KMEAN + (b64 * (H // GROUP) + hk64) * HEAD_DIM
    kmean = tl.load(km_base + cols_d, mask=d_ok, other=0.0)
    if HAS_DLSE:  # not for a row without keys (LSE2 +inf): its LSE is -inf whatever q is
        dlse = tl.load(DLSE + stat_base + rows, mask=row_ok, other=0.0)
        ds_sum -= tl.where(lse2 == float("inf"), 0.0, dlse)
    dq -= ds_sum[:, None] * kmean[None, :]
    dq *= sm_scale
    tl.store(DQ + b64 * s_dqb + h64 * s_dqh + (q0 + rows)[:, None] * s_dqn + cols_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=qd_ok)  # fmt: skip


@triton.jit
def _center_kernel(
    X, MEAN, LSE, OUT, s_xb, s_xh, s_xn, s_ob, s_oh, s_on, s_lb, s_lh, N, H, GROUP, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, D_PAD: tl.constexpr, SHIFT: tl.constexpr,
):  # fmt: skip
    """The inputs of torch's backward kernels with K centered (autograd._centered), one pass over X
    [B, H, N, D] per call. MEAN [B, H // GROUP, D] float32, rounded to X's dtype as K minus it is.
    SHIFT False (X is K): OUT = X - mean, in X's dtype. SHIFT True (X is Q): OUT [B, H, N] float32 =
    LSE - sm_scale * x . mean of x's KV head, the LSE of the scores against centered K."""
    pid, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < N
    cols_d = tl.arange(0, D_PAD)
    d_ok = cols_d < HEAD_DIM
    ok = row_ok[:, None] & d_ok[None, :]
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    x = tl.load(X + b64 * s_xb + h64 * s_xh + rows[:, None] * s_xn + cols_d[None, :], mask=ok, other=0.0)
    mean = tl.load(MEAN + (b64 * (H // GROUP) + h64 // GROUP) * HEAD_DIM + cols_d, mask=d_ok, other=0.0)
    mean = mean.to(X.dtype.element_ty).to(tl.float32)
    if SHIFT:
        lse = tl.load(LSE + b64 * s_lb + h64 * s_lh + rows, mask=row_ok, other=0.0)
        shift = tl.sum(x.to(tl.float32) * mean[None, :], axis=1)
        tl.store(OUT + (b64 * H + h64) * N + rows, lse - sm_scale * shift, mask=row_ok)
    else:
        out = (x.to(tl.float32) - mean[None, :]).to(OUT.dtype.element_ty)
        tl.store(OUT + b64 * s_ob + h64 * s_oh + rows[:, None] * s_on + cols_d[None, :], out, mask=ok)


#: Rows per program of _center_kernel.
CENTER_BLOCK = 64


def centered(q, k, lse, sm_scale):
    """(K minus its mean over the keys, the LSE of the scores against it), for torch's backward kernels
    (autograd._centered computes the same in torch ops): two launches of _center_kernel. q, k: HND
    views [B, H, N, D] with a unit last stride; lse [B, Hq, Nq] float32 (its rows contiguous)."""
    b, hq, nq, head_dim = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    d_pad = _d_pad(head_dim)
    mean = k.mean(dim=2, dtype=torch.float32)
    k_centered = torch.empty_like(k)
    lse_centered = torch.empty((b, hq, nq), dtype=torch.float32, device=q.device)
    lse = _unit_last(lse)
    with _on_device(q):
        _center_kernel[(triton.cdiv(nk, CENTER_BLOCK), hkv, b)](
            k, mean, mean, k_centered, *k.stride()[:3], *k_centered.stride()[:3], 0, 0, nk, hkv, 1, sm_scale,
            HEAD_DIM=head_dim, BLOCK=CENTER_BLOCK, D_PAD=d_pad, SHIFT=False,
        )  # fmt: skip
        _center_kernel[(triton.cdiv(nq, CENTER_BLOCK), hq, b)](
            q, mean, lse, lse_centered, *q.stride()[:3], 0, 0, 0, lse.stride(0), lse.stride(1), nq, hq,
            hq // hkv, sm_scale, HEAD_DIM=head_dim, BLOCK=CENTER_BLOCK, D_PAD=d_pad, SHIFT=True,
        )  # fmt: skip
    return k_centered, lse_centered


# --------------------------------------------------------------------------------------------------
# Launchers


def _bhn(x: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    return (0 if varlen else x.stride(0), x.stride(1), x.stride(2))


def _mask_args(attn_mask, b, h, nq, nk, device):
    if attn_mask is None:
        return torch.empty(0, dtype=torch.uint8, device=device), MASK_NONE.value, (0, 0, 0, 0)
    m = attn_mask.expand(b, h, nq, nk)  # broadcast dims get stride 0, nothing is copied
    if m.dtype == torch.bool:
        return m.view(torch.uint8), MASK_BOOL.value, tuple(m.stride())
    return m, MASK_ADD.value, tuple(m.stride())


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _on_device(q: torch.Tensor):
    """Launch on q's GPU even when another one is current (Triton launches on the current one)."""
    if q.device.type == "cuda" and q.device.index != torch.cuda.current_device():
        return torch.cuda.device(q.device)
    return contextlib.nullcontext()


def _int8(x, kmean, lse2, group, qk_scale, *, center: bool, shift: bool):
    """x [B, H, N, D] in INT8 per token (_quant_kernel): (x8 [B, H, N, D_PAD], its transpose, scales)."""
    b, h, n, head_dim = x.shape
    d_pad = _d_pad(head_dim, True)
    x8 = torch.empty((b, h, n, d_pad), dtype=torch.int8, device=x.device)
    xt = torch.empty((b, h, d_pad, n), dtype=torch.int8, device=x.device)
    scale = torch.empty((b, h, n), dtype=torch.float32, device=x.device)
    _quant_kernel[(triton.cdiv(n, QUANT_BLOCK), h, b)](
        x, kmean, lse2, x8, xt, scale, *x.stride()[:3], n, h, group, qk_scale,
        HEAD_DIM=head_dim, BLOCK=QUANT_BLOCK, D_PAD=d_pad, CENTER=center, SHIFT=shift,
    )  # fmt: skip
    return x8, xt, scale


def _backward(do, q, k, v, out, lse, dlse, attn_mask, cu_q, cu_k, *, nq, nk, batch, is_causal, sm_scale,
              varlen, quant):  # fmt: skip
    """The launches on [B, H, N, D] views ([1, H, T, D] with cu_q/cu_k when varlen); ``quant``: the
    INT8 backward (Q and K quantized per token first, K smoothed)."""
    do, q, k, v, out = (_unit_last(x) for x in (do, q, k, v, out))
    hq, hkv, head_dim = q.shape[1], k.shape[1], q.shape[-1]
    group = hq // hkv
    d_pad = _d_pad(head_dim, quant)
    config = CONFIG_OVERRIDES.get((d_pad, quant)) or block_config(head_dim, quant)
    qk_scale = sm_scale * _LOG2E
    stat_shape = (q.shape[0], hq, q.shape[2])  # [B, H, N] dense, [1, H, T] packed
    delta = torch.empty(stat_shape, dtype=torch.float32, device=q.device)
    lse2 = torch.empty(stat_shape, dtype=torch.float32, device=q.device)
    if cu_q is None:
        cu_q = cu_k = torch.empty(0, dtype=torch.int32, device=q.device)
    n_stat = q.shape[2]  # the row count of the statistics per head (NQ dense, T packed)
    mask, mask_kind, ms = _mask_args(attn_mask, q.shape[0], hq, nq, nk, q.device)
    has_lse, has_dlse = lse is not None, dlse is not None
    # The kernels take the statistics' batch and head strides, their rows contiguous: the LSE's gradient
    # may come in any layout (a transposed view, from a merge of chunks in NHD, say).
    lse = _unit_last(lse) if has_lse else None
    dlse = _unit_last(dlse) if has_dlse else None
    lse_arg = lse if has_lse else delta
    dlse_arg = dlse if has_dlse else delta
    lse_s = (lse.stride(0), lse.stride(1)) if has_lse else (0, 0)
    dlse_s = (dlse.stride(0), dlse.stride(1)) if has_dlse else (0, 0)
    if varlen:
        lse_s, dlse_s = (0, lse_s[1]), (0, dlse_s[1])
    with _on_device(q):
        _delta_kernel[(triton.cdiv(nq, DELTA_BLOCK), hq, batch)](
            out, do, lse_arg, dlse_arg, delta, lse2, cu_q, *_bhn(out, varlen), *_bhn(do, varlen), *lse_s,
            *dlse_s, n_stat, hq,
            HEAD_DIM=head_dim, BLOCK=DELTA_BLOCK, D_PAD=d_pad, VARLEN=varlen, HAS_LSE=has_lse,
            HAS_DLSE=has_dlse,
        )  # fmt: skip
        # The keys' mean per (b, Hkv) ([1, Hkv] over the whole packed batch for varlen: any constant
        # vector keeps dQ exact, see _dq_kernel).
        kmean = k.mean(dim=2, dtype=torch.float32).contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if quant:  # the kernels read INT8 Q and K (and their transposes) in place of q and k
            q, qt, q_scale = _int8(q, kmean, lse2, group, qk_scale, center=False, shift=has_lse)
            k, kt, k_scale = _int8(k, kmean, lse2, 1, qk_scale, center=True, shift=False)
        else:
            qt = kt = q_scale = k_scale = delta  # not read
        ks = (0 if varlen else k_scale.stride(0), k_scale.stride(1)) if quant else (0, 0)
        qts, kts = (_bhn(x, varlen) if quant else (0, 0, 0) for x in (qt, kt))
        block_m, block_n, warps, stages = config["dq"]
        if not has_lse:
            _lse_kernel[(triton.cdiv(nq, block_m), hq, batch)](
                q, k, mask, lse2, q_scale, k_scale, cu_q, cu_k, *_bhn(q, varlen), *_bhn(k, varlen), *ms, *ks,
                n_stat, nk, hq, group, qk_scale,
                HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, D_PAD=d_pad, IS_CAUSAL=is_causal,
                MASK_KIND=mask_kind, VARLEN=varlen, QUANT=quant, num_warps=warps, num_stages=stages,
            )  # fmt: skip
        dlse_rows = dlse.to(torch.float32).contiguous() if has_dlse else delta
        _dq_kernel[(triton.cdiv(nq, block_m), hq, batch)](
            q, k, v, do, lse2, delta, mask, dq, kmean, dlse_rows, kt, q_scale, k_scale, cu_q, cu_k,
            *_bhn(q, varlen), *_bhn(k, varlen), *_bhn(v, varlen), *_bhn(do, varlen), *_bhn(dq, varlen), *ms,
            *kts, *ks, n_stat, nk, hq, group, qk_scale, sm_scale,
            HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, D_PAD=d_pad, IS_CAUSAL=is_causal,
            MASK_KIND=mask_kind, VARLEN=varlen, HAS_DLSE=has_dlse, QUANT=quant, num_warps=warps,
            num_stages=stages,
        )  # fmt: skip
        block_m, block_n, warps, stages = config["dkdv"]
        _dkdv_kernel[(triton.cdiv(nk, block_n), hkv, batch)](
            q, k, v, do, lse2, delta, mask, dk, dv, qt, q_scale, k_scale, cu_q, cu_k,
            *_bhn(q, varlen), *_bhn(k, varlen), *_bhn(v, varlen), *_bhn(do, varlen), *_bhn(dk, varlen),
            *_bhn(dv, varlen), *ms, *qts, *ks, n_stat, nk, hq, group, qk_scale, sm_scale,
            HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, D_PAD=d_pad, IS_CAUSAL=is_causal,
            MASK_KIND=mask_kind, VARLEN=varlen, QUANT=quant, num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return dq, dk, dv


def attention_bwd(do, q, k, v, out, lse, dlse=None, *, attn_mask=None, is_causal=False, sm_scale,
                  quant=False):  # fmt: skip
    """dQ, dK, dV of attention on HND views [B, H, N, D] (GQA: k/v with fewer heads). ``lse``: the
    forward's natural-log LSE [B, Hq, Nq] (None: recomputed here); ``dlse``: its gradient or None;
    ``quant``: Q·Kᵀ, dS·K and dSᵀ·Q in INT8 (the quantized backward), dO·Vᵀ and Pᵀ·dO in 16 bits."""
    return _backward(do, q, k, v, out, lse, dlse, attn_mask, None, None, nq=q.shape[2], nk=k.shape[2],
                     batch=q.shape[0], is_causal=is_causal, sm_scale=sm_scale, varlen=False,
                     quant=quant)  # fmt: skip


def varlen_bwd(
    do, q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, is_causal, sm_scale,
    quant=False,
):  # fmt: skip
    """dQ, dK, dV of packed-sequence attention: q/out/do [Tq, Hq, D], k/v [Tk, Hkv, D]. The packed
    forward saves no LSE: it is recomputed here (from the INT8 scores when ``quant``)."""
    q4, k4, v4, o4, do4 = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v, out, do))
    # The statistics are indexed per token: give the kernels the packed token counts as row counts.
    dq, dk, dv = _backward(
        do4, q4, k4, v4, o4, None, None, None, cu_seqlens_q, cu_seqlens_k, nq=max_seqlen_q, nk=max_seqlen_k,
        batch=cu_seqlens_q.shape[0] - 1, is_causal=is_causal, sm_scale=sm_scale, varlen=True, quant=quant,
    )  # fmt: skip
    return tuple(x.transpose(1, 2).squeeze(0) for x in (dq, dk, dv))


__all__ = ["attention_bwd", "varlen_bwd", "block_config", "centered", "CONFIG_OVERRIDES"]
