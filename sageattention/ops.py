"""The implementations that dispatch.py points to, and the torch custom ops around the Triton ones.

* Triton: ``sageattention.triton`` is imported on first use, guarded (it needs the ``triton``
  package, absent on CPU-only machines, Windows and macOS); the reason is kept for
  ``python -m sageattention env``. The two entry points are registered as torch custom ops
  (``sageattention::triton_attn``, ``sageattention::triton_varlen``) with fake implementations, so
  ``torch.compile(fullgraph=True)`` traces them without a graph break. In eager mode they are called
  directly: a custom-op call costs tens of microseconds of Python, which is measurable at short
  sequence lengths.
* Compiled CUDA kernels (``sageattention._qattn_sm80/_sm89/_sm90``): ``cuda_attention`` calls the arch
  family's launcher (cuda_sm80, cuda_sm89, cuda_sm90); whether a module loads and holds code for a GPU
  is the bottom layer's (``extensions``).
* torch SDPA: the fallback, with SageAttention's semantics (layouts, GQA, masks together with
  ``is_causal``, fully masked rows give 0, LSE on request).
"""

from __future__ import annotations

import importlib
import math
import warnings
from types import ModuleType

import torch
import torch.nn.functional as F

from . import cuda_sm80, cuda_sm89, cuda_sm90
from .extensions import (
    COMPILED_EXTENSIONS,
    FUSED_EXTENSION,
    cuda_capability,
    fused_quant_unavailable_reason,
    kernel_image_missing_reason,
)
from .quant import PVDtype

#: ``enable_gqa`` of F.scaled_dot_product_attention exists from torch 2.5 on.
_SDPA_HAS_GQA = torch.__version__ >= (2, 5)
#: Elements of one float32 score block when the fallback computes the LSE (256 MiB).
_LSE_BLOCK_ELEMENTS = 1 << 26

_PV_BY_VALUE = {member.value: member for member in PVDtype}

_triton: list = []  # [module or None, reason or None], filled on first use


# --------------------------------------------------------------------------------------------------
# What is available here


def triton_module() -> ModuleType | None:
    """``sageattention.triton``, imported once; None when it cannot be imported."""
    if not _triton:
        try:
            module, reason = importlib.import_module("sageattention.triton"), None
        except ImportError as exc:  # triton missing, or a triton too old for the kernels
            module, reason = None, f"{type(exc).__name__}: {exc}"
        _triton[:] = [module, reason]
    return _triton[0]


def triton_unavailable_reason() -> str | None:
    """None when the Triton kernels can be imported, else why not."""
    if triton_module() is None:
        return f"the Triton kernels cannot be imported ({_triton[1]})"
    return None


#: pv_accum_dtype (quant.PVAccum values) -> the accumulation each mma.sync kernel runs. None (sageattn
#: without the option) takes the first entry's kernel default below; a value a kernel does not have
#: maps to its nearest (the named variants accept only the kernel's own values, core.py).
_SM80_ACCUM = {"fp32": "fp32", "fp32+fp32": "fp32", "fp16+fp32": "fp16+fp32", "fp16": "fp16+fp32",
               "fp32+fp16": "fp16+fp32"}  # fmt: skip
_SM89_ACCUM = {"fp32": "fp32", "fp32+fp32": "fp32+fp32", "fp32+fp16": "fp32+fp16", "fp16+fp32": "fp32+fp16",
               "fp16": "fp32+fp16"}  # fmt: skip


_fp16_accum_warned: list = []  # the fallback below warns once per process


def _pv_accum(arch: str, options: dict) -> str:
    """The kernel's accumulation for the pv_accum option (a quant.PVAccum or None)."""
    accum = options.get("pv_accum")
    if arch == "sm80":
        return "fp32" if accum is None else _SM80_ACCUM[accum.value]
    # sm89's own default is "fp32+fp16" (FP16 accumulation runs the FP8 MMA at twice the rate on sm89
    # GeForce and workstation GPUs); a build made with CUDA < 12.8 lacks it and runs "fp32+fp32".
    chosen = "fp32+fp16" if accum is None else _SM89_ACCUM[accum.value]
    if chosen == "fp32+fp16" and not cuda_sm89.fp16_accum_available():
        if accum is not None and not torch.compiler.is_compiling() and not _fp16_accum_warned:
            _fp16_accum_warned.append(True)
            warnings.warn(
                f"sageattention: pv_accum_dtype={accum.value!r} runs as 'fp32+fp32': "
                f"sageattention.{COMPILED_EXTENSIONS['sm89']} was built with a CUDA older than 12.8, which "
                "lacks the FP16-accumulating FP8 MMA",
                stacklevel=4,
            )
        chosen = "fp32+fp32"
    return chosen


def cuda_attention(q, k, v, *, arch, attn_mask, is_causal, sm_scale, return_lse, smooth_k, pv, options):
    """Quantized attention on HND views through the compiled kernels of an arch family ("sm80":
    FP16 P·V with two-level K, "sm89": FP8 P·V with mma.sync, "sm90": FP8 P·V with wgmma): (out like q,
    lse or None). ``options["pv_accum"]`` picks the accumulation of the sm80/sm89 kernels (_pv_accum).

    Head dims that are not a multiple of 8 (the kernels store 16-byte rows) go through the Triton
    kernels of the same P·V precision, which compute the same quantized attention. ``attn_mask``: None,
    or on sm90 a key-padding mask (dispatch routes no other)."""
    if attn_mask is not None and arch != "sm90":
        raise AssertionError("dispatch routes masked calls to the Triton kernels or the sm90 kernel")
    if q.shape[-1] % 8:
        return triton_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, sm_scale=sm_scale,
                                return_lse=return_lse, smooth_k=smooth_k, pv=pv, options={})  # fmt: skip
    # The entry points have checked q, k and v (_checks.check_qkv) and dispatch the head dims the kernels
    # take: the launchers need not check them again (check=False).
    # No device switch here: every compiled op holds a CUDAGuard on its inputs' GPU (csrc/bindings.cpp)
    # and the torch reductions in the launchers run where their tensors are. This function is traced
    # by torch.compile, where a Python context manager of our own would break the graph.
    if arch not in _LAUNCHERS:
        valid = ", ".join(COMPILED_EXTENSIONS)
        raise ValueError(f"arch={arch!r} has no compiled kernels; valid values: {valid}")
    module, name = _LAUNCHERS[arch]
    launcher = getattr(module, name)  # looked up at call time: tests put stand-ins there
    if arch == "sm90":
        return launcher(q, k, v, is_causal=is_causal, sm_scale=sm_scale, smooth_k=smooth_k,
                        return_lse=return_lse, check=False, key_mask=attn_mask)  # fmt: skip
    return launcher(q, k, v, is_causal=is_causal, sm_scale=sm_scale, smooth_k=smooth_k, return_lse=return_lse,
                    check=False, pv_accum=_pv_accum(arch, options))  # fmt: skip


#: Each arch family's launcher: (module, function).
_LAUNCHERS = {"sm80": (cuda_sm80, "attention_sm80"), "sm89": (cuda_sm89, "attention_sm89"),
              "sm90": (cuda_sm90, "attention_sm90")}  # fmt: skip


def cuda_call_plan(q, k, v, *, arch, nhd, is_causal, sm_scale, smooth_k, return_lse, key_mask=None):
    """A function of (q, k, v) (and the key mask, with ``key_mask``: a key-padding mask of the signature)
    that computes what ``cuda_attention`` computes for inputs of this signature, in the caller's layout,
    for dispatch.call_plan; None where the arch family has none (only sm90 has: one op, whose arguments
    pack once) or its kernels do not take the head dim."""
    if arch != "sm90" or q.shape[-1] % 8:
        return None
    return cuda_sm90.call_plan(q, k, v, nhd=nhd, is_causal=is_causal, sm_scale=sm_scale, smooth_k=smooth_k,
                               return_lse=return_lse, key_mask=key_mask)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Triton, as custom ops

_ATTN_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool is_causal, float sm_scale, str pv, "
    "bool smooth_k, bool return_lse, str quant_backend) -> (Tensor, Tensor)"
)
_VARLEN_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
    "int max_seqlen_k, bool is_causal, float sm_scale, str pv, bool smooth_k) -> Tensor"
)


def _kernels() -> ModuleType:
    module = triton_module()
    if module is None:
        raise RuntimeError(triton_unavailable_reason())
    return module


def _on_device(q: torch.Tensor):
    """Launch on q's GPU even when another one is current (Triton launches on the current one)."""
    if q.device.type == "cuda" and q.device.index != torch.cuda.current_device():
        return torch.cuda.device(q.device)
    return _NO_CONTEXT


class _NoContext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NO_CONTEXT = _NoContext()


def _triton_attn(q, k, v, attn_mask, is_causal, sm_scale, pv: PVDtype, smooth_k, return_lse, quant_backend):
    with _on_device(q):
        return _kernels().attention_fwd(
            q, k, v, is_causal=is_causal, sm_scale=sm_scale, pv=pv, smooth_k=smooth_k,
            attn_mask=attn_mask, return_lse=return_lse, quant_backend=quant_backend,
        )  # fmt: skip


def _triton_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, sm_scale, pv: PVDtype, smooth_k):
    with _on_device(q):
        return _kernels().varlen_fwd(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max_q,
            max_k,
            is_causal=is_causal,
            sm_scale=sm_scale,
            pv=pv,
            smooth_k=smooth_k,
        )


@torch.library.custom_op("sageattention::triton_attn", mutates_args=(), schema=_ATTN_SCHEMA)
def _triton_attn_op(q, k, v, attn_mask, is_causal, sm_scale, pv, smooth_k, return_lse, quant_backend):
    # Inputs may come back from a compiled graph with other strides; the kernels need a unit last stride.
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out, lse = _triton_attn(
        q, k, v, attn_mask, is_causal, sm_scale, _PV_BY_VALUE[pv], smooth_k, return_lse, quant_backend
    )
    if lse is None:  # an op returns tensors only: "no LSE" is an empty one
        lse = q.new_empty((0,), dtype=torch.float32)
    return out, lse


@_triton_attn_op.register_fake
def _(q, k, v, attn_mask, is_causal, sm_scale, pv, smooth_k, return_lse, quant_backend):
    lse_shape = (q.shape[0], q.shape[1], q.shape[2]) if return_lse else (0,)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("sageattention::triton_varlen", mutates_args=(), schema=_VARLEN_SCHEMA)
def _triton_varlen_op(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, sm_scale, pv, smooth_k):
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    return _triton_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, sm_scale, _PV_BY_VALUE[pv], smooth_k)


@_triton_varlen_op.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, sm_scale, pv, smooth_k):
    return torch.empty_like(q)


def triton_attention(q, k, v, *, attn_mask, is_causal, sm_scale, return_lse, smooth_k, pv, options):
    """Quantized attention on HND views through the Triton kernels: (out like q, lse or None).

    Of the options only ``quantization_backend`` applies: "cuda" quantizes with the compiled fused
    ops (same arithmetic as the Triton quantization kernels, bit for bit) and needs them built.
    """
    quant_backend = options.get("quantization_backend", "triton")
    if quant_backend == "cuda":
        reason = fused_quant_unavailable_reason()
        if reason is None and q.is_cuda and not torch.compiler.is_compiling():
            reason = kernel_image_missing_reason(FUSED_EXTENSION, cuda_capability(q.device.index))
        if reason is not None:
            raise RuntimeError(
                f"quantization_backend='cuda' needs the compiled quantization kernels: {reason}"
            )
    if torch.compiler.is_compiling():
        out, lse = torch.ops.sageattention.triton_attn(
            q, k, v, attn_mask, is_causal, sm_scale, pv.value, smooth_k, return_lse, quant_backend
        )
        return out, (lse if return_lse else None)
    return _triton_attn(q, k, v, attn_mask, is_causal, sm_scale, pv, smooth_k, return_lse, quant_backend)


def triton_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, is_causal, sm_scale, smooth_k, pv, options):
    """Packed-sequence attention through the Triton kernels (K smoothed per sequence)."""
    del options
    if torch.compiler.is_compiling():
        return torch.ops.sageattention.triton_varlen(
            q, k, v, cu_q, cu_k, max_q, max_k, is_causal, sm_scale, pv.value, smooth_k
        )
    return _triton_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, sm_scale, pv, smooth_k)


# --------------------------------------------------------------------------------------------------
# torch SDPA fallback


def _causal_visible(nq: int, nk: int, device) -> torch.Tensor:
    """[Nq, Nk] bool: query i sees keys j <= i (SDPA's top-left alignment)."""
    return torch.ones(nq, nk, dtype=torch.bool, device=device).tril()


def _merge_causal(attn_mask: torch.Tensor, nq: int, nk: int) -> torch.Tensor:
    """One mask holding both attn_mask and the causal mask (SDPA refuses the two together)."""
    visible = _causal_visible(nq, nk, attn_mask.device)
    if attn_mask.dtype == torch.bool:
        return attn_mask & visible
    # where(), not masked_fill(): the mask may broadcast (e.g. [Nq, 1]) and must grow to [.., Nq, Nk]
    return torch.where(visible, attn_mask, -math.inf)


def _rows_with_a_visible_key(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return mask.any(dim=-1, keepdim=True)
    return (mask != -math.inf).any(dim=-1, keepdim=True)


def _expand_kv(x: torch.Tensor, q_heads: int) -> torch.Tensor:
    groups = q_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def sdpa_lse(q, k, attn_mask, is_causal: bool, sm_scale: float) -> torch.Tensor:
    """Natural-log LSE [B, Hq, Nq] (float32) of the scaled, masked scores, in blocks of query rows."""
    b, hq, nq, _ = q.shape
    nk = k.shape[2]
    kf = _expand_kv(k, hq).float().transpose(-1, -2)
    rows = max(1, _LSE_BLOCK_ELEMENTS // max(1, b * hq * nk))
    parts = []
    for start in range(0, nq, rows):
        stop = min(start + rows, nq)
        s = torch.matmul(q[:, :, start:stop].float(), kf) * sm_scale
        if attn_mask is not None:
            m = attn_mask if attn_mask.shape[-2] == 1 else attn_mask[..., start:stop, :]
            s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m.float()
        if is_causal:
            s = s.masked_fill(~_causal_visible(nq, nk, q.device)[start:stop], -math.inf)
        parts.append(torch.logsumexp(s, dim=-1))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def sdpa_attention(q, k, v, *, attn_mask, is_causal, sm_scale, return_lse, **unused):
    """torch SDPA on HND views with SageAttention's semantics: (out, lse or None). Not quantized."""
    del unused  # quantization options mean nothing here
    nq, nk = q.shape[2], k.shape[2]
    mask = attn_mask
    if mask is not None and is_causal:
        mask, is_causal = _merge_causal(mask, nq, nk), False
    extra = {}
    if q.shape[1] != k.shape[1]:
        if _SDPA_HAS_GQA:
            extra["enable_gqa"] = True
        else:
            k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=sm_scale, **extra
    )
    if mask is not None:
        # Rows with no visible key give 0 on every torch version and backend (some give NaN).
        out = out.masked_fill(~_rows_with_a_visible_key(mask), 0.0)
    like_q = torch.empty_like(q)
    if like_q.stride() != out.stride():  # give the caller's memory layout back, as the kernels do
        out = like_q.copy_(out)
    lse = sdpa_lse(q, k, mask, is_causal, sm_scale) if return_lse else None
    return out, lse


def sdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, is_causal, sm_scale, **unused):
    """Packed sequences through torch SDPA, one sequence at a time (reads cu_seqlens on the host)."""
    del max_q, max_k, unused
    out = torch.zeros_like(q)
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for i in range(len(bounds_q) - 1):
        q0, q1, k0, k1 = bounds_q[i], bounds_q[i + 1], bounds_k[i], bounds_k[i + 1]
        if q1 == q0 or k1 == k0:  # no query, or no key to see: the rows stay 0
            continue
        seq_q, seq_k, seq_v = (x.transpose(0, 1).unsqueeze(0) for x in (q[q0:q1], k[k0:k1], v[k0:k1]))
        o, _ = sdpa_attention(seq_q, seq_k, seq_v, attn_mask=None, is_causal=is_causal, sm_scale=sm_scale,
                              return_lse=False)  # fmt: skip
        out[q0:q1] = o[0].transpose(0, 1)
    return out
