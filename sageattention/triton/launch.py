"""Launchers for the Triton path: quantize Q/K/V, then run the attention kernel.

Inputs are HND views ([B, H, N, D], any strides with a contiguous last dim): an NHD tensor comes
in as ``x.transpose(1, 2)`` and nothing is copied. The output is allocated like ``q`` so an NHD
caller gets NHD memory back.
"""

from __future__ import annotations

import functools

import torch
import triton

from ..quant import FP8_E4M3_MAX, LOG2E, PVDtype
from . import attention as _attn
from . import quant as _quant

#: Query rows per attention program; Q is quantized per token, so this is not a quantization block.
BLOCK_M = 128
#: Keys per inner step, and the INT8 block of K (one scale per block). 128 for FP8 P·V: the FP8
#: MMA takes 32 keys per instruction and the promotion to FP32 happens once per block.
BLOCK_N = {PVDtype.FP16: 64, PVDtype.FP8: 128}
#: Rows per program of the quantization kernels.
QUANT_BLOCK = 64


def kernel_block_sizes(pv: PVDtype, head_dim: int) -> tuple[int, int]:
    """(Q quantization block, K quantization block) of the kernels: Q per token, K per key block."""
    del head_dim  # one choice for every head dim today
    return 1, BLOCK_N[pv]


def _d_pad(head_dim: int) -> int:
    # INT8 MMA needs K >= 32; Triton needs power-of-two tile sides.
    return max(32, triton.next_power_of_2(head_dim))


@functools.cache
def _launch_config(capability: tuple[int, int], d_pad: int, pv: PVDtype) -> dict:
    """num_warps / num_stages per target, from measurements (bench/results)."""
    # H200, b=4 h=32 d=128 (bench/sweep_triton.py): FP16 P·V 490-556 TOPS with 4 warps against
    # 440-512 with 8; FP8 P·V 520-621 with 8 warps and 3 stages against 490-552 with 4.
    if pv is PVDtype.FP8 and d_pad > 64:
        return {"num_warps": 8, "num_stages": 3}
    return {"num_warps": 4, "num_stages": 3}


def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _quantize_q(q, scale_out, corr, km, cu, *, n, batch, sm_scale, kv_group, d_pad, varlen):
    """INT8 Q (per token) into a [.., N, d_pad] buffer; fills scale_out (and corr when given)."""
    heads, head_dim = q.shape[1], q.shape[-1]
    if varlen:
        qq = torch.empty(q.shape[0], heads, d_pad, dtype=torch.int8, device=q.device)
        xs = (0, q.stride(1), q.stride(0))
        qs = (0, qq.stride(1), qq.stride(0))
        ss = (0, scale_out.stride(0))
    else:
        qq = torch.empty(batch, heads, n, d_pad, dtype=torch.int8, device=q.device)
        xs = (q.stride(0), q.stride(1), q.stride(2))
        qs = (qq.stride(0), qq.stride(1), qq.stride(2))
        ss = (scale_out.stride(0), scale_out.stride(1))
    kms = (km.stride(0), km.stride(1)) if km is not None else (0, 0)
    grid = (triton.cdiv(n, QUANT_BLOCK), heads, batch)
    _quant._quant_q_kernel[grid](
        q,
        qq,
        scale_out,
        km,
        corr,
        cu,
        *xs,
        *qs,
        *ss,
        *kms,
        n,
        head_dim,
        kv_group,
        sm_scale * _quant.Q_SCALE_MUL,
        sm_scale,
        BLOCK=QUANT_BLOCK,
        D_PAD=d_pad,
        VARLEN=varlen,
        WITH_CORR=corr is not None,
    )
    return qq


def _quantize_k(k, km, cu, *, n, batch, block_n, d_pad, varlen):
    heads, head_dim = k.shape[1], k.shape[-1]
    nblk = triton.cdiv(n, block_n)
    ks = torch.empty(batch, heads, nblk, dtype=torch.float32, device=k.device)
    if varlen:
        kq = torch.empty(k.shape[0], heads, d_pad, dtype=torch.int8, device=k.device)
        xs, qs = (0, k.stride(1), k.stride(0)), (0, kq.stride(1), kq.stride(0))
    else:
        kq = torch.empty(batch, heads, n, d_pad, dtype=torch.int8, device=k.device)
        xs, qs = (k.stride(0), k.stride(1), k.stride(2)), (kq.stride(0), kq.stride(1), kq.stride(2))
    kms = (km.stride(0), km.stride(1)) if km is not None else (0, 0)
    _quant._quant_k_kernel[(nblk, heads, batch)](
        k,
        kq,
        ks,
        km,
        cu,
        *xs,
        *qs,
        ks.stride(0),
        ks.stride(1),
        *kms,
        n,
        head_dim,
        BLOCK=block_n,
        D_PAD=d_pad,
        VARLEN=varlen,
        SMOOTH=km is not None,
    )
    return kq, ks


def _quantize_v_fp8(v, vmax, cu, *, n, batch, total, d_pad, varlen):
    """FP8 V transposed to [B, H, d_pad, N16] (N16: tokens rounded up to 16 for aligned rows)."""
    heads, head_dim = v.shape[1], v.shape[-1]
    n16 = triton.cdiv(total, 16) * 16
    if varlen:
        vt = torch.empty(heads, d_pad, n16, dtype=torch.float8_e4m3fn, device=v.device)
        xs, ts = (0, v.stride(1), v.stride(0)), (0, vt.stride(0), vt.stride(1))
    else:
        vt = torch.empty(batch, heads, d_pad, n16, dtype=torch.float8_e4m3fn, device=v.device)
        xs, ts = (v.stride(0), v.stride(1), v.stride(2)), (vt.stride(0), vt.stride(1), vt.stride(2))
    _quant._quant_v_fp8_kernel[(triton.cdiv(n, QUANT_BLOCK), heads, batch)](
        v,
        vt,
        vmax,
        cu,
        *xs,
        *ts,
        vmax.stride(0),
        vmax.stride(1),
        n,
        head_dim,
        BLOCK=QUANT_BLOCK,
        D_PAD=d_pad,
        VARLEN=varlen,
    )
    return vt


def _mask_args(attn_mask, b, h, nq, nk):
    if attn_mask is None:
        return None, _attn.MASK_NONE.value, (0, 0, 0, 0)
    m = attn_mask.expand(b, h, nq, nk)  # broadcast dims get stride 0, nothing is copied
    kind = _attn.MASK_BOOL.value if m.dtype == torch.bool else _attn.MASK_ADD.value
    if kind == _attn.MASK_BOOL.value:
        m = m.view(torch.uint8)  # same element size: a reinterpretation, not a copy
    return m, kind, tuple(m.stride())


def attention_fwd(
    q,
    k,
    v,
    *,
    is_causal: bool,
    sm_scale: float,
    pv: PVDtype,
    smooth_k: bool,
    attn_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    quant_backend: str = "triton",
):
    """Quantized attention on HND views. Returns (out like q, lse [B, Hq, Nq] float32 or None).

    ``quant_backend``: "triton" (the kernels in quant.py) or "cuda" (the compiled fused ops of
    csrc/fused, registered as torch.ops.sageattention.quant_*; same arithmetic, bit for bit).
    """
    b, hq, nq, head_dim = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    d_pad = _d_pad(head_dim)
    block_n = BLOCK_N[pv]
    dev = q.device

    kv_group = hq // hkv
    km = k.mean(dim=2, dtype=torch.float32) if smooth_k else None
    with_corr = return_lse and km is not None
    vmax = (
        torch.linalg.vector_norm(v, ord=float("inf"), dim=2, dtype=torch.float32)
        if pv is PVDtype.FP8
        else None
    )
    if quant_backend == "cuda":
        ops = torch.ops.sageattention
        qq, q_scale, corr = ops.quant_q_per_token(
            q, km, sm_scale, sm_scale * _quant.Q_SCALE_MUL, d_pad, kv_group, with_corr
        )
        kq, ks = ops.quant_k_per_block(k, km, block_n, d_pad)
        vv = ops.quant_v_fp8(v, vmax, d_pad, triton.cdiv(nk, 16) * 16) if vmax is not None else None
        corr = corr if with_corr else None
    else:
        q_scale = torch.empty(b, hq, nq, dtype=torch.float32, device=dev)
        corr = torch.empty_like(q_scale) if with_corr else None
        qq = _quantize_q(q, q_scale, corr, km, None, n=nq, batch=b, sm_scale=sm_scale, kv_group=kv_group,
                         d_pad=d_pad, varlen=False)  # fmt: skip
        kq, ks = _quantize_k(k, km, None, n=nk, batch=b, block_n=block_n, d_pad=d_pad, varlen=False)
        vv = (
            _quantize_v_fp8(v, vmax, None, n=nk, batch=b, total=nk, d_pad=d_pad, varlen=False)
            if vmax is not None
            else None
        )
    if vv is not None:
        vs = vmax * (1.0 / FP8_E4M3_MAX)
        v_strides = (vv.stride(0), vv.stride(1), 1, vv.stride(2))
        vs_strides = (vs.stride(0), vs.stride(1))
    else:
        vv = v if v.dtype == torch.float16 else v.to(torch.float16)
        vs = None
        v_strides = (vv.stride(0), vv.stride(1), vv.stride(2), 1)
        vs_strides = (0, 0)

    out = torch.empty_like(q)
    lse = torch.empty(b, hq, nq, dtype=torch.float32, device=dev) if return_lse else None
    mask, mask_kind, mask_strides = _mask_args(attn_mask, b, hq, nq, nk)
    grid = (triton.cdiv(nq, BLOCK_M), hq, b)
    _attn._attn_kernel[grid](
        qq,
        kq,
        vv,
        q_scale,
        ks,
        vs,
        out,
        lse,
        corr,
        mask,
        None,
        None,
        qq.stride(0),
        qq.stride(1),
        qq.stride(2),
        kq.stride(0),
        kq.stride(1),
        kq.stride(2),
        *v_strides,
        q_scale.stride(0),
        q_scale.stride(1),
        ks.stride(0),
        ks.stride(1),
        *vs_strides,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        *((lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)),
        *mask_strides,
        nq,
        nk,
        hq // hkv,
        HEAD_DIM=head_dim,
        BLOCK_M=BLOCK_M,
        BLOCK_N=block_n,
        D_PAD=d_pad,
        PV_FP8=pv is PVDtype.FP8,
        IS_CAUSAL=is_causal,
        MASK_KIND=mask_kind,
        VARLEN=False,
        RETURN_LSE=return_lse,
        LSE_CORR=corr is not None,
        **_launch_config(_capability(dev), d_pad, pv),
    )
    return out, lse


def varlen_fwd(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool,
    sm_scale: float,
    pv: PVDtype,
    smooth_k: bool,
):
    """Packed sequences: q [Tq, Hq, D], k/v [Tk, Hkv, D]; K smoothed per sequence."""
    tq, hq, head_dim = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    batch = cu_seqlens_q.shape[0] - 1
    d_pad = _d_pad(head_dim)
    block_n = BLOCK_N[pv]
    dev = q.device

    need_stats = smooth_k or pv is PVDtype.FP8
    km = torch.empty(batch, hkv, head_dim, dtype=torch.float32, device=dev) if smooth_k else None
    vmax = torch.empty(batch, hkv, head_dim, dtype=torch.float32, device=dev) if pv is PVDtype.FP8 else None
    if need_stats:
        ref = km if km is not None else vmax
        _quant._seq_stats_kernel[(hkv, batch)](
            k,
            v,
            km,
            vmax,
            cu_seqlens_k,
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            ref.stride(0),
            ref.stride(1),
            head_dim,
            BLOCK=QUANT_BLOCK,
            D_PAD=d_pad,
            SMOOTH=smooth_k,
            V_AMAX=vmax is not None,
        )
    q_scale = torch.empty(hq, tq, dtype=torch.float32, device=dev)
    qq = _quantize_q(
        q,
        q_scale,
        None,
        None,
        cu_seqlens_q,
        n=max_seqlen_q,
        batch=batch,
        sm_scale=sm_scale,
        kv_group=hq // hkv,
        d_pad=d_pad,
        varlen=True,
    )
    kq, ks = _quantize_k(
        k, km, cu_seqlens_k, n=max_seqlen_k, batch=batch, block_n=block_n, d_pad=d_pad, varlen=True
    )
    if pv is PVDtype.FP8:
        vv = _quantize_v_fp8(
            v, vmax, cu_seqlens_k, n=max_seqlen_k, batch=batch, total=tk, d_pad=d_pad, varlen=True
        )
        vs = vmax * (1.0 / FP8_E4M3_MAX)
        v_strides = (0, vv.stride(0), 1, vv.stride(1))
        vs_strides = (vs.stride(0), vs.stride(1))
    else:
        vv = v if v.dtype == torch.float16 else v.to(torch.float16)
        vs = None
        v_strides = (0, vv.stride(1), vv.stride(0), 1)
        vs_strides = (0, 0)

    out = torch.empty_like(q)
    grid = (triton.cdiv(max_seqlen_q, BLOCK_M), hq, batch)
    _attn._attn_kernel[grid](
        qq,
        kq,
        vv,
        q_scale,
        ks,
        vs,
        out,
        None,
        None,
        None,
        cu_seqlens_q,
        cu_seqlens_k,
        0,
        qq.stride(1),
        qq.stride(0),
        0,
        kq.stride(1),
        kq.stride(0),
        *v_strides,
        0,
        q_scale.stride(0),
        ks.stride(0),
        ks.stride(1),
        *vs_strides,
        0,
        out.stride(1),
        out.stride(0),
        0,
        0,
        0,
        0,
        0,
        0,
        max_seqlen_q,
        max_seqlen_k,
        hq // hkv,
        HEAD_DIM=head_dim,
        BLOCK_M=BLOCK_M,
        BLOCK_N=block_n,
        D_PAD=d_pad,
        PV_FP8=pv is PVDtype.FP8,
        IS_CAUSAL=is_causal,
        MASK_KIND=_attn.MASK_NONE.value,
        VARLEN=True,
        RETURN_LSE=False,
        LSE_CORR=False,
        **_launch_config(_capability(dev), d_pad, pv),
    )
    return out


__all__ = ["attention_fwd", "varlen_fwd", "kernel_block_sizes", "LOG2E"]
