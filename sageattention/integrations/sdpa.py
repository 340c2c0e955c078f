"""Every ``torch.nn.functional.scaled_dot_product_attention`` call of the process through ``sageattn``.

    from sageattention.integrations.sdpa import install
    patch = install()   # from here on F.scaled_dot_product_attention is sageattn wherever it can be
    model(x)            # any model that calls F.scaled_dot_product_attention, unchanged
    print(patch.calls)  # how many calls went where, and why

or, for a block, ``with patched() as patch: ...``; or, without changing a script,
``python -m sageattention run script.py [args...]``.

A call goes to ``sageattn`` only when ``sageattn`` computes what SDPA would compute, on a quantized
kernel. Two kinds of rules decide it:

* the library's own: sageattn's argument checks (``sageattention._checks``: dtypes, 4-D shapes, head
  counts, contiguous last dimension, scale, mask dtype, device and shape; a mask that requires grad,
  ``sageattention.autograd``) and its dispatch decision (``sageattention.dispatch.decide``: a
  quantized backend for this device, dtype, head dim and mask, else torch SDPA, e.g. head_dim above
  ``MAX_HEAD_DIM`` or no CUDA GPU). When sageattn learns to serve a new case, the patch follows;
* the patch's own, for what sageattn's arguments cannot express or where SDPA means something else:
  ``dropout_p > 0``, q/k/v that are not plain ``torch.Tensor`` (subclasses, nested tensors), head counts
  that differ without ``enable_gqa`` (SDPA refuses them), a mask together with ``is_causal`` (SDPA
  refuses it), a float mask of another dtype than q (SDPA refuses it), a float mask under autocast,
  device types not in ``devices``, and ``masks=False``.

Training calls (q, k or v requiring grad) go to ``sageattn`` too: its backward gives dQ, dK and dV
(docs/api.md, "Gradients"). Under autocast, float inputs go to sageattn in the autocast dtype, as SDPA
would compute them. Every other call goes to the original function with its arguments as given: a
mask, a dropout probability or a mask gradient is never dropped, and what SDPA refuses is refused by
SDPA itself, with its own error. Each reason warns once (``SDPAFallbackWarning``) and is counted in
``patch.calls``. Code that bound the function before the patch (``from torch.nn.functional import
scaled_dot_product_attention``) keeps the original.

The environment variable ``SAGEATTENTION_PATCH_SDPA`` (``ENV_VAR``) is read in two places only, never on
``import sageattention``: by ``patch_from_env()`` (``1`` installs the patch, ``0`` or unset does
nothing) and by ``python -m sageattention run`` (which patches unless it is ``0``).

Checked with torch 2.11.0 (on an H100) and torch 2.14.1 (the CPU tests) (``CHECKED_WITH``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections import Counter

import torch
import torch.nn.functional as F

from .. import autograd, dispatch
from .._checks import INPUT_DTYPES, _valid_dense, check_attn_mask, check_qkv, check_sm_scale, mask_kind
from ..core import _dispatch_head_dim, sageattn

#: The client this integration was checked with (torch on an H100, and the CPU tests).
CHECKED_WITH = {"torch": "2.11.0, 2.14.1"}
#: The environment variable read by patch_from_env() and python -m sageattention run.
ENV_VAR = "SAGEATTENTION_PATCH_SDPA"
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
#: The key of ``patch.calls`` counting the calls that went to sageattn.
SAGE = "sageattn"
#: The prefix of the other keys: "original: <reason>".
ORIGINAL = "original: "


class SDPAFallbackWarning(UserWarning):
    """A scaled_dot_product_attention call went to the original function; the message says why."""


# Why sageattn would not run a quantized kernel for (device type, index, dtype, head dim, has mask), or
# None: decided once per key by the library's dispatch table (decide), so a call is never sent to
# sageattn where it would only run torch SDPA itself.
_kernels: dict = {}


def reset() -> None:
    """Forget the dispatch decisions (after changing what sageattention finds, e.g. in tests)."""
    _kernels.clear()


def _kernel_reason(device_type: str, index, dtype: torch.dtype, head_dim: int, has_mask: int) -> str | None:
    key = (device_type, index, dtype, head_dim, has_mask)
    if key not in _kernels:
        request = dispatch.make_request(device_type, index, dtype, head_dim, has_mask)
        entry, reasons = dispatch.decide(request)
        why = None
        if entry.backend is dispatch.SDPA:
            why = "; ".join(reasons) or "no quantized backend for this call"
        _kernels[key] = why
    return _kernels[key]


@torch.compiler.assume_constant_result
def _quantized_here(device_type: str, index, dtype: torch.dtype, head_dim: int, has_mask: int) -> bool:
    return _kernel_reason(device_type, index, dtype, head_dim, has_mask) is None


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast casts SDPA inputs to on this device type, or None."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError, RuntimeError):  # torch < 2.4 has only the CUDA/CPU forms
        return None
    return None


def _cast_dtype(query, key, value) -> torch.dtype | None:
    """Under autocast, SDPA computes in the autocast dtype: the dtype to cast to, or None."""
    if not isinstance(query, torch.Tensor) or not query.is_floating_point():
        return None
    target = _autocast_dtype(query.device.type)
    if target is None:
        return None
    if all(isinstance(t, torch.Tensor) and t.dtype == target for t in (query, key, value)):
        return None
    return target


class SageSDPA:
    """A drop-in for ``F.scaled_dot_product_attention`` that calls sageattn where the result is the same.

    ``original``: the function to call otherwise. ``masks``: send masked calls to sageattn (where the
    dispatch table has a backend taking masks) or, with False, to the original. ``devices``: device
    types whose tensors may go to sageattn at all (default ``("cuda",)``; None: any the dispatch table
    serves). ``warn``: one SDPAFallbackWarning per distinct reason. ``calls``: a Counter of where the
    calls went (``SAGE``, or ``"original: <reason>"``).
    """

    def __init__(self, original, *, masks: bool = True, devices=("cuda",), warn: bool = True):
        self.original = original
        self.masks = masks
        self.devices = None if devices is None else tuple(devices)
        self.warn = warn
        self.calls: Counter = Counter()
        self._local = threading.local()
        self._warned: set = set()

    def __call__(
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
        enable_gqa=False,
    ):  # fmt: skip
        compiling = torch.compiler.is_compiling()
        if not compiling and getattr(self._local, "busy", False):
            # sageattn itself fell back to SDPA (it found no kernel for this call): that inner call
            # must reach the original, not come back here.
            return self._original(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        cast = _cast_dtype(query, key, value)
        reason, qkv = self._route(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, cast)
        if reason is not None:
            if not compiling:
                self.calls[ORIGINAL + reason] += 1
                if self.warn and reason not in self._warned:
                    self._warned.add(reason)
                    warnings.warn(
                        f"sageattention.integrations.sdpa: {reason}; this call goes to the original "
                        "scaled_dot_product_attention",
                        SDPAFallbackWarning,
                        stacklevel=2,
                    )
            return self._original(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        q, k, v = qkv
        extra = {} if attn_mask is None else {"attn_mask": attn_mask}
        if compiling:
            return sageattn(q, k, v, tensor_layout="HND", is_causal=is_causal, sm_scale=scale, **extra)
        self.calls[SAGE] += 1
        self._local.busy = True
        try:
            return sageattn(q, k, v, tensor_layout="HND", is_causal=is_causal, sm_scale=scale, **extra)
        finally:
            self._local.busy = False

    def _original(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        kwargs = {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale}
        if enable_gqa:  # passed only when set: torch < 2.5 has no such argument
            kwargs["enable_gqa"] = enable_gqa
        return self.original(query, key, value, **kwargs)

    def why_not(
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
        cast=None,
    ) -> str | None:  # fmt: skip
        """Why this call must go to the original function, or None when sageattn computes the same.
        ``cast``: the dtype the inputs are cast to first (autocast's), or None."""
        return self._route(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, cast)[0]

    def _route(self, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, cast):
        """(None, the q, k, v to give sageattn) or (why not, None)."""
        qkv = (query, key, value)
        why = self._own_reason(qkv, attn_mask, dropout_p, is_causal, cast)
        if why is not None:
            return why, None
        device = query.device
        dtype = cast or query.dtype
        if query.dim() > 0:  # which backend sageattn would pick: the library's dispatch table
            head_dim = _dispatch_head_dim(query.shape[-1])
            decision = (device.type, device.index, dtype, head_dim, mask_kind(attn_mask, is_causal))
            if not _quantized_here(*decision):
                detail = "" if torch.compiler.is_compiling() else f": {_kernel_reason(*decision)}"
                return f"sageattn has no quantized kernel for this call on {device.type}{detail}", None
        if cast is not None:
            qkv = tuple(t if t.dtype == cast else t.to(cast) for t in qkv)
        why = _library_reason(*qkv, attn_mask, scale)
        if why is not None:
            return why, None
        if qkv[0].shape[1] != qkv[1].shape[1] and not enable_gqa:
            return "q and k head counts differ without enable_gqa", None
        return None, qkv

    def _own_reason(self, qkv, attn_mask, dropout_p, is_causal, cast) -> str | None:
        """The rules of the patch itself: what sageattn's arguments cannot express, or SDPA's own refusals."""
        query = qkv[0]
        if not all(type(t) is torch.Tensor for t in qkv):
            return "q, k, v are not all plain torch.Tensor (a subclass or another type)"
        if any(t.is_nested for t in qkv):
            return "nested tensors"
        device_type = query.device.type
        if self.devices is not None and device_type not in self.devices:
            return f"{device_type} tensors"
        dtype = cast or query.dtype
        if dtype not in INPUT_DTYPES:
            return f"dtype {dtype} (sageattn takes float16 or bfloat16)"
        if dropout_p:
            return "dropout_p > 0"
        if attn_mask is not None:
            if not self.masks:
                return "attn_mask is given (masks=False)"
            if is_causal:
                return "attn_mask together with is_causal"
            if type(attn_mask) is not torch.Tensor:
                return "attn_mask is not a plain torch.Tensor"
            if cast is not None and attn_mask.dtype != torch.bool:
                return "a float attn_mask under autocast"
            if attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype:
                return f"attn_mask dtype {attn_mask.dtype} (SDPA takes bool or q's dtype)"
        return None


def _library_reason(query, key, value, attn_mask, scale) -> str | None:
    """What sageattn's own argument checks refuse in this call (their message), or None."""
    try:
        if not _valid_dense(query, key, value, "HND"):
            check_qkv(query, key, value, "HND")  # raises, with the message of the first failed check
        check_attn_mask(attn_mask, query, key.shape[2])
        if autograd.needs_grad(query, key, value, attn_mask):
            autograd.check_mask_grad(attn_mask)
        if scale is not None:
            check_sm_scale(scale, query.shape[-1], "scale")
    except (TypeError, ValueError) as refused:
        return str(refused)
    return None


def installed() -> SageSDPA | None:
    """The patch installed as ``F.scaled_dot_product_attention``, or None."""
    current = F.scaled_dot_product_attention
    return current if isinstance(current, SageSDPA) else None


def unpatched():
    """``F.scaled_dot_product_attention`` as it is without any patch of this module."""
    current = F.scaled_dot_product_attention
    while isinstance(current, SageSDPA):
        current = current.original
    return current


def install(**options) -> SageSDPA:
    """Replace ``torch.nn.functional.scaled_dot_product_attention`` for the whole process; returns the
    patch (already installed: that one). Options: see SageSDPA."""
    current = installed()
    if current is not None:
        return current
    patch = SageSDPA(F.scaled_dot_product_attention, **options)
    F.scaled_dot_product_attention = patch
    return patch


def uninstall() -> None:
    """Put the original function back (nothing happens when no patch is installed)."""
    current = installed()
    if current is not None:
        F.scaled_dot_product_attention = current.original


@contextlib.contextmanager
def patched(patch: SageSDPA | None = None, **options):
    """``with patched() as patch:``: the patch inside the block only. An installed patch is reused;
    ``patch`` gives the one to use (built once, e.g. by a diffusers processor, and reused per call)."""
    previous = F.scaled_dot_product_attention
    if patch is None:
        patch = previous if isinstance(previous, SageSDPA) else SageSDPA(previous, **options)
    F.scaled_dot_product_attention = patch
    try:
        yield patch
    finally:
        F.scaled_dot_product_attention = previous


def env_setting(environ=None, default: bool = False) -> bool:
    """Whether ``SAGEATTENTION_PATCH_SDPA`` asks for the patch: 1/true/yes/on or 0/false/no/off (empty:
    off); ``default`` when it is unset. Another value raises ValueError naming the variable."""
    value = (os.environ if environ is None else environ).get(ENV_VAR)
    if value is None:
        return default
    value = value.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{ENV_VAR}={value!r}: use 1 (patch) or 0 (do not)")


def patch_from_env(environ=None, **options) -> SageSDPA | None:
    """``install(**options)`` when ``SAGEATTENTION_PATCH_SDPA`` is 1 (true, yes, on); returns the
    patch, or None when the variable is 0 or unset (nothing changes then, nothing is uninstalled)."""
    return install(**options) if env_setting(environ) else None


def format_calls(patch: SageSDPA) -> str:
    """The patch's counts as lines of text: the total, then each destination with its count."""
    total = sum(patch.calls.values())
    sage = patch.calls.get(SAGE, 0)
    lines = [
        f"scaled_dot_product_attention calls: {total} ({sage} to sageattn, {total - sage} to the original)"
    ]
    for where, count in patch.calls.most_common():
        lines.append(f"  {count:>8}  {where}")
    return "\n".join(lines)
