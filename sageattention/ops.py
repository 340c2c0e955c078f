"""The implementations that dispatch.py points to, and the torch custom ops around the Triton ones.

* Triton: ``sageattention.triton`` is imported on first use, guarded (it needs the ``triton``
  package, absent on CPU-only machines, Windows and macOS); the reason is kept for
  ``python -m sageattention env``. The two entry points are registered as torch custom ops
  (``sageattention::triton_attn``, ``sageattention::triton_varlen``) with fake implementations, so
  ``torch.compile(fullgraph=True)`` traces them without a graph break. In eager mode they are called
  directly: a custom-op call costs tens of microseconds of Python, which is measurable at short
  sequence lengths.
* Compiled CUDA extensions (``sageattention._qattn_sm80/_sm89/_sm90``): loaded through ``_native``
  (a plain C ABI, no libtorch), their ops defined by ``cuda_ops``; the reason one is missing is kept.
  The wheel's record of the archs each one holds code for
  (``_build_info.json``) tells whether it runs on a given GPU (one without code is passed over).
* torch SDPA: the fallback, with SageAttention's semantics (layouts, GQA, masks together with
  ``is_causal``, fully masked rows give 0, LSE on request).
"""

from __future__ import annotations

import functools
import importlib
import math
import re
import warnings
from types import ModuleType

import torch
import torch.nn.functional as F

from . import _native, cuda_ops
from .quant import PVDtype

#: The compiled extensions, by the arch family their kernels were written for.
COMPILED_EXTENSIONS = {"sm80": "_qattn_sm80", "sm89": "_qattn_sm89", "sm90": "_qattn_sm90"}
#: The compiled fused quantization ops (torch.ops.sageattention.quant_*), for every built arch.
FUSED_EXTENSION = "_fused"

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


def _import_extension(module: str) -> tuple[_native.Library | None, str | None]:
    """(the module's functions, None) when ``sageattention.<module>`` loads and its ops are defined, else
    (None, why not); once (cuda_ops.register)."""
    if cuda_ops.register(module):
        return _native.load(module)[0], None
    return None, cuda_ops.unavailable_reason(module)


def extension_status(arch: str) -> tuple[_native.Library | None, str | None]:
    """(module, None) when ``sageattention._qattn_<arch>`` loads, else (None, why not)."""
    return _import_extension(COMPILED_EXTENSIONS[arch])


def build_info() -> dict:
    """What the build compiled, for which archs (``_native.build_info``, the wheel's
    ``_build_info.json``)."""
    return _native.build_info()


@functools.cache  # a handful of (arch, GPU) pairs; asked on every quantization_backend="cuda" call
def sass_runs_on(arch: str, capability: tuple) -> bool:
    """Whether SASS built for ``arch`` ("8.6", "9.0a", "10.0f") loads on a GPU of compute capability
    ``capability``: one of the same major and at least its minor; an arch-specific build ("a") only
    on that very arch. (The builds embed SASS alone, no PTX.) An arch of another form counts as
    runnable: the driver decides."""
    match = re.fullmatch(r"(\d+)\.(\d+)([af]?)", arch)
    if match is None:
        return True
    major, minor = int(match[1]), int(match[2])
    if match[3] == "a":
        return tuple(capability) == (major, minor)
    return capability[0] == major and capability[1] >= minor


@functools.cache
def cuda_capability(index: int) -> tuple[int, int]:
    """(major, minor) of CUDA device ``index``, queried once per process (the query costs about a
    microsecond, on every call that asked it); ``cuda_capability.cache_clear()`` forgets it."""
    return tuple(torch.cuda.get_device_capability(index))


def kernel_image_missing_reason(module: str, capability: tuple) -> str | None:
    """Why ``sageattention.<module>`` holds no code for a GPU of ``capability`` (None: it holds some,
    or the build left no record of its archs)."""
    archs = build_info().get("extensions", {}).get(f"sageattention.{module}")
    if not archs or any(sass_runs_on(arch, capability) for arch in archs):
        return None
    gpu = f"{capability[0]}.{capability[1]}"
    wanted = gpu + ("a" if capability[0] >= 9 else "")  # the builds name sm90 and newer arch-specific
    return (
        f"sageattention.{module} holds no code for this GPU ({gpu}; built for {', '.join(archs)}); a build "
        f"with {wanted} in TORCH_CUDA_ARCH_LIST has it"
    )


def cuda_image_missing_reason(arch: str, capability: tuple) -> str | None:
    """Why an arch family's kernels, or the fused quantization ops they read, hold no code for a GPU
    of ``capability`` (None: both do, as far as the build's record tells)."""
    return kernel_image_missing_reason(COMPILED_EXTENSIONS[arch], capability) or kernel_image_missing_reason(
        FUSED_EXTENSION, capability
    )


def fused_quant_unavailable_reason() -> str | None:
    """None when the compiled fused quantization ops (``sageattention._fused``) load, else why not."""
    module, reason = _import_extension(FUSED_EXTENSION)
    return None if module is not None else f"sageattention.{FUSED_EXTENSION} could not be imported ({reason})"


#: Arch families whose compiled kernels serve ``sageattn`` (and the named CUDA variants) in this version.
WIRED_EXTENSIONS = ("sm80", "sm89", "sm90")


def cuda_unavailable_reason(arch: str) -> str | None:
    """Why the compiled kernels of an arch family cannot serve ``sageattn`` here (None: they can)."""
    module, reason = extension_status(arch)
    if module is None:
        return f"sageattention.{COMPILED_EXTENSIONS[arch]} could not be imported ({reason})"
    if arch not in WIRED_EXTENSIONS:
        return f"sageattention.{COMPILED_EXTENSIONS[arch]} is present but not wired to the Python API yet"
    return fused_quant_unavailable_reason()  # the kernels read what the fused quantization ops write


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
    from .cuda_sm89 import fp16_accum_available  # noqa: PLC0415 - reads the built extension

    # sm89's own default is "fp32+fp16" (FP16 accumulation runs the FP8 MMA at twice the rate on sm89
    # GeForce and workstation GPUs); a build made with CUDA < 12.8 lacks it and runs "fp32+fp32".
    chosen = "fp32+fp16" if accum is None else _SM89_ACCUM[accum.value]
    if chosen == "fp32+fp16" and not fp16_accum_available():
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
    kernels of the same P·V precision, which compute the same quantized attention."""
    if attn_mask is not None:
        raise AssertionError("dispatch routes masked calls to the Triton kernels")
    if q.shape[-1] % 8:
        return triton_attention(q, k, v, attn_mask=None, is_causal=is_causal, sm_scale=sm_scale,
                                return_lse=return_lse, smooth_k=smooth_k, pv=pv, options={})  # fmt: skip
    # The entry points have checked q, k and v (_checks.check_qkv) and dispatch the head dims the kernels
    # take: the launchers need not check them again (check=False).
    # No device switch here: every compiled op holds a CUDAGuard on its inputs' GPU (csrc/bindings.cpp)
    # and the torch reductions in the launchers run where their tensors are. This function is traced
    # by torch.compile, where a Python context manager of our own would break the graph.
    launcher = _launchers.get(arch)
    if launcher is None:
        launcher = _launcher(arch)
    if arch == "sm90":
        return launcher(q, k, v, is_causal=is_causal, sm_scale=sm_scale, smooth_k=smooth_k,
                        return_lse=return_lse, check=False)  # fmt: skip
    return launcher(q, k, v, is_causal=is_causal, sm_scale=sm_scale, smooth_k=smooth_k, return_lse=return_lse,
                    check=False, pv_accum=_pv_accum(arch, options))  # fmt: skip


def cuda_call_plan(q, k, v, *, arch, nhd, is_causal, sm_scale, smooth_k, return_lse):
    """A function of (q, k, v) that computes what ``cuda_attention`` computes for inputs of this signature,
    in the caller's layout, for dispatch.call_plan; None where the arch family has none (only sm90 has:
    one op, whose arguments pack once) or its kernels do not take the head dim."""
    if arch != "sm90" or q.shape[-1] % 8:
        return None
    from .cuda_sm90 import call_plan  # noqa: PLC0415 - see _launcher

    return call_plan(q, k, v, nhd=nhd, is_causal=is_causal, sm_scale=sm_scale, smooth_k=smooth_k,
                     return_lse=return_lse)  # fmt: skip


_launchers: dict = {}  # arch -> its launcher, imported on the first call (an import costs a microsecond)


def _launcher(arch: str):
    """The launcher of an arch family, imported once. Imports here, not at the top: the launchers import
    cuda_common, which imports this module. (Import statements, which torch.compile traces;
    importlib.import_module it would not.)"""
    if arch == "sm80":
        from .cuda_sm80 import attention_sm80 as launcher  # noqa: PLC0415
    elif arch == "sm89":
        from .cuda_sm89 import attention_sm89 as launcher  # noqa: PLC0415
    elif arch == "sm90":
        from .cuda_sm90 import attention_sm90 as launcher  # noqa: PLC0415
    else:
        raise ValueError(
            f"arch={arch!r} has no compiled kernels; valid values: {', '.join(COMPILED_EXTENSIONS)}"
        )
    _launchers[arch] = launcher
    return launcher


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
