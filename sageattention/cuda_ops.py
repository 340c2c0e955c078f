"""Fake (meta) implementations of the compiled attention ops, so torch.compile can trace them.

``torch.library.register_fake`` needs the op's schema, which exists only once the extension that
defines it has loaded; each registration therefore runs only when its extension imports, and the
reason it did not is kept (as ops.py does for the extensions themselves).

Ops covered:

* ``sageattention::qk_int8_sv_f16_attn`` (``sageattention._qattn_sm80``): INT8 Q·Kᵀ, FP16 P·V.
  Returns ``out`` [B, Hq, Nq, D] of ``out_dtype`` (D = ``v.shape[-1]``), whose memory is
  [B, Nq, Hq, D] when ``out_nhd``, and the float32 LSE [B, Hq, Nq] (an empty tensor without
  ``return_lse``).
* ``sageattention::qk_int8_sv_f8_attn_sm90`` (``sageattention._qattn_sm90``): INT8 Q·Kᵀ, FP8 P·V on
  sm_90a. Returns ``out`` [B, Hq, Nq, D] of ``out_dtype`` (D = ``v_scale.shape[-1]``), whose memory
  is [B, Nq, Hq, D] when ``out_nhd``, and the float32 LSE [B, Hq, Nq] (an empty tensor without
  ``return_lse``).
"""

from __future__ import annotations

import importlib

import torch

__all__ = ["registered", "unavailable_reason"]

_SM80_MODULE = "sageattention._qattn_sm80"
_SM90_MODULE = "sageattention._qattn_sm90"

_registered: dict[str, bool] = {}
_reasons: dict[str, str] = {}


def _fake_qk_int8_sv_f16_attn(
    q_int8, k_int8, v, q_scale, k_scale, corr, is_causal, return_lse, out_dtype, out_nhd, pv_accum
):
    b, hq, nq, _ = q_int8.shape
    d = v.shape[-1]
    if out_nhd:
        out = v.new_empty((b, nq, hq, d), dtype=out_dtype).transpose(1, 2)
    else:
        out = v.new_empty((b, hq, nq, d), dtype=out_dtype)
    lse = v.new_empty((b, hq, nq) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def _register_sm80() -> None:
    if _SM80_MODULE in _registered:
        return
    try:
        importlib.import_module(_SM80_MODULE)
    except ImportError as exc:  # not built here, or built against another torch
        _registered[_SM80_MODULE] = False
        _reasons[_SM80_MODULE] = f"{type(exc).__name__}: {exc}"
        return
    torch.library.register_fake("sageattention::qk_int8_sv_f16_attn")(_fake_qk_int8_sv_f16_attn)
    _registered[_SM80_MODULE] = True


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
    _registered[_SM90_MODULE] = True


def registered(module: str = _SM80_MODULE) -> bool:
    """True when the fake implementations of ``module``'s ops are registered."""
    return _registered.get(module, False)


def unavailable_reason(module: str = _SM80_MODULE) -> str | None:
    """Why ``module``'s fakes are not registered (None when they are)."""
    return _reasons.get(module)


_register_sm80()
_register_sm90()
