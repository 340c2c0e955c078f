"""Triton quantization kernels: INT8 Q per token, INT8 K per block (smoothed), FP8 V per channel.

The arithmetic matches `sageattention.reference` step for step: ``rint(x * (127 / amax))`` with
round-half-even, scales ``amax / 127`` (Q's also carries ``sm_scale * log2(e)``), FP8 V as
``fp8(v * (448 / amax))`` stored transposed ([D, N]) because Hopper's FP8 MMA wants its B operand
K-major.

Dense and packed (varlen) inputs share each kernel: a sequence's rows start at
``cu_seqlens[b]`` when ``VARLEN`` (the wrapper then passes batch strides of 0), else at row 0 of
batch ``b``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..quant import FP8_E4M3_MAX as _FP8_MAX
from ..quant import INT8_MAX as _INT8_MAX
from ..quant import K_RESIDUAL_MUL as _K_RESIDUAL_MUL
from ..quant import K_RESIDUAL_SCALE as _K_RESIDUAL_SCALE
from ..quant import LOG2E

# Triton kernels read module globals only as constexpr.
INT8_MAX = tl.constexpr(_INT8_MAX)
FP8_E4M3_MAX = tl.constexpr(_FP8_MAX)
K_RESIDUAL_MUL = tl.constexpr(_K_RESIDUAL_MUL)
K_RESIDUAL_SCALE = tl.constexpr(_K_RESIDUAL_SCALE)


@triton.jit
def _ieee_div(limit, amax):
    """limit / amax rounded as IEEE division (the default `/` is approximate): the reference's and
    the CUDA kernels' scales then agree bit for bit."""
    return tl.math.div_rn(tl.zeros_like(amax) + limit, amax)


@triton.jit
def _abs_bits(x):
    """|x| as int32 bit patterns: non-negative floats (and a NaN with its sign cleared) order like
    their patterns, with NaN above +Inf, so an integer max of them is a max that keeps NaN (tl.max
    of floats drops it, which would turn a NaN input into a finite output where SDPA's is NaN)."""
    return tl.abs(x).to(tl.int32, bitcast=True)


@triton.jit
def _seq_bounds(cu_seqlens, b, n, VARLEN: tl.constexpr):
    """(first row, length) of sequence b."""
    if VARLEN:
        start = tl.load(cu_seqlens + b)
        return start, tl.load(cu_seqlens + b + 1) - start
    return 0, n


@triton.jit
def _quant_q_kernel(
    X,
    XQ,
    XS,
    KM,
    CORR,
    cu_seqlens,
    stride_xb,
    stride_xh,
    stride_xn,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_sb,
    stride_sh,
    stride_kmb,
    stride_kmh,
    n,
    head_dim,
    kv_group,
    scale_mul,
    sm_scale,
    BLOCK: tl.constexpr,
    D_PAD: tl.constexpr,
    VARLEN: tl.constexpr,
    WITH_CORR: tl.constexpr,
):
    """INT8 Q with one scale per token; optionally the LSE correction sm_scale * q . mean(k)."""
    pid_n, h, b = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    start, length = _seq_bounds(cu_seqlens, b, n, VARLEN)
    tile = tl.arange(0, BLOCK)
    rows = pid_n * BLOCK + tile
    row0 = (start + pid_n * BLOCK).to(tl.int64)  # 64-bit row base; 32-bit offsets inside the tile
    if pid_n * BLOCK >= length:
        return
    cols = tl.arange(0, D_PAD)
    rows_ok = rows < length
    valid = rows_ok[:, None] & (cols < head_dim)[None, :]
    bx = b * stride_xb + h * stride_xh + row0 * stride_xn
    x = tl.load(X + bx + tile[:, None] * stride_xn + cols[None, :], mask=valid, other=0.0)
    x = x.to(tl.float32)
    amax = tl.max(_abs_bits(x), axis=1).to(tl.float32, bitcast=True)
    inv = tl.where(amax > 0, _ieee_div(INT8_MAX, amax), 0.0)
    xq = libdevice.rint(x * inv[:, None]).to(tl.int8)
    bq = b * stride_qb
    tl.store(
        XQ + bq + h * stride_qh + row0 * stride_qn + tile[:, None] * stride_qn + cols[None, :],
        xq,
        mask=rows_ok[:, None],
    )
    srow = b * stride_sb + h * stride_sh + row0 + tile
    tl.store(XS + srow, amax * scale_mul, mask=rows_ok)
    if WITH_CORR:
        km = tl.load(
            KM + b * stride_kmb + (h // kv_group) * stride_kmh + cols, mask=cols < head_dim, other=0.0
        )
        tl.store(CORR + srow, tl.sum(x * km[None, :], axis=1) * sm_scale, mask=rows_ok)


@triton.jit
def _quant_k_kernel(
    X,
    XQ,
    XR,
    XS,
    KM,
    cu_seqlens,
    stride_xb,
    stride_xh,
    stride_xn,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_sb,
    stride_sh,
    stride_kmb,
    stride_kmh,
    n,
    head_dim,
    BLOCK: tl.constexpr,
    D_PAD: tl.constexpr,
    VARLEN: tl.constexpr,
    SMOOTH: tl.constexpr,
    RESIDUAL: tl.constexpr,
):
    """INT8 K, one scale per block of BLOCK tokens (the attention kernel's key block). RESIDUAL: also
    the second INT8 digit (XR, laid out like XQ) and the two-level scale (see quant.K_RESIDUAL_MUL)."""
    pid_n, h, b = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    start, length = _seq_bounds(cu_seqlens, b, n, VARLEN)
    if pid_n * BLOCK >= length:
        return
    tile = tl.arange(0, BLOCK)
    rows = pid_n * BLOCK + tile
    row0 = (start + pid_n * BLOCK).to(tl.int64)  # 64-bit row base; 32-bit offsets inside the tile
    cols = tl.arange(0, D_PAD)
    rows_ok = rows < length
    valid = rows_ok[:, None] & (cols < head_dim)[None, :]
    bx = b * stride_xb + h * stride_xh + row0 * stride_xn
    x = tl.load(X + bx + tile[:, None] * stride_xn + cols[None, :], mask=valid, other=0.0)
    x = x.to(tl.float32)
    if SMOOTH:
        km = tl.load(KM + b * stride_kmb + h * stride_kmh + cols, mask=cols < head_dim, other=0.0)
        x = tl.where(valid, x - km[None, :], 0.0)
    amax = tl.max(tl.max(_abs_bits(x), axis=1), axis=0).to(tl.float32, bitcast=True)
    inv = tl.where(amax > 0, _ieee_div(INT8_MAX, amax), 0.0)
    k1 = libdevice.rint(x * inv)
    offs = b * stride_qb + h * stride_qh + row0 * stride_qn + tile[:, None] * stride_qn + cols[None, :]
    tl.store(XQ + offs, k1.to(tl.int8), mask=rows_ok[:, None])
    if RESIDUAL:
        rest = tl.fma(x, inv, -k1)  # one rounding, as the reference computes it
        tl.store(XR + offs, libdevice.rint(rest * K_RESIDUAL_MUL).to(tl.int8), mask=rows_ok[:, None])
        tl.store(XS + b * stride_sb + h * stride_sh + pid_n, amax * K_RESIDUAL_SCALE)
    else:
        tl.store(XS + b * stride_sb + h * stride_sh + pid_n, amax * (1.0 / INT8_MAX))


@triton.jit
def _quant_v_fp8_kernel(
    X,
    VT,
    VMAX,
    cu_seqlens,
    stride_xb,
    stride_xh,
    stride_xn,
    stride_tb,
    stride_th,
    stride_td,
    stride_mb,
    stride_mh,
    n,
    head_dim,
    BLOCK: tl.constexpr,
    D_PAD: tl.constexpr,
    VARLEN: tl.constexpr,
):
    """FP8 e4m3 V with one scale per channel, written transposed: VT[b, h, d, token]."""
    pid_n, h, b = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    start, length = _seq_bounds(cu_seqlens, b, n, VARLEN)
    if pid_n * BLOCK >= length:
        return
    tile = tl.arange(0, BLOCK)
    rows = pid_n * BLOCK + tile
    row0 = (start + pid_n * BLOCK).to(tl.int64)  # 64-bit row base; 32-bit offsets inside the tile
    cols = tl.arange(0, D_PAD)
    rows_ok = rows < length
    valid = rows_ok[:, None] & (cols < head_dim)[None, :]
    bx = b * stride_xb + h * stride_xh + row0 * stride_xn
    x = tl.load(X + bx + tile[:, None] * stride_xn + cols[None, :], mask=valid, other=0.0)
    amax = tl.load(VMAX + b * stride_mb + h * stride_mh + cols, mask=cols < head_dim, other=0.0)
    inv = tl.where(amax > 0, _ieee_div(FP8_E4M3_MAX, amax), 0.0)
    xq = (x.to(tl.float32) * inv[None, :]).to(tl.float8e4nv)
    bt = b * stride_tb
    # Store the transposed tile ([D, tokens], tokens contiguous) so that consecutive lanes write
    # consecutive bytes; storing [tokens, D] through transposed pointers scatters single bytes.
    tl.store(
        VT + bt + h * stride_th + row0 + cols[:, None] * stride_td + tile[None, :],
        tl.trans(xq),
        mask=rows_ok[None, :],
    )


@triton.jit
def _seq_stats_kernel(
    K,
    V,
    KM,
    VMAX,
    cu_seqlens,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_mb,
    stride_mh,
    head_dim,
    BLOCK: tl.constexpr,
    D_PAD: tl.constexpr,
    SMOOTH: tl.constexpr,
    V_AMAX: tl.constexpr,
):
    """Per packed sequence: mean of K and amax of |V| per channel (varlen only)."""
    h, b = tl.program_id(0), tl.program_id(1)
    start, length = _seq_bounds(cu_seqlens, b, 0, True)
    cols = tl.arange(0, D_PAD)
    ksum = tl.zeros([D_PAD], dtype=tl.float32)
    vmax = tl.zeros([D_PAD], dtype=tl.float32)
    tile = tl.arange(0, BLOCK)
    for off in range(0, length, BLOCK):
        rows = off + tile
        row0 = (start + off).to(tl.int64)  # 64-bit row base (packed sequences can be long)
        valid = (rows < length)[:, None] & (cols < head_dim)[None, :]
        if SMOOTH:
            k_ptr = K + h * stride_kh + row0 * stride_kn + tile[:, None] * stride_kn + cols[None, :]
            k = tl.load(k_ptr, mask=valid, other=0.0)
            ksum += tl.sum(k.to(tl.float32), axis=0)
        if V_AMAX:
            v_ptr = V + h * stride_vh + row0 * stride_vn + tile[:, None] * stride_vn + cols[None, :]
            v = tl.load(v_ptr, mask=valid, other=0.0)
            block_max = tl.max(_abs_bits(v.to(tl.float32)), axis=0).to(tl.float32, bitcast=True)
            vmax = tl.maximum(vmax, block_max, propagate_nan=tl.PropagateNan.ALL)
    out = b * stride_mb + h * stride_mh + cols
    if SMOOTH:
        tl.store(KM + out, ksum / tl.maximum(length, 1).to(tl.float32), mask=cols < head_dim)
    if V_AMAX:
        tl.store(VMAX + out, vmax, mask=cols < head_dim)


Q_SCALE_MUL = LOG2E / _INT8_MAX
