"""Every ``torch.nn.functional.scaled_dot_product_attention`` call of the process through ``sageattn``.

    from example.sdpa_monkeypatch import install
    patch = install()   # from here on F.scaled_dot_product_attention is sageattn wherever it can be
    model(x)            # any model that calls F.scaled_dot_product_attention, unchanged
    print(patch.calls)  # how many calls went where, and why

A call goes to ``sageattn`` only when ``sageattn`` computes what SDPA would compute, on a quantized
kernel: tensors on a CUDA GPU that sageattn has kernels for, float16/bfloat16 (any float dtype
under autocast to one of them), 4-D ``[batch, heads, seq, head_dim]`` with head_dim <= 128, no
dropout, a bool or same-dtype float mask that needs no gradient (unless ``masks=False``), a positive
scale. Training calls (q, k or v requiring grad) go to ``sageattn`` too: its backward gives dQ, dK and
dV (docs/api.md, "Gradients"). Every other call
goes to the original function with its arguments as given: a mask, a dropout probability or a
mask gradient is never dropped, and what SDPA refuses is refused by SDPA itself, with its own error.
Each reason warns once (``SDPAFallbackWarning``) and is counted in ``patch.calls``.

``patched()`` does the same for a ``with`` block. Code that bound the function before the patch
(``from torch.nn.functional import scaled_dot_product_attention``) keeps the original.

Run as a script, it checks a few calls against the original and times the attention calls of a
Flux-sized image transformer (b=1, h=24, n=4608, d=128) both ways, back to back as a model issues them
(ms per call).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import threading
import warnings
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as `python example/sdpa_monkeypatch.py`: make `example` importable
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from example.measure import cosine, default_device, describe, format_table, per_call_ms  # noqa: E402
from sageattention import sageattn  # noqa: E402

SAGE = "sageattn"
#: Largest head dim of sageattn's quantized kernels; above it sageattn itself would use SDPA.
MAX_HEAD_DIM = 128
_DTYPES = (torch.float16, torch.bfloat16)


class SDPAFallbackWarning(UserWarning):
    """A scaled_dot_product_attention call went to the original function; the message says why."""


# The backend sageattn picks for (device type, index, dtype, has mask): decided once, by the library's
# own dispatch table, so a call is never sent to sageattn where it would only run SDPA itself.
_backends: dict = {}


def reset() -> None:
    """Forget the backend decisions (after changing what sageattention finds, e.g. in tests)."""
    _backends.clear()


@torch.compiler.assume_constant_result
def _quantized_here(device_type: str, index: int, dtype: torch.dtype, has_mask: bool) -> bool:
    key = (device_type, index, dtype, has_mask)
    if key not in _backends:
        from sageattention import dispatch  # noqa: PLC0415

        request = dispatch.make_request(device_type, index, dtype, MAX_HEAD_DIM, has_mask)
        entry, _ = dispatch.decide(request)
        _backends[key] = entry.backend.name
    return _backends[key] != "sdpa"


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast casts SDPA inputs to on this device type, or None."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError, RuntimeError):  # torch < 2.4 has only the CUDA/CPU forms
        return None
    return None


class SageSDPA:
    """A drop-in for ``F.scaled_dot_product_attention`` that calls sageattn where the result is the same.

    ``original``: the function to call otherwise. ``masks``: send masked calls to sageattn (its Triton
    kernels take bool and additive masks) or, with False, to the original. ``devices``: device types
    whose tensors may go to sageattn. ``warn``: one SDPAFallbackWarning per distinct reason.
    """

    def __init__(self, original, *, masks: bool = True, devices=("cuda",), warn: bool = True):
        self.original = original
        self.masks = masks
        self.devices = tuple(devices)
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
        cast = None  # under autocast, SDPA computes in the autocast dtype: so does sageattn
        if isinstance(query, torch.Tensor) and query.is_floating_point():
            target = _autocast_dtype(query.device.type)
            cast = target if target is not None and target != query.dtype else None
        reason = self.why_not(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, cast)
        if reason is not None:
            if not compiling:
                self.calls[f"original: {reason}"] += 1
                if self.warn and reason not in self._warned:
                    self._warned.add(reason)
                    warnings.warn(
                        f"sdpa_monkeypatch: {reason}; this call goes to the original "
                        "scaled_dot_product_attention",
                        SDPAFallbackWarning,
                        stacklevel=2,
                    )
            return self._original(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if cast is not None:
            query, key, value = query.to(cast), key.to(cast), value.to(cast)
        extra = {} if attn_mask is None else {"attn_mask": attn_mask}
        if compiling:
            return sageattn(
                query, key, value, tensor_layout="HND", is_causal=is_causal, sm_scale=scale, **extra
            )
        self.calls[SAGE] += 1
        self._local.busy = True
        try:
            return sageattn(
                query, key, value, tensor_layout="HND", is_causal=is_causal, sm_scale=scale, **extra
            )
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
        """Why this call must go to the original function, or None when sageattn computes the same."""
        qkv = (query, key, value)
        if not all(type(t) is torch.Tensor for t in qkv):
            return "q, k, v are not all plain torch.Tensor (a subclass or another type)"
        if any(t.is_nested for t in qkv):
            return "nested tensors"
        device = query.device
        if device.type not in self.devices:
            return f"{device.type} tensors"
        if key.device != device or value.device != device:
            return "q, k, v are on different devices"
        dtype = cast or query.dtype
        if dtype not in _DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
            return f"dtype {dtype} (sageattn takes float16 or bfloat16, the same for q, k, v)"
        if cast is not None and attn_mask is not None and attn_mask.dtype != torch.bool:
            return "a float attn_mask under autocast"
        if dropout_p:
            return "dropout_p > 0"
        if torch.is_grad_enabled() and isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad:
            # Training calls go to sageattn (quantized forward, high-precision backward); a learned mask
            # does not: sageattn computes no gradient for the mask.
            return "attn_mask requires grad (sageattn computes no gradient for the mask)"
        if any(t.dim() != 4 for t in qkv):
            return "inputs are not 4-D [batch, heads, seq, head_dim]"
        batch, q_heads, q_len, head_dim = query.shape
        kv_batch, kv_heads, kv_len, k_dim = key.shape
        if tuple(value.shape) != tuple(key.shape) or kv_batch != batch or k_dim != head_dim:
            return "q, k, v shapes differ in batch or head dim, or k and v differ"
        if head_dim > MAX_HEAD_DIM:
            return f"head_dim {head_dim} > {MAX_HEAD_DIM}"
        if min(batch, q_heads, q_len, kv_len, head_dim) == 0:
            return "an empty dimension"
        if q_heads != kv_heads and not (enable_gqa and q_heads % kv_heads == 0):
            return "q and k head counts differ without enable_gqa (or do not divide)"
        if any(t.stride(-1) != 1 for t in qkv):
            return "a last dimension is not contiguous"
        if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            return "scale is not a positive finite number"
        if attn_mask is not None:
            why = self._mask_reason(attn_mask, query, kv_len, is_causal)
            if why is not None:
                return why
        if not _quantized_here(device.type, device.index, dtype, attn_mask is not None):
            return f"sageattn has no quantized kernel for {device} (see python -m sageattention env)"
        return None

    def _mask_reason(self, mask, query, kv_len, is_causal) -> str | None:
        if not self.masks:
            return "attn_mask is given (masks=False)"
        if is_causal:
            return "attn_mask together with is_causal"
        if type(mask) is not torch.Tensor or mask.device != query.device:
            return "attn_mask is not a tensor on q's device"
        if mask.dtype != torch.bool and mask.dtype != query.dtype:
            return f"attn_mask dtype {mask.dtype} (bool or q's dtype)"
        target = (query.shape[0], query.shape[1], query.shape[2], kv_len)
        shape = tuple(mask.shape)
        if not 2 <= len(shape) <= 4 or any(m not in (1, t) for m, t in zip(shape[::-1], target[::-1])):
            return f"attn_mask of shape {list(shape)} (sageattn takes 2 to 4 dims, broadcastable)"
        return None


def install(**options) -> SageSDPA:
    """Replace ``torch.nn.functional.scaled_dot_product_attention`` for the whole process; returns the
    patch (already installed: that one). Options: see SageSDPA."""
    current = F.scaled_dot_product_attention
    if isinstance(current, SageSDPA):
        return current
    patch = SageSDPA(current, **options)
    F.scaled_dot_product_attention = patch
    return patch


def uninstall() -> None:
    """Put the original function back (nothing happens when no patch is installed)."""
    current = F.scaled_dot_product_attention
    if isinstance(current, SageSDPA):
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


# --------------------------------------------------------------------------------------------------
# The script


def check_calls(device: torch.device, n: int = 256) -> list[dict]:
    """A few calls, each through the patch and through the original: where it went, and the cosine."""
    original = F.scaled_dot_product_attention
    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    q, k, v = randn(2, 8, n, 64), randn(2, 8, n, 64), randn(2, 8, n, 64)
    kv2 = randn(2, 2, n, 64), randn(2, 2, n, 64)
    keep = torch.rand(2, 1, n, n, generator=gen).to(device) > 0.2
    cases = {
        "plain": ((q, k, v), {}),
        "causal": ((q, k, v), {"is_causal": True}),
        "GQA (enable_gqa)": ((q, *kv2), {"enable_gqa": True}),
        "bool mask": ((q, k, v), {"attn_mask": keep}),
        "additive mask": ((q, k, v), {"attn_mask": torch.where(keep, 0.0, -1e4).to(q.dtype)}),
        "scale=0.05": ((q, k, v), {"scale": 0.05}),
        "float32": ((q.float(), k.float(), v.float()), {}),
        "dropout_p=0.1 (seeded)": ((q, k, v), {"dropout_p": 0.1}),
        "head_dim 256": ((randn(1, 2, n, 256), randn(1, 2, n, 256), randn(1, 2, n, 256)), {}),
    }
    rows = []
    with patched(warn=False) as patch:
        for name, (args, kwargs) in cases.items():
            before = Counter(patch.calls)
            torch.manual_seed(1)
            out = F.scaled_dot_product_attention(*args, **kwargs)
            torch.manual_seed(1)
            ref = original(*args, **kwargs)
            went = next(iter((patch.calls - before).keys()))
            rows.append({"call": name, "went to": went, "cos vs original": cosine(out, ref)})
    return rows


def time_call(device: torch.device, b=1, h=24, n=4608, d=128, reps=10) -> dict:
    """Attention calls of this shape, back to back: the original against the patch (ms per call,
    speedup, cosine)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=gen).to(device, torch.bfloat16) for _ in range(3))
    original = F.scaled_dot_product_attention
    ref = original(q, k, v)
    sdpa_ms = per_call_ms(lambda: original(q, k, v), device, reps=reps)
    with patched(warn=False):
        out = F.scaled_dot_product_attention(q, k, v)
        sage_ms = per_call_ms(lambda: F.scaled_dot_product_attention(q, k, v), device, reps=reps)
    return {
        "shape": f"b={b} h={h} n={n} d={d}",
        "sdpa ms": sdpa_ms,
        "patched ms": sage_ms,
        "speedup": sdpa_ms / sage_ms,
        "cos": cosine(out, ref),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--n", type=int, default=None, help="sequence length of the timed calls (4608 on a GPU)"
    )
    args = parser.parse_args(argv)
    device = default_device()
    print(f"device: {describe(device)}")
    if device.type != "cuda":
        print("no CUDA GPU: every call goes to the original function (sageattn would only run SDPA here)")
    print(format_table(check_calls(device), ["call", "went to", "cos vs original"]))
    n = args.n or (4608 if device.type == "cuda" else 256)
    row = time_call(device, n=n, h=24 if device.type == "cuda" else 2)
    print(format_table([row], ["shape", "sdpa ms", "patched ms", "speedup", "cos"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
