"""What the launchers of the compiled attention kernels (cuda_sm80, cuda_sm89, cuda_sm90) share:
the input checks, the padded head dim, and loading the extensions whose ops they call. Importing it
registers the ops' fake implementations (cuda_ops), so that torch.compile traces whichever launcher
a process reaches first."""

from __future__ import annotations

import torch

from . import (
    cuda_ops,  # noqa: F401  (registers the fake implementations, for torch.compile)
    extensions,
)

__all__ = ["d_pad", "check_qkv", "load_extensions", "start_call"]


def d_pad(head_dim: int) -> int:
    """The head dim the quantized tensors are padded to (the kernels take 64 or 128)."""
    return 64 if head_dim <= 64 else 128


def check_qkv(q, k, v) -> None:
    """The shapes and dtypes the compiled kernels take (ValueError / TypeError naming the argument)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4 or x.stride(-1) != 1:
            raise ValueError(f"{name} must be a 4-d [B, H, N, D] view with a unit last stride")
        if x.dtype not in (torch.float16, torch.bfloat16) or x.dtype != q.dtype:
            raise TypeError(f"q, k and v must share one dtype, float16 or bfloat16; {name} is {x.dtype}")
    b, hq, _, head_dim = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    if head_dim > 128 or head_dim % 8:
        raise ValueError(f"head dim {head_dim} is not supported: it must be a multiple of 8, at most 128")
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be [B, Hkv, Nk, {head_dim}]")
    if k.shape[0] != b or hq % hkv:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)}: batch must match, Hq a multiple of Hkv")
    if nk == 0:
        raise ValueError("k and v must hold at least one key")


def load_extensions(arch: str) -> None:
    """Load the fused quantization ops and an arch family's kernels (loading registers the ops); once."""
    if arch in _loaded:
        return
    for module in (extensions.FUSED_EXTENSION, extensions.COMPILED_EXTENSIONS[arch]):
        loaded, reason = extensions._import_extension(module)
        if loaded is None:
            raise RuntimeError(f"sageattention.{module} is not available: {reason}")
    _loaded.add(arch)


_loaded: set[str] = set()  # arch families whose modules load


def start_call(arch: str, q, k, v, *, check: bool, pv_accum: str | None = None, pv_accums: tuple = ()):
    """What every launcher does first: the input checks (unless ``check`` is False: the caller has made
    them), ``pv_accum`` checked against the arch family's ``pv_accums`` (ValueError naming the valid
    values; None for a family without the choice), then the extensions loaded (RuntimeError saying why
    one is not available)."""
    if check:
        check_qkv(q, k, v)
    if pv_accum is not None and pv_accum not in pv_accums:
        raise ValueError(
            f"pv_accum={pv_accum!r} is not supported by the {arch} kernel; valid values: {pv_accums}"
        )
    load_extensions(arch)
