"""What the examples measure, the same way in each: output agreement and wall time.

* ``cosine``: cosine similarity of two outputs, in float64 over all elements.
* ``time_ms``: median wall time of a call in milliseconds, synchronizing the GPU around each call, after
  warm-up calls (the first calls compile Triton kernels and pick cuDNN/cuBLAS algorithms).
* ``per_call_ms``: milliseconds per call in a run of calls issued back to back, as the layers of a
  model issue them: the host prepares the next call while the GPU runs this one, so its own time per
  call counts only where it exceeds the GPU's. (A single synchronized call adds both: at short
  sequences that can hide a faster kernel behind a slower host path.)
* ``uniform_attention``: the negative control. A cosine near 1 means something only if a wrong
  attention would give a clearly lower one; this runs the model with every visible key weighted the
  same (scores ignored, masks and causality kept) to show how far a broken attention moves the output.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors of the same number of elements (NaN anywhere gives NaN)."""
    x, y = a.detach().double().flatten(), b.detach().double().flatten()
    denom = x.norm() * y.norm()
    if denom == 0:
        return 1.0 if torch.equal(x, y) else 0.0
    return float((x @ y) / denom)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_call_ms(
    fn: Callable[[], object], device: torch.device, *, warmup: int = 2, calls: int = 20, reps: int = 5
) -> float:
    """Median over ``reps`` runs of ``calls`` back-to-back calls (one sync at each run's end), per call."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(times)


def time_ms(fn: Callable[[], object], device: torch.device, *, warmup: int = 2, reps: int = 5) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` calls, each synchronized, after ``warmup`` calls."""
    return per_call_ms(fn, device, warmup=warmup, calls=1, reps=reps)


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def describe(device: torch.device) -> str:
    """The device in words, e.g. "NVIDIA H100 80GB HBM3 (sm90), torch 2.11.0+cu130"."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = f"{torch.cuda.get_device_name(device)} (sm{major}{minor})"
    else:
        name = "CPU"
    return f"{name}, torch {torch.__version__}"


def format_table(rows: list[dict], columns: list[str]) -> str:
    """Rows of dicts as an aligned text table (floats with 4 significant digits, cosines with 6)."""

    def cell(column: str, value: object) -> str:
        if isinstance(value, float):
            return f"{value:.6f}" if column.startswith("cos") else f"{value:.4g}"
        return "" if value is None else str(value)

    cells = [[cell(c, row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


#: The row name of the negative control (uniform_attention) in the examples' tables.
CONTROL = "control: uniform attention"


def cudnn_first():
    """torch SDPA with its cuDNN backend tried first (then flash, memory-efficient, math)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    return sdpa_kernel([*order, SDPBackend.MATH], set_priority=True)


@contextlib.contextmanager
def uniform_attention():
    """Inside the block, F.scaled_dot_product_attention ignores the scores: each query averages the
    values of the keys it may see. The negative control of the examples' comparisons."""
    original = F.scaled_dot_product_attention

    def uniform(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        extra = {"enable_gqa": True} if enable_gqa else {}
        blind = torch.zeros_like(query)
        return original(
            blind,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            **extra,
        )

    F.scaled_dot_product_attention = uniform
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
