"""Reference arithmetic of sageattn3, runnable on the CPU.

`attention_ref` is the ground truth: float64 softmax attention with SDPA's semantics.

`sage3_ref` is what the kernels compute, step by step, in float32 (the FP4 products are formed
exactly in float64 and rounded once to float32, as a tensor core accumulating in float32 would for
one 16-element group). A kernel is held tightly to it and loosely to `attention_ref`.

NVFP4 (the number format)
-------------------------
* Element: E2M1, 4 bits, sign + magnitude. The magnitude codes 0..7 mean
  0, 0.5, 1, 1.5, 2, 3, 4, 6. Two codes share a byte: element ``2i`` in the low nibble,
  ``2i + 1`` in the high nibble (the order the tensor cores read a 32-bit register).
* Group scale: one E4M3 (float8_e4m3fn) per 16 consecutive elements along the reduction axis
  (head dim for Q and K; tokens for P and V^T).
* Block scale: one float32 per block (128 query rows of Q; ``block_n`` key tokens of K and V; one
  row of a ``block_n``-wide tile of P). ``g = amax(block) / (6 * 448)`` maps the block's largest
  magnitude to the top of the E4M3 x E2M1 range, so every group scale lands in E4M3's normal
  range unless the group is ~2^16 times smaller than its block, and a group scale can never
  overflow E4M3 (448). For P this is the "per-row FP32 scale" of the two-level scheme.

Quantizing one group ``x[0:16]`` with block scale ``g`` (all float32, every division correctly
rounded, as ``div.rn.f32`` on the GPU):

1. ``sf = e4m3_rne(min(amax(|x|) / (g * 6), 448))``. ``g * 6`` is one rounded product; the
   quotient can exceed 448 by an ulp, hence the clamp (a saturating conversion). An all-zero
   group, a block with ``g == 0``, and a group so small that ``sf`` rounds to 0 (below 2^-10)
   all get ``sf = 0`` and codes 0: they are flushed to zero.
2. ``inv = 1 / (sf * g)`` (a rounded product, then one correctly rounded reciprocal per group;
   0 where ``sf * g == 0``), and ``y = x * inv`` (one rounded product per element: a division
   per element is slow to compile and to run on the GPU).
3. ``code = e2m1_rne(y)``: round to nearest, ties to the even code, saturating at 6. The ties:
   0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4. The sign bit is set
   iff ``y < 0`` (a tiny negative value becomes code 0b1000, "-0").
4. Dequantized value: ``(value(code) * sf) * g``. ``value(code) * sf`` has at most 6
   significant bits and lies in [2^-10, 2688], so it is exact in float16 and bfloat16: a
   kernel without FP4 tensor cores can feed it to an fp16 MMA without further rounding.

`fp4_quantize_ref` without a block scale is the single-level format (``g = 1``): scale
``amax / 6`` rounded to E4M3, saturating at 448.

Attention (`sage3_ref`)
-----------------------
1. K is smoothed by its mean over tokens (float32, per batch, head, channel). Subtracting it
   shifts every score of a query row by the same amount, so softmax is unchanged; the LSE gets
   ``sm_scale * q . k_mean`` added back.
2. With ``per_block_mean``, Q is smoothed by the mean of each block of 128 query rows, and the
   term ``q_mean . (k - k_mean)`` (float32, exact products summed in float64 and rounded once) is
   added back to every score of that block. Smoothing concentrates Q's and K's values around 0,
   where FP4's few levels are densest.
3. Q and K are quantized to NVFP4 along the head dim; V is transposed and quantized along tokens.
4. Scores in the log2 domain: ``s = (dot(q4, k4) * (gq * gk) + corr) * (sm_scale * log2 e)``
   where ``dot`` is over the dequantized group values (``value * sf``), formed exactly.
5. Online softmax over key blocks of ``block_n`` with exp2; per block, ``p = exp2(s - m)``
   (``m`` the running row max) is quantized in two levels: the row scale ``gp = max(p_row) / 2688``
   then per-16-key groups, exactly as in the recipe above.
6. ``acc = acc * alpha + dot(p4, v4^T) * (gp * gv)``; the row sum ``l`` adds the unquantized
   float32 ``p``; the output is ``acc / l``.

Causal masking follows SDPA's ``is_causal`` (top-left corner, also for Nq != Nk). A row with no
visible key gives an output of 0 and an LSE of -inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "E2M1_VALUES",
    "E4M3_MAX",
    "FP4_MAX",
    "GROUP",
    "LOG2E",
    "QuantizedTensor",
    "attention_ref",
    "block_scale_ref",
    "e2m1_round_ref",
    "e4m3_round_ref",
    "e4m3_round_bits_ref",
    "fp4_dequantize_ref",
    "fp4_quantize_ref",
    "quantize_k_ref",
    "quantize_q_ref",
    "quantize_v_ref",
    "sage3_ref",
    "smooth_q_ref",
    "to_hnd",
]

#: exp(x) == exp2(x * LOG2E): scores are kept in the log2 domain so the kernels use exp2.
LOG2E = 1.4426950408889634
#: Largest E2M1 magnitude.
FP4_MAX = 6.0
#: Largest finite float8_e4m3fn value.
E4M3_MAX = 448.0
#: Elements per E4M3 group scale (NVFP4).
GROUP = 16
#: Query rows per block of Q (the per-block mean and Q's block scale).
Q_BLOCK = 128
#: The E2M1 magnitudes, indexed by the 3-bit magnitude code.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Rounding thresholds between consecutive magnitudes: (midpoint, whether a tie rounds up).
# A tie goes to the even code: 0.25 -> 0 (code 0), 0.75 -> 1.0 (code 2), 1.25 -> 1.0 (code 2),
# 1.75 -> 2.0 (code 4), 2.5 -> 2.0 (code 4), 3.5 -> 4.0 (code 6), 5.0 -> 4.0 (code 6).
E2M1_THRESHOLDS = (
    (0.25, False),
    (0.75, True),
    (1.25, False),
    (1.75, True),
    (2.5, False),
    (3.5, True),
    (5.0, False),
)


def default_sm_scale(head_dim: int) -> float:
    """SDPA's default softmax scale, 1/sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim)


def to_hnd(x: torch.Tensor, tensor_layout: str) -> torch.Tensor:
    """View a [B, N, H, D] ("NHD") tensor as [B, H, N, D]; "HND" passes through."""
    if tensor_layout == "NHD":
        return x.transpose(1, 2)
    if tensor_layout == "HND":
        return x
    raise ValueError(f"tensor_layout={tensor_layout!r} is not supported; valid values: 'HND', 'NHD'")


def _expand_kv(x: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    groups = num_q_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b as one correctly rounded float32 division per element, 0 where b == 0.
    (Both operands are tensors: torch computes tensor / Python-number as a reciprocal multiply.)"""
    a, b = torch.broadcast_tensors(a, b)
    safe = torch.where(b > 0, b, torch.ones_like(b))
    return torch.where(b > 0, a / safe, torch.zeros_like(a))


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


# ------------------------------------------------------------------------------------------------
# Element formats


def e2m1_round_ref(y: torch.Tensor) -> torch.Tensor:
    """float32 -> 4-bit E2M1 codes (uint8, 0..15): RNE, ties to even, saturating at 6."""
    a = y.abs()
    mag = torch.zeros_like(a, dtype=torch.uint8)
    for mid, tie_up in E2M1_THRESHOLDS:
        mag += (a >= mid if tie_up else a > mid).to(torch.uint8)
    return mag | ((y < 0).to(torch.uint8) << 3)


def e2m1_decode_ref(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8, 0..15, unpacked) -> float32 values."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    mag = table[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def e4m3_round_ref(x: torch.Tensor) -> torch.Tensor:
    """Non-negative float32 -> nearest float8_e4m3fn (RNE), saturating at 448."""
    return x.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


def e4m3_round_bits_ref(x: torch.Tensor) -> torch.Tensor:
    """The same rounding written with exponent arithmetic only, as the Triton kernels do it
    (float8 conversions do not exist on sm80). Returns the float32 value of the rounded scale."""
    x = x.clamp(max=E4M3_MAX)
    bits = x.view(torch.int32)
    exp = (bits >> 23) - 127
    # Quantum: 2^(e - 3) for normals (3 mantissa bits), 2^-9 below the smallest normal 2^-6.
    qexp = torch.clamp(exp, min=-6) - 3
    quantum = ((qexp + 127) << 23).view(torch.float32)
    return torch.round(x / quantum) * quantum  # power-of-two scaling: exact; round: half-even


def block_scale_ref(amax: torch.Tensor) -> torch.Tensor:
    """The float32 block scale amax / (6 * 448)."""
    return _div(amax.float(), _f32(FP4_MAX * E4M3_MAX, amax))


# ------------------------------------------------------------------------------------------------
# NVFP4 quantization along the last dimension


def fp4_quantize_ref(x: torch.Tensor, global_scale: torch.Tensor | None = None):
    """Quantize ``x`` (last dimension a multiple of 16) to NVFP4 along its last dimension.

    ``global_scale``: the float32 block scale ``g``, broadcastable to ``x.shape[:-1] + (1,)``;
    None means the single-level format (``g = 1``).

    Returns ``(codes, scales)``: codes uint8 ``[..., D // 2]`` (two per byte, even element in
    the low nibble), scales float8_e4m3fn ``[..., D // 16]``.
    """
    x = x.float()
    d = x.shape[-1]
    if d % GROUP:
        raise ValueError(f"x: the last dimension must be a multiple of {GROUP}, got {d}")
    groups = x.reshape(*x.shape[:-1], d // GROUP, GROUP)
    g = torch.ones((), device=x.device) if global_scale is None else global_scale.float()
    g = g.unsqueeze(-1) if g.dim() else g  # [..., 1] -> [..., 1, 1]: one value for all groups
    amax = groups.abs().amax(dim=-1, keepdim=True)
    sf = e4m3_round_ref(_div(amax, g * _f32(FP4_MAX, x)))
    inv = _div(_f32(1.0, x), sf.float() * g)
    codes = e2m1_round_ref(groups * inv).reshape(x.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, sf.squeeze(-1)


def fp4_unpack_ref(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., D // 2] -> 4-bit codes uint8 [..., D]."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)


def fp4_group_values_ref(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``value(code) * sf`` per element (float32; exact, and exact in fp16/bf16 as well)."""
    vals = e2m1_decode_ref(fp4_unpack_ref(packed))
    sf = scales.float().repeat_interleave(GROUP, dim=-1)
    return vals * sf


def fp4_dequantize_ref(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | None = None):
    """Inverse of `fp4_quantize_ref`: ``(value * sf) * g`` in float32."""
    out = fp4_group_values_ref(packed, scales)
    if global_scale is not None:
        out = out * global_scale.float()  # broadcastable to x[..., :1], as in fp4_quantize_ref
    return out


@dataclass
class QuantizedTensor:
    """An NVFP4 tensor with its block scales (and the mean it was smoothed by, if any)."""

    codes: torch.Tensor  # uint8 [..., rows, D // 2] (V: [B, H, D, Nk_pad // 2])
    scales: torch.Tensor  # float8_e4m3fn [..., rows, D // 16]
    block_scale: torch.Tensor  # float32 [B, H, num_blocks]
    mean: torch.Tensor | None = None  # Q: [B, H, num_blocks, D]; K: [B, H, D]


def _pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    n = x.shape[2]
    return torch.nn.functional.pad(x, (0, 0, 0, -(-n // multiple) * multiple - n))


def _quantize_rows(x: torch.Tensor, block: int) -> QuantizedTensor:
    """[B, H, N, D] float32 -> NVFP4 along D with one float32 scale per block of rows."""
    b, h, n, d = x.shape
    xp = _pad_rows(x, block)
    nblk = xp.shape[2] // block
    blocks = xp.view(b, h, nblk, block, d)
    g = block_scale_ref(blocks.abs().amax(dim=(-1, -2)))  # [B, H, nblk]
    codes, scales = fp4_quantize_ref(blocks, g[..., None, None])
    return QuantizedTensor(
        codes.view(b, h, -1, d // 2)[:, :, :n], scales.view(b, h, -1, d // GROUP)[:, :, :n], g
    )


def smooth_q_ref(q: torch.Tensor, block_m: int = Q_BLOCK, q_mean: torch.Tensor | None = None):
    """Per-block mean of Q [B, H, N, D] (float32 [B, H, nblk, D], over the block's real rows)
    and the smoothed float32 Q."""
    qf = q.float()
    b, h, n, d = qf.shape
    if q_mean is None:
        nblk = -(-n // block_m)
        sums = _pad_rows(qf, block_m).view(b, h, nblk, block_m, d).sum(dim=3)
        counts = torch.tensor(
            [min(block_m, n - i * block_m) for i in range(nblk)], dtype=torch.float32, device=qf.device
        )
        q_mean = _div(sums, counts.view(1, 1, nblk, 1))
    rows = q_mean.repeat_interleave(block_m, dim=2)[:, :, :n]
    return q_mean, qf - rows


def quantize_q_ref(q, *, per_block_mean: bool = True, block_m: int = Q_BLOCK, q_mean=None) -> QuantizedTensor:
    """Q [B, H, N, D] -> NVFP4 along D, smoothed by its per-block mean when asked.
    ``q_mean`` may be given (to hold a kernel's own mean to the same quantization)."""
    if per_block_mean:
        q_mean, qs = smooth_q_ref(q, block_m, q_mean)
    else:
        q_mean, qs = None, q.float()
    out = _quantize_rows(qs, block_m)
    out.mean = q_mean
    return out


def quantize_k_ref(k, *, block_n: int = 128, k_mean=None) -> QuantizedTensor:
    """K [B, H, N, D] -> smoothed by its token mean, NVFP4 along D, one block scale per block_n."""
    kf = k.float()
    if k_mean is None:
        k_mean = kf.mean(dim=2)
    out = _quantize_rows(kf - k_mean.unsqueeze(2), block_n)
    out.mean = k_mean
    return out


def quantize_v_ref(v, *, block_n: int = 128) -> QuantizedTensor:
    """V [B, H, N, D] -> V^T [B, H, D, N_pad] in NVFP4 along tokens (N padded with zeros to a
    multiple of block_n); one block scale per block_n tokens (over all channels)."""
    vf = _pad_rows(v.float(), block_n)
    b, h, npad, d = vf.shape
    nblk = npad // block_n
    g = block_scale_ref(vf.view(b, h, nblk, block_n * d).abs().amax(dim=-1))
    vt = vf.transpose(2, 3).reshape(b, h, d, nblk, block_n)
    codes, scales = fp4_quantize_ref(vt, g.view(b, h, 1, nblk, 1))
    return QuantizedTensor(codes.reshape(b, h, d, npad // 2), scales.reshape(b, h, d, npad // GROUP), g)


def quantize_p_ref(p: torch.Tensor):
    """Two-level P quantization of a [.., M, block_n] tile of probabilities (float32, in [0, 1]):
    row scale ``gp = max(p_row) / 2688``, then NVFP4 per 16 keys. Returns (group values
    ``value * sf`` as float32, gp [.., M])."""
    gp = block_scale_ref(p.amax(dim=-1))
    codes, scales = fp4_quantize_ref(p, gp.unsqueeze(-1))
    return fp4_group_values_ref(codes, scales), gp


# ------------------------------------------------------------------------------------------------
# Attention


def _visible(nq: int, nk: int, is_causal: bool, attn_mask, device):
    visible = None
    if is_causal:
        visible = torch.ones(nq, nk, dtype=torch.bool, device=device).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        visible = attn_mask if visible is None else (visible & attn_mask)
    return visible


def attention_ref(
    q, k, v, *, tensor_layout="HND", is_causal=False, sm_scale=None, attn_mask=None, return_lse=False
):
    """Float64 attention with SDPA semantics (GQA allowed): float64 output in the caller's layout
    (and the natural-log LSE [B, H, Nq] when ``return_lse``)."""
    q, k, v = (to_hnd(t, tensor_layout).double() for t in (q, k, v))
    if sm_scale is None:
        sm_scale = default_sm_scale(q.shape[-1])
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    s = (q @ k.transpose(-1, -2)) * sm_scale
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        s = s + attn_mask.double()
    visible = _visible(q.shape[2], k.shape[2], is_causal, attn_mask, q.device)
    if visible is not None:
        s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).masked_fill(lse.unsqueeze(-1) == -math.inf, 0.0))
    o = to_hnd(p @ v, tensor_layout)
    return (o, lse) if return_lse else o


def sage3_ref(
    q,
    k,
    v,
    *,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: float | None = None,
    attn_mask: torch.Tensor | None = None,
    per_block_mean: bool = True,
    block_n: int = 128,
    return_lse: bool = False,
):
    """Simulated NVFP4 attention: what the kernels compute, in float32 steps (see the module doc).

    Output float32 in the caller's layout; LSE (natural log, float32, [B, Hq, Nq]) when asked.
    """
    if block_n % GROUP:
        raise ValueError(f"block_n must be a multiple of {GROUP}, got {block_n}")
    q, k, v = (to_hnd(t, tensor_layout) for t in (q, k, v))
    b, hq, nq, d = q.shape
    nk = k.shape[2]
    if sm_scale is None:
        sm_scale = default_sm_scale(d)
    qq = quantize_q_ref(q, per_block_mean=per_block_mean)
    kq = quantize_k_ref(k, block_n=block_n)
    vq = quantize_v_ref(v, block_n=block_n)

    q_vals = fp4_group_values_ref(qq.codes, qq.scales).double()  # [B, Hq, Nq, D]
    k_vals = _expand_kv(fp4_group_values_ref(kq.codes, kq.scales), hq).double()
    v_vals = _expand_kv(fp4_group_values_ref(vq.codes, vq.scales), hq).double()  # [B, Hq, D, Npad]
    gq_rows = qq.block_scale.repeat_interleave(Q_BLOCK, dim=-1)[..., :nq]  # [B, Hq, Nq]
    gk = _expand_kv(kq.block_scale, hq)
    gv = _expand_kv(vq.block_scale, hq)
    corr = None
    if per_block_mean:
        k_smooth = _expand_kv(k.float() - kq.mean.unsqueeze(2), hq).double()
        corr = (qq.mean.double() @ k_smooth.transpose(-1, -2)).float()  # [B, Hq, nblk_q, Nk]
        corr = corr.repeat_interleave(Q_BLOCK, dim=2)[:, :, :nq]
    qk_scale = _f32(sm_scale * LOG2E, q)

    additive = None
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        additive = attn_mask.float() * _f32(LOG2E, q)
    visible = _visible(nq, nk, is_causal, attn_mask, q.device)

    m = torch.full((b, hq, nq), -math.inf, device=q.device)
    l_sum = torch.zeros((b, hq, nq), device=q.device)
    acc = torch.zeros((b, hq, nq, v.shape[-1]), device=q.device)
    for blk, start in enumerate(range(0, nk, block_n)):
        stop = min(start + block_n, nk)
        dot = (q_vals @ k_vals[:, :, start:stop].transpose(-1, -2)).float()
        s = dot * (gq_rows * gk[:, :, blk : blk + 1]).unsqueeze(-1)
        if corr is not None:
            s = s + corr[..., start:stop]
        s = s * qk_scale
        if additive is not None:
            s = s + additive.expand(b, hq, nq, nk)[..., start:stop]
        if visible is not None:
            s = s.masked_fill(~visible.expand(b, hq, nq, nk)[..., start:stop], -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
        p = torch.exp2(s - m_safe.unsqueeze(-1))
        alpha = torch.exp2(m - m_safe)
        l_sum = l_sum * alpha + p.sum(dim=-1)
        # Pad the tile to block_n keys (zeros) so the groups of 16 line up with V's.
        p_full = torch.nn.functional.pad(p, (0, block_n - (stop - start)))
        p_vals, gp = quantize_p_ref(p_full)
        pv = (p_vals.double() @ v_vals[..., blk * block_n : (blk + 1) * block_n].transpose(-1, -2)).float()
        acc = acc * alpha.unsqueeze(-1) + pv * (gp * gv[:, :, blk : blk + 1]).unsqueeze(-1)
        m = m_new

    out = torch.where(l_sum.unsqueeze(-1) > 0, acc / l_sum.unsqueeze(-1), torch.zeros_like(acc))
    out = to_hnd(out, tensor_layout)
    if not return_lse:
        return out
    lse = (m + torch.log2(l_sum)) / LOG2E
    lse = lse + sm_scale * (q.float() @ _expand_kv(kq.mean, hq).unsqueeze(-1)).squeeze(-1)
    return out, lse
