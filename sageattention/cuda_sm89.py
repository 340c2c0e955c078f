"""Launcher of the sm89-family CUDA attention kernel (csrc/sm89), op
``sageattention::qk_int8_sv_f8_attn_sm89``.

One call quantizes with the compiled fused ops and attends:

* Q: INT8 per token (``quant_q_per_token``), its scale carrying ``sm_scale * log2(e)``;
* K: minus its mean over tokens (smooth-K, when asked), INT8 per block of 64 keys
  (``quant_k_per_block``): the kernel's key step, so one scale covers one step;
* V: FP8 e4m3 per channel (scale ``amax / 448``), transposed to [B, Hkv, d_pad, n_pad] with its keys
  permuted within groups of 16 (``quant_v_fp8(..., permute_keys=True)``; the mma.sync m16n8k32
  fragments are laid out as wgmma's, see ``sageattention.reference.permute_keys_sm90``);
* the attention kernel (mma.sync; sm89 and newer), whose output is stored like ``q``.

It computes what ``sage_ref(q, k, v, pv=PVDtype.FP8, block_m=1, block_n=64, ...)`` computes. With
``pv_accum="fp32+fp16"`` the P·V product of each 64-key block accumulates in FP16; V is then quantized
to 448 / 256 of e4m3's range (FP16_ACCUM_V_HEADROOM) so that no block sum can overflow, which keeps
V's e4m3 digits those of the reference except for values below 4 / 448 of their channel's amax.
"""

from __future__ import annotations

import math

import torch

from . import cuda_common, cuda_ops
from .cuda_sm80 import quantize_qk
from .quant import FP8_E4M3_MAX

__all__ = ["attention_sm89", "fp16_accum_available", "KEY_BLOCK", "PV_ACCUMS"]

#: Keys per kernel step and K's INT8 block (one scale per block).
KEY_BLOCK = 64
#: Vᵀ's key dimension is padded to a multiple of this (the permutation group; 16-byte rows).
KEY_GROUP = 16
#: The kernel's P·V accumulations: "fp32" adds every MMA into the running FP32 output; "fp32+fp32"
#: accumulates each 64-key block in fresh FP32 registers and adds them in; "fp32+fp16" does the same
#: with the FP16-accumulating FP8 MMA (twice the MMA rate on sm89 GeForce and workstation GPUs).
PV_ACCUMS = ("fp32", "fp32+fp32", "fp32+fp16")
#: "fp32+fp16": V is quantized with its amax times this: P * 448 <= 448 and |V| <= 448 / 256, so a
#: 64-key block sums to at most 50176 < 65504. A power of two leaves V's e4m3 digits as they are,
#: except for values below 4 / 448 of their channel's amax (below e4m3's normal range).
FP16_ACCUM_V_HEADROOM = 256.0


def fp16_accum_available() -> bool:
    """Whether the built kernels include "fp32+fp16" (the FP16-accumulating FP8 MMA needs CUDA >= 12.8
    at build time). False when the extension is not built."""
    return cuda_ops.fp16_accum_built()


def attention_sm89(q, k, v, *, is_causal: bool, sm_scale: float, smooth_k: bool, return_lse: bool,
                   pv_accum: str = "fp32+fp32", check: bool = True):  # fmt: skip
    """Quantized attention on HND views ([B, H, N, D], any strides with a unit last stride) of
    float16/bfloat16 tensors, D <= 128 and a multiple of 8, Hq a multiple of Hkv. ``pv_accum``: one
    of PV_ACCUMS.

    Returns (out, lse): out [B, Hq, Nq, D] in q's dtype, stored like q; lse [B, Hq, Nq] float32
    (natural log, including the smooth-K correction) or None. ``check=False`` skips the input checks
    (cuda_common.check_qkv) for a caller that has made them already (sageattention's entry points).
    """
    cuda_common.start_call("sm89", q, k, v, check=check, pv_accum=pv_accum, pv_accums=PV_ACCUMS)
    if pv_accum == "fp32+fp16" and not fp16_accum_available():
        raise RuntimeError(
            "pv_accum='fp32+fp16' is not available: sageattention._qattn_sm89 was built with a CUDA older "
            "than 12.8, which lacks the FP16-accumulating FP8 MMA; use 'fp32+fp32'"
        )
    qq, q_scale, kq, k_scale, _, corr = quantize_qk(
        q, k, sm_scale=sm_scale, smooth_k=smooth_k, return_lse=return_lse, residual=False
    )
    vmax = torch.linalg.vector_norm(v, ord=math.inf, dim=2, dtype=torch.float32)
    if pv_accum == "fp32+fp16":
        vmax = vmax * FP16_ACCUM_V_HEADROOM
    n_pad = -(-k.shape[2] // KEY_GROUP) * KEY_GROUP
    vt = cuda_ops.call("quant_v_fp8", v, vmax, cuda_common.d_pad(q.shape[-1]), n_pad, True)
    v_scale = vmax * (1.0 / FP8_E4M3_MAX)
    out_nhd = q.stride(1) < q.stride(2)  # NHD memory in, NHD memory out
    out, lse = cuda_ops.call(
        "qk_int8_sv_f8_attn_sm89", qq, kq, vt, q_scale, k_scale, v_scale, corr, is_causal, return_lse,
        q.dtype, out_nhd, pv_accum,
    )  # fmt: skip
    return out, (lse if return_lse else None)
