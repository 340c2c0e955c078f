"""Launchers for the Triton path: quantize Q/K/V, then run the attention kernel.

Inputs are HND views ([B, H, N, D], any strides with a contiguous last dim): an NHD tensor comes
in as ``x.transpose(1, 2)`` and nothing is copied. The output is allocated like ``q`` so an NHD
caller gets NHD memory back.

Packed (varlen) inputs [T, H, D] are viewed as one batch [1, H, T, D]; the kernels then index
sequence ``b`` through ``cu_seqlens`` and get a batch stride of 0 for every per-token tensor
(``_bhn``), while per-sequence tensors (K means, K block scales, V scales) keep theirs.
"""

from __future__ import annotations

import functools

import torch
import triton

from ..quant import FP8_E4M3_MAX, PVDtype
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


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _bhn(x: torch.Tensor, varlen: bool) -> tuple[int, ...]:
    """(batch, head, token) strides of a per-token tensor [B, H, N, ...]; batch 0 when packed."""
    return (0 if varlen else x.stride(0), x.stride(1), x.stride(2))


def _bh(x: torch.Tensor) -> tuple[int, int]:
    """(batch, head) strides of a per-sequence tensor, or zeros when there is none."""
    return (x.stride(0), x.stride(1)) if x is not None else (0, 0)


def _quantize_q(q, km, corr, cu, *, n, sm_scale, kv_group, d_pad, varlen):
    """INT8 Q per token: (q_int8 [B, H, N, d_pad], scale [B, H, N]); fills corr when given."""
    b, h, tokens, head_dim = q.shape
    qq = torch.empty(b, h, tokens, d_pad, dtype=torch.int8, device=q.device)
    scale = torch.empty(b, h, tokens, dtype=torch.float32, device=q.device)
    batch = cu.shape[0] - 1 if varlen else b
    _quant._quant_q_kernel[(triton.cdiv(n, QUANT_BLOCK), h, batch)](
        q, qq, scale, km, corr, cu, *_bhn(q, varlen), *_bhn(qq, varlen), *_bhn(scale, varlen)[:2], *_bh(km),
        n, head_dim, kv_group, sm_scale * _quant.Q_SCALE_MUL, sm_scale,
        BLOCK=QUANT_BLOCK, D_PAD=d_pad, VARLEN=varlen, WITH_CORR=corr is not None,
    )  # fmt: skip
    return qq, scale


def _quantize_k(k, km, cu, *, n, batch, block_n, d_pad, varlen):
    """INT8 K per block of block_n tokens of each sequence: (k_int8, scale [batch, H, blocks])."""
    _, h, tokens, head_dim = k.shape
    nblk = triton.cdiv(n, block_n)
    kq = torch.empty(k.shape[0], h, tokens, d_pad, dtype=torch.int8, device=k.device)
    ks = torch.empty(batch, h, nblk, dtype=torch.float32, device=k.device)
    _quant._quant_k_kernel[(nblk, h, batch)](
        k, kq, ks, km, cu, *_bhn(k, varlen), *_bhn(kq, varlen), *_bh(ks), *_bh(km), n, head_dim,
        BLOCK=block_n, D_PAD=d_pad, VARLEN=varlen, SMOOTH=km is not None,
    )  # fmt: skip
    return kq, ks


def _quantize_v_fp8(v, vmax, cu, *, n, batch, d_pad, varlen):
    """FP8 V transposed to [B, H, d_pad, N16] (N16: tokens rounded up to 16 for aligned rows)."""
    b, h, tokens, head_dim = v.shape
    vt = torch.empty(b, h, d_pad, triton.cdiv(tokens, 16) * 16, dtype=torch.float8_e4m3fn, device=v.device)
    vt_strides = (0 if varlen else vt.stride(0), vt.stride(1), vt.stride(2))  # (batch, head, channel)
    _quant._quant_v_fp8_kernel[(triton.cdiv(n, QUANT_BLOCK), h, batch)](
        v, vt, vmax, cu, *_bhn(v, varlen), *vt_strides, *_bh(vmax), n, head_dim,
        BLOCK=QUANT_BLOCK, D_PAD=d_pad, VARLEN=varlen,
    )  # fmt: skip
    return vt


def _mask_args(attn_mask, b, h, nq, nk):
    if attn_mask is None:
        return None, _attn.MASK_NONE.value, (0, 0, 0, 0)
    m = attn_mask.expand(b, h, nq, nk)  # broadcast dims get stride 0, nothing is copied
    kind = _attn.MASK_BOOL.value if m.dtype == torch.bool else _attn.MASK_ADD.value
    if kind == _attn.MASK_BOOL.value:
        m = m.view(torch.uint8)  # same element size: a reinterpretation, not a copy
    return m, kind, tuple(m.stride())


def _forward(q, k, v, km, vmax, cu_q, cu_k, *, nq, nk, batch, is_causal, sm_scale, pv, attn_mask, return_lse,
             quant_backend, varlen):  # fmt: skip
    """Quantize and attend. q/k/v: [B, H, N, D] views (B=1 and cu_* given when varlen); km/vmax: the
    K mean and V amax per (sequence, head, channel), or None. Returns (out like q, lse or None)."""
    hq, head_dim = q.shape[1], q.shape[-1]
    kv_group = hq // k.shape[1]
    d_pad = _d_pad(head_dim)
    block_n = BLOCK_N[pv]
    with_corr = return_lse and km is not None
    if quant_backend == "cuda":  # the compiled fused ops of csrc/fused: same arithmetic, bit for bit
        ops = torch.ops.sageattention
        scale_mul = sm_scale * _quant.Q_SCALE_MUL
        qq, q_scale, corr = ops.quant_q_per_token(q, km, sm_scale, scale_mul, d_pad, kv_group, with_corr)
        corr = corr if with_corr else None
        kq, ks = ops.quant_k_per_block(k, km, block_n, d_pad)
        vv = ops.quant_v_fp8(v, vmax, d_pad, triton.cdiv(nk, 16) * 16) if vmax is not None else None
    else:
        corr = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if with_corr else None
        qq, q_scale = _quantize_q(q, km, corr, cu_q, n=nq, sm_scale=sm_scale, kv_group=kv_group, d_pad=d_pad,
                                  varlen=varlen)  # fmt: skip
        kq, ks = _quantize_k(k, km, cu_k, n=nk, batch=batch, block_n=block_n, d_pad=d_pad, varlen=varlen)
        vv = None if vmax is None else _quantize_v_fp8(v, vmax, cu_k, n=nk, batch=batch, d_pad=d_pad,
                                                       varlen=varlen)  # fmt: skip
    if vv is not None:
        vs = vmax * (1.0 / FP8_E4M3_MAX)
        vb, vh, vd = (0 if varlen else vv.stride(0)), vv.stride(1), vv.stride(2)
        v_strides = (vb, vh, 1, vd)  # (batch, head, token, channel) of the transposed FP8 V
    else:
        vv = v if v.dtype == torch.float16 else v.to(torch.float16)
        vs = None
        v_strides = (*_bhn(vv, varlen), 1)

    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if return_lse else None
    mask, mask_kind, mask_strides = _mask_args(attn_mask, q.shape[0], hq, nq, nk)
    _attn._attn_kernel[(triton.cdiv(nq, BLOCK_M), hq, batch)](
        qq, kq, vv, q_scale, ks, vs, out, lse, corr, mask, cu_q, cu_k,
        *_bhn(qq, varlen), *_bhn(kq, varlen), *v_strides, *_bhn(q_scale, varlen)[:2], *_bh(ks), *_bh(vs),
        *_bhn(out, varlen), *(_bhn(lse, varlen)[:2] if lse is not None else (0, 0)), *mask_strides,
        nq, nk, kv_group,
        HEAD_DIM=head_dim, BLOCK_M=BLOCK_M, BLOCK_N=block_n, D_PAD=d_pad, PV_FP8=pv is PVDtype.FP8,
        IS_CAUSAL=is_causal, MASK_KIND=mask_kind, VARLEN=varlen, RETURN_LSE=return_lse,
        LSE_CORR=corr is not None,
        **_launch_config(_capability(q.device), d_pad, pv),
    )  # fmt: skip
    return out, lse


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
    km = k.mean(dim=2, dtype=torch.float32) if smooth_k else None
    vmax = None
    if pv is PVDtype.FP8:
        vmax = torch.linalg.vector_norm(v, ord=float("inf"), dim=2, dtype=torch.float32)
    return _forward(
        q, k, v, km, vmax, None, None, nq=q.shape[2], nk=k.shape[2], batch=q.shape[0], is_causal=is_causal,
        sm_scale=sm_scale, pv=pv, attn_mask=attn_mask, return_lse=return_lse, quant_backend=quant_backend,
        varlen=False,
    )  # fmt: skip


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
    batch = cu_seqlens_q.shape[0] - 1
    hkv, head_dim = k.shape[1], k.shape[2]
    q4, k4, v4 = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))  # [1, H, T, D] views
    stats = lambda: torch.empty(batch, hkv, head_dim, dtype=torch.float32, device=q.device)  # noqa: E731
    km = stats() if smooth_k else None
    vmax = stats() if pv is PVDtype.FP8 else None
    if km is not None or vmax is not None:
        ref = km if km is not None else vmax
        _quant._seq_stats_kernel[(hkv, batch)](
            k, v, km, vmax, cu_seqlens_k, k.stride(0), k.stride(1), v.stride(0), v.stride(1), *_bh(ref),
            head_dim,
            BLOCK=QUANT_BLOCK, D_PAD=_d_pad(head_dim), SMOOTH=km is not None, V_AMAX=vmax is not None,
        )  # fmt: skip
    out, _ = _forward(
        q4, k4, v4, km, vmax, cu_seqlens_q, cu_seqlens_k, nq=max_seqlen_q, nk=max_seqlen_k, batch=batch,
        is_causal=is_causal, sm_scale=sm_scale, pv=pv, attn_mask=None, return_lse=False,
        quant_backend="triton", varlen=True,
    )  # fmt: skip
    return out.transpose(1, 2).squeeze(0)


__all__ = ["attention_fwd", "varlen_fwd", "kernel_block_sizes"]
