"""`sageattn3_blackwell`: argument checks, layout handling and the choice of implementation.

Backends, chosen per call by `choose_backend`:

* ``native``: the compiled kernels of ``sageattn3._C`` (NVFP4 quantization and attention), on the
  GPUs a wheel holds SASS for: sm_120a (block-scaled FP4 tensor cores) and sm_100a (FP4 decoded to
  fp16 in registers). The default on compute capability 10.0 and 12.0 when built.
* ``triton``: the Triton kernels (sm80 and newer): the default elsewhere, and the fallback on
  Blackwell when the extension is missing (one warning says why).
* ``reference``: `sage3_ref` on the CPU (slow; the exact recipe).

``SAGEATTN3_BACKEND=native|triton|reference`` forces one (``native`` also on an sm_90a test build,
where the Hopper GPU runs the sm_100a code).
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from . import ops, reference
from .reference import LOG2E, Q_BLOCK, default_sm_scale, to_hnd

#: Head dims the kernels are built for.
HEAD_DIMS = (64, 128)
#: Keys per block of the online softmax (and per block scale of K and V).
BLOCK_N = 128
#: Smallest compute capability the Triton path serves (fp16 mma.sync).
MIN_TRITON_CC = (8, 0)


def _check_tensor(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"{name} must be float16 or bfloat16, got {x.dtype}")
    if x.dim() != 4:
        raise ValueError(f"{name} must have 4 dimensions ([B, H, N, D] or [B, N, H, D]), got {x.dim()}")


def _check_bool(value, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_args(q, k, v, attn_mask, is_causal, per_block_mean, sm_scale, return_lse, tensor_layout) -> float:
    """Validate the public arguments; return the softmax scale to use."""
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_tensor(x, name)
    if tensor_layout not in ("HND", "NHD"):
        raise ValueError(f"tensor_layout={tensor_layout!r} is not supported; valid values: 'HND', 'NHD'")
    for value, name in (
        (is_causal, "is_causal"),
        (per_block_mean, "per_block_mean"),
        (return_lse, "return_lse"),
    ):
        _check_bool(value, name)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k and v must be on the same device, got {q.device}, {k.device}, {v.device}")
    qh, kh, vh = (to_hnd(x, tensor_layout) for x in (q, k, v))
    b, hq, nq, d = qh.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"q: head dim {d} is not supported; supported: {', '.join(map(str, HEAD_DIMS))}")
    if kh.shape[0] != b or kh.shape[3] != d:
        raise ValueError(
            f"k must have q's batch size and head dim, got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if vh.shape != kh.shape:
        raise ValueError(f"v must have k's shape, got k {tuple(k.shape)}, v {tuple(v.shape)}")
    hkv, nk = kh.shape[1], kh.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(
            f"k: the number of q heads ({hq}) must be a multiple of the number of kv heads ({hkv})"
        )
    if nq == 0 or nk == 0 or b == 0:
        raise ValueError(f"q and k must have at least one batch, token and head, got q {tuple(q.shape)}")
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(f"attn_mask must be bool or floating point, got {attn_mask.dtype}")
        if attn_mask.device != q.device:
            raise ValueError(f"attn_mask must be on {q.device}, got {attn_mask.device}")
        if is_causal:
            raise ValueError("attn_mask and is_causal cannot both be set (as in SDPA)")
        try:
            torch.broadcast_shapes(attn_mask.shape, (b, hq, nq, nk))
        except RuntimeError:
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to [B, Hq, Nq, Nk] = "
                f"{[b, hq, nq, nk]}"
            ) from None
    if sm_scale is None:
        return default_sm_scale(d)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale must be a float or None, got {type(sm_scale).__name__}")
    if not (math.isfinite(sm_scale) and sm_scale > 0):
        raise ValueError(f"sm_scale must be a finite positive number, got {sm_scale}")
    return float(sm_scale)


#: Compute capabilities whose default is the compiled kernels (the wheel's sm_100a and sm_120a targets).
NATIVE_DEFAULT_CC = ((10, 0), (12, 0))
BACKENDS = ("native", "triton", "reference")
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def choose_backend(device: torch.device) -> str:
    """'native', 'triton' or 'reference' for tensors on `device` (see the module docstring)."""
    forced = os.environ.get("SAGEATTN3_BACKEND", "").strip().lower()
    if forced and forced not in BACKENDS:
        raise ValueError(
            f"SAGEATTN3_BACKEND={forced!r} is not supported; valid values: {', '.join(BACKENDS)}"
        )
    if device.type != "cuda" or forced == "reference":
        return "reference"
    cc = torch.cuda.get_device_capability(device)
    if forced == "native" or (not forced and cc in NATIVE_DEFAULT_CC):
        reason = ops.unavailable_reason(device)
        if reason is None:
            return "native"
        if forced == "native":
            raise RuntimeError(f"SAGEATTN3_BACKEND=native: the compiled kernels cannot run here: {reason}")
        _warn_once(f"sageattn3: using the Triton kernels instead of the compiled ones: {reason}")
    if cc >= MIN_TRITON_CC:
        return "triton"
    return "reference"


def sageattn3_blackwell(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    per_block_mean: bool = True,
    *,
    sm_scale: float | None = None,
    return_lse: bool = False,
    tensor_layout: str = "HND",
):
    """NVFP4 attention: Q, K, P and V in FP4 (E2M1) with an E4M3 scale per 16 elements.

    q: [B, Hq, Nq, D] ("HND") or [B, Nq, Hq, D] ("NHD"), float16 or bfloat16, D in {64, 128}.
    k, v: [B, Hkv, Nk, D] (or NHD), Hq a multiple of Hkv (grouped-query attention).
    attn_mask: optional bool (True = keep) or additive float mask broadcastable to
    [B, Hq, Nq, Nk]; is_causal: SDPA's top-left causal mask. per_block_mean: smooth Q by the
    mean of each block of 128 query rows (more accurate; the default).

    Returns the output in q's dtype and layout, and with ``return_lse`` also the natural-log
    LSE [B, Hq, Nq] in float32. The inputs are never modified.
    """
    scale = check_args(q, k, v, attn_mask, is_causal, per_block_mean, sm_scale, return_lse, tensor_layout)
    backend = choose_backend(q.device)
    if backend == "native":
        return _native_forward(
            q, k, v, attn_mask, is_causal, per_block_mean, scale, return_lse, tensor_layout
        )
    if backend == "reference":
        res = reference.sage3_ref(
            q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=scale, attn_mask=attn_mask,
            per_block_mean=per_block_mean, block_n=BLOCK_N, return_lse=return_lse,
        )  # fmt: skip
        if return_lse:
            return res[0].to(q.dtype), res[1]
        return res.to(q.dtype)
    return _triton_forward(q, k, v, attn_mask, is_causal, per_block_mean, scale, return_lse, tensor_layout)


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _grouped_matmul(a: torch.Tensor, bt: torch.Tensor) -> torch.Tensor:
    """a [B, Hq, M, D] @ bt [B, Hkv, D, N] with Hq = G * Hkv (query head h uses kv head h // G)."""
    b, hq, m, d = a.shape
    hkv = bt.shape[1]
    out = a.reshape(b, hkv, (hq // hkv) * m, d) @ bt
    return out.reshape(b, hq, m, bt.shape[-1])


def _triton_forward(q, k, v, attn_mask, is_causal, per_block_mean, sm_scale, return_lse, tensor_layout):
    from .triton import attention, quant

    qh, kh, vh = (_last_contiguous(to_hnd(x, tensor_layout)) for x in (q, k, v))
    b, hq, nq, d = qh.shape
    nk = kh.shape[2]
    with torch.cuda.device(q.device):
        qq = quant.quantize_q(qh, per_block_mean)
        kq = quant.quantize_k(kh, BLOCK_N)
        vq = quant.quantize_vt(vh, BLOCK_N)
        k_mean = kq[3]
        corr = _smoothing_correction(qq[3], kh, k_mean) if per_block_mean else None
        out = torch.empty_like(q)  # the caller's layout
        lse = attention.attention_fp4(
            qq, kq, vq, nq=nq, nk=nk, corr=corr, attn_mask=attn_mask, is_causal=is_causal, sm_scale=sm_scale,
            out=to_hnd(out, tensor_layout), return_lse=return_lse, block_n=BLOCK_N,
        )  # fmt: skip
    if not return_lse:
        return out
    # The softmax ignored the per-row constant q . k_mean; the LSE needs it back.
    q_km = _grouped_matmul(qh.float(), k_mean.unsqueeze(-1)).squeeze(-1)
    return out, lse + sm_scale * q_km


def _smoothing_correction(q_mean: torch.Tensor, kh: torch.Tensor, k_mean: torch.Tensor) -> torch.Tensor:
    """q_mean . (k - k_mean) [B, Hq, nblk_q, Nk]: exact products summed in float64, rounded once (as
    the reference)."""
    k_smooth = (kh.double() - k_mean.double().unsqueeze(2)).transpose(-1, -2)
    return _grouped_matmul(q_mean.double(), k_smooth).float().contiguous()


def _native_forward(q, k, v, attn_mask, is_causal, per_block_mean, sm_scale, return_lse, tensor_layout):
    """The compiled kernels: NVFP4 quantization of Q, K (smoothed) and V^T, then the attention kernel."""
    qh, kh, vh = (_last_contiguous(to_hnd(x, tensor_layout)) for x in (q, k, v))
    b, hq, nq, _ = qh.shape
    nk = kh.shape[2]
    kernels = torch.ops.sageattn3
    with torch.cuda.device(q.device):
        q_codes, q_scales, q_gs, q_mean = kernels.quant_nvfp4_rows(
            qh, Q_BLOCK, 2 if per_block_mean else 0, None
        )
        k_mean = torch.mean(kh, dim=2, dtype=torch.float32)
        k_codes, k_scales, k_gs, _ = kernels.quant_nvfp4_rows(kh, BLOCK_N, 1, k_mean)
        v_codes, v_scales, v_gs = kernels.quant_nvfp4_vt(vh, BLOCK_N)
        corr = _smoothing_correction(q_mean, kh, k_mean) if per_block_mean else None
        mask = None
        if attn_mask is not None:
            # Convert the (small, broadcastable) mask first, then expand: stride 0 on broadcast dims.
            small = attn_mask if attn_mask.dtype in (torch.bool, torch.float32) else attn_mask.float()
            mask = small.expand(b, hq, nq, nk)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # the caller's layout
        lse = kernels.attn_nvfp4(
            q_codes, q_scales, q_gs, k_codes, k_scales, k_gs, v_codes, v_scales, v_gs, corr, mask,
            to_hnd(out, tensor_layout), nq, nk, is_causal, sm_scale * LOG2E, return_lse,
        )  # fmt: skip
    if not return_lse:
        return out
    # The softmax ignored the per-row constant q . k_mean; the LSE needs it back.
    q_km = _grouped_matmul(qh.float(), k_mean.unsqueeze(-1)).squeeze(-1)
    return out, lse + sm_scale * q_km


__all__ = [
    "sageattn3_blackwell",
    "check_args",
    "choose_backend",
    "BACKENDS",
    "HEAD_DIMS",
    "BLOCK_N",
    "Q_BLOCK",
]
