"""Quantization choices as types, and the constants every implementation shares.

The public API keeps the familiar string arguments ("fp32+fp16", "per_warp", ...);
they are converted here once, so nothing below the API passes magic strings around.
"""

from __future__ import annotations

import enum
import math

#: exp(x) == exp2(x * LOG2E): scores are kept in the log2 domain so the kernels use exp2.
LOG2E = 1.4426950408889634
#: Largest INT8 magnitude used; -128 is left out so the range is symmetric.
INT8_MAX = 127.0
#: Largest finite float8 e4m3fn value.
FP8_E4M3_MAX = 448.0
#: Two-level INT8 K: K ~ scale * (k1 + k2 / K_RESIDUAL_MUL), both digits INT8. The residual of
#: the first rounding is at most half a step, so 254 * residual stays within +-127, and
#: 254 * (q . k1) + q . k2 fits int32 for head dims up to 128 (127 * 32385 * 128 < 2^31).
K_RESIDUAL_MUL = 254.0
#: Scale of the two-level integer k1 * 254 + k2: amax / 127 / 254 (one float32 constant for every
#: implementation, so the kernels and the reference round it the same way).
K_RESIDUAL_SCALE = 1.0 / (INT8_MAX * K_RESIDUAL_MUL)


class PVDtype(enum.Enum):
    """Precision of the P·V product."""

    FP16 = "fp16"
    FP8 = "fp8"


class PVAccum(enum.Enum):
    """How the P·V products are accumulated (the established `pv_accum_dtype` strings)."""

    FP32 = "fp32"
    FP16 = "fp16"
    FP16_FP32 = "fp16+fp32"
    FP32_FP32 = "fp32+fp32"
    FP32_FP16 = "fp32+fp16"


class QKQuantGran(enum.Enum):
    """Granularity of the INT8 scales of Q and K (the established `qk_quant_gran` strings)."""

    PER_BLOCK = "per_block"
    PER_WARP = "per_warp"
    PER_THREAD = "per_thread"


def parse_enum(enum_type: type[enum.Enum], value: object, argument: str) -> enum.Enum:
    """Convert a public string argument to its enum, with an error naming the argument."""
    if isinstance(value, enum_type):
        return value
    # A dict lookup, not a loop over the enum class: older torch.compile versions cannot iterate one.
    member = enum_type._value2member_map_.get(value) if isinstance(value, str) else None
    if member is not None:
        return member
    valid = ", ".join(repr(m.value) for m in enum_type)
    raise ValueError(f"{argument}={value!r} is not supported; valid values: {valid}")


def default_sm_scale(head_dim: int) -> float:
    """SDPA's default softmax scale, 1/sqrt(head_dim), of the caller's (unpadded) head dim."""
    return 1.0 / math.sqrt(head_dim)
