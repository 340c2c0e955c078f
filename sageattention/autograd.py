"""Gradients through sageattn: the quantized forward, a high-precision backward.

core.py asks ``needs_grad`` once per call (``torch.is_grad_enabled()`` and a ``requires_grad`` look at
q, k, v and the mask). When it is False, as under ``torch.no_grad``, ``torch.inference_mode`` or
with inputs that need no gradient, the call goes straight to the backend as before: nothing is saved
and nothing more is launched. When it is True, the quantized backends run inside ``_Attention`` (or
``_VarlenAttention``), a ``torch.autograd.Function``: the forward is the backend's own, quantized,
asked for its LSE; the output and the LSE are saved with q, k and v, and the backward recomputes P
from q and k in their own precision (BF16/FP16 products, FP32 accumulation) with that LSE,
FlashAttention-2 style::

    D = rowsum(dO * O) - dlse,  P = exp(scale * Q K^T + mask - lse),
    dV = P^T dO,  dS = P * (dO V^T - D),  dQ = scale * dS K,  dK = scale * dS^T Q

with dK and dV summed over each group of query heads (grouped-query attention), the causal mask
aligned at the top-left corner as in the forward, and ``dlse`` the gradient of the returned LSE (0
when the LSE is not returned). The mask gets no gradient: a mask that requires one is refused at the
call. The torch SDPA fallback needs none of this: torch's own autograd differentiates it.

Which backward runs is a table (``BACKWARDS``, first row that can run wins), decided per call
on the host from metadata only:

    triton   sageattention/triton/backward.py: every case (masks, GQA, causal, varlen, dlse); CUDA sm80+
    int8     the same kernels quantized: Q and K in INT8 per token (K smoothed), S = Q K^T, dQ = dS K
             and dK = dS^T Q in INT8 (dS, and dS^T for dK, in INT8 per row, the other operand's
             scales folded in), dO V^T and P^T dO in 16 bits; in no default order: chosen by
             set_backward_order("int8")
    flash    torch's FlashAttention-2 backward fed our O and LSE: no mask, no GQA, no dlse, head dim a
             multiple of 8 up to 256, causal only with q_len == kv_len (its causal alignment differs)
    cudnn    torch's cuDNN backward, the same limits (head dim up to 128)
    torch    chunked float32 recompute in plain torch: anything, any device (the CPU fallback)

flash and cudnn are fed K minus its mean over the keys and the LSE shifted to match (``_centered``), so
that their dQ is the Triton backward's, scale * dS (K - mean). The order is per GPU
(``default_order``): cudnn first on sm90, where it is the fastest, triton first elsewhere.
``set_backward_order`` reorders it (e.g. to measure one against another, bench/backward.py);
``backward_for`` tells which one a call would get.

torch.compile: both Functions are traced by dynamo; the backward enters the graph as the custom op
``sageattention::attn_backward`` (``sageattention::varlen_backward``), whose fake implementations
give the gradients' metadata. In eager mode the implementation is called directly. The Triton
backward reads no tensor values on the host, so forward and backward can be captured in a CUDA graph.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from dataclasses import dataclass
from typing import Callable

import torch

from . import dispatch, ops

__all__ = [
    "BACKWARDS",
    "backward_for",
    "check_mask_grad",
    "needs_grad",
    "set_backward_order",
    "torch_backward",
    "torch_varlen_backward",
]

#: Elements of one float32 score block [.., rows, kv_len] of the plain-torch backward (128 MiB).
_TORCH_BLOCK_ELEMENTS = 1 << 25
#: Head dims of torch's flash and cuDNN backward kernels.
_FLASH_MAX_HEAD_DIM = 256
_CUDNN_MAX_HEAD_DIM = 128
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask=None) -> bool:
    """Whether this call must record a backward (the one check on the inference path)."""
    return torch.is_grad_enabled() and (
        q.requires_grad
        or k.requires_grad
        or v.requires_grad
        or (attn_mask is not None and attn_mask.requires_grad)
    )


def check_mask_grad(attn_mask) -> None:
    """A mask that requires a gradient is refused: sageattn computes dQ, dK and dV only."""
    if attn_mask is not None and attn_mask.requires_grad:
        raise ValueError(
            "attn_mask requires grad, but sageattn computes no gradient for the mask (only for q, k and v); "
            "pass attn_mask.detach(), or torch.nn.functional.scaled_dot_product_attention for a learned bias"
        )


# --------------------------------------------------------------------------------------------------
# The backward implementations


@dataclass(frozen=True)
class BackwardRequest:
    """What the choice of a backward depends on (metadata only)."""

    device_type: str
    capability: tuple | None
    dtype: torch.dtype
    head_dim: int
    q_heads: int
    kv_heads: int
    has_mask: bool
    has_dlse: bool
    is_causal: bool
    same_len: bool  # q_len == kv_len
    varlen: bool


def _interpreting() -> bool:
    """Triton's CPU interpreter (TRITON_INTERPRET=1) runs the Triton backward on CPU tensors (tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _cuda_sm80(req: BackwardRequest) -> str | None:
    if req.device_type != "cuda" or req.capability is None:
        return f"device {req.device_type} is not a CUDA GPU"
    if torch.version.hip is not None:
        return "ROCm"
    if req.capability < (8, 0):
        return "needs sm80 or newer"
    return None


def _triton_cannot(req: BackwardRequest) -> str | None:
    if not (req.device_type == "cpu" and _interpreting()):
        why = _cuda_sm80(req)
        if why is not None:
            return why
    if req.dtype not in _HALF_DTYPES:
        return f"dtype {req.dtype}"
    return ops.triton_unavailable_reason()


def _torch_kernel_cannot(req: BackwardRequest, max_head_dim: int) -> str | None:
    why = _cuda_sm80(req)
    if why is not None:
        return why
    if req.dtype not in _HALF_DTYPES:
        return f"dtype {req.dtype}"
    if req.varlen:
        return "packed sequences"
    if req.has_mask:
        return "attn_mask"
    if req.has_dlse:
        return "a gradient of the LSE"
    if req.q_heads != req.kv_heads:
        return "grouped-query attention"
    if req.head_dim % 8 or req.head_dim > max_head_dim:
        return f"head_dim {req.head_dim}"
    if req.is_causal and not req.same_len:
        return "causal with q_len != kv_len (its causal mask is aligned at the bottom-right)"
    return None


def _triton_dense(do, q, k, v, out, lse, dlse, mask, is_causal, sm_scale, quant=False):
    from .triton.backward import attention_bwd  # noqa: PLC0415 - needs triton

    return attention_bwd(do, q, k, v, out, lse, dlse, attn_mask=mask, is_causal=is_causal, sm_scale=sm_scale,
                         quant=quant)  # fmt: skip


def _triton_varlen(do, q, k, v, out, cu_q, cu_k, max_q, max_k, is_causal, sm_scale, quant=False):
    from .triton.backward import varlen_bwd  # noqa: PLC0415 - needs triton

    return varlen_bwd(do, q, k, v, out, cu_q, cu_k, max_q, max_k, is_causal=is_causal, sm_scale=sm_scale,
                      quant=quant)  # fmt: skip


def _philox(q: torch.Tensor) -> torch.Tensor:
    # The RNG state arguments of torch's kernels; dropout is 0, so they are never read.
    return torch.zeros((), dtype=torch.int64, device=q.device)


def _query_dot(q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """q [B, H, N, D] dotted with c [B, H, D] over D, in float32: [B, H, N]. In chunks of heads of at
    most _TORCH_BLOCK_ELEMENTS float32 elements (q's float32 copy would double its memory)."""
    b, h, n, d = q.shape
    dots = q.new_empty((b, h, n), dtype=torch.float32)
    step = max(1, _TORCH_BLOCK_ELEMENTS // max(1, n * d))
    for i in range(b):
        for j in range(0, h, step):
            chunk = q[i, j : j + step].float()
            dots[i, j : j + step] = torch.matmul(chunk, c[i, j : j + step].unsqueeze(-1)).squeeze(-1)
    return dots


def _centered(q, k, lse, sm_scale):
    """K minus its mean over the keys, and the LSE of the scores with it, for the backward kernels of
    torch, which compute dQ = scale * dS K: fed these they compute scale * dS (K - mean), which is the
    same in exact arithmetic (each row of dS sums to zero) but not with the quantized forward's O and
    LSE, where the row sums are small but not zero and K's mean, large in real models, multiplies them
    (the Triton backward's KMEAN form). P is unchanged: the scores of each query row shift by one
    constant, q . mean, which the LSE takes. The mean is rounded to K's dtype: any vector would do, so
    the one K minus it is computed with is the one the LSE shifts by.

    Two Triton launches where Triton runs (triton/backward.py, centered: one pass over K, one over Q);
    otherwise these torch ops (some 20 launches and float32 copies of Q: 1.3 ms of a 4 ms backward at
    b=4 h=32 n=4096 on an H200)."""
    if q.is_cuda and ops.triton_unavailable_reason() is None:
        from .triton.backward import centered  # noqa: PLC0415 - needs triton

        return centered(q, k, lse, sm_scale)
    mean = k.mean(dim=2, keepdim=True, dtype=torch.float32).to(k.dtype)
    shift = _query_dot(q, mean.squeeze(2).float())
    return k - mean, lse - sm_scale * shift


def _flash_dense(do, q, k, v, out, lse, dlse, mask, is_causal, sm_scale):
    del dlse, mask  # the predicate admits neither
    rng = _philox(q)
    k, lse = _centered(q, k, lse, sm_scale)
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        do, q, k, v, out, lse.contiguous(), None, None, q.shape[2], k.shape[2], 0.0, is_causal, rng, rng,
        scale=sm_scale,
    )  # fmt: skip


def _dim_order(x: torch.Tensor) -> tuple:
    """x's dims from the largest stride to the smallest (its memory order)."""
    return tuple(sorted(range(x.dim()), key=lambda i: -x.stride(i)))


def _in_order(x: torch.Tensor, order: tuple) -> torch.Tensor:
    """x, or a copy of it, dense in memory order ``order``."""
    if _dim_order(x) == order and x.permute(order).is_contiguous():
        return x
    inverse = tuple(order.index(i) for i in range(len(order)))
    return x.permute(order).contiguous().permute(inverse)


def _cudnn_dense(do, q, k, v, out, lse, dlse, mask, is_causal, sm_scale):
    del dlse, mask
    rng = _philox(q)
    k, lse = _centered(q, k, lse, sm_scale)
    # cuDNN reads every operand in one memory layout: given O and dO in another than q's it computes
    # garbage, silently (bench/backward_accuracy.py fed it float64's O, HND, with NHD inputs). All of
    # them dense in q's order (the quantized forward stores O like q: no copy in training calls).
    order = _dim_order(q)
    q, k, v, out, do = (_in_order(x, order) for x in (q, k, v, out, do))
    # cuDNN's statistics are [B, H, Nq, 1].
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, out, lse.unsqueeze(-1).contiguous(), rng, rng, None, None, None, q.shape[2], k.shape[2],
        0.0, is_causal, scale=sm_scale,
    )  # fmt: skip


def _like(x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """grad in x's dtype and memory layout (what the fake implementation promises)."""
    like = torch.empty_like(x)
    return like.copy_(grad)


def _expand_mask(mask, b, hq, nq, nk):
    return None if mask is None else mask.expand(b, hq, nq, nk)


def torch_lse(q, k, mask, is_causal: bool, sm_scale: float) -> torch.Tensor:
    """Natural-log LSE [B, Hq, Nq] (float32) of the scaled, masked scores, chunked over query rows."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = hq // hkv
    kt = k.float().unsqueeze(2).transpose(-1, -2)  # [B, Hkv, 1, D, Nk]
    full = _expand_mask(mask, b, hq, nq, nk)
    rows = max(1, _TORCH_BLOCK_ELEMENTS // max(1, b * hq * nk))
    parts = []
    for start in range(0, nq, rows):
        stop = min(nq, start + rows)
        s, visible = _scores(q, kt, full, start, stop, is_causal, sm_scale, g)
        if visible is not None:
            s = s.masked_fill(~visible, -math.inf)
        parts.append(torch.logsumexp(s, dim=-1).reshape(b, hq, stop - start))
    return torch.cat(parts, dim=-1)


def _scores(q, kt, full_mask, start, stop, is_causal, sm_scale, g):
    """Float32 scores [B, Hkv, G, rows, Nk] of query rows start:stop, and the visible keys (or None)."""
    b, hq, _, d = q.shape
    hkv, nk = kt.shape[1], kt.shape[-1]
    c = stop - start
    qc = q[:, :, start:stop].float().reshape(b, hkv, g, c, d)
    s = torch.matmul(qc, kt) * sm_scale
    visible = None
    if full_mask is not None:
        mc = full_mask[:, :, start:stop].reshape(b, hkv, g, c, nk)
        if mc.dtype == torch.bool:
            visible = mc
        else:
            s = s + mc.float()
    if is_causal:
        rows = torch.arange(start, stop, device=q.device)
        causal = rows[:, None] >= torch.arange(nk, device=q.device)[None, :]
        visible = causal if visible is None else visible & causal
    return s, visible


def torch_backward(do, q, k, v, out, lse, dlse, mask, is_causal: bool, sm_scale: float):
    """dQ, dK, dV in plain torch, float32, in blocks of query rows (any device, every case).

    q, out, do: [B, Hq, Nq, D]; k, v: [B, Hkv, Nk, D]; lse: natural log [B, Hq, Nq] or None
    (recomputed); dlse: [B, Hq, Nq] or None."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = hq // hkv
    if lse is None:
        lse = torch_lse(q, k, mask, is_causal, sm_scale)
    lse = torch.where(lse == -math.inf, math.inf, lse.float())  # an empty row: P = 0
    delta = (do.float() * out.float()).sum(-1)
    if dlse is not None:
        delta = delta - dlse.float()
    kf, vf = k.float().unsqueeze(2), v.float().unsqueeze(2)  # [B, Hkv, 1, Nk, D]
    kt, vt = kf.transpose(-1, -2), vf.transpose(-1, -2)
    full = _expand_mask(mask, b, hq, nq, nk)
    dq = torch.empty(b, hq, nq, d, dtype=torch.float32, device=q.device)
    dk = torch.zeros(b, hkv, nk, d, dtype=torch.float32, device=q.device)
    dv = torch.zeros_like(dk)
    rows = max(1, _TORCH_BLOCK_ELEMENTS // max(1, b * hq * nk))
    for start in range(0, nq, rows):
        stop = min(nq, start + rows)
        c = stop - start
        s, visible = _scores(q, kt, full, start, stop, is_causal, sm_scale, g)
        lse_c = lse[:, :, start:stop].reshape(b, hkv, g, c, 1)
        p = torch.exp(s - lse_c)
        if visible is not None:
            p = p.masked_fill(~visible, 0.0)
        doc = do[:, :, start:stop].float().reshape(b, hkv, g, c, d)
        dv += torch.matmul(p.transpose(-1, -2), doc).sum(2)
        dp = torch.matmul(doc, vt)
        ds = p * (dp - delta[:, :, start:stop].reshape(b, hkv, g, c, 1))
        dq[:, :, start:stop] = torch.matmul(ds, kf).reshape(b, hq, c, d) * sm_scale
        qc = q[:, :, start:stop].float().reshape(b, hkv, g, c, d)
        dk += torch.matmul(ds.transpose(-1, -2), qc).sum(2) * sm_scale
    return _like(q, dq), _like(k, dk), _like(v, dv)


def torch_varlen_backward(do, q, k, v, out, cu_q, cu_k, max_q, max_k, is_causal: bool, sm_scale: float):
    """Packed sequences through torch_backward, one sequence at a time (reads cu_seqlens on the host)."""
    del max_q, max_k
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    bq, bk = cu_q.tolist(), cu_k.tolist()
    for i in range(len(bq) - 1):
        q0, q1, k0, k1 = bq[i], bq[i + 1], bk[i], bk[i + 1]
        if q1 == q0 or k1 == k0:  # no query, or no key: nothing flows
            continue
        seq = [x[a:z].transpose(0, 1).unsqueeze(0) for x, a, z in ((do, q0, q1), (q, q0, q1), (k, k0, k1),
                                                                   (v, k0, k1), (out, q0, q1))]  # fmt: skip
        g = torch_backward(seq[0], seq[1], seq[2], seq[3], seq[4], None, None, None, is_causal, sm_scale)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = (x[0].transpose(0, 1) for x in g)
    return dq, dk, dv


@dataclass(frozen=True)
class BackwardImpl:
    name: str
    description: str
    cannot_run: Callable[[BackwardRequest], str | None]
    dense: Callable
    varlen: Callable | None = None


BACKWARDS = {
    impl.name: impl
    for impl in (
        BackwardImpl(
            "triton",
            "Triton FA2-style backward (sageattention/triton/backward.py)",
            _triton_cannot,
            _triton_dense,
            _triton_varlen,
        ),
        BackwardImpl(
            "int8",
            "the Triton backward with Q·Kᵀ, dS·K and dSᵀ·Q in INT8, dO·Vᵀ and Pᵀ·dO in 16 bits",
            _triton_cannot,
            functools.partial(_triton_dense, quant=True),
            functools.partial(_triton_varlen, quant=True),
        ),
        BackwardImpl(
            "flash",
            "torch's FlashAttention-2 backward kernel",
            lambda r: _torch_kernel_cannot(r, _FLASH_MAX_HEAD_DIM),
            _flash_dense,
        ),
        BackwardImpl(
            "cudnn",
            "torch's cuDNN backward kernel",
            lambda r: _torch_kernel_cannot(r, _CUDNN_MAX_HEAD_DIM),
            _cudnn_dense,
        ),
        BackwardImpl(
            "torch",
            "chunked float32 recompute in plain torch",
            lambda r: None,
            torch_backward,
            torch_varlen_backward,
        ),
    )
}

#: The order the rows are tried in, by GPU. On sm90 cuDNN's backward first: on an H200 it runs at 1.5x the
#: Triton backward's TOPS (b=4 h=32 d=128 bf16, n=16384: 549 against 363;
#: bench/results/backward-NVIDIA_H200-*.json); Triton serves what it cannot (masks, GQA, varlen, the
#: LSE's gradient). Elsewhere Triton first, which serves every case: bench/backward.py settles the
#: choice between it and torch's kernels on each GPU it runs on.
DEFAULT_ORDER = ("triton", "flash", "cudnn", "torch")
DEVICE_ORDERS = {(9, 0): ("cudnn", "triton", "flash", "torch")}
_chosen: list = [None]  # [the order set by set_backward_order], None: each device's default
_decisions: dict = {}


def default_order(capability) -> tuple:
    """The order the backwards are tried in on a GPU of this capability (None: not a CUDA GPU)."""
    return DEVICE_ORDERS.get(capability, DEFAULT_ORDER)


def set_backward_order(order=None) -> None:
    """Try the backwards in this order (names of BACKWARDS; None: each device's default). A single name
    forces that one: a call it cannot serve raises RuntimeError saying why."""
    if order is None:
        _chosen[0] = None
    else:
        names = [order] if isinstance(order, str) else list(order)
        unknown = [n for n in names if n not in BACKWARDS]
        if unknown:
            raise ValueError(f"unknown backward(s) {unknown}; valid names: {', '.join(BACKWARDS)}")
        _chosen[0] = tuple(names)
    _decisions.clear()


@contextlib.contextmanager
def backward_order(order):
    """``with backward_order("flash"):`` the backwards of calls inside run in that order."""
    before = _chosen[0]
    set_backward_order(order)
    try:
        yield
    finally:
        set_backward_order(before)


def _request(q, k, mask, dlse, is_causal, varlen) -> BackwardRequest:
    cap = dispatch.device_capability(q.device.type, q.device.index)
    return BackwardRequest(
        q.device.type,
        cap,
        q.dtype,
        q.shape[-1],
        q.shape[1],
        k.shape[1],
        mask is not None,
        dlse is not None,
        is_causal,
        varlen or q.shape[2] == k.shape[2],
        varlen,
    )


def choose(req: BackwardRequest) -> str:
    """The first backward of the order that can serve the request (memoized)."""
    name = _decisions.get(req)
    if name is None:
        reasons = []
        order = _chosen[0] if _chosen[0] is not None else default_order(req.capability)
        for candidate in order:
            impl = BACKWARDS[candidate]
            if req.varlen and impl.varlen is None:
                why = "no packed-sequence support"
            else:
                why = impl.cannot_run(req)
            if why is None:
                name = candidate
                break
            reasons.append(f"{candidate}: {why}")
        if name is None:
            raise RuntimeError(
                "sageattention: no backward in the chosen order can serve this call ("
                + "; ".join(reasons)
                + ")"
            )
        _decisions[req] = name
    return name


def backward_for(q, k, attn_mask=None, *, is_causal=False, with_lse_grad=False, varlen=False) -> str:
    """Name of the backward a call with these (HND, or packed when varlen) inputs would run."""
    dlse = q if with_lse_grad else None  # only its presence matters
    return choose(_request(q, k, attn_mask, dlse, is_causal, varlen))


def _unit_last(x):
    return x if x is None or x.stride(-1) == 1 else x.contiguous()


def _dense_backward(do, q, k, v, out, lse, dlse, mask, is_causal, sm_scale):
    do, q, k, v, out = (_unit_last(x) for x in (do, q, k, v, out))
    name = choose(_request(q, k, mask, dlse, is_causal, False))
    return tuple(BACKWARDS[name].dense(do, q, k, v, out, lse, dlse, mask, is_causal, sm_scale))


def _varlen_backward(do, q, k, v, out, cu_q, cu_k, max_q, max_k, is_causal, sm_scale):
    do, q, k, v, out = (_unit_last(x) for x in (do, q, k, v, out))
    name = choose(_request(q, k, None, None, is_causal, True))
    return tuple(BACKWARDS[name].varlen(do, q, k, v, out, cu_q, cu_k, max_q, max_k, is_causal, sm_scale))


# --------------------------------------------------------------------------------------------------
# Custom ops: what torch.compile puts in the graph for the backward

_BWD_SCHEMA = (
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? dlse, Tensor? attn_mask, "
    "bool is_causal, float sm_scale) -> (Tensor, Tensor, Tensor)"
)
_VARLEN_BWD_SCHEMA = (
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "int max_seqlen_q, int max_seqlen_k, bool is_causal, float sm_scale) -> (Tensor, Tensor, Tensor)"
)


@torch.library.custom_op("sageattention::attn_backward", mutates_args=(), schema=_BWD_SCHEMA)
def _attn_backward_op(dout, q, k, v, out, lse, dlse, attn_mask, is_causal, sm_scale):
    return _dense_backward(dout, q, k, v, out, lse, dlse, attn_mask, is_causal, sm_scale)


@_attn_backward_op.register_fake
def _(dout, q, k, v, out, lse, dlse, attn_mask, is_causal, sm_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.custom_op("sageattention::varlen_backward", mutates_args=(), schema=_VARLEN_BWD_SCHEMA)
def _varlen_backward_op(dout, q, k, v, out, cu_q, cu_k, max_q, max_k, is_causal, sm_scale):
    return _varlen_backward(dout, q, k, v, out, cu_q, cu_k, max_q, max_k, is_causal, sm_scale)


@_varlen_backward_op.register_fake
def _(dout, q, k, v, out, cu_q, cu_k, max_q, max_k, is_causal, sm_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# --------------------------------------------------------------------------------------------------
# The autograd Functions


class _Attention(torch.autograd.Function):
    """Dense attention: the backend's quantized forward, the backward of the table."""

    @staticmethod
    def forward(ctx, q, k, v, mask, name, is_causal, sm_scale, return_lse, smooth_k, options):
        backend = dispatch.BACKENDS[name]
        out, lse = backend.dense(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal,
            sm_scale=sm_scale,
            return_lse=True,
            smooth_k=smooth_k,
            pv=backend.pv,
            options=options,
        )
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.is_causal, ctx.sm_scale, ctx.return_lse = is_causal, sm_scale, return_lse
        if not return_lse:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, mask = ctx.saved_tensors
        dlse = dlse if ctx.return_lse else None
        if torch.compiler.is_compiling():
            dq, dk, dv = torch.ops.sageattention.attn_backward(
                dout, q, k, v, out, lse, dlse, mask, ctx.is_causal, ctx.sm_scale
            )
        else:
            dq, dk, dv = _dense_backward(dout, q, k, v, out, lse, dlse, mask, ctx.is_causal, ctx.sm_scale)
        return dq, dk, dv, None, None, None, None, None, None, None


class _VarlenAttention(torch.autograd.Function):
    """Packed sequences: the backend's quantized forward (no LSE: the backward recomputes it)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, name, is_causal, sm_scale, smooth_k, options):
        backend = dispatch.BACKENDS[name]
        out = backend.varlen(
            q,
            k,
            v,
            cu_q,
            cu_k,
            max_q,
            max_k,
            is_causal=is_causal,
            sm_scale=sm_scale,
            smooth_k=smooth_k,
            pv=backend.pv,
            options=options,
        )
        ctx.save_for_backward(q, k, v, out, cu_q, cu_k)
        ctx.max_q, ctx.max_k, ctx.is_causal, ctx.sm_scale = max_q, max_k, is_causal, sm_scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, cu_q, cu_k = ctx.saved_tensors
        args = (dout, q, k, v, out, cu_q, cu_k, ctx.max_q, ctx.max_k, ctx.is_causal, ctx.sm_scale)
        if torch.compiler.is_compiling():
            dq, dk, dv = torch.ops.sageattention.varlen_backward(*args)
        else:
            dq, dk, dv = _varlen_backward(*args)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


def dense(name, q, k, v, mask, *, is_causal, sm_scale, return_lse, smooth_k, options):
    """A dense call that needs a gradient (core.py, once needs_grad said so): (out, lse or None)."""
    check_mask_grad(mask)
    backend = dispatch.BACKENDS[name]
    if backend is dispatch.SDPA:  # torch differentiates SDPA and the LSE's plain-torch recompute itself
        return backend.dense(
            q, k, v, attn_mask=mask, is_causal=is_causal, sm_scale=sm_scale, return_lse=return_lse,
            smooth_k=smooth_k, pv=backend.pv, options=options,
        )  # fmt: skip
    out, lse = _Attention.apply(q, k, v, mask, name, is_causal, sm_scale, return_lse, smooth_k, options)
    return out, (lse if return_lse else None)


def varlen(name, q, k, v, cu_q, cu_k, max_q, max_k, *, is_causal, sm_scale, smooth_k, options):
    """A packed call that needs a gradient: the output."""
    backend = dispatch.BACKENDS[name]
    if backend is dispatch.SDPA:
        return backend.varlen(
            q, k, v, cu_q, cu_k, max_q, max_k, is_causal=is_causal, sm_scale=sm_scale, smooth_k=smooth_k,
            pv=backend.pv, options=options,
        )  # fmt: skip
    return _VarlenAttention.apply(
        q, k, v, cu_q, cu_k, max_q, max_k, name, is_causal, sm_scale, smooth_k, options
    )
