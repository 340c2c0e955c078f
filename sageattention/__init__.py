"""SageAttention: quantized attention for PyTorch (INT8 Q·K with smoothed K, FP8 or FP16 P·V).

``sageattn`` is a drop-in for ``torch.nn.functional.scaled_dot_product_attention`` that picks the
best implementation for the device; the named variants force one. ``python -m sageattention env``
tells which one runs here and why.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from . import _native

# A wheel of one CUDA line beside a torch of another is refused here, with what to install instead;
# `python -m sageattention env` still runs, to show both.
_CUDA_LINE_PROBLEM = _native.cuda_line_problem()
if _CUDA_LINE_PROBLEM is not None and getattr(sys, "orig_argv", [])[1:3] != ["-m", "sageattention"]:
    raise ImportError(_CUDA_LINE_PROBLEM)

from .core import (  # noqa: E402 - after the CUDA-line check, which must come first
    sageattn,
    sageattn_qk_int8_pv_fp8_cuda,
    sageattn_qk_int8_pv_fp8_cuda_sm90,
    sageattn_qk_int8_pv_fp8_triton,
    sageattn_qk_int8_pv_fp16_cuda,
    sageattn_qk_int8_pv_fp16_triton,
    sageattn_varlen,
)
from .dispatch import SageAttentionFallbackWarning  # noqa: E402
from .merge import merge_attention  # noqa: E402

try:
    __version__ = version("sageattention")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "SageAttentionFallbackWarning",
    "__version__",
    "merge_attention",
    "sageattn",
    "sageattn_qk_int8_pv_fp8_cuda",
    "sageattn_qk_int8_pv_fp8_cuda_sm90",
    "sageattn_qk_int8_pv_fp8_triton",
    "sageattn_qk_int8_pv_fp16_cuda",
    "sageattn_qk_int8_pv_fp16_triton",
    "sageattn_varlen",
]
