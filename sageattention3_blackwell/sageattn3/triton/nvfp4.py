"""NVFP4 element arithmetic as Triton device functions, bit-for-bit the recipe of
`sageattn3.reference` (see its module docstring).

No float8 or float4 conversion instructions are used: sm80 has none, and writing the roundings
with comparisons and exponent arithmetic keeps every target on the same bits. Divisions are
``div.rn`` (Triton's ``/`` on float32 is an approximate division).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: 6 * 448: the block scale maps a block's largest magnitude to the top of E2M1 x E4M3.
FP4_E4M3_RANGE = tl.constexpr(2688.0)
#: 1.5 * 2^23: x + RNE_SHIFT - RNE_SHIFT is x rounded to an integer (ties to even) for |x| < 2^22.
RNE_SHIFT = tl.constexpr(12582912.0)


@triton.jit
def div_rn(a, b):
    """a / b correctly rounded, 0 where b == 0."""
    safe = tl.where(b > 0, b, 1.0)
    return tl.where(b > 0, tl.math.div_rn(a, safe), 0.0)


@triton.jit
def e4m3_round(x):
    """Non-negative float32 -> the nearest E4M3 value (ties to even), saturating at 448."""
    x = tl.minimum(x, 448.0)
    exp = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    qexp = tl.maximum(exp, -6) - 3  # 3 mantissa bits; the subnormal quantum is 2^-9
    quantum = ((qexp + 127) << 23).to(tl.float32, bitcast=True)
    inv_quantum = ((127 - qexp) << 23).to(tl.float32, bitcast=True)
    # Round to an integer, ties to even: adding 1.5 * 2^23 leaves no fraction bits in float32.
    # The scaled value is below 17, and scaling by a power of two is exact.
    return ((x * inv_quantum + RNE_SHIFT) - RNE_SHIFT) * quantum


@triton.jit
def e4m3_encode(r):
    """An E4M3 value (from `e4m3_round`) -> its byte, as int32."""
    bits = r.to(tl.int32, bitcast=True)
    exp = ((bits >> 23) & 0xFF) - 127
    normal = ((exp + 7) << 3) | ((bits >> 20) & 7)
    subnormal = (r * 512.0).to(tl.int32)
    return tl.where(r >= 0.015625, normal, subnormal)


@triton.jit
def e4m3_decode(byte):
    """E4M3 byte (any integer type) -> float32."""
    b = byte.to(tl.int32)
    exp = (b >> 3) & 15
    man = b & 7
    normal = ((exp + 120) << 23 | (man << 20)).to(tl.float32, bitcast=True)
    return tl.where(exp == 0, man.to(tl.float32) * 0.001953125, normal)


@triton.jit
def e2m1_code(y):
    """float32 -> E2M1 code (int32, 0..15): ties to the even code, saturating at 6."""
    a = tl.abs(y)
    mag = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
        + (a > 2.5).to(tl.int32)
        + (a >= 3.5).to(tl.int32)
        + (a > 5.0).to(tl.int32)
    )
    return mag | ((y < 0).to(tl.int32) << 3)


@triton.jit
def e2m1_value(code):
    """E2M1 code (int32) -> float32: magnitude (1 + m/2) * 2^(e-1), or m/2 when e == 0."""
    e = (code >> 1) & 3
    m = (code & 1).to(tl.float32)
    normal = (1.0 + 0.5 * m) * ((e + 126) << 23).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, 0.5 * m, normal)
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def spread_groups(t, R: tl.constexpr, C: tl.constexpr):
    """[R, C // 16] -> [R, C]: each group's value repeated over its 16 elements."""
    return tl.reshape(tl.broadcast_to(tl.reshape(t, (R, C // 16, 1)), (R, C // 16, 16)), (R, C))


@triton.jit
def quantize_groups(x, g, R: tl.constexpr, C: tl.constexpr):
    """Quantize x [R, C] (float32) in groups of 16 along C with block scale g ([R, 1] or a
    scalar). Returns (codes int32 [R, C], group scale float32 [R, C // 16])."""
    amax = tl.max(tl.reshape(tl.abs(x), (R, C // 16, 16)), axis=2)  # [R, C // 16]
    sf = e4m3_round(div_rn(amax, g * 6.0))
    # The elementwise work stays in 2-D: Triton compiles 3-D elementwise chains very slowly.
    # One correctly rounded reciprocal per group, then a product per element: per-element
    # divisions made ptxas take minutes on a 128x128 tile.
    inv_step = spread_groups(div_rn(tl.full((R, C // 16), 1.0, tl.float32), sf * g), R, C)
    return e2m1_code(x * inv_step), sf


@triton.jit
def group_values(codes, sf, R: tl.constexpr, C: tl.constexpr):
    """value(code) * sf for codes [R, C] and group scales [R, C // 16] (float32, exact)."""
    return e2m1_value(codes) * spread_groups(sf, R, C)


@triton.jit
def pack_codes(codes, R: tl.constexpr, C: tl.constexpr):
    """codes [R, C] int32 -> bytes [R, C // 2] uint8, even element in the low nibble."""
    lo, hi = tl.split(tl.reshape(codes, (R, C // 2, 2)))
    return (lo | (hi << 4)).to(tl.uint8)


@triton.jit
def unpack_codes(packed, R: tl.constexpr, C: tl.constexpr):
    """bytes [R, C // 2] -> codes [R, C] int32."""
    p = packed.to(tl.int32)
    return tl.reshape(tl.join(p & 15, (p >> 4) & 15), (R, C))
