"""Argument checks of the public API, in one place, run once per call before any work.

Every error names the argument and says what is valid. The checks read only tensor metadata
(dtype, device, shape, strides), so they cost no device work, never synchronize with the GPU and
trace cleanly under ``torch.compile``. The only value checks are those of ``cu_seqlens_*`` held on
the CPU, where reading them is free.
"""

from __future__ import annotations

import math
import numbers

import torch

from .quant import PVAccum, QKQuantGran, default_sm_scale, parse_enum

#: Largest head dim of the quantized kernels (one 128-wide tile of the head dim).
MAX_HEAD_DIM = 128
#: Input dtypes of every path. float32 is refused everywhere, also where the torch SDPA fallback could
#: take it, so that a call behaves the same on every machine.
INPUT_DTYPES = (torch.float16, torch.bfloat16)
LAYOUTS = ("HND", "NHD")
QUANTIZATION_BACKENDS = ("triton", "cuda")
CU_SEQLENS_DTYPES = (torch.int32, torch.int64)

#: Keyword arguments accepted through ``**kwargs`` by the dense entry points (one set for all, so a
#: dict of options can be passed to any of them).
DENSE_OPTIONS = (
    "attn_mask",
    "qk_quant_gran",
    "pv_accum_dtype",
    "smooth_k",
    "smooth_v",
    "quantization_backend",
)
#: The same for ``sageattn_varlen`` (no mask: packed sequences have their own masking).
VARLEN_OPTIONS = ("qk_quant_gran", "pv_accum_dtype", "smooth_v", "quantization_backend")
#: FlashAttention's names of two parameters, accepted by every entry point: alias -> parameter. Each means
#: exactly the parameter (``causal`` is ``is_causal``, top-left aligned as in torch SDPA).
ALIASES = {"causal": "is_causal", "softmax_scale": "sm_scale"}
_ALIASES_HINT = ", ".join(f"{alias} (= {name})" for alias, name in ALIASES.items())

_DTYPE_HINT = "torch.float16 or torch.bfloat16"


def check_kwargs(caller: str, kwargs: dict, valid: tuple[str, ...]) -> None:
    """Refuse keyword arguments that no entry point knows (a typo must not pass silently)."""
    unknown = [name for name in kwargs if name not in valid]
    if unknown:
        names = ", ".join(repr(n) for n in unknown)
        raise TypeError(
            f"{caller}() got unexpected keyword argument(s) {names}; "
            f"valid extra keyword arguments: {', '.join(valid)}; aliases: {_ALIASES_HINT}"
        )


def resolve_aliases(caller: str, kwargs: dict, is_causal: object, sm_scale: object) -> tuple[object, object]:
    """Take the aliases (``causal``, ``softmax_scale``) out of kwargs: (is_causal, sm_scale).

    A parameter counts as given when it is not at its default (is_causal False, sm_scale None). An
    alias and its parameter both given with different values raise TypeError; the same value twice is
    accepted. Called only when kwargs is not empty.
    """
    if "causal" in kwargs:
        causal = check_flag("causal", kwargs.pop("causal"))
        if check_flag("is_causal", is_causal) and not causal:
            raise TypeError(
                f"{caller}() got is_causal={is_causal!r} and its alias causal=False; give one of them"
            )
        is_causal = causal
    if "softmax_scale" in kwargs:
        scale = kwargs.pop("softmax_scale")
        if scale is not None:
            scale = check_sm_scale(scale, 1, "softmax_scale")
        if sm_scale is not None and (scale is None or check_sm_scale(sm_scale, 1) != scale):
            raise TypeError(
                f"{caller}() got sm_scale={sm_scale!r} and its alias softmax_scale={scale!r}; "
                "give one of them"
            )
        sm_scale = scale
    return is_causal, sm_scale


def check_flag(name: str, value: object) -> bool:
    """A Python bool (ints are taken as truth values; tensors are refused: reading one syncs)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_layout(tensor_layout: object) -> str:
    if tensor_layout not in LAYOUTS:
        raise ValueError(f"tensor_layout={tensor_layout!r} is not supported; valid values: 'HND', 'NHD'")
    return tensor_layout


def _check_tensor(name: str, x: object, ndim: int, shape_doc: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        if x.is_floating_point():
            raise TypeError(
                f"{name} has dtype {x.dtype}; the inputs must be {_DTYPE_HINT}: "
                f"convert with {name}.half() or {name}.bfloat16()"
            )
        raise TypeError(f"{name} has dtype {x.dtype}; the inputs must be floating tensors of {_DTYPE_HINT}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {shape_doc}, got shape {tuple(x.shape)}")


def _check_same(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have the same dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on the same device; got q on {q.device}, k on {k.device}, v on {v.device}"
        )


def _check_last_dim_contiguous(**tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        if x.stride(-1) != 1 and x.shape[-1] != 1:
            raise ValueError(
                f"{name} must have a contiguous last dimension (stride 1), got strides {tuple(x.stride())}; "
                f"pass {name}.contiguous()"
            )


def _check_heads_and_dims(q, k, v, q_heads: int, kv_heads: int) -> int:
    head_dim = q.shape[-1]
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if head_dim < 1:
        raise ValueError(f"head_dim (the last dimension of q) must be at least 1, got {head_dim}")
    if k.shape[-1] != head_dim:
        raise ValueError(
            "q, k and v must have the same head_dim (last dimension); "
            f"got q {head_dim}, k and v {k.shape[-1]}"
        )
    if kv_heads < 1 and q_heads > 0:
        raise ValueError(f"k and v have no heads while q has {q_heads}; k and v need at least 1")
    if kv_heads > 0 and q_heads % kv_heads != 0:
        raise ValueError(
            f"the number of q heads ({q_heads}) must be a multiple of the number of k/v heads ({kv_heads})"
        )
    return head_dim


def check_head_dim_for_kernels(caller: str, head_dim: int) -> None:
    """The named quantized variants refuse what their kernels cannot do (``sageattn`` falls back)."""
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(
            f"{caller}(): head_dim={head_dim} is larger than {MAX_HEAD_DIM}, the largest the quantized "
            "kernels support; use sageattn(), which falls back to torch SDPA for it"
        )


def _valid_dense(q, k, v, tensor_layout: str) -> bool:
    """Whether dense q, k, v pass every check of ``check_qkv``, in one expression: the common case
    costs the host a fraction of the named checks (which run, for their messages, when this is False)."""
    if not (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor):
        return False  # subclasses and non-tensors: the named checks
    dtype, qs, ks = q.dtype, q.shape, k.shape
    if not (dtype in INPUT_DTYPES and k.dtype is dtype and v.dtype is dtype):
        return False
    if len(qs) != 4 or len(ks) != 4:
        return False
    if not (ks == v.shape and q.device == k.device == v.device):
        return False
    h, n = (1, 2) if tensor_layout == "HND" else (2, 1)
    d, hkv = qs[3], ks[h]
    return (
        qs[0] == ks[0]
        and ks[3] == d >= 1
        and qs[h] >= 1
        and hkv >= 1
        and qs[h] % hkv == 0
        and qs[n] >= 1
        and ks[n] >= 1
        and (q.stride(3) == 1 or d == 1)
        and (k.stride(3) == 1 or d == 1)
        and (v.stride(3) == 1 or d == 1)
    )


def check_qkv(q: object, k: object, v: object, tensor_layout: str):
    """Check dense q, k, v and return their HND views ([B, H, N, D]; nothing is copied)."""
    if _valid_dense(q, k, v, tensor_layout):
        if tensor_layout == "HND":
            return q, k, v
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    shape_doc = "([B, H, N, D] for 'HND', [B, N, H, D] for 'NHD')"
    _check_tensor("q", q, 4, shape_doc)
    _check_tensor("k", k, 4, shape_doc)
    _check_tensor("v", v, 4, shape_doc)
    _check_same(q, k, v)
    if tensor_layout == "NHD":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(
            f"q, k and v must have the same batch size; got q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}"
        )
    _check_heads_and_dims(q, k, v, q.shape[1], k.shape[1])
    _check_last_dim_contiguous(q=q, k=k, v=v)
    return q, k, v


def check_sm_scale(sm_scale: object, head_dim: int, name: str = "sm_scale") -> float:
    """The softmax scale as a positive finite Python float (default ``1/sqrt(head_dim)``)."""
    if sm_scale is None:
        return default_sm_scale(head_dim)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"{name} must be a Python float (or None), got {type(sm_scale).__name__}")
    value = float(sm_scale)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be a positive finite number, got {sm_scale!r}")
    return value


def check_attn_mask(attn_mask: object, q: torch.Tensor, nk: int) -> torch.Tensor | None:
    """A bool (True = attend) or floating (additive) mask broadcastable to [B, Hq, Nq, Nk]."""
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(
            f"attn_mask has dtype {attn_mask.dtype}; it must be torch.bool (True = attend) "
            "or a floating dtype (added to the scores)"
        )
    if attn_mask.device != q.device:
        raise ValueError(f"attn_mask must be on the same device as q ({q.device}), got {attn_mask.device}")
    target = (q.shape[0], q.shape[1], q.shape[2], nk)
    shape = tuple(attn_mask.shape)
    ok = 2 <= len(shape) <= 4 and all(m == 1 or m == t for m, t in zip(shape[::-1], target[::-1]))
    if not ok:
        raise ValueError(
            f"attn_mask of shape {shape} is not broadcastable to [batch, q_heads, q_len, kv_len] = "
            f"{list(target)} (it needs 2 to 4 dimensions)"
        )
    return attn_mask


#: What a call's attn_mask is, for the choice of a backend (dispatch.Request.has_mask): none; a key-padding
#: mask (bool, one row of keys per batch entry, broadcast over the heads and the queries, without
#: is_causal); any other.
NO_MASK, KEY_PADDING_MASK, ANY_MASK = 0, 1, 2


def mask_kind(attn_mask: torch.Tensor | None, is_causal: bool) -> int:
    """NO_MASK, KEY_PADDING_MASK or ANY_MASK for a checked mask (check_attn_mask). A key-padding mask has
    size 1 or stride 0 (an expanded view) in its head and query dims; with is_causal it is ANY_MASK:
    the key positions matter then (the sm90 kernel moves the kept keys to the front)."""
    if attn_mask is None:
        return NO_MASK
    if is_causal or attn_mask.dtype != torch.bool:
        return ANY_MASK
    shape, strides = attn_mask.shape, attn_mask.stride()
    for dim in range(max(len(shape) - 3, 0), len(shape) - 1):  # the head and query dims present
        if shape[dim] != 1 and strides[dim] != 0:
            return ANY_MASK
    return KEY_PADDING_MASK


def check_qk_quant_gran(value: object, valid: tuple[str, ...] | None = None) -> QKQuantGran:
    gran = parse_enum(QKQuantGran, value, "qk_quant_gran")
    if valid is not None and gran.value not in valid:
        raise ValueError(f"qk_quant_gran={value!r} is not supported here; valid values: {', '.join(valid)}")
    return gran


def check_pv_accum(value: object, valid: tuple[str, ...] | None = None) -> PVAccum:
    accum = parse_enum(PVAccum, value, "pv_accum_dtype")
    if valid is not None and accum.value not in valid:
        raise ValueError(f"pv_accum_dtype={value!r} is not supported here; valid values: {', '.join(valid)}")
    return accum


def check_quantization_backend(value: object) -> str:
    if value not in QUANTIZATION_BACKENDS:
        raise ValueError(f"quantization_backend={value!r} is not supported; valid values: 'triton', 'cuda'")
    return value


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """Check packed q [Tq, Hq, D], k/v [Tk, Hkv, D] and the sequence bounds.

    Returns (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), the bounds as int32. The
    values of ``cu_seqlens_*`` (starting at 0,
    non-decreasing, ending at the token count, no sequence longer than ``max_seqlen_*``) are checked
    only when they are on the CPU and the call is eager: on a GPU, reading them would synchronize
    the host with the device, and under torch.compile it would break the graph.
    """
    shape_doc = "[total_tokens, heads, head_dim]"
    _check_tensor("q", q, 3, shape_doc)
    _check_tensor("k", k, 3, shape_doc)
    _check_tensor("v", v, 3, shape_doc)
    _check_same(q, k, v)
    _check_heads_and_dims(q, k, v, q.shape[1], k.shape[1])
    _check_last_dim_contiguous(q=q, k=k, v=v)
    cu_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q)
    cu_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q)
    if cu_q.shape[0] != cu_k.shape[0]:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1); "
            f"got {cu_q.shape[0]} and {cu_k.shape[0]}"
        )
    max_q = _check_max_seqlen("max_seqlen_q", max_seqlen_q, q.shape[0])
    max_k = _check_max_seqlen("max_seqlen_k", max_seqlen_k, k.shape[0])
    if cu_q.device.type == "cpu" and not torch.compiler.is_compiling():  # reading values breaks a graph
        _check_cu_values("cu_seqlens_q", cu_q, q.shape[0], "max_seqlen_q", max_q)
        _check_cu_values("cu_seqlens_k", cu_k, k.shape[0], "max_seqlen_k", max_k)
    return cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k


def _check_cu_seqlens(name: str, cu: object, q: torch.Tensor) -> torch.Tensor:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype not in CU_SEQLENS_DTYPES:
        raise TypeError(f"{name} has dtype {cu.dtype}; it must be torch.int32 (torch.int64 is converted)")
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 entries, got shape {tuple(cu.shape)}")
    if cu.device != q.device:
        raise ValueError(f"{name} must be on the same device as q ({q.device}), got {cu.device}")
    return cu


def _check_max_seqlen(name: str, value: object, tokens: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a Python int, got {type(value).__name__}")
    if value < 1 and (tokens > 0 or value < 0):  # 0 only where there are no tokens at all
        raise ValueError(f"{name} must be at least 1 (the input has {tokens} tokens), got {value}")
    return value


def _check_cu_values(name: str, cu: torch.Tensor, total: int, max_name: str, max_len: int) -> None:
    values = cu.tolist()
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    lengths = [b - a for a, b in zip(values[:-1], values[1:])]
    if min(lengths) < 0:
        raise ValueError(f"{name} must be non-decreasing, got {values}")
    if values[-1] != total:
        raise ValueError(f"{name} must end at the number of tokens ({total}), got {values[-1]}")
    if max(lengths) > max_len:
        raise ValueError(
            f"{max_name}={max_len} is smaller than the longest sequence in {name} ({max(lengths)})"
        )
