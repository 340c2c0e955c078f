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
from dataclasses import dataclass

import torch
import triton

from ..extensions import cuda_capability
from ..quant import FP8_E4M3_MAX, PVDtype
from . import attention as _attn
from . import quant as _quant

#: Query rows per FP16-P·V attention program (FP8: _launch_config); Q is quantized per token, so
#: this is not a quantization block.
BLOCK_M = 128
#: Keys per inner step, and the INT8 block of K (one scale per block). 128 for FP8 P·V: the FP8
#: MMA takes 32 keys per instruction and the promotion to FP32 happens once per block.
BLOCK_N = {PVDtype.FP16: 64, PVDtype.FP8: 128}
#: Two-level INT8 K (quant.K_RESIDUAL_MUL) for FP16 P·V: one more INT8 MMA per key block buys the
#: FP16 path its accuracy (relative L1 0.020 -> 0.012 on the outlier set, bench/NOTES.md); FP8 P·V
#: is limited by its P and V rounding, where a finer K changes nothing measurable.
K_RESIDUAL = {PVDtype.FP16: True, PVDtype.FP8: False}
#: Rows per program of the quantization kernels.
QUANT_BLOCK = 64


def kernel_block_sizes(pv: PVDtype, head_dim: int) -> tuple[int, int]:
    """(Q quantization block, K quantization block) of the kernels: Q per token, K per key block."""
    del head_dim  # one choice for every head dim today
    return 1, BLOCK_N[pv]


def reference_options(pv: PVDtype, head_dim: int) -> dict:
    """The keyword arguments of ``reference.sage_ref`` that reproduce these kernels' quantization."""
    block_m, block_n = kernel_block_sizes(pv, head_dim)
    return {"pv": pv, "block_m": block_m, "block_n": block_n, "k_residual": K_RESIDUAL[pv]}


def _d_pad(head_dim: int) -> int:
    # INT8 MMA needs K >= 32; Triton needs power-of-two tile sides.
    return max(32, triton.next_power_of_2(head_dim))


@functools.cache
def _launch_config(capability: tuple[int, int], d_pad: int, pv: PVDtype, causal: bool) -> dict:
    """block_m / num_warps / num_stages per target, from measurements (bench/sweep_triton.py)."""
    del capability, causal  # one setting per precision today: the sweeps below found no better split
    if pv is PVDtype.FP8:
        # H100, b=4 h=32 d=128, full call TOPS at n=4096/16384 (non-causal; causal): 64 rows x 4 warps
        # 544/623; 432/597 against 128 x 8 warps 508/619; 399/574, and 128 x 4 or 64 x 8 far behind.
        return {"block_m": 64, "num_warps": 4, "num_stages": 3}
    # FP16 P·V with two-level K, same shapes: 128 rows x 4 warps 406/472; 338/398 against 64 x 4
    # 331/337; 286/346 (the second K digit doubles the key tile that 64 rows would amortize less).
    return {"block_m": BLOCK_M, "num_warps": 4, "num_stages": 3}


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


def _quantize_k(k, km, cu, *, n, batch, block_n, d_pad, varlen, residual):
    """INT8 K per block of block_n tokens of each sequence: (k_int8, k_residual or None, scale
    [batch, H, blocks]); with ``residual`` the second INT8 digit and the two-level scale."""
    _, h, tokens, head_dim = k.shape
    nblk = triton.cdiv(n, block_n)
    kq = torch.empty(k.shape[0], h, tokens, d_pad, dtype=torch.int8, device=k.device)
    kr = torch.empty_like(kq) if residual else None
    ks = torch.empty(batch, h, nblk, dtype=torch.float32, device=k.device)
    _quant._quant_k_kernel[(nblk, h, batch)](
        k, kq, kr, ks, km, cu, *_bhn(k, varlen), *_bhn(kq, varlen), *_bh(ks), *_bh(km), n, head_dim,
        BLOCK=block_n, D_PAD=d_pad, VARLEN=varlen, SMOOTH=km is not None, RESIDUAL=residual,
    )  # fmt: skip
    return kq, kr, ks


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


@dataclass
class Quantized:
    """What the attention kernel reads: INT8 Q/K (and K's second digit) with scales, V as FP16 or
    transposed FP8 with its per-channel scale, the smooth-K LSE correction."""

    q: torch.Tensor
    q_scale: torch.Tensor
    k: torch.Tensor
    k_residual: torch.Tensor | None
    k_scale: torch.Tensor
    v: torch.Tensor
    v_scale: torch.Tensor | None
    v_strides: tuple  # (batch, head, token, channel)
    corr: torch.Tensor | None


def quantize(q, k, v, km, vmax, cu_q, cu_k, *, nq, nk, batch, sm_scale, pv, return_lse, quant_backend,
             varlen):  # fmt: skip
    """Quantize q/k/v ([B, H, N, D] views; B=1 and cu_* given when varlen). km/vmax: the K mean and V
    amax per (sequence, head, channel), or None."""
    hq, head_dim = q.shape[1], q.shape[-1]
    kv_group = hq // k.shape[1]
    d_pad = _d_pad(head_dim)
    block_n = BLOCK_N[pv]
    residual = K_RESIDUAL[pv]
    with_corr = return_lse and km is not None
    if quant_backend == "cuda":  # the compiled fused ops of csrc/fused: same arithmetic, bit for bit
        from .. import cuda_ops  # noqa: PLC0415 - the compiled modules, loaded on first use

        scale_mul = sm_scale * _quant.Q_SCALE_MUL
        qq, q_scale, corr = cuda_ops.call(
            "quant_q_per_token", q, km, sm_scale, scale_mul, d_pad, kv_group, with_corr
        )
        corr = corr if with_corr else None
        quantized_k = cuda_ops.call(
            "quant_k_per_block", k, km, block_n, d_pad, residual
        )  # [k1, scale] (+ [k2])
        kq, ks = quantized_k[0], quantized_k[1]
        kr = quantized_k[2] if residual else None
        n_pad = triton.cdiv(nk, 16) * 16
        vv = cuda_ops.call("quant_v_fp8", v, vmax, d_pad, n_pad, False) if vmax is not None else None
    else:
        corr = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if with_corr else None
        qq, q_scale = _quantize_q(q, km, corr, cu_q, n=nq, sm_scale=sm_scale, kv_group=kv_group, d_pad=d_pad,
                                  varlen=varlen)  # fmt: skip
        kq, kr, ks = _quantize_k(k, km, cu_k, n=nk, batch=batch, block_n=block_n, d_pad=d_pad, varlen=varlen,
                                 residual=residual)  # fmt: skip
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
    return Quantized(qq, q_scale, kq, kr, ks, vv, vs, v_strides, corr)


def attend(x: Quantized, q, cu_q, cu_k, *, nq, nk, batch, is_causal, pv, attn_mask, return_lse, varlen):
    """The attention kernel on quantized inputs. q: the caller's [B, H, N, D] view (output dtype,
    layout and head dim). Returns (out like q, lse or None)."""
    hq, head_dim = q.shape[1], q.shape[-1]
    kv_group = hq // x.k.shape[1]
    d_pad = _d_pad(head_dim)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if return_lse else None
    mask, mask_kind, mask_strides = _mask_args(attn_mask, q.shape[0], hq, nq, nk)
    config = dict(_launch_config(cuda_capability(q.device.index), d_pad, pv, is_causal))
    block_m = config.pop("block_m")
    _attn._attn_kernel[(triton.cdiv(nq, block_m), hq, batch)](
        x.q, x.k, x.k_residual, x.v, x.q_scale, x.k_scale, x.v_scale, out, lse, x.corr, mask, cu_q, cu_k,
        *_bhn(x.q, varlen), *_bhn(x.k, varlen), *x.v_strides, *_bhn(x.q_scale, varlen)[:2], *_bh(x.k_scale),
        *_bh(x.v_scale), *_bhn(out, varlen), *(_bhn(lse, varlen)[:2] if lse is not None else (0, 0)),
        *mask_strides, nq, nk, kv_group,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=BLOCK_N[pv], D_PAD=d_pad, PV_FP8=pv is PVDtype.FP8,
        IS_CAUSAL=is_causal, MASK_KIND=mask_kind, VARLEN=varlen, RETURN_LSE=return_lse,
        LSE_CORR=x.corr is not None, K_RESIDUAL=x.k_residual is not None,
        **config,
    )  # fmt: skip
    return out, lse


def _forward(q, k, v, km, vmax, cu_q, cu_k, *, nq, nk, batch, is_causal, sm_scale, pv, attn_mask, return_lse,
             quant_backend, varlen):  # fmt: skip
    """Quantize and attend. Returns (out like q, lse or None)."""
    x = quantize(q, k, v, km, vmax, cu_q, cu_k, nq=nq, nk=nk, batch=batch, sm_scale=sm_scale, pv=pv,
                 return_lse=return_lse, quant_backend=quant_backend, varlen=varlen)  # fmt: skip
    return attend(x, q, cu_q, cu_k, nq=nq, nk=nk, batch=batch, is_causal=is_causal, pv=pv,
                  attn_mask=attn_mask, return_lse=return_lse, varlen=varlen)  # fmt: skip


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


__all__ = ["attention_fwd", "varlen_fwd", "kernel_block_sizes", "reference_options", "quantize", "attend"]
