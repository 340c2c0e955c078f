"""Triton kernels: the portable quantized path (sm80+; FP8 P·V needs sm89+)."""

from .launch import attention_fwd, kernel_block_sizes, reference_options, varlen_fwd

__all__ = ["attention_fwd", "kernel_block_sizes", "reference_options", "varlen_fwd"]
