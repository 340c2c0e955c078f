"""Reference attention: exact (float64) and simulated-quantization.

`attention_ref` is the ground truth: float64 softmax attention with SDPA's semantics.

`sage_ref` reproduces what the quantized kernels compute, step by step, so a kernel can be held
to a tight bound against it (and loosely against `attention_ref`):

1. K is smoothed: its mean over tokens (float32, per batch, head and channel) is subtracted.
   That shifts every score of a query row by the same amount, so softmax is unchanged; only the
   LSE needs the correction ``sm_scale * q . mean(k)``, which is added back.
2. Q is quantized to INT8 per block of ``block_m`` tokens, K per block of ``block_n`` tokens:
   ``x_int8 = round_half_even(x * (127 / amax))``; the scale is ``amax / 127``, and for Q it also
   carries ``sm_scale * log2(e)`` so that scores come out in the log2 domain.
3. Scores: the INT8 product (exact in int32), converted to float32 and multiplied by
   ``q_scale * k_scale``.
4. Online softmax over key blocks of ``block_n`` in float32 with exp2, as the kernels run it: the
   running max decides the scale at which each block's P is rounded.
5. P·V: FP16 P times FP16 V (bf16 V is converted to fp16), or FP8 e4m3 ``P * 448`` times FP8 V
   quantized per channel (``amax / 448``), accumulated in float32; the output is divided by
   the row sum (and by 448 and multiplied by the V scale for FP8).

Causal masking follows SDPA's ``is_causal``: query ``i`` sees keys ``j <= i`` counted from the
top-left corner, also when the query and key lengths differ. A row with no visible key (possible
only with ``attn_mask``) gives an output of 0 and an LSE of -inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .quant import FP8_E4M3_MAX, INT8_MAX, K_RESIDUAL_MUL, K_RESIDUAL_SCALE, LOG2E, PVDtype, default_sm_scale

__all__ = [
    "attention_ref",
    "exp2_h2_ref",
    "sage_ref",
    "quantize_per_block_ref",
    "quantize_v_fp8_ref",
    "QuantizedQK",
    "to_hnd",
]


def to_hnd(x: torch.Tensor, tensor_layout: str) -> torch.Tensor:
    """View a [B, N, H, D] ("NHD") tensor as [B, H, N, D]; "HND" passes through."""
    if tensor_layout == "NHD":
        return x.transpose(1, 2)
    if tensor_layout == "HND":
        return x
    raise ValueError(f"tensor_layout={tensor_layout!r} is not supported; valid values: 'HND', 'NHD'")


def _expand_kv(x: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Repeat KV heads for grouped-query attention."""
    groups = num_q_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _visible(nq: int, nk: int, is_causal: bool, attn_mask, device) -> torch.Tensor | None:
    """Boolean [.., Nq, Nk] mask of visible keys, or None when all are visible."""
    visible = None
    if is_causal:
        visible = torch.ones(nq, nk, dtype=torch.bool, device=device).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        visible = attn_mask if visible is None else (visible & attn_mask)
    return visible


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: float | None = None,
    attn_mask: torch.Tensor | None = None,
    return_lse: bool = False,
):
    """Float64 attention with SDPA semantics (GQA allowed). Returns float64 output
    (and the natural-log LSE [B, H, Nq] in float64 when ``return_lse``)."""
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
    o = p @ v
    o = to_hnd(o, tensor_layout)  # the transpose is its own inverse
    return (o, lse) if return_lse else o


def _ieee_div(limit: float, amax: torch.Tensor) -> torch.Tensor:
    """limit / amax as one correctly rounded float32 division, like the kernels. (A Python number
    divided by a tensor is computed by torch as reciprocal-then-multiply, which rounds twice.)"""
    return torch.full_like(amax, limit) / amax


@dataclass
class QuantizedQK:
    """INT8 Q and K (held as integer-valued float32) with their per-block scales."""

    q: torch.Tensor  # [B, Hq, Nq, D]
    q_scale: torch.Tensor  # [B, Hq, ceil(Nq / block_m)], includes sm_scale * log2(e)
    k: torch.Tensor  # [B, Hkv, Nk, D]
    k_scale: torch.Tensor  # [B, Hkv, ceil(Nk / block_n)]
    k_mean: torch.Tensor | None  # [B, Hkv, D] float32, when smoothed


def quantize_per_block_ref(x: torch.Tensor, block: int, extra_scale: float = 1.0, residual: bool = False):
    """Per-block symmetric INT8 of a [B, H, N, D] float32 tensor.

    Returns (integer-valued float32 tensor, scale [B, H, ceil(N / block)]). The scale is
    ``amax / 127 * extra_scale``; an all-zero block gets scale 0 and zeros.

    ``residual``: two INT8 digits, as the FP16-P·V kernels quantize K. ``k1 = rint(x * 127 / amax)``,
    then the rounding residual (one fused multiply-add, ``fma(x, 127 / amax, -k1)``, as the kernels
    compute it) times 254, rounded: ``k2``. Returns ``k1 * 254 + k2`` with the scale
    ``amax * K_RESIDUAL_SCALE`` (``extra_scale`` must be 1).
    """
    b, h, n, d = x.shape
    nblk = -(-n // block)
    padded = torch.nn.functional.pad(x, (0, 0, 0, nblk * block - n))
    blocks = padded.reshape(b, h, nblk, block * d)  # reshape: an NHD view may not be viewable
    amax = blocks.abs().amax(dim=-1)
    inv = torch.where(amax > 0, _ieee_div(INT8_MAX, amax), torch.zeros_like(amax))
    xq = torch.round(blocks * inv.unsqueeze(-1)).clamp_(-INT8_MAX, INT8_MAX)
    if residual:
        if extra_scale != 1.0:
            raise ValueError("a two-level quantization takes no extra_scale")
        # fma(x, inv, -k1): the exact product minus k1, rounded once (float64 holds it exactly).
        rest = (blocks.double() * inv.unsqueeze(-1).double() - xq.double()).float()
        k2 = torch.round(rest * torch.tensor(K_RESIDUAL_MUL, dtype=torch.float32)).clamp_(-INT8_MAX, INT8_MAX)
        xq = xq * K_RESIDUAL_MUL + k2
        scale = amax * torch.tensor(K_RESIDUAL_SCALE, dtype=torch.float32)
    else:
        scale = amax * torch.tensor(extra_scale / INT8_MAX, dtype=torch.float32)
    xq = xq.reshape(b, h, nblk * block, d)[:, :, :n]
    return xq, scale


def quantize_v_fp8_ref(v: torch.Tensor):
    """Per-channel FP8 e4m3 of V [B, H, N, D]: (fp8 values as float32, scale [B, H, D])."""
    v = v.float()
    amax = v.abs().amax(dim=2)
    inv = torch.where(amax > 0, _ieee_div(FP8_E4M3_MAX, amax), torch.zeros_like(amax))
    v8 = (v * inv.unsqueeze(2)).to(torch.float8_e4m3fn).float()
    return v8, amax / FP8_E4M3_MAX


def quantize_qk_ref(
    q, k, *, sm_scale: float, block_m: int, block_n: int, smooth_k: bool, k_residual: bool = False
) -> QuantizedQK:
    """Quantize HND q, k as the kernels do (smooth-K, per-block INT8, scale folding, two-level K)."""
    qf, kf = q.float(), k.float()
    k_mean = kf.mean(dim=2) if smooth_k else None
    if k_mean is not None:
        kf = kf - k_mean.unsqueeze(2)
    q8, q_scale = quantize_per_block_ref(qf, block_m, extra_scale=sm_scale * LOG2E)
    k8, k_scale = quantize_per_block_ref(kf, block_n, residual=k_residual)
    return QuantizedQK(q8, q_scale, k8, k_scale, k_mean)


#: exp2_h2 (csrc/sm90/attn_int8_fp8.cu): the bias added to its arguments, and its degree-2 polynomial
#: for 2^f (|f| <= 1/2, relative error 1.7e-3) scaled by 2^-bias, as the float16 bit patterns the
#: kernel multiplies with (constant term first)
H2_EXP2_BIAS = 11.0
H2_EXP2_POLY_BITS = (0x1000, 0x0DA1, 0x07A1)
_H2_EXP2_POLY = torch.tensor(H2_EXP2_POLY_BITS, dtype=torch.int16).view(torch.float16).tolist()


def exp2_h2_ref(x: torch.Tensor) -> torch.Tensor:
    """2^x as the sm_90a kernel's exp2_h2 computes it for 448 P (x = the score's exponent plus log2 448,
    float32), in float16 steps: x + bias, negatives to 0 (2^-bias is 0 in e4m3 anyway) and rounded to
    float16; j = round(x) and f = x - j; p(f) by the polynomial, two float16 FMAs; p * 2^j. The result
    is within 0.8% of 2^x for x >= -10 (float16's rounding of x, up to 2^-7, dominates) and at most 2^-10
    below: e4m3 rounds it to 0 there, as it does 2^x."""
    h = torch.clamp_min(x.float() + H2_EXP2_BIAS, 0).to(torch.float16).float()
    j = (h + 1536).to(torch.float16).float() - 1536  # exact: float16 holds integers to 2048
    f = h - j  # exact, |f| <= 1/2
    c0, c1, c2 = _H2_EXP2_POLY
    p = (f * c2 + c1).to(torch.float16).float()  # one rounding, as fma.rn.f16x2
    p = (p * f + c0).to(torch.float16).float()
    return p * torch.exp2(j)


def _half_exp2_columns(tiles: int, block_n: int, device) -> torch.Tensor:
    """The keys of a block_n-key block whose 8-key column tile c has bit c set in ``tiles``."""
    return ((tiles >> (torch.arange(block_n, device=device) // 8)) & 1).bool()


def _zero_where_no_key(m: torch.Tensor) -> torch.Tensor:
    """A running max with 0 where a row has seen no key yet (-inf), so that exp2(x - it) stays finite."""
    return torch.where(m == -math.inf, torch.zeros_like(m), m)


def sage_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: float | None = None,
    attn_mask: torch.Tensor | None = None,
    pv: PVDtype = PVDtype.FP16,
    smooth_k: bool = True,
    block_m: int = 128,
    block_n: int = 64,
    k_residual: bool = False,
    return_lse: bool = False,
    rowsum: str = "exact",
    key_parts: torch.Tensor | None = None,
    half_exp2_tiles: int = 0,
):
    """Simulated-quantization attention: what the Triton kernels compute, in float32 steps.

    ``k_residual``: K as two INT8 digits (``quantize_per_block_ref(residual=True)``), as the FP16-P·V
    kernels quantize it; the score is then the exact integer ``q1 . (254 k1 + k2)`` times the scales.

    ``rowsum``: what the softmax divides by. ``"exact"``: the sum of P in float32 before it is rounded
    for the P·V product. ``"rounded"``: the sum of the rounded P that multiplies V (the sm_90a kernel
    has the tensor cores add it up, as a column of ones next to V), so the weights of every output
    row add up to exactly one.

    ``key_parts``: ints broadcastable to [B, Hq, Nq], how many ranges a kernel splits each query row's
    key blocks into (1: none). With nb blocks of ``block_n`` keys and P parts, part j takes blocks
    [j nb / P, (j + 1) nb / P) with an online softmax of its own (its own running max, hence its own
    rounding of P), and the parts merge in part order: m = max_j m_j, acc = sum_j 2^(m_j - m) acc_j, l
    = sum_j 2^(m_j - m) l_j. The sm_90a kernel splits its last wave's tiles so
    (``sageattention.cuda_sm90.key_parts``).

    ``half_exp2_tiles``: with FP8 P·V, the 8-key column tiles of each block (bit c: keys 8c..8c+7 of
    its ``block_n``) whose 448 P the sm_90a kernel computes in float16 (``exp2_h2_ref``) instead of
    float32, in the blocks it takes without a mask: whole blocks below Nk of calls that are not causal
    and have no ``attn_mask`` (``sageattention.cuda_sm90.half_exp2_tiles``). 0: float32 everywhere.

    Output is float32 in the caller's layout; LSE (natural log, float32, [B, Hq, Nq]) when asked.
    """
    if rowsum not in ("exact", "rounded"):
        raise ValueError(f'rowsum must be "exact" or "rounded", got {rowsum!r}')
    q, k, v = (to_hnd(t, tensor_layout) for t in (q, k, v))
    b, hq, nq, d = q.shape
    nk = k.shape[2]
    if sm_scale is None:
        sm_scale = default_sm_scale(d)
    qk = quantize_qk_ref(
        q, k, sm_scale=sm_scale, block_m=block_m, block_n=block_n, smooth_k=smooth_k, k_residual=k_residual
    )
    if pv is PVDtype.FP8:
        v_q, v_scale = quantize_v_fp8_ref(v)
    else:
        v_q, v_scale = v.to(torch.float16).float(), None

    q8 = qk.q.double()
    k8 = _expand_kv(qk.k, hq).double()
    k_scale = _expand_kv(qk.k_scale, hq)
    v_q = _expand_kv(v_q, hq)
    q_scale_rows = qk.q_scale.repeat_interleave(block_m, dim=-1)[..., :nq]  # [B, H, Nq]

    additive = None
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        additive = attn_mask.float() * torch.tensor(LOG2E, dtype=torch.float32)
    visible = _visible(nq, nk, is_causal, attn_mask, q.device)
    half = None
    if half_exp2_tiles and pv is PVDtype.FP8 and not is_causal and attn_mask is None:
        half = _half_exp2_columns(half_exp2_tiles, block_n, q.device)

    def online_softmax(first_blk: int, stop_blk: int):
        """acc, l_sum and the running max m over key blocks [first_blk, stop_blk)."""
        m = torch.full((b, hq, nq), -math.inf, device=q.device)
        l_sum = torch.zeros((b, hq, nq), device=q.device)
        acc = torch.zeros((b, hq, nq, v.shape[-1]), device=q.device)
        for blk in range(first_blk, stop_blk):
            start, stop = blk * block_n, min(blk * block_n + block_n, nk)
            s_int = (q8 @ k8[:, :, start:stop].transpose(-1, -2)).float()
            s = s_int * (q_scale_rows.unsqueeze(-1) * k_scale[:, :, blk].reshape(b, hq, 1, 1))
            if additive is not None:
                s = s + additive.expand(b, hq, nq, nk)[..., start:stop]
            if visible is not None:
                s = s.masked_fill(~visible.expand(b, hq, nq, nk)[..., start:stop], -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_safe = _zero_where_no_key(m_new)
            p = torch.exp2(s - m_safe.unsqueeze(-1))
            alpha = torch.exp2(m - m_safe)
            if pv is PVDtype.FP8:
                p_q = p * FP8_E4M3_MAX
                if half is not None and stop - start == block_n:
                    x = s[..., half] - m_safe.unsqueeze(-1) + math.log2(FP8_E4M3_MAX)
                    p_q[..., half] = exp2_h2_ref(x)
                p_q = p_q.to(torch.float8_e4m3fn).float()
            else:
                p_q = p.to(torch.float16).float()
            l_sum = l_sum * alpha + (p.sum(dim=-1) if rowsum == "exact" else p_q.sum(dim=-1))
            pv_blk = (p_q.double() @ v_q[:, :, start:stop].double()).float()
            acc = acc * alpha.unsqueeze(-1) + pv_blk
            m = m_new
        return acc, l_sum, m

    blocks = -(-nk // block_n)
    acc, l_sum, m = online_softmax(0, blocks)
    if key_parts is not None:
        key_parts = torch.as_tensor(key_parts, device=q.device).expand(b, hq, nq)
        for parts in sorted(set(key_parts.unique().tolist()) - {1}):
            pieces = [online_softmax(j * blocks // parts, (j + 1) * blocks // parts) for j in range(parts)]
            m_parts = torch.stack([piece[2] for piece in pieces]).amax(dim=0)
            m_safe = _zero_where_no_key(m_parts)
            acc_parts, l_parts = torch.zeros_like(acc), torch.zeros_like(l_sum)
            for acc_j, l_j, m_j in pieces:
                weight = torch.exp2(m_j - m_safe)
                acc_parts = acc_parts + acc_j * weight.unsqueeze(-1)
                l_parts = l_parts + l_j * weight
            split = key_parts == parts
            acc = torch.where(split.unsqueeze(-1), acc_parts, acc)
            l_sum, m = torch.where(split, l_parts, l_sum), torch.where(split, m_parts, m)

    p_scale = FP8_E4M3_MAX if pv is PVDtype.FP8 else 1.0  # p_q = p_scale * P, rounded
    # l_sum adds P (exact) or p_q (rounded); the divisor is in p_q's units, the LSE's sum in P's.
    denom = l_sum if rowsum == "rounded" else l_sum * p_scale
    if rowsum == "rounded":
        l_sum = l_sum / p_scale
    out = torch.where(denom.unsqueeze(-1) > 0, acc / denom.unsqueeze(-1), torch.zeros_like(acc))
    if v_scale is not None:
        out = out * _expand_kv(v_scale, hq).unsqueeze(2)
    out = to_hnd(out, tensor_layout)
    if not return_lse:
        return out
    lse = (m + torch.log2(l_sum)) / LOG2E
    if qk.k_mean is not None:
        lse = lse + sm_scale * (q.float() @ _expand_kv(qk.k_mean, hq).unsqueeze(-1)).squeeze(-1)
    return out, lse


def permute_keys_sm90(vt: torch.Tensor) -> torch.Tensor:
    """The key order of Vᵀ that the sm_90a kernel multiplies with (``quant_v_fp8(...,
    permute_keys=True)``), applied to an unpermuted Vᵀ [..., n_pad] (keys last, n_pad a multiple of
    16). Within each group of 16 keys, slot ``4q + r`` holds key ``8 * (r // 2) + 2q + r % 2``::

        slot  0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
        key   0  1  8  9  2  3 10 11  4  5 12 13  6  7 14 15

    Why: wgmma's FP32 accumulator gives a thread the scores of keys {2q, 2q+1, 8+2q, 9+2q} of each
    16 in a row, while its 8-bit A operand (P for the FP8 P·V product) takes k = {4q, .., 4q+3} from
    that thread. Packing the scores in their natural order and permuting V's keys the same way
    pairs every P element with its own key, with no data exchange between threads.
    """
    n_pad = vt.shape[-1]
    if n_pad % 16:
        raise ValueError(f"the key dimension ({n_pad}) must be a multiple of 16")
    slot = torch.arange(n_pad, device=vt.device)
    key = slot - slot % 16 + 8 * ((slot // 2) % 2) + 2 * ((slot // 4) % 4) + slot % 2
    if vt.element_size() == 1 and vt.is_floating_point():  # FP8: gather the raw bytes
        return vt.view(torch.uint8)[..., key].view(vt.dtype)
    return vt[..., key]


__all__ += ["permute_keys_sm90"]
