"""The public functions: ``sageattn``, ``sageattn_varlen`` and the named variants.

All of them run through one path: check the arguments once (``_checks``), view the inputs as HND,
ask ``dispatch.select`` for the backend (the named variants force theirs), call it, and give the
output back in the caller's layout and dtype.

The docstrings are assembled from one table of parameter descriptions, following each function's
signature, so every parameter is documented the same way everywhere and defaults are read from
the signature itself.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from . import autograd, dispatch
from ._checks import (
    DENSE_OPTIONS,
    MAX_HEAD_DIM,
    VARLEN_OPTIONS,
    check_attn_mask,
    check_flag,
    check_head_dim_for_kernels,
    check_kwargs,
    check_layout,
    check_pv_accum,
    check_qk_quant_gran,
    check_qkv,
    check_quantization_backend,
    check_sm_scale,
    check_varlen,
    mask_kind,
    resolve_aliases,
)

#: Values of the options a caller did not give (None: the backend's own choice).
_OPTION_DEFAULTS = {
    "attn_mask": None,
    "qk_quant_gran": None,
    "pv_accum_dtype": None,
    "smooth_k": True,
    "smooth_v": False,
    "quantization_backend": "triton",
}

# pv_accum_dtype / qk_quant_gran accepted by each compiled kernel family (as the established API).
# qk_quant_gran is accepted for compatibility only: the kernels quantize Q per token and K per key
# block whichever is given (finer than the established per-warp/per-thread scales). The FP16 kernel has
# no "fp16" (whole-sequence FP16 accumulation): "fp16+fp32" is its fast mode.
_CUDA_GRANS = ("per_warp", "per_thread")
_FP16_CUDA_ACCUMS = ("fp32", "fp16+fp32")
_FP8_CUDA_ACCUMS = ("fp32+fp16", "fp32+fp32", "fp32")
_SM90_CUDA_ACCUMS = ("fp32+fp32",)


def _dispatch_head_dim(head_dim):
    # Dispatch only needs to know on which side of MAX_HEAD_DIM the head dim lies. Passing that, not
    # the value, keeps the constant-folded dispatch usable under torch.compile when the head dim is
    # symbolic (dynamic shapes). A conditional expression, not bool(): torch.compile guards on it.
    return MAX_HEAD_DIM if head_dim <= MAX_HEAD_DIM else MAX_HEAD_DIM + 1


def _options(caller, kwargs, valid, explicit, grans=None, accums=None) -> dict:
    """Merge and check the quantization options (kwargs and the variant's own parameters). The result
    is read, never written: a call that gives no option gets one shared dict of the defaults."""
    if not kwargs and not explicit:
        return _DEFAULTS_CHECKED
    check_kwargs(caller, kwargs, valid)
    opts = {**_OPTION_DEFAULTS, **explicit, **kwargs}
    gran, accum = opts["qk_quant_gran"], opts["pv_accum_dtype"]
    return {
        "smooth_k": check_flag("smooth_k", opts["smooth_k"]),
        "smooth_v": check_flag("smooth_v", opts["smooth_v"]),
        "qk_quant_gran": None if gran is None else check_qk_quant_gran(gran, grans),
        "pv_accum": None if accum is None else check_pv_accum(accum, accums),
        "quantization_backend": check_quantization_backend(opts["quantization_backend"]),
        "attn_mask": opts["attn_mask"],
    }


#: The checked options of a call that gives none (``sageattn(q, k, v)``, the common case).
_DEFAULTS_CHECKED = _options("sageattn", {"attn_mask": None}, DENSE_OPTIONS, {})


def _without_work(q, k, v, nhd: bool, return_lse: bool):
    """The result of a call with nothing to compute (a batch, heads or a length of 0), as torch SDPA
    gives it and without a kernel: an empty output, or zeros for queries that have no key, whose LSE is
    -inf. q, k, v are HND views; the output is laid out for the caller's layout (``nhd``). Under
    autograd the output comes from the attention math on the empty operands, so q, k and v get their
    (zero) gradients."""
    b, hq, nq, _ = q.shape
    if autograd.needs_grad(q, k, v):
        groups = hq // k.shape[1] if k.shape[1] else 1
        k, v = (k, v) if groups == 1 else (k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1))
        out = torch.matmul(torch.matmul(q, k.transpose(-2, -1)).softmax(-1), v)
    elif nhd:
        out = q.new_zeros((b, nq, hq, v.shape[-1])).transpose(1, 2)
    else:
        out = q.new_zeros((b, hq, nq, v.shape[-1]))
    lse = q.new_full((b, hq, nq), -math.inf, dtype=torch.float32) if return_lse else None
    return out, lse


def call_key(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, attn_mask=None):
    """The signature of a call without options but the mask, as dispatch.call_plan keys it: everything the
    checks, the choice of a backend and the packed kernel arguments depend on. None for inputs that are not
    plain tensors (subclasses go the whole way every time)."""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return None
    mask = None
    if attn_mask is not None:
        if type(attn_mask) is not torch.Tensor:
            return None
        mask = (attn_mask.shape, attn_mask.stride(), attn_mask.dtype, attn_mask.device)
    return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape,
            v.stride(), v.dtype, v.device, tensor_layout, is_causal, sm_scale, return_lse, mask)  # fmt: skip


def _attention(caller, forced, q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs, explicit,
               grans=None, accums=None):  # fmt: skip
    """The one implementation behind every dense entry point.

    An eager call without options whose signature (call_key) has been served before runs its plan
    (dispatch.call_plan), which the first call made: the same kernels on the same arguments, without
    the checks and the layers in between. Calls that need a gradient never do."""
    key = None
    plain = not kwargs or (len(kwargs) == 1 and "attn_mask" in kwargs)  # no option but the mask
    if plain and not explicit and forced is None and not torch.compiler.is_compiling():
        attn_mask = kwargs.get("attn_mask")
        key = call_key(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, attn_mask)
        plan = dispatch.call_plan(key) if key is not None else None
        if plan and not autograd.needs_grad(q, k, v, attn_mask):
            out, lse = plan(q, k, v) if attn_mask is None else plan(q, k, v, attn_mask)
            return (out, lse) if return_lse else out
        if plan is False:  # seen before, no plan: nothing to remember
            key = None
    if kwargs:  # FlashAttention's names (causal, softmax_scale) of two parameters
        is_causal, sm_scale = resolve_aliases(caller, kwargs, is_causal, sm_scale)
    opts = _options(caller, kwargs, DENSE_OPTIONS, explicit, grans, accums)
    layout = check_layout(tensor_layout)
    q, k, v = check_qkv(q, k, v, layout)
    head_dim = q.shape[-1]
    is_causal = check_flag("is_causal", is_causal)
    return_lse = check_flag("return_lse", return_lse)
    sm_scale = check_sm_scale(sm_scale, head_dim)
    mask = check_attn_mask(opts["attn_mask"], q, k.shape[2])
    if forced is not None:
        check_head_dim_for_kernels(caller, head_dim)
    # q.is_cuda and q.get_device() say what q.device.type and .index say, at a fifth of the host time.
    is_cuda = q.is_cuda
    name = dispatch.select(
        "cuda" if is_cuda else q.device.type, q.get_device() if is_cuda else q.device.index, q.dtype,
        _dispatch_head_dim(head_dim), mask_kind(mask, is_causal), False, return_lse, forced, caller,
    )  # fmt: skip
    backend = dispatch.BACKENDS[name]
    if q.numel() == 0 or k.numel() == 0:  # no query or no key: nothing to launch, never a plan
        out, lse = _without_work(q, k, v, layout == "NHD", return_lse)
    elif autograd.needs_grad(q, k, v, mask):  # training: the quantized forward, a recorded backward
        out, lse = autograd.dense(
            name, q, k, v, mask, is_causal=is_causal, sm_scale=sm_scale, return_lse=return_lse,
            smooth_k=opts["smooth_k"], options=opts,
        )  # fmt: skip
    else:
        out, lse = backend.dense(
            q, k, v, attn_mask=mask, is_causal=is_causal, sm_scale=sm_scale, return_lse=return_lse,
            smooth_k=opts["smooth_k"], pv=backend.pv, options=opts,
        )  # fmt: skip
        if key is not None:  # served once: the plan of later calls like it
            dispatch.remember_plan(key, backend, q, k, v, mask, nhd=layout == "NHD", is_causal=is_causal,
                                   sm_scale=sm_scale, smooth_k=opts["smooth_k"],
                                   return_lse=return_lse)  # fmt: skip
    if layout == "NHD":
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------------
# Public API


def sageattn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: float | None = None,
    return_lse: bool = False,
    **kwargs: Any,
):
    return _attention("sageattn", None, q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs, {})


def sageattn_qk_int8_pv_fp16_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    quantization_backend: str = "triton",
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    smooth_k: bool = True,
    return_lse: bool = False,
    **kwargs: Any,
):
    explicit = {"quantization_backend": quantization_backend, "attn_mask": attn_mask, "smooth_k": smooth_k}
    return _attention(
        "sageattn_qk_int8_pv_fp16_triton", "triton_fp16", q, k, v, tensor_layout, is_causal, sm_scale,
        return_lse, kwargs, explicit,
    )  # fmt: skip


def sageattn_qk_int8_pv_fp8_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    smooth_k: bool = True,
    return_lse: bool = False,
    **kwargs: Any,
):
    explicit = {"attn_mask": attn_mask, "smooth_k": smooth_k}
    return _attention(
        "sageattn_qk_int8_pv_fp8_triton", "triton_fp8", q, k, v, tensor_layout, is_causal, sm_scale,
        return_lse, kwargs, explicit,
    )  # fmt: skip


def sageattn_qk_int8_pv_fp16_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    qk_quant_gran: str = "per_thread",
    sm_scale: float | None = None,
    pv_accum_dtype: str = "fp32",
    smooth_k: bool = True,
    smooth_v: bool = False,
    return_lse: bool = False,
    **kwargs: Any,
):
    explicit = {"qk_quant_gran": qk_quant_gran, "pv_accum_dtype": pv_accum_dtype, "smooth_k": smooth_k,
                "smooth_v": smooth_v}  # fmt: skip
    return _attention(
        "sageattn_qk_int8_pv_fp16_cuda", "cuda_sm80", q, k, v, tensor_layout, is_causal, sm_scale, return_lse,
        kwargs, explicit, _CUDA_GRANS, _FP16_CUDA_ACCUMS,
    )  # fmt: skip


def sageattn_qk_int8_pv_fp8_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    qk_quant_gran: str = "per_thread",
    sm_scale: float | None = None,
    pv_accum_dtype: str = "fp32+fp16",
    smooth_k: bool = True,
    smooth_v: bool = False,
    return_lse: bool = False,
    **kwargs: Any,
):
    explicit = {"qk_quant_gran": qk_quant_gran, "pv_accum_dtype": pv_accum_dtype, "smooth_k": smooth_k,
                "smooth_v": smooth_v}  # fmt: skip
    return _attention(
        "sageattn_qk_int8_pv_fp8_cuda", "cuda_sm89", q, k, v, tensor_layout, is_causal, sm_scale, return_lse,
        kwargs, explicit, _CUDA_GRANS, _FP8_CUDA_ACCUMS,
    )  # fmt: skip


def sageattn_qk_int8_pv_fp8_cuda_sm90(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    qk_quant_gran: str = "per_thread",
    sm_scale: float | None = None,
    pv_accum_dtype: str = "fp32+fp32",
    smooth_k: bool = True,
    return_lse: bool = False,
    **kwargs: Any,
):
    explicit = {"qk_quant_gran": qk_quant_gran, "pv_accum_dtype": pv_accum_dtype, "smooth_k": smooth_k}
    return _attention(
        "sageattn_qk_int8_pv_fp8_cuda_sm90", "cuda_sm90", q, k, v, tensor_layout, is_causal, sm_scale,
        return_lse, kwargs, explicit, _CUDA_GRANS, _SM90_CUDA_ACCUMS,
    )  # fmt: skip


def sageattn_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    is_causal: bool = False,
    sm_scale: float | None = None,
    smooth_k: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    caller = "sageattn_varlen"
    if kwargs:
        is_causal, sm_scale = resolve_aliases(caller, kwargs, is_causal, sm_scale)
    opts = _options(caller, kwargs, VARLEN_OPTIONS, {"smooth_k": smooth_k})
    cu_q, cu_k, max_q, max_k = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    head_dim = q.shape[-1]
    is_causal = check_flag("is_causal", is_causal)
    sm_scale = check_sm_scale(sm_scale, head_dim)
    name = dispatch.select(
        q.device.type, q.device.index, q.dtype, _dispatch_head_dim(head_dim), False, True, False, None, caller
    )
    if q.numel() == 0 or k.numel() == 0:  # no query or no key: [Tq, Hq, D] of zeros, without a launch
        as_hnd = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        return _without_work(*as_hnd, True, False)[0].squeeze(0).transpose(0, 1)
    if autograd.needs_grad(q, k, v):
        return autograd.varlen(
            name, q, k, v, cu_q, cu_k, max_q, max_k, is_causal=is_causal, sm_scale=sm_scale,
            smooth_k=opts["smooth_k"], options=opts,
        )  # fmt: skip
    backend = dispatch.BACKENDS[name]
    return backend.varlen(
        q, k, v, cu_q, cu_k, max_q, max_k, is_causal=is_causal, sm_scale=sm_scale, smooth_k=opts["smooth_k"],
        pv=backend.pv, options=opts,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Docstrings

_SHAPES = '[batch, {h}, {n}, head_dim] for tensor_layout "HND", [batch, {n}, {h}, head_dim] for "NHD"'
# The **kwargs text of both tables ({options} is filled in per function by _document).
_KWARGS_DOC = (
    "Options by name: {{options}}. They are the parameters of the named variants; a backend ignores "
    "those it has no use for{aside}. causal and softmax_scale, FlashAttention's names, are accepted as "
    "aliases of is_causal and sm_scale (both given with different values: TypeError). Any other name "
    "raises TypeError."
)
_PARAM_DOCS = {
    "q": (
        "torch.Tensor",
        "Queries, torch.float16 or torch.bfloat16, of shape " + _SHAPES.format(h="q_heads", n="q_len") + ". "
        "The last dimension must be contiguous (stride 1); the other strides are free and nothing is copied.",
    ),
    "k": (
        "torch.Tensor",
        "Keys, same dtype and device as q, of shape " + _SHAPES.format(h="kv_heads", n="kv_len") + ". "
        "q_heads must be a multiple of kv_heads (grouped-query attention).",
    ),
    "v": ("torch.Tensor", "Values, of the same shape, dtype and device as k."),
    "tensor_layout": ("str", 'Layout of q, k, v and of the output: "HND" or "NHD".'),
    "quantization_backend": (
        "str",
        'Which kernels quantize Q and K: "triton" (the fused Triton kernels) or "cuda" (the compiled '
        "fused quantization ops, the same bits; RuntimeError where they are not built for this GPU).",
    ),
    "is_causal": (
        "bool",
        "Causal masking aligned at the top-left corner, as torch SDPA does it: query i sees keys j <= i, "
        "also when q_len != kv_len. May be combined with attn_mask; both are then applied "
        "(torch SDPA itself refuses the combination).",
    ),
    "attn_mask": (
        "torch.Tensor or None",
        "Mask broadcastable to [batch, q_heads, q_len, kv_len], on q's device: torch.bool (True = attend, "
        "as in torch SDPA) or a floating dtype (added to the scaled scores). Served by the Triton kernels "
        "and the SDPA fallback; the CUDA kernels take no mask.",
    ),
    "qk_quant_gran": (
        "str",
        "Granularity of the INT8 scales of Q and K in the CUDA kernels: {choices}. "
        "The Triton kernels have a fixed granularity and ignore it.",
    ),
    "sm_scale": ("float or None", "Softmax scale, a positive finite number; None means 1 / sqrt(head_dim)."),
    "pv_accum_dtype": (
        "str",
        "Accumulation of the P·V products in the CUDA kernels: {choices}. The Triton kernels always "
        "accumulate in FP32.",
    ),
    "smooth_k": (
        "bool",
        "Subtract the mean of K over the tokens (per batch and head; per sequence in varlen) before "
        "quantizing. Softmax is unchanged by it and the INT8 error shrinks when K has a per-channel "
        "offset; the returned LSE is corrected for it.",
    ),
    "smooth_v": (
        "bool",
        "Subtract the mean of V over the tokens before the P·V product and add it back after. Accepted "
        "for compatibility and ignored: it serves whole-sequence FP16 accumulation, which no kernel here "
        "has (each key block is added into FP32).",
    ),
    "return_lse": (
        "bool",
        "Also return the log-sum-exp of each query row of the scaled, masked scores (natural log, float32, "
        "[batch, q_heads, q_len]), e.g. to merge partial results as ring attention does.",
    ),
    "cu_seqlens_q": (
        "torch.Tensor",
        "torch.int32 (torch.int64 is converted), shape [batch + 1], on q's device: sequence i holds the "
        "rows cu_seqlens_q[i]:cu_seqlens_q[i + 1] of q. It starts at 0, does not decrease and ends at "
        "total_q; the values are checked only when the tensor is on the CPU, since reading them from "
        "a GPU would stall the host.",
    ),
    "cu_seqlens_k": ("torch.Tensor", "The same for k and v (ending at total_k)."),
    "max_seqlen_q": ("int", "Length of the longest query sequence (at least every length in cu_seqlens_q)."),
    "max_seqlen_k": ("int", "Length of the longest key sequence (at least every length in cu_seqlens_k)."),
    "kwargs": (
        "",
        _KWARGS_DOC.format(aside=" (attn_mask aside: a named CUDA variant given one raises RuntimeError)"),
    ),
}
_VARLEN_PARAM_DOCS = {
    "q": (
        "torch.Tensor",
        "Packed queries of all sequences, torch.float16 or torch.bfloat16, "
        "shape [total_q, q_heads, head_dim], "
        "last dimension contiguous.",
    ),
    "k": (
        "torch.Tensor",
        "Packed keys, same dtype and device as q, shape [total_k, kv_heads, head_dim]; q_heads must be a "
        "multiple of kv_heads.",
    ),
    "v": ("torch.Tensor", "Packed values, of the same shape, dtype and device as k."),
    "is_causal": (
        "bool",
        "Causal masking within each sequence, aligned at its top-left corner: query i of a sequence sees "
        "its keys j <= i.",
    ),
    "smooth_k": (
        "bool",
        "Subtract the mean of K over each sequence's tokens (per head) before quantizing. Softmax is "
        "unchanged by it and the INT8 error shrinks when K has a per-channel offset.",
    ),
    "kwargs": ("", _KWARGS_DOC.format(aside="")),
}

_DENSE_RETURNS = """\
Returns
-------
out : torch.Tensor
    The attention output, dtype of q, shape of q (in the same layout).
lse : torch.Tensor
    Only when return_lse: float32 [batch, q_heads, q_len], natural log."""

_VARLEN_RETURNS = """\
Returns
-------
out : torch.Tensor
    The attention output, dtype of q, shape [total_q, q_heads, head_dim]."""

_EMPTY_ROW_NOTE = """\
A query row with no visible key (possible only with attn_mask) gives an output of 0 and an LSE
of -inf, as torch SDPA does."""

_COMMON_NOTES = """\
NaN in the inputs is not checked for; it propagates.

Raises TypeError for a wrong type or dtype (float32 inputs included: convert with .half() or
.bfloat16()) and ValueError for a wrong shape, layout, device or value; the message names the
argument."""

_SUMMARIES = {
    "sageattn": """\
SageAttention, a drop-in for torch.nn.functional.scaled_dot_product_attention.

Q and K are quantized to INT8 (K smoothed by its mean), P and V to FP8 (FP16 on sm80/sm86/sm87),
with FP32 accumulation. The implementation is chosen for the device: the CUDA kernels when built
for this GPU, else the Triton kernels; on anything else (CPU, MPS, ROCm, GPUs older than sm80,
head_dim > 128, no Triton) torch SDPA runs instead, not quantized, with one warning per reason.
`python -m sageattention env` shows the choice and why.""",
    "sageattn_qk_int8_pv_fp16_triton": """\
SageAttention through the Triton kernels: INT8 Q·K, FP16 P·V with FP32 accumulation (sm80 and newer).""",
    "sageattn_qk_int8_pv_fp8_triton": """\
SageAttention through the Triton kernels: INT8 Q·K, FP8 (e4m3) P·V with FP32 accumulation (sm89
and newer).""",
    "sageattn_qk_int8_pv_fp16_cuda": """\
SageAttention through the compiled sm80 kernels: INT8 Q·K, FP16 P·V (sm80 and newer).

Q is INT8 per token; K (smoothed) is two INT8 digits per block of 64 keys, K ~ scale * (k1 + k2 / 254),
whose product with Q is exact in INT32; P·V multiplies FP16 P by FP16 V (bf16 V is converted).""",
    "sageattn_qk_int8_pv_fp8_cuda": """\
SageAttention through the compiled sm89 kernels: INT8 Q·K, FP8 P·V (sm89, sm120, and sm100 or sm121 in
a wheel built with 10.0a or 12.1a; the mma.sync kernels also run on sm90).

Q is INT8 per token, K (smoothed) INT8 per block of 64 keys; P (scaled by 448) and V (per channel)
are FP8 e4m3.""",
    "sageattn_qk_int8_pv_fp8_cuda_sm90": """\
SageAttention through the compiled sm90 (Hopper) kernels: INT8 Q·K, FP8 P·V with wgmma.""",
    "sageattn_varlen": """\
SageAttention over packed sequences of different lengths (no padding), Triton kernels.

Each sequence attends only to itself; K is smoothed per sequence. Elsewhere (as for sageattn)
torch SDPA runs one sequence at a time, reading cu_seqlens on the host.""",
}

_NEEDS = "Raises RuntimeError where it cannot run ({what}); sageattn() picks what can."
_NOT_BUILT = (
    "Raises RuntimeError while the compiled kernels are not built in this installation, or hold no code "
    "for this GPU."
)
_EXTRA_NOTES = {
    "sageattn": """\
Named variants' options (qk_quant_gran, pv_accum_dtype, smooth_k, smooth_v,
quantization_backend, attn_mask) may be passed by keyword. With attn_mask, the Triton kernels
serve the call (the CUDA kernels take no mask).""",
    "sageattn_qk_int8_pv_fp16_triton": _NEEDS.format(what="no CUDA GPU of sm80+, or no Triton"),
    "sageattn_qk_int8_pv_fp8_triton": _NEEDS.format(what="no CUDA GPU of sm89+, or no Triton"),
    "sageattn_qk_int8_pv_fp16_cuda": _NOT_BUILT
    + "\nRaises ValueError for a pv_accum_dtype the kernel does not have.",
    "sageattn_qk_int8_pv_fp8_cuda": _NOT_BUILT
    + """
A build made with CUDA older than 12.8 has no "fp32+fp16" kernels; that value then runs as
"fp32+fp32", with one warning.""",
    "sageattn_qk_int8_pv_fp8_cuda_sm90": _NOT_BUILT,
    "sageattn_varlen": "",
}

_ACCUM_MEANING = (
    '. "fp32" is exact FP32; "a+b" accumulates in a inside a block of keys and adds into b between '
    'blocks; "fp16" is the fastest and least accurate'
)
_CUDA_GRAN_CHOICES = (
    '"per_warp" or "per_thread", accepted for compatibility: these kernels quantize Q per token and K '
    "per block of 64 keys whichever is given (finer scales than either)"
)
_CHOICES = {
    ("sageattn", "qk_quant_gran"): '"per_warp", "per_thread" or "per_block"; None leaves it to the backend',
    ("sageattn", "pv_accum_dtype"): (
        '"fp32", "fp16", "fp16+fp32", "fp32+fp16" or "fp32+fp32"; None leaves it to the backend'
        + _ACCUM_MEANING
    ),
    ("sageattn_varlen", "qk_quant_gran"): '"per_warp", "per_thread" or "per_block"',
    ("sageattn_varlen", "pv_accum_dtype"): '"fp32", "fp16", "fp16+fp32", "fp32+fp16" or "fp32+fp32"'
    + _ACCUM_MEANING,
    ("sageattn_qk_int8_pv_fp16_cuda", "qk_quant_gran"): _CUDA_GRAN_CHOICES,
    ("sageattn_qk_int8_pv_fp16_cuda", "pv_accum_dtype"): (
        '"fp32" (FP32 accumulators throughout) or "fp16+fp32" (FP16 accumulators inside each block of 64 '
        "keys, added into FP32: twice the MMA rate on sm86/sm89)"
    ),
    ("sageattn_qk_int8_pv_fp8_cuda", "qk_quant_gran"): _CUDA_GRAN_CHOICES,
    ("sageattn_qk_int8_pv_fp8_cuda", "pv_accum_dtype"): (
        '"fp32+fp16" (the FP8 MMA accumulates each block of 64 keys in FP16, added into FP32: the fastest '
        "on sm89; V is then quantized to 448 / 256 of the e4m3 range so no block sum can overflow), "
        '"fp32+fp32" (each block in fresh FP32 accumulators, added into FP32) or "fp32" (every MMA adds '
        "into the running FP32 output)"
    ),
    ("sageattn_qk_int8_pv_fp8_cuda_sm90", "pv_accum_dtype"): ", ".join(f'"{a}"' for a in _SM90_CUDA_ACCUMS)
    + " (each block of 128 keys in fresh FP32 accumulators, added into the FP32 output)",
}


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())


def _wrap(text: str, width: int = 96) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(lines)


def _document(fn) -> None:
    """Write fn's numpy-style docstring from its signature and the tables above."""
    name = fn.__name__
    varlen = name == "sageattn_varlen"
    options = ", ".join(VARLEN_OPTIONS if varlen else DENSE_OPTIONS)
    params = []
    for param in inspect.signature(fn).parameters.values():
        key = param.name
        kind, text = (_VARLEN_PARAM_DOCS if varlen else {}).get(key) or _PARAM_DOCS[key]
        text = text.format(choices=_CHOICES.get((name, key), '"per_warp" or "per_thread"'), options=options)
        if param.kind is param.VAR_KEYWORD:
            header = f"**{key}"
        else:
            default = "" if param.default is param.empty else f", default {param.default!r}"
            header = f"{key} : {kind}{default}"
        params.append(header + "\n" + _indent(_wrap(text)))
    empty_row = None if varlen else _EMPTY_ROW_NOTE  # varlen has neither attn_mask nor an LSE
    notes = "\n\n".join(part for part in (_EXTRA_NOTES[name], empty_row, _COMMON_NOTES) if part)
    fn.__doc__ = "\n\n".join(
        (
            _SUMMARIES[name],
            "Parameters\n----------\n" + "\n".join(params),
            _VARLEN_RETURNS if varlen else _DENSE_RETURNS,
            "Notes\n-----\n" + notes,
        )
    )


PUBLIC_FUNCTIONS = (
    sageattn,
    sageattn_varlen,
    sageattn_qk_int8_pv_fp16_triton,
    sageattn_qk_int8_pv_fp8_triton,
    sageattn_qk_int8_pv_fp16_cuda,
    sageattn_qk_int8_pv_fp8_cuda,
    sageattn_qk_int8_pv_fp8_cuda_sm90,
)
for _fn in PUBLIC_FUNCTIONS:
    _document(_fn)
del _fn
