"""sageattn3: NVFP4 (FP4 microscaling) attention for Blackwell GPUs, with a portable Triton path.

Public API: `sageattn3_blackwell`. The exact arithmetic is in `sageattn3.reference`.
"""

from __future__ import annotations

from .core import sageattn3_blackwell

__version__ = "1.0.0"

__all__ = ["sageattn3_blackwell", "__version__"]
