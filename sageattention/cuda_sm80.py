"""Launcher of the sm80-family CUDA attention kernel (csrc/sm80, op ``sageattention::qk_int8_sv_f16_attn``).

One call quantizes with the compiled fused ops and attends:

* Q: INT8 per token (``quant_q_per_token``), its scale carrying ``sm_scale * log2(e)``;
* K: minus its mean over tokens (smooth-K, when asked), two INT8 digits per block of 64 keys
  (``quant_k_per_block(..., residual=True)``, see ``sageattention.quant.K_RESIDUAL_MUL``): the kernel's
  key step, so one scale covers one step;
* V: FP16 as it is (bf16 is converted);
* the attention kernel (mma.sync, runs on every GPU from sm80 on), whose output is stored like ``q``
  (NHD memory for an NHD caller).

It computes what ``sage_ref(q, k, v, pv=PVDtype.FP16, block_m=1, block_n=64, k_residual=True, ...)``
computes.
"""

from __future__ import annotations

import torch

from . import cuda_common, cuda_ops
from .quant import INT8_MAX, LOG2E

__all__ = ["attention_sm80", "KEY_BLOCK", "PV_ACCUMS"]

#: Keys per kernel step and K's INT8 block (one scale per block).
KEY_BLOCK = 64
#: The kernel's P·V accumulations: FP32 throughout, or FP16 inside a 64-key block added into FP32.
PV_ACCUMS = ("fp32", "fp16+fp32")


def quantize_qk(q, k, *, sm_scale: float, smooth_k: bool, return_lse: bool, residual: bool):
    """INT8 Q per token and K per 64-key block with the fused ops: (qq, q_scale, kq, k_scale, kr or None,
    corr or None); kr is K's second digit when ``residual``."""
    hq, hkv, head_dim = q.shape[1], k.shape[1], q.shape[-1]
    d_pad = cuda_common.d_pad(head_dim)
    km = k.mean(dim=2, dtype=torch.float32) if smooth_k else None
    with_corr = return_lse and smooth_k
    scale_mul = sm_scale * LOG2E / INT8_MAX
    qq, q_scale, corr = cuda_ops.call(
        "quant_q_per_token", q, km, sm_scale, scale_mul, d_pad, hq // hkv, with_corr
    )
    quantized_k = cuda_ops.call("quant_k_per_block", k, km, KEY_BLOCK, d_pad, residual)
    kq, k_scale = quantized_k[0], quantized_k[1]
    kr = quantized_k[2] if residual else None
    return qq, q_scale, kq, k_scale, kr, (corr if with_corr else None)


def attention_sm80(q, k, v, *, is_causal: bool, sm_scale: float, smooth_k: bool, return_lse: bool,
                   pv_accum: str = "fp32", check: bool = True):  # fmt: skip
    """Quantized attention on HND views ([B, H, N, D], any strides with a unit last stride) of
    float16/bfloat16 tensors, D <= 128 and a multiple of 8, Hq a multiple of Hkv. ``pv_accum``: one
    of PV_ACCUMS.

    Returns (out, lse): out [B, Hq, Nq, D] in q's dtype, stored like q; lse [B, Hq, Nq] float32
    (natural log, including the smooth-K correction) or None. ``check=False`` skips the input checks
    (cuda_common.check_qkv) for a caller that has made them already (sageattention's entry points).
    """
    cuda_common.start_call("sm80", q, k, v, check=check, pv_accum=pv_accum, pv_accums=PV_ACCUMS)
    qq, q_scale, kq, k_scale, kr, corr = quantize_qk(
        q, k, sm_scale=sm_scale, smooth_k=smooth_k, return_lse=return_lse, residual=True
    )
    vh = v if v.dtype == torch.float16 else v.to(torch.float16)
    out_nhd = q.stride(1) < q.stride(2)  # NHD memory in, NHD memory out
    out, lse = cuda_ops.call(
        "qk_int8_sv_f16_attn",
        qq,
        kq,
        vh,
        q_scale,
        k_scale,
        corr,
        is_causal,
        return_lse,
        q.dtype,
        out_nhd,
        pv_accum,
        kr,
    )
    return out, (lse if return_lse else None)
