"""Fake (meta) implementations of the compiled attention ops, so torch.compile can trace them.

``torch.library.register_fake`` needs the op's schema, which exists only once the extension that
defines it has loaded; each registration therefore runs only when its extension imports, and the
reason it did not is kept (as ops.py does for the extensions themselves).

Ops covered:

* ``sageattention::quant_q_per_token``, ``quant_k_per_block``, ``quant_v_fp8``, ``quant_qkv_sm90``
  (``sageattention._fused``): the fused quantization ops. ``quant_k_per_block`` returns a list:
  [k_int8, k_scale], plus K's second INT8 digit with ``residual=True``. ``quant_qkv_sm90`` quantizes
  Q, K and V for the sm_90a kernel in one launch (two for long sequences) and returns (q_int8,
  q_scale, corr, k_int8, k_scale, vt, v_scale, k_mean).
* ``sageattention::qk_int8_sv_f16_attn`` (``sageattention._qattn_sm80``): INT8 Q·Kᵀ (optionally
  two-level K), FP16 P·V. Returns ``out`` [B, Hq, Nq, D] of ``out_dtype`` (D = ``v.shape[-1]``),
  whose memory is [B, Nq, Hq, D] when ``out_nhd``, and the float32 LSE [B, Hq, Nq] (an empty tensor
  without ``return_lse``).
* ``sageattention::qk_int8_sv_f8_attn_sm89`` (``sageattention._qattn_sm89``): INT8 Q·Kᵀ, FP8 P·V
  with mma.sync (sm89 and newer). Returns as the sm90 op below.
* ``sageattention::qk_int8_sv_f8_attn_sm90`` (``sageattention._qattn_sm90``): INT8 Q·Kᵀ, FP8 P·V on
  sm_90a. Returns ``out`` [B, Hq, Nq, D] of ``out_dtype`` (D = ``v_scale.shape[-1]``), whose memory
  is [B, Nq, Hq, D] when ``out_nhd``, and the float32 LSE [B, Hq, Nq] (an empty tensor without
  ``return_lse``).
* ``sageattention::attn_sm90`` (``sageattention._qattn_sm90``): the whole sm_90a call from Q, K and V
  (``quant_qkv_sm90``, then ``qk_int8_sv_f8_attn_sm90``). Returns as that op, ``out`` of q's dtype
  and head dim.
"""

from __future__ import annotations

import importlib

import torch

__all__ = ["registered", "unavailable_reason"]

_FUSED_MODULE = "sageattention._fused"
_SM80_MODULE = "sageattention._qattn_sm80"
_SM89_MODULE = "sageattention._qattn_sm89"
_SM90_MODULE = "sageattention._qattn_sm90"

_registered: dict[str, bool] = {}
_reasons: dict[str, str] = {}


def _import(module: str) -> bool:
    """Import ``module`` once; False (with the reason kept) when it cannot be imported."""
    if module in _registered:
        return False  # done before: registered, or failed with its reason kept
    try:
        importlib.import_module(module)
    except ImportError as exc:  # not built here, or built against another torch
        _registered[module] = False
        _reasons[module] = f"{type(exc).__name__}: {exc}"
        return False
    return True


def _attn_outputs(like, b, hq, nq, d, out_dtype, out_nhd, return_lse):
    if out_nhd:
        out = like.new_empty((b, nq, hq, d), dtype=out_dtype).transpose(1, 2)
    else:
        out = like.new_empty((b, hq, nq, d), dtype=out_dtype)
    lse = like.new_empty((b, hq, nq) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def _fake_quant_q_per_token(q, k_mean, sm_scale, scale_mul, d_pad, kv_group, with_corr):
    b, h, n, _ = q.shape
    q_int8 = q.new_empty((b, h, n, d_pad), dtype=torch.int8)
    q_scale = q.new_empty((b, h, n), dtype=torch.float32)
    corr = q.new_empty((b if with_corr else 0, h, n), dtype=torch.float32)
    return q_int8, q_scale, corr


def _fake_quant_k_per_block(k, k_mean, block, d_pad, residual=False):
    b, h, n, _ = k.shape
    k_int8 = k.new_empty((b, h, n, d_pad), dtype=torch.int8)
    k_scale = k.new_empty((b, h, -(-n // block)), dtype=torch.float32)
    return [k_int8, k_scale, torch.empty_like(k_int8)] if residual else [k_int8, k_scale]


def _fake_quant_v_fp8(v, v_amax, d_pad, n_pad, permute_keys=False):
    b, h = v.shape[:2]
    return v.new_empty((b, h, d_pad, n_pad), dtype=torch.float8_e4m3fn)


def _fake_quant_qkv_sm90(q, k, v, smooth_k, sm_scale, scale_mul, d_pad, with_corr):
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    n_pad = -(-nk // 16) * 16
    f32 = torch.float32
    return (
        q.new_empty((b, hq, nq, d_pad), dtype=torch.int8),
        q.new_empty((b, hq, nq), dtype=f32),
        q.new_empty((b if with_corr else 0, hq, nq), dtype=f32),
        q.new_empty((b, hkv, nk, d_pad), dtype=torch.int8),
        q.new_empty((b, hkv, -(-nk // 128)), dtype=f32),
        q.new_empty((b, hkv, d_pad, n_pad), dtype=torch.float8_e4m3fn),
        q.new_empty((b, hkv, d), dtype=f32),
        q.new_empty((b, hkv, d) if smooth_k else (0,), dtype=f32),
    )


def _register_fused() -> None:
    if not _import(_FUSED_MODULE):
        return
    torch.library.register_fake("sageattention::quant_q_per_token")(_fake_quant_q_per_token)
    torch.library.register_fake("sageattention::quant_k_per_block")(_fake_quant_k_per_block)
    torch.library.register_fake("sageattention::quant_v_fp8")(_fake_quant_v_fp8)
    torch.library.register_fake("sageattention::quant_qkv_sm90")(_fake_quant_qkv_sm90)
    _registered[_FUSED_MODULE] = True


def _fake_qk_int8_sv_f16_attn(
    q_int8,
    k_int8,
    v,
    q_scale,
    k_scale,
    corr,
    is_causal,
    return_lse,
    out_dtype,
    out_nhd,
    pv_accum,
    k_residual=None,
):
    b, hq, nq, _ = q_int8.shape
    return _attn_outputs(v, b, hq, nq, v.shape[-1], out_dtype, out_nhd, return_lse)


def _register_sm80() -> None:
    if not _import(_SM80_MODULE):
        return
    torch.library.register_fake("sageattention::qk_int8_sv_f16_attn")(_fake_qk_int8_sv_f16_attn)
    _registered[_SM80_MODULE] = True


def _fake_qk_int8_sv_f8_attn_sm89(
    q_int8,
    k_int8,
    vt_fp8,
    q_scale,
    k_scale,
    v_scale,
    corr,
    is_causal,
    return_lse,
    out_dtype,
    out_nhd,
    pv_accum,
):
    b, hq, nq, _ = q_int8.shape
    return _attn_outputs(q_int8, b, hq, nq, v_scale.shape[-1], out_dtype, out_nhd, return_lse)


def _register_sm89() -> None:
    if not _import(_SM89_MODULE):
        return
    torch.library.register_fake("sageattention::qk_int8_sv_f8_attn_sm89")(_fake_qk_int8_sv_f8_attn_sm89)
    _registered[_SM89_MODULE] = True


def _fake_qk_int8_sv_f8_attn_sm90(
    q_int8, k_int8, vt_fp8, q_scale, k_scale, v_scale, corr, is_causal, return_lse, out_dtype, out_nhd
):
    b, hq, nq, _ = q_int8.shape
    d = v_scale.shape[-1]
    if out_nhd:
        out = q_int8.new_empty((b, nq, hq, d), dtype=out_dtype).transpose(1, 2)
    else:
        out = q_int8.new_empty((b, hq, nq, d), dtype=out_dtype)
    lse = q_int8.new_empty((b, hq, nq) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def _fake_attn_sm90(q, k, v, is_causal, sm_scale, scale_mul, d_pad, smooth_k, return_lse, out_nhd):
    b, hq, nq, d = q.shape
    return _attn_outputs(q, b, hq, nq, d, q.dtype, out_nhd, return_lse)


def _register_sm90() -> None:
    if _SM90_MODULE in _registered:
        return
    try:
        importlib.import_module(_SM90_MODULE)
    except ImportError as exc:  # not built here (sm_90a only), or built against another torch
        _registered[_SM90_MODULE] = False
        _reasons[_SM90_MODULE] = f"{type(exc).__name__}: {exc}"
        return
    torch.library.register_fake("sageattention::qk_int8_sv_f8_attn_sm90")(_fake_qk_int8_sv_f8_attn_sm90)
    torch.library.register_fake("sageattention::attn_sm90")(_fake_attn_sm90)
    _registered[_SM90_MODULE] = True


def registered(module: str = _SM80_MODULE) -> bool:
    """True when the fake implementations of ``module``'s ops are registered."""
    return _registered.get(module, False)


def unavailable_reason(module: str = _SM80_MODULE) -> str | None:
    """Why ``module``'s fakes are not registered (None when they are)."""
    return _reasons.get(module)


_register_fused()
_register_sm80()
_register_sm89()
_register_sm90()
